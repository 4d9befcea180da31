"""FSDP2 (``fully_shard``) options and parameter groups.

``fully_shard=`` lists what the user would call ``fully_shard`` on: module
classes (or their names, as the command line takes them: a string that is no
module's FQN but a class name of the model's modules), module FQNs, a tuple of
FQNs for one grouped call, or a callable ``(name, module) -> bool``. Calls are
applied bottom-up (post-order, as FSDP2 recipes do) and the root last. Each call
manages the parameters of its modules' subtrees that no earlier call manages
(``_get_managed_modules`` / ``_get_managed_states``); each parameter is sharded
on dim 0 and padded so the dim divides the shard world size, or on the dim its call's
``shard_placement_fn`` returns (see :func:`shard_dims`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from fsdpviz.errors import ConfigError, FSDPConfigError
from fsdpviz.plan.fsdp1 import closest_class, model_classes
from fsdpviz.plan.job import JOB_KEYS, JobOptions, parse_job_options
from fsdpviz.plan.options import check_dtypes, check_keywords, torch_rules, world_size
from fsdpviz.plan.tensor_parallel import (
    TPPlan,
    layout_name,
    local_shape,
    parse_tp_mesh,
)
from fsdpviz.plan.torch_fsdp import TorchFSDP, installed
from fsdpviz.schema.config import FSDP2_KEYS, ReportConfig, TraceMode
from fsdpviz.schema.report import Unit, dtype_name, unit_label

_KNOWN = {
    "fully_shard", "reshard_after_forward", "mp_policy", "forward_prefetch", "backward_prefetch",
    "world_size", "loss", "trace", "progress", "ignored_params", "offload_policy", "mesh",
    "shard_placement_fn", "activation_checkpointing", "parallelize_plan", "torch_version",
    "reshard_after_backward", "requires_all_reduce", *JOB_KEYS,
}  # fmt: skip
FSDP2_KEYWORDS = frozenset(_KNOWN)
"""Every keyword ``analyze`` takes for FSDP2 (``fully_shard``'s options and fsdpviz's own)."""
_REJECTED = {
    "requires_gradient_sync": "pass grad_accum=N: N micro-steps per optimizer step, the first "
    "N - 1 after model.set_requires_gradient_sync(False)",
    "no_sync": "FSDP2's counterpart is set_requires_gradient_sync(False): pass grad_accum=N for "
    "N micro-steps per optimizer step, the first N - 1 without gradient sync",
}


@dataclass
class FSDP2Options:
    world_size: int
    targets: Any
    reshard_after_forward: bool | int | dict[str, bool | int] | None
    mp_policy: MixedPrecisionPolicy
    forward_prefetch: dict[str, list[str]]
    backward_prefetch: dict[str, list[str]]
    ignored_params: list[nn.Parameter] | None
    loss: Callable[[Any], torch.Tensor] | None
    trace: TraceMode
    progress: bool | None
    activation_checkpointing: Any = None
    # The mesh: ranks a group's parameters are sharded over, and the replicas of a 2-D mesh
    # (HSDP: gradients all-reduced across them); names as init_device_mesh's mesh_dim_names.
    shard_size: int = 0  # 0: world_size
    replicas: int = 1
    mesh_names: tuple[str, str] | None = None
    offload: bool = False  # CPUOffloadPolicy: shards, gradients, optimizer in host memory
    # tensor parallelism: parallelize_module's plan (resolved on the traced copy by
    # build_groups), the tp dimension's size and name, and the mesh as given
    parallelize_plan: Any = None
    tp: TPPlan | None = None
    tp_size: int = 1
    tp_name: str = ""
    mesh_dims: dict[str, int] | None = None
    # context parallelism: the cp mesh dimension's size (FSDP shards over dp_shard x cp,
    # torchtitan's dp_shard_cp; each rank of a cp group holds 1/cp of every sequence)
    cp_size: int = 1
    # the job around FSDP: gradient accumulation, torch.compile, float8, TF32 (plan/job.py)
    job: JobOptions = field(default_factory=JobOptions)
    # whose FSDP2 (torch_version=; default the installed torch's): plan/torch_fsdp.py
    torch: TorchFSDP = field(default_factory=installed)
    # the micro-steps before the last of an accumulation: set_reshard_after_backward(False)
    # keeps the parameters gathered into the next micro-step (as pipeline schedules do);
    # set_requires_all_reduce(False) reduce-scatters each and all-reduces across the HSDP
    # replicas in the last only (instead of set_requires_gradient_sync(False))
    reshard_after_backward: bool = True
    requires_all_reduce: bool = True
    # fully_shard's shard_placement_fn: one function for every call, or {module FQN: function}
    # for the calls that take one (as reshard_after_forward's mapping names them)
    shard_placement_fn: Any = None

    @property
    def shard_ranks(self) -> int:
        return self.shard_size or self.world_size

    def describe(self, groups: list[Group]) -> ReportConfig:
        """These options and the groups they made, as ``Report.config`` states them."""
        mp = self.mp_policy
        job, job_keys = self.job.config()
        return ReportConfig(
            api="FSDP2",
            torch_version=self.torch.version,
            world_size=self.world_size,
            fully_shard=tuple(g.name for g in groups),
            reshard_after_forward={g.name: g.reshard_after_forward for g in groups},
            mp_policy={
                "param_dtype": dtype_name(mp.param_dtype),
                "reduce_dtype": dtype_name(mp.reduce_dtype),
                "output_dtype": dtype_name(mp.output_dtype),
                "cast_forward_inputs": mp.cast_forward_inputs,
            },
            explicit_forward_prefetch={k: tuple(v) for k, v in self.forward_prefetch.items()},
            explicit_backward_prefetch={k: tuple(v) for k, v in self.backward_prefetch.items()},
            trace=self.trace,
            shard_world_size=(
                self.shard_ranks if self.replicas > 1 or self.tp or self.cp_size > 1 else None
            ),
            mesh=self._mesh(),
            tp_world_size=self.tp_size if self.tp else None,
            cp_world_size=self.cp_size if self.cp_size > 1 else None,
            parallelize_plan=self.tp.describe() if self.tp else None,
            cpu_offload=self.offload,
            reshard_after_backward=self.reshard_after_backward,
            requires_all_reduce=self.requires_all_reduce,
            **job,
            stated=FSDP2_KEYS
            + (
                ("shard_world_size", "mesh")
                if self.replicas > 1 or self.tp or self.cp_size > 1
                else ()
            )
            + (("tp_world_size", "parallelize_plan") if self.tp else ())
            + (("cp_world_size",) if self.cp_size > 1 else ())
            + (("cpu_offload",) if self.offload else ())
            + job_keys
            + (("reshard_after_backward",) if not self.reshard_after_backward else ())
            + (("requires_all_reduce",) if not self.requires_all_reduce else ()),
        )

    def _mesh(self) -> dict[str, int] | None:
        if self.mesh_dims is not None and (self.tp or self.cp_size > 1):
            return dict(self.mesh_dims)
        if self.mesh_names is None:
            return None
        return dict(zip(self.mesh_names, (self.replicas, self.shard_ranks), strict=True))


def parse_fsdp2_options(kwargs: dict[str, Any]) -> FSDP2Options:
    check_keywords(kwargs, _KNOWN, _REJECTED, "FSDP2 option", "FSDP2")
    plan = kwargs.get("parallelize_plan")
    mesh = kwargs.get("mesh")
    all_sizes, all_names = mesh_dims(mesh, 4)
    cp_size, dp_sizes, dp_names = context_parallel_mesh(all_sizes, all_names)
    if dp_sizes is not None and len(dp_sizes) > (3 if plan is not None else 2):
        raise ConfigError(_MESH_HELP.format(got=repr(mesh)))
    sizes: tuple[int, ...] | None = None
    names: tuple[str, ...] = ()
    tp_size, tp_name = 1, ""
    if dp_sizes is not None:
        sizes, names, tp_size, tp_name = parse_tp_mesh(dp_sizes, dp_names, plan)
    elif plan is not None:
        parse_tp_mesh((1,), (), plan)  # raises: a plan needs a mesh with a tp dimension
    if sizes is not None and len(sizes) == 2 and not names:
        names = ("replicate", "shard")
    two = (str(names[0]), str(names[1])) if sizes is not None and len(sizes) == 2 else None
    ranks = math.prod(all_sizes) if all_sizes is not None else None
    if all_sizes is not None and "world_size" in kwargs and kwargs["world_size"] != ranks:
        raise ConfigError(
            f"world_size={kwargs['world_size']!r} but the mesh has {ranks} "
            f"ranks ({' x '.join(map(str, all_sizes))}); give one of them"
        )
    ws = math.prod(all_sizes) if all_sizes is not None else world_size(kwargs)
    offload = kwargs.get("offload_policy")
    if offload is not None and type(offload).__name__ not in ("OffloadPolicy", "CPUOffloadPolicy"):
        raise ConfigError(
            "offload_policy must be torch.distributed.fsdp.CPUOffloadPolicy() or OffloadPolicy(), "
            f"got {type(offload).__name__}"
        )
    mp = kwargs.get("mp_policy") or MixedPrecisionPolicy()
    if not isinstance(mp, MixedPrecisionPolicy):
        raise ConfigError(f"mp_policy must be a MixedPrecisionPolicy, got {type(mp).__name__}")
    check_dtypes(mp, ("param_dtype", "reduce_dtype", "output_dtype"), "MixedPrecisionPolicy")
    raf = kwargs.get("reshard_after_forward")
    if raf is not None and not isinstance(raf, (bool, int, dict)):
        raise ConfigError("reshard_after_forward must be a bool, an int, or {fqn: bool or int}")
    rules = torch_rules(kwargs)
    if kwargs.get("ignored_params") is not None and not rules.ignored_params:
        raise FSDPConfigError(
            f"ignored_params: fully_shard of {rules.name} has no ignored_params (torch 2.7 "
            "added it); leave those modules out of fully_shard=, or plan for torch 2.7+"
        )
    trace = kwargs.get("trace", "meta")
    if trace not in ("meta", "real"):
        fx = " (trace='fx' traces FSDP1 plans only)" if trace == "fx" else ""
        raise ConfigError(
            f"trace={trace!r} is not valid for FSDP2{fx}; use 'meta' (default) or 'real'"
        )
    job = parse_job_options(kwargs, "FSDP2")
    after_backward = _accumulating(kwargs, "reshard_after_backward", job.grad_accum)
    all_reduce = _accumulating(kwargs, "requires_all_reduce", job.grad_accum)
    if not all_reduce and not (sizes is not None and len(sizes) == 2):
        raise ConfigError(
            "requires_all_reduce=False skips HSDP's all-reduce across the replicas of a 2-D "
            "mesh; this plan has none (pass mesh=(replicas, shard ranks))"
        )
    return FSDP2Options(
        world_size=ws,
        targets=kwargs.get("fully_shard"),
        reshard_after_forward=raf,
        mp_policy=mp,
        forward_prefetch=_prefetch_map(kwargs.get("forward_prefetch"), "forward_prefetch"),
        backward_prefetch=_prefetch_map(kwargs.get("backward_prefetch"), "backward_prefetch"),
        ignored_params=kwargs.get("ignored_params"),
        loss=kwargs.get("loss"),
        trace=trace,
        progress=kwargs.get("progress"),
        activation_checkpointing=kwargs.get("activation_checkpointing"),
        shard_size=sizes[-1] * cp_size if sizes is not None else 0,
        replicas=sizes[0] if sizes is not None and len(sizes) == 2 else 1,
        mesh_names=two,
        offload=type(offload).__name__ == "CPUOffloadPolicy",
        parallelize_plan=plan,
        tp_size=tp_size,
        tp_name=tp_name,
        mesh_dims=_named_dims(all_sizes, all_names, plan is not None),
        job=job,
        torch=rules,
        reshard_after_backward=after_backward,
        requires_all_reduce=all_reduce,
        cp_size=cp_size,
        shard_placement_fn=_placement_option(kwargs.get("shard_placement_fn")),
    )


def _placement_option(value: Any) -> Any:
    """``shard_placement_fn=``: a function, ``{module FQN: function or None}``, or None."""
    if value is None or (callable(value) and not isinstance(value, type)):
        return value
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and (v is None or (callable(v) and not isinstance(v, type)))
        for k, v in value.items()
    ):
        return dict(value)
    raise ConfigError(
        "shard_placement_fn must be fully_shard's: a function (parameter) -> Shard(dim) or None "
        "(None shards dim 0), e.g. lambda p: Shard(1) if p.ndim == 2 else None, or a mapping "
        "{module FQN: function} for the fully_shard calls given one; got "
        f"{value!r}"
    )


def _accumulating(kwargs: Mapping[str, Any], name: str, grad_accum: int) -> bool:
    """An option of the micro-steps that accumulate gradients (``set_<name>(False)`` before
    each, ``True`` before the last)."""
    value = kwargs.get(name, True)
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    if not value and grad_accum < 2:
        raise ConfigError(
            f"{name}=False is what the micro-steps before the last do (FSDP2's "
            f"set_{name}(False), then True for the last one): pass grad_accum=N for N "
            "micro-steps per optimizer step"
        )
    return value


def context_parallel_mesh(
    sizes: tuple[int, ...] | None, names: tuple[str, ...]
) -> tuple[int, tuple[int, ...] | None, tuple[str, ...]]:
    """A mesh's context-parallel dimension (named ``cp``, right after ``dp_shard`` as
    torchtitan's ``ParallelDims`` builds it): its size, and the other dimensions' sizes and
    names. FSDP shards each parameter over ``dp_shard x cp`` (torchtitan's flattened
    ``dp_shard_cp``)."""
    if sizes is None or "cp" not in names:
        return 1, sizes, names
    at = names.index("cp")
    rest = names[:at] + names[at + 1 :]
    if at == 0 or (at + 1 < len(names) and names[at + 1] != "tp"):
        raise ConfigError(
            f"the mesh's cp dimension must come right after the data-parallel ones (and before "
            f"tp), as torchtitan builds its mesh: e.g. ('dp_shard', 8, 'cp', 4); got {names}"
        )
    return sizes[at], sizes[:at] + sizes[at + 1 :], rest


def _named_dims(
    sizes: tuple[int, ...] | None, names: tuple[str, ...], tp: bool
) -> dict[str, int] | None:
    if sizes is None:
        return None
    if not names:
        dp = {1: ("dp_shard",), 2: ("dp_replicate", "dp_shard")}[len(sizes) - tp]
        names = (*dp, "tp") if tp else dp
    return dict(zip(names, sizes, strict=True))


def mesh_dims(mesh: Any, most: int) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
    """The sizes and names (possibly none) of ``mesh=`` with at most ``most`` dimensions
    (three with a tensor-parallel dimension: ``("dp_replicate", 2, "dp_shard", 16, "tp",
    8)``)."""
    if mesh is None:
        return None, ()
    names: tuple[str, ...]
    if hasattr(mesh, "mesh_dim_names") and hasattr(mesh, "shape"):
        sizes = tuple(int(n) for n in mesh.shape)
        names = tuple(mesh.mesh_dim_names or ())
    elif isinstance(mesh, dict):
        names, sizes = tuple(str(k) for k in mesh), tuple(mesh.values())
    elif isinstance(mesh, (tuple, list)) and mesh and all(isinstance(x, str) for x in mesh[::2]):
        names, sizes = tuple(mesh[::2]), tuple(mesh[1::2])
    elif isinstance(mesh, (tuple, list)):
        names, sizes = (), tuple(mesh)
    else:
        raise ConfigError(_MESH_HELP.format(got=repr(mesh)))
    if not sizes or len(sizes) > most or (names and len(names) != len(sizes)):
        raise ConfigError(_MESH_HELP.format(got=repr(mesh)))
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        raise ConfigError(f"mesh sizes must be positive ints, got {sizes!r}")
    return sizes, tuple(str(n) for n in names)


_MESH_HELP = (
    "mesh must be a DeviceMesh, ('dp_replicate', R, 'dp_shard', S), {{'dp_replicate': R, "
    "'dp_shard': S}} or sizes (R, S) (one or two dimensions: shard, or replicate x shard; "
    "with parallelize_plan=... a tp dimension last, e.g. ('dp_shard', 32, 'tp', 8); a "
    "context-parallel dimension named cp after dp_shard, e.g. ('dp_shard', 8, 'cp', 4)); "
    "got {got}"
)


def _prefetch_map(value: Any, name: str) -> dict[str, list[str]]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, (list, tuple)) for k, v in value.items()
    ):
        raise ConfigError(
            f"{name} must map a module FQN to a list of module FQNs, e.g. "
            f'{{"layers.0": ["layers.1"]}} (the effect of set_modules_to_{name})'
        )
    return {k: list(v) for k, v in value.items()}


@dataclass
class Group:
    """One ``fully_shard`` call: its modules, parameters and sizes."""

    name: str  # FSDP2's name: member FQNs joined by ", " in named_modules() order
    modules: tuple[nn.Module, ...]
    fqns: tuple[str, ...]
    params: list[nn.Parameter] = field(default_factory=list)
    param_fqns: list[str] = field(default_factory=list)
    reshard_after_forward: bool | int = True
    auto_reshard: bool = False
    schema: Unit | None = None
    # tensor parallelism: the replicated parameters whose gradients are partial sums, all-
    # reduced over the tp dimension in post-backward (parameter FQN, unsharded bytes)
    tp_partial_grads: list[tuple[str, int]] = field(default_factory=list)
    # the dim FSDP2 shards each parameter on (its call's shard_placement_fn); empty: all dim 0
    shard_dims: list[int] = field(default_factory=list)

    @property
    def is_root(self) -> bool:
        return self.fqns == ("",)


@dataclass
class _Claim:
    """One ``fully_shard`` call and the parameters it takes: the same for every plan with
    one ``fully_shard`` spec, whatever the world size or resharding."""

    name: str
    modules: tuple[nn.Module, ...]
    fqns: tuple[str, ...]
    params: list[nn.Parameter]


@dataclass
class GroupMemo:
    """What :func:`build_groups` works out from the model alone, kept across the plans of
    one model copy whose structure does not change (fsdpviz.replan's stored traces): the
    modules by name and position, each parameter's first name and its other names, and
    the calls and parameters of each ``fully_shard`` spec :func:`_spec_key` can name."""

    modules: dict[str, nn.Module]
    names: dict[nn.Module, str]
    position: dict[str, int]
    post: dict[str, int]  # a module's place in post-order
    first_fqn: dict[nn.Parameter, str]
    aliases: dict[nn.Parameter, dict[str, str]]
    claims: dict[Any, list[_Claim]] = field(default_factory=dict)

    @classmethod
    def of(cls, model: nn.Module) -> GroupMemo:
        modules = dict(model.named_modules())
        first_fqn, aliases = _parameter_names(model)
        return cls(
            modules=modules,
            names={m: n for n, m in modules.items()},
            position={n: i for i, n in enumerate(modules)},
            post={n: i for i, n in enumerate(_post_order(model))},
            first_fqn=first_fqn,
            aliases=aliases,
        )


def _parameter_names(
    model: nn.Module,
) -> tuple[dict[nn.Parameter, str], dict[nn.Parameter, dict[str, str]]]:
    """Each parameter's first FQN, and its other FQNs (shared parameters) -> the first."""
    first_fqn: dict[nn.Parameter, str] = {}
    for n, p in model.named_parameters():
        first_fqn.setdefault(p, n)
    aliases: dict[nn.Parameter, dict[str, str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        if n != first_fqn[p]:
            aliases.setdefault(p, {})[n] = first_fqn[p]
    return first_fqn, aliases


def _spec_key(spec: Any, ignored: set[nn.Parameter]) -> Any:
    """A hashable stand-in for ``fully_shard=`` made of classes and FQNs (with the ignored
    parameters), else ``None``."""
    items = [] if spec is None else [spec] if isinstance(spec, (str, type)) else spec
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, (str, type)) for i in items):
        return None
    return (tuple(items), frozenset(id(p) for p in ignored))


def resolve_targets(
    model: nn.Module, spec: Any, memo: GroupMemo | None = None
) -> list[tuple[str, ...]]:
    """The ``fully_shard`` calls, as tuples of FQNs, bottom-up with the root last."""
    memo = memo or GroupMemo.of(model)
    names, modules = memo.names, memo.modules
    classes = {type(m).__name__ for m in modules.values()}
    items: Iterable[Any] = [] if spec is None else spec
    if (callable(spec) and not isinstance(spec, type)) or isinstance(spec, (str, type)):
        items = [spec]
    calls: list[tuple[str, ...]] = []
    for item in items:
        if isinstance(item, type):
            found = [(n,) for m, n in names.items() if isinstance(m, item)]
            if not found:
                raise ConfigError(f"fully_shard: no module of class {item.__name__} in the model")
            calls.extend(found)
        elif isinstance(item, str) and item not in modules and item in classes:
            calls.extend((n,) for m, n in names.items() if type(m).__name__ == item)
        elif isinstance(item, str):
            calls.append((_lookup(item, modules, model),))
        elif isinstance(item, tuple):
            grouped = [str(i) for i in item if str(i) not in modules and str(i) in classes]
            if grouped:
                raise ConfigError(
                    f"fully_shard: a tuple groups modules by FQN into one fully_shard call, and "
                    f"{grouped[0]!r} is a class name: list it alone (fully_shard=[{grouped[0]!r}]"
                    ") to shard each module of that class, or give the FQNs to group"
                )
            calls.append(tuple(_lookup(str(i), modules, model) for i in item))
        elif callable(item):
            calls.extend((n,) for n, m in modules.items() if item(n, m))
        else:
            raise ConfigError(
                f"fully_shard entries must be module classes, FQNs, tuples of FQNs or a "
                f"callable (name, module) -> bool, got {item!r}"
            )
    post = memo.post
    unique = list(dict.fromkeys(c for c in calls if c != ("",)))
    unique.sort(key=lambda c: max(post[n] for n in c))
    return [*unique, ("",)]


def _lookup(fqn: str, modules: dict[str, nn.Module], model: nn.Module) -> str:
    """A module FQN of ``fully_shard=`` (a string that names no class of the model)."""
    if fqn in modules:
        return fqn
    hint = difflib.get_close_matches(fqn, list(modules), n=1)
    if hint:
        tip = f"; did you mean {hint[0]!r}?"
    elif "." in fqn or any(c.isdigit() for c in fqn):
        tip = ""
    else:  # a class name, most likely
        cls = closest_class(model, fqn)
        tip = (
            f"; a string names a module (an FQN such as 'layers.0') or a class of the model's "
            f"modules: did you mean the class {cls!r}? ({model_classes(model)})"
            if cls
            else ""
        )
    raise ConfigError(f"fully_shard: no module named {fqn!r} in the model{tip}")


def _post_order(model: nn.Module) -> list[str]:
    out: list[str] = []
    seen: set[nn.Module] = set()

    def dfs(name: str, m: nn.Module) -> None:
        seen.add(m)
        for child_name, child in m.named_children():
            if child not in seen:
                dfs(f"{name}.{child_name}" if name else child_name, child)
        out.append(name)

    dfs("", model)
    return out


def build_groups(
    model: nn.Module,
    opts: FSDP2Options,
    ignored: set[nn.Parameter],
    memo: GroupMemo | None = None,
    originals: Mapping[int, nn.Parameter] | None = None,
) -> list[Group]:
    """Apply the calls in order, claiming parameters as ``fully_shard`` does. ``memo`` (made
    by :meth:`GroupMemo.of` for this ``model``) keeps what does not depend on ``opts``
    beyond ``fully_shard=`` for the next plan of the same model. ``originals`` maps
    ``id(parameter of model)`` to the user's parameter, which ``shard_placement_fn`` is
    called with (``model`` is fsdpviz's copy)."""
    memo = memo or GroupMemo.of(model)
    key = _spec_key(opts.targets, ignored)
    claims = memo.claims.get(key) if key is not None else None
    if claims is None:
        claims = _claims(model, opts.targets, ignored, memo)
        if key is not None:
            memo.claims[key] = claims
    groups: list[Group] = []
    for claim in claims:
        group = Group(
            name=claim.name, modules=claim.modules, fqns=claim.fqns, params=list(claim.params)
        )
        group.reshard_after_forward, group.auto_reshard = reshard_after_forward_of(
            opts.reshard_after_forward, group.name, group.fqns, opts.torch
        )
        groups.append(group)
    _place(groups, opts, memo, originals or {})
    finalize_groups(model, groups, opts, memo)
    position = memo.position
    return sorted(groups, key=lambda g: min(position[f] for f in g.fqns))


def _claims(
    model: nn.Module, spec: Any, ignored: set[nn.Parameter], memo: GroupMemo
) -> list[_Claim]:
    """The calls of ``fully_shard=`` in order, each with the parameters it claims."""
    modules, names, position = memo.modules, memo.names, memo.position
    sharded: set[nn.Module] = set()
    claimed: dict[nn.Parameter, str] = {}
    out: list[_Claim] = []
    for call in resolve_targets(model, spec, memo):
        members = tuple(modules[n] for n in call)
        container = members[0] if len(members) == 1 else None
        if (
            isinstance(container, (nn.ModuleList, nn.ModuleDict))
            and type(container).forward is nn.Module.forward
        ):
            kinds = sorted({type(m).__name__ for m in container.children()})
            raise FSDPConfigError(
                f"fully_shard does not support containers that do not implement forward: "
                f"{call[0]!r} is a {type(container).__name__} of {len(container)} "
                f"({', '.join(kinds)}), and FSDP2 raises this for it. Shard each module in it "
                "(fully_shard=[the block class], or their FQNs), or group them in one call "
                "(a tuple of their FQNs)"
            )
        ordered = sorted(set(call), key=position.__getitem__)
        claim = _Claim(name=", ".join(ordered), modules=members, fqns=call, params=[])
        seen: set[nn.Parameter] = set()
        for module in _managed_modules(members, sharded):
            for pname, p in module._parameters.items():  # named_parameters(recurse=False)
                if p is None or p in ignored or p in seen:
                    continue
                seen.add(p)
                if p.dim() == 0:
                    raise FSDPConfigError(
                        f"fully_shard doesn't support scalar parameters. Change "
                        f"{names[module]}.{pname} to a 1D tensor with numel equal to 1."
                    )
                if p in claimed:
                    raise FSDPConfigError(
                        f"Parameter '{names[module]}.{pname}' is shared with a parameter already "
                        f"managed by another FSDP group ({claimed[p]!r}). For shared/tied "
                        "parameters, use fully_shard([module_a, module_b]) to place them in the "
                        "same FSDP group (FSDP2 raises this at the first forward)."
                    )
                claim.params.append(p)
        for p in claim.params:
            claimed[p] = claim.name
        sharded.update(members)
        out.append(claim)
    return out


def finalize_groups(
    model: nn.Module, groups: list[Group], opts: FSDP2Options, memo: GroupMemo | None = None
) -> None:
    """Name each group's parameters by their first FQN and compute its sizes."""
    first_fqn, aliases = (
        (memo.first_fqn, memo.aliases) if memo is not None else _parameter_names(model)
    )
    placements = opts.tp.placements(model) if opts.tp is not None else {}
    partial = opts.tp.partial_grads(model) if opts.tp is not None else set()
    compute = opts.mp_policy.param_dtype
    for group in groups:
        group.param_fqns = [first_fqn[p] for p in group.params]
        trainable = {p.dtype for p in group.params if p.requires_grad}
        if len(trainable) > 1:
            raise FSDPConfigError(
                f"fully_shard group {unit_label(group.name)}: FSDP expects uniform original "
                f"parameter dtype but got {sorted(str(d) for d in trainable)} (FSDP2 raises "
                "this at the first forward); shard the modules of each dtype separately"
            )
        shared = {k: v for p in group.params for k, v in aliases.get(p, {}).items()}
        group.schema = _schema(group, opts, shared, placements)
        group.tp_partial_grads = [
            (f, p.numel() * (compute or p.dtype).itemsize)
            for f, p in zip(group.param_fqns, group.params, strict=True)
            if p in partial and p.requires_grad
        ]


def _managed_modules(roots: tuple[nn.Module, ...], sharded: set[nn.Module]) -> list[nn.Module]:
    out: list[nn.Module] = []
    visited: set[nn.Module] = set()

    def dfs(m: nn.Module) -> None:
        if m not in roots and m in sharded:
            return
        visited.add(m)
        for child in m.children():
            if child not in visited:
                dfs(child)
        out.append(m)

    for root in roots:
        dfs(root)
    return out


def reshard_after_forward_of(
    value: Any, name: str, fqns: tuple[str, ...], rules: TorchFSDP | None = None
) -> tuple[bool | int, bool]:
    """``fully_shard``'s ``reshard_after_forward`` for the group ``name`` (modules ``fqns``)
    given the option's value (a bool, an int or ``{fqn: bool | int}``), and whether that is
    torch's default (reshard all but the root). Before torch 2.8 (``rules``) lazy init keeps
    the root unsharded after forward whatever it was given."""
    if fqns == ("",) and rules is not None and not rules.auto_reshard_after_forward:
        return False, True
    if isinstance(value, dict):
        for key in (name, *fqns):
            if key in value:
                return value[key], False
        value = None
    if value is None:
        return fqns != ("",), True
    return value, False


def reshards(raf: bool | int) -> bool:
    """Whether a group with this ``reshard_after_forward`` frees its parameters after forward."""
    return raf if isinstance(raf, bool) else raf > 1


def check_reshard_ints(groups: list[Group], world_size: int) -> None:
    """Raise as FSDP2 does for an int ``reshard_after_forward`` that does not divide the ranks."""
    for g in groups:
        raf = g.reshard_after_forward
        if isinstance(raf, bool) or not isinstance(raf, int):
            continue
        if raf < 1 or raf > world_size or world_size % raf:
            raise FSDPConfigError(
                f"reshard_after_forward={raf} for {unit_label(g.name)}: if passing "
                f"reshard_after_forward as an int, it should be a factor of {world_size} "
                "(FSDP2 raises this)"
            )
    check_placements_reshard(groups, world_size)


def prefetch_indices(
    spec: Mapping[str, Sequence[str]], groups: list[Group], name: str
) -> dict[int, list[int]]:
    """An explicit prefetch map ``{fqn: [fqn, ...]}`` (option ``name``) as group indices."""
    index: dict[str, int] = {}
    for i, g in enumerate(groups):
        for f in g.fqns:
            index[f] = i

    def find(fqn: str) -> int:
        if fqn not in index:
            known = ", ".join(repr(f) for f in list(index)[:6])
            raise ConfigError(
                f"{name}: {fqn!r} is not a module fully_shard is applied to (known: {known}, ...)"
            )
        return index[fqn]

    return {find(k): [find(v) for v in vs] for k, vs in spec.items()}


# [Note: shard_placement_fn]
# fully_shard(module, shard_placement_fn=fn) calls fn on each parameter of the call, the
# user's nn.Parameter before it is sharded (FSDPParam._init_sharded_param; torch 2.13 calls
# it once more per parameter beforehand, to group parameters by mesh). fn returns Shard(dim)
# or None (Shard(0)); a negative dim counts from the end. FSDP2 then chunks the parameter
# along dim over the shard ranks (torch.chunk, the first chunk the largest) and pads every
# rank's shard to the first chunk's size: dim 0 may be uneven (ranks past the end hold
# padding only), another dim must divide evenly (NotImplementedError otherwise). The shard
# is ceil(size[dim] / W) rows of that dim times the other dims; all-gather input, output and
# reduce-scatter sizes follow. A parameter on dim != 0 costs two extra copies per step
# (_fsdp_collectives.py): the copy-out of its all-gather writes into a temporary as large as
# the unsharded parameter and torch.cat's the ranks' chunks along dim into the parameter
# (foreach_all_gather_copy_out), and the reduction rebuilds its gradient as
# torch.cat(torch.chunk(grad, W, dim), dim=0) before the reduce-scatter's chunk_cat
# (foreach_reduce). fsdpviz calls fn once per parameter of each call, on the user's parameter.


def shard_shape(shape: Sequence[int], world_size: int, dim: int = 0) -> list[int]:
    """One rank's padded shard of a parameter of ``shape`` that FSDP2 shards on ``dim``
    over ``world_size`` ranks: ``ceil(shape[dim] / world_size)`` along ``dim``.

    Example::

        shard_shape([6, 8], 4)         # [2, 8]: ranks 0-2 hold rows, rank 3 padding
        shard_shape([6, 8], 4, dim=1)  # [6, 2]
    """
    out = list(shape)
    out[dim] = math.ceil(out[dim] / world_size)
    return out


def sharded_numel(shape: Sequence[int], world_size: int, dim: int = 0) -> int:
    """Elements of a parameter of ``shape`` that each rank holds: FSDP2 shards ``dim``
    (default 0), padded to a multiple of ``world_size``."""
    return math.prod(shard_shape(shape, world_size, dim))


def _dims(dims: Sequence[int] | None, n: int) -> Sequence[int]:
    return dims if dims else [0] * n


def trainable_fields(
    fqns: Sequence[str],
    shapes: Sequence[Sequence[int]],
    trains: Sequence[bool],
    world_size: int,
    dims: Sequence[int] | None = None,
) -> dict[str, Any]:
    """``Unit``'s fields for a group that mixes frozen and trainable parameters: FSDP2
    reduce-scatters the gradients that exist, one padded shard per trainable parameter
    (``dims``: the dim each is sharded on, default 0), and the optimizer keeps state for
    those shards only."""
    ds = _dims(dims, len(shapes))
    return {
        "frozen_params": [f for f, t in zip(fqns, trains, strict=True) if not t],
        "trainable_numel": sum(math.prod(s) for s, t in zip(shapes, trains, strict=True) if t),
        "trainable_sharded_numel": sum(
            sharded_numel(s, world_size, d) for s, t, d in zip(shapes, trains, ds, strict=True) if t
        ),
    }


def dtype_fields(
    fqns: Sequence[str],
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[Any],
    world_size: int,
    dims: Sequence[int] | None = None,
) -> dict[str, Any]:
    """``Unit``'s fields for a group of parameters in several dtypes: each dtype's
    parameters, and their elements in all and in one rank's padded shard."""
    names: dict[str, list[str]] = {}
    numels: dict[str, list[int]] = {}
    for fqn, shape, dt, d in zip(fqns, shapes, dtypes, _dims(dims, len(shapes)), strict=True):
        name = dtype_name(dt) or str(dt)
        names.setdefault(name, []).append(fqn)
        counts = numels.setdefault(name, [0, 0])
        counts[0] += math.prod(shape)
        counts[1] += sharded_numel(shape, world_size, d)
    return {"param_dtypes": names, "dtype_numels": numels}


def placement_fn_of(value: Any, name: str, fqns: tuple[str, ...]) -> Any:
    """The ``shard_placement_fn`` of the ``fully_shard`` call ``name`` (modules ``fqns``):
    the option's function, or its mapping's entry for the call (by the call's name or one
    of its modules' FQNs), else None."""
    if isinstance(value, Mapping):
        for key in (name, *fqns):
            if key in value:
                return value[key]
        return None
    return value


def _place(
    groups: list[Group],
    opts: FSDP2Options,
    memo: GroupMemo,
    originals: Mapping[int, nn.Parameter],
) -> None:
    """Each group's ``shard_dims``: its call's ``shard_placement_fn`` asked of each of its
    parameters (the user's), in call order (see [Note: shard_placement_fn])."""
    value = opts.shard_placement_fn
    if value is None:
        return
    if isinstance(value, Mapping):
        known = {k for g in groups for k in (g.name, *g.fqns)}
        unknown = [k for k in value if k not in known]
        if unknown:
            listed = ", ".join(repr(g.name) for g in groups[:6])
            raise ConfigError(
                f"shard_placement_fn: {unknown[0]!r} is not a module fully_shard is applied to "
                f"(the calls: {listed}{', ...' if len(groups) > 6 else ''}); key the mapping by "
                "those modules' FQNs"
            )
    for group in groups:
        fn = placement_fn_of(value, group.name, group.fqns)
        if fn is None:
            continue
        group.shard_dims = [
            shard_dim(fn, originals.get(id(p), p), memo.first_fqn[p], group.name)
            for p in group.params
        ]
        if not any(group.shard_dims):
            group.shard_dims = []


def shard_dim(fn: Callable[[Any], Any], param: nn.Parameter, fqn: str, unit: str) -> int:
    """The dim FSDP2 shards ``param`` on: ``fn(param)`` checked as ``fully_shard`` checks it
    (``Shard(dim)`` or None; a negative dim counts from the end)."""
    from torch.distributed.tensor import Shard

    where = f"shard_placement_fn of {unit_label(unit)}"
    shape = tuple(param.shape)
    try:
        result = fn(param)
    except Exception as e:
        raise ConfigError(
            f"{where} raised {type(e).__name__} for parameter {fqn!r} {list(shape)}: {e}"
        ) from e
    if result is None:
        return 0
    if type(result).__name__ == "ShardPlacementResult":
        raise ConfigError(
            f"{where} returned a ShardPlacementResult for {fqn!r}: a parameter on a mesh of its "
            "own is not modelled; return Shard(dim) (or None for Shard(0)) on the call's mesh"
        )
    if not isinstance(result, Shard):
        raise FSDPConfigError(
            f"{where} returned {result!r} for {fqn!r} {list(shape)}: fully_shard takes Shard(dim) "
            "or None (None shards dim 0) and raises ValueError('Invalid shard_placement_fn "
            "result') for anything else; return torch.distributed.tensor.Shard(dim)"
        )
    ndim = len(shape)
    dim = result.dim + ndim if result.dim < 0 else result.dim
    if not 0 <= dim < ndim:
        raise FSDPConfigError(
            f"{where} returned Shard({result.dim}) for {fqn!r}, a {ndim}-D parameter "
            f"{list(shape)}: FSDP2 fails on it (Shard dim {result.dim} is invalid for a {ndim}D "
            f"tensor); return a dim from {-ndim} to {ndim - 1} (negative dims count from the end)"
        )
    return dim


def check_even_shard(shape: Sequence[int], dim: int, world_size: int, fqn: str, unit: str) -> None:
    """FSDP2 shards a dim other than 0 only evenly (``_init_sharded_param``)."""
    if dim > 0 and shape[dim] % world_size:
        raise FSDPConfigError(
            f"shard_placement_fn of {unit_label(unit)} shards {fqn!r} {list(shape)} on dim {dim}, "
            f"whose size {shape[dim]} the {world_size} shard ranks do not divide: FSDP2 raises "
            f"NotImplementedError (FSDP does not support uneven sharding on dim {dim}). Shard it "
            "on dim 0 (uneven dim-0 shards are padded) or on a dim the shard ranks divide"
        )


def check_placements_reshard(groups: Sequence[Group], world_size: int) -> None:
    """FSDP2 fails in the copy-out of a parameter sharded on a dim other than 0 once it
    resharded to a smaller post-forward mesh (``reshard_after_forward`` an int between 1 and
    the ``world_size`` shard ranks)."""
    for g in groups:
        raf = g.reshard_after_forward
        smaller = not isinstance(raf, bool) and 1 < raf < world_size
        if any(g.shard_dims) and smaller:
            raise FSDPConfigError(
                f"reshard_after_forward={raf} for {unit_label(g.name)}, whose shard_placement_fn "
                "shards parameters on a dim other than 0: FSDP2's backward all-gather from the "
                "post-forward mesh fails in its copy-out (IndexError in "
                "foreach_all_gather_copy_out); use reshard_after_forward=True or False for it"
            )


def _schema(
    group: Group, opts: FSDP2Options, shared: dict[str, str], placements: dict[Any, Any]
) -> Unit:
    """The unit of ``group``. Under tensor parallelism FSDP2 shards each rank's tp-local
    tensor (``FSDPParam._orig_size`` is the local size): sizes are one rank's."""
    ws = opts.shard_ranks
    local = [local_shape(p.shape, placements.get(p), opts.tp_size) for p in group.params]
    dims = _dims(group.shard_dims, len(local))
    for shape, d, fqn in zip(local, dims, group.param_fqns, strict=True):
        check_even_shard(shape, d, ws, fqn, group.name)
    numel = sum(math.prod(s) for s in local)
    sharded = sum(sharded_numel(s, ws, d) for s, d in zip(local, dims, strict=True))
    dtypes = {p.dtype for p in group.params}
    # FSDP2's orig dtype: the trainable parameters' (they share one), frozen ones may differ
    orig = {p.dtype for p in group.params if p.requires_grad} or dtypes
    dtype = next(iter(orig)) if len(orig) == 1 else None
    mp = opts.mp_policy
    compute = mp.param_dtype or (dtype if len(dtypes) == 1 else None)
    reduce = mp.reduce_dtype or mp.param_dtype or dtype
    grads = {p.requires_grad for p in group.params}
    mixed = len(grads) > 1
    trains = [p.requires_grad for p in group.params]
    itemsize = torch.empty((), dtype=dtype or torch.float32, device="meta").element_size()
    placed = any(dims)
    return Unit(
        module=group.name,
        module_class=", ".join(type(m).__name__ for m in group.modules),
        params=list(group.param_fqns),
        shared_params=shared,
        numel=numel,
        flat_numel=numel,
        padded_numel=sharded * ws,
        sharded_numel=sharded,
        dtype=dtype_name(dtype),
        compute_dtype=dtype_name(compute),
        reduce_dtype=dtype_name(reduce),
        requires_grad=None if mixed else (grads.pop() if grads else None),
        sharding_strategy="FULL_SHARD"
        if group.reshard_after_forward is not False
        else "SHARD_GRAD_OP",
        itemsize=itemsize,
        **(trainable_fields(group.param_fqns, local, trains, ws, dims) if mixed else {}),
        **(
            dtype_fields(group.param_fqns, local, [p.dtype for p in group.params], ws, dims)
            if len(dtypes) > 1
            else {}
        ),
        shard_shapes={
            f: shard_shape(s, ws, d) for f, s, d in zip(group.param_fqns, local, dims, strict=True)
        }
        if opts.tp is not None or placed
        else {},
        tp_placements={
            f: layout_name(placements[p])
            for f, p in zip(group.param_fqns, group.params, strict=True)
            if p in placements
        },
        shard_dims={f: d for f, d in zip(group.param_fqns, dims, strict=True) if d},
    )
