"""FSDP2 (``fully_shard``) options: each keyword ``analyze`` takes for FSDP2 checked and
read into :class:`FSDP2Options`, ``mesh=`` read into its dimensions, and the options as
``Report.config`` states them (:meth:`FSDP2Options.describe`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from fsdpviz.errors import ConfigError, FSDPConfigError
from fsdpviz.plan.fsdp2_group import Group, reshard_map
from fsdpviz.plan.job import JobOptions, parse_job_options
from fsdpviz.plan.options import (
    KEYWORDS,
    check_dtypes,
    check_keywords,
    check_switch,
    describe_precision,
    torch_rules,
    world_size,
)
from fsdpviz.plan.tensor_parallel import TPPlan, parse_tp_mesh
from fsdpviz.plan.torch_fsdp import TorchFSDP, installed
from fsdpviz.schema.config import FSDP2_KEYS, ReportConfig, TraceMode, non_default_keys
from fsdpviz.schema.mesh import ParallelDims

FSDP2_KEYWORDS = KEYWORDS["FSDP2"]
"""Every keyword ``analyze`` takes for FSDP2 (``fully_shard``'s options and fsdpviz's own)."""


@dataclass(frozen=True, kw_only=True)
class FSDP2Options:
    """``fully_shard``'s options as ``analyze`` takes them, checked and read once
    (:func:`parse_fsdp2_options`), with fsdpviz's own. Frozen: a change is :meth:`replace`,
    which checks the changed options again.

    Attributes:
        parallel_dims: the job's ranks by mesh dimension (the mesh's, where ``mesh=`` is
            given), read once by the parser: FSDP shards a group over ``dp_shard_cp`` (all
            ranks without a mesh), ``hsdp`` where ``fully_shard`` gets a 2-D mesh (torch's
            ``HSDPMeshInfo``, whose ``foreach_reduce`` all-reduces each gradient shard over
            the replicate dimension, one replica included: the mesh's dimensionality
            decides, not its size), and the tp and cp dimensions' sizes (FSDP shards over
            dp_shard x cp, torchtitan's dp_shard_cp; each rank of a cp group holds 1/cp of
            every sequence).
        targets: ``fully_shard=``: the module classes or FQNs each given a call, as given.
        reshard_after_forward: ``True``, ``False``, an int (ranks to reshard to), or
            ``{module FQN: bool or int}``; ``None``: torch's default (the root ``False``).
        mp_policy: the ``MixedPrecisionPolicy``.
        forward_prefetch, backward_prefetch: explicit prefetches, ``{module FQN: [module
            FQN]}`` (the effect of ``set_modules_to_forward_prefetch`` / ``..._backward_...``).
        ignored_params: ``ignored_params=`` as given (torch 2.7+).
        loss: the callable from the model's output to a scalar the trace backpropagates.
        trace: ``"meta"`` or ``"real"``.
        progress: show a progress bar (``None``: when the trace is slow).
        activation_checkpointing: module classes or a predicate run under checkpointing.
        mesh_names: a 2-D data-parallel mesh's (HSDP's) replicate and shard dimensions'
            names, as ``init_device_mesh``'s ``mesh_dim_names`` (None: a 1-D mesh).
        offload: ``CPUOffloadPolicy``: shards, gradients, optimizer in host memory.
        parallelize_plan, tp, tp_name, mesh: tensor parallelism: ``parallelize_module``'s
            plan as given and as resolved on the traced copy (by the schedule, with
            :meth:`replace`), the tp dimension's name (its size: ``parallel_dims.tp``), and
            the mesh as given (``{name: size}``).
        job: the job around FSDP: gradient accumulation, torch.compile, float8, TF32
            (``plan/job.py``).
        torch: whose FSDP2 (``torch_version=``; default the installed torch's):
            ``plan/torch_fsdp.py``.
        reshard_after_backward, requires_all_reduce: the micro-steps before the last of an
            accumulation: ``set_reshard_after_backward(False)`` keeps the parameters
            gathered into the next micro-step (as pipeline schedules do);
            ``set_requires_all_reduce(False)`` reduce-scatters each and all-reduces across
            the HSDP replicas in the last only (instead of
            ``set_requires_gradient_sync(False)``).
        shard_placement_fn: ``fully_shard``'s ``shard_placement_fn``: one function for
            every call, or ``{module FQN: function}`` for the calls that take one (as
            ``reshard_after_forward``'s mapping names them).
        unshard_in_backward: ``FSDPModule.set_unshard_in_backward``: ``False`` for every
            call, or ``{module FQN: bool}`` for the calls it names (as
            ``reshard_after_forward``'s mapping names them; the others ``True``, torch's
            default). A group set ``False`` is not all-gathered in backward, neither by its
            pre-backward nor as a prefetch; its backward must not read its parameters (an
            embedding's makes the weight's gradient from the indices), else torch fails
            where a group freed them after forward, and fsdpviz refuses it.
    """

    parallel_dims: ParallelDims
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
    mesh_names: tuple[str, str] | None = None
    offload: bool = False
    parallelize_plan: Any = None
    tp: TPPlan | None = None
    tp_name: str = ""
    mesh: dict[str, int] | None = None
    job: JobOptions = field(default_factory=JobOptions)
    torch: TorchFSDP = field(default_factory=installed)
    reshard_after_backward: bool = True
    requires_all_reduce: bool = True
    shard_placement_fn: Any = None
    unshard_in_backward: bool | dict[str, bool] = True

    def __post_init__(self) -> None:
        if self.parallel_dims.hsdp != (self.mesh_names is not None):
            raise ConfigError(
                "parallel_dims.hsdp and mesh_names disagree: HSDP is a 2-D mesh, named"
            )
        _check_reshard(self.reshard_after_forward)
        check_unshard_in_backward(self.unshard_in_backward)
        for name in ("reshard_after_backward", "requires_all_reduce"):
            check_switch(name, getattr(self, name))
        _check_trace(self.trace)

    def replace(self, **changes: Any) -> FSDP2Options:
        """A copy with ``changes`` (fields by name), checked as a new one is.

        Example::

            opts.replace(reshard_after_forward=False)
        """
        return dataclasses.replace(self, **changes)

    @property
    def world_size(self) -> int:
        """The ranks of the job (the mesh's, where ``mesh=`` is given):
        ``parallel_dims.world_size``."""
        return self.parallel_dims.world_size

    def reshard(self, group: Group) -> Group:
        """``group`` with its ``reshard_after_forward`` as these options give it for its
        ``fully_shard`` call under :attr:`torch`'s rules (:meth:`Group.reshard_as`)."""
        group.reshard_as(self.reshard_after_forward, self.torch)
        return group

    def unshards_in_backward(self, group: Group) -> bool:
        """Whether ``group``'s pre-backward all-gathers its parameters: the option's value
        for its ``fully_shard`` call (a mapping names it by its name or a member's FQN;
        ``True`` for a call it does not name)."""
        value = self.unshard_in_backward
        if isinstance(value, dict):
            return next((value[k] for k in (group.name, *group.fqns) if k in value), True)
        return value

    def describe(self, groups: list[Group]) -> ReportConfig:
        """These options and the groups they made, as ``Report.config`` states them."""
        job, job_keys = self.job.config()
        dims = self.parallel_dims
        multi = dims.hsdp or bool(self.tp) or dims.cp > 1
        mesh: dict[
            str, Any
        ] = {  # each stated where it is not a plain 1-D plan's (the config's default)
            "shard_world_size": dims.dp_shard_cp if multi else None,
            "mesh": self._stated_mesh(dims),
            "tp_world_size": dims.tp if self.tp else None,
            "parallelize_plan": self.tp.describe() if self.tp else None,
            "cp_world_size": dims.cp if dims.cp > 1 else None,
            "cpu_offload": self.offload,
        }
        accumulation: dict[str, Any] = {
            "reshard_after_backward": self.reshard_after_backward,
            "requires_all_reduce": self.requires_all_reduce,
            "unshard_in_backward": {g.name: False for g in groups if not g.unshard_in_backward},
        }
        return ReportConfig(
            api="FSDP2",
            torch_version=self.torch.version,
            world_size=self.world_size,
            fully_shard=tuple(g.name for g in groups),
            reshard_after_forward=reshard_map(groups),
            mp_policy=describe_mp_policy(self.mp_policy),
            explicit_forward_prefetch={k: tuple(v) for k, v in self.forward_prefetch.items()},
            explicit_backward_prefetch={k: tuple(v) for k, v in self.backward_prefetch.items()},
            trace=self.trace,
            **mesh,
            **accumulation,
            **job,
            stated=FSDP2_KEYS + non_default_keys(mesh) + job_keys + non_default_keys(accumulation),
        )

    def _stated_mesh(self, dims: ParallelDims) -> dict[str, int] | None:
        return FSDP2Mesh(dims, self.mesh_names, self.tp_name, self.mesh).stated(bool(self.tp))


def checked_mp_policy(mp: Any) -> MixedPrecisionPolicy:
    """``mp_policy`` as FSDP2 takes it (None: torch's default policy), a
    ``MixedPrecisionPolicy`` whose dtypes are ``torch.dtype``s (else
    :class:`~fsdpviz.errors.ConfigError` says what was given)."""
    mp = mp or MixedPrecisionPolicy()
    if not isinstance(mp, MixedPrecisionPolicy):
        raise ConfigError(f"mp_policy must be a MixedPrecisionPolicy, got {type(mp).__name__}")
    check_dtypes(mp, "MixedPrecisionPolicy")
    return mp


def describe_mp_policy(mp: MixedPrecisionPolicy) -> dict[str, str | bool | None]:
    """A ``MixedPrecisionPolicy`` as ``Report.config`` states it: every field, dtypes by name.

    Example::

        describe_mp_policy(MixedPrecisionPolicy(param_dtype=torch.bfloat16))
        # {'param_dtype': 'bfloat16', 'reduce_dtype': None, 'output_dtype': None,
        #  'cast_forward_inputs': True}
    """
    return describe_precision(mp, every=True)


def _check_trace(trace: Any) -> TraceMode:
    if trace not in ("meta", "real"):
        fx = " (trace='fx' traces FSDP1 plans only)" if trace == "fx" else ""
        raise ConfigError(
            f"trace={trace!r} is not valid for FSDP2{fx}; use 'meta' (default) or 'real'"
        )
    return cast(TraceMode, trace)


def check_unshard_in_backward(value: Any) -> bool | dict[str, bool]:
    """``value`` as ``unshard_in_backward=`` takes it: a bool, or ``{module FQN: bool}``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, bool) for k, v in value.items()
    ):
        return dict(value)
    raise ConfigError(
        "unshard_in_backward must be a bool (FSDPModule.set_unshard_in_backward for every "
        "fully_shard call) or a mapping {module FQN: bool} for the calls it names, e.g. "
        f'{{"embed_tokens": False}}; got {value!r}'
    )


def _check_reshard(raf: Any) -> Any:
    """``raf`` as ``reshard_after_forward`` takes it: ``None``, a bool, an int or a dict."""
    if raf is not None and not isinstance(raf, (bool, int, dict)):
        raise ConfigError("reshard_after_forward must be a bool, an int, or {fqn: bool or int}")
    return raf


def mesh_ranks(kwargs: Mapping[str, Any], sizes: Sequence[int]) -> int:
    """The ranks of ``kwargs``' ``mesh=`` (its dimensions' ``sizes``), where a ``world_size``
    given with it agrees."""
    ranks = math.prod(sizes)
    if "world_size" in kwargs and kwargs["world_size"] != ranks:
        raise ConfigError(
            f"world_size={kwargs['world_size']!r} but the mesh has {ranks} "
            f"ranks ({' x '.join(map(str, sizes))}); give one of them"
        )
    return ranks


def offloads(policy: Any) -> bool:
    """Whether ``offload_policy=policy`` offloads to the host (``CPUOffloadPolicy``), checked."""
    if policy is not None and type(policy).__name__ not in ("OffloadPolicy", "CPUOffloadPolicy"):
        raise ConfigError(
            "offload_policy must be torch.distributed.fsdp.CPUOffloadPolicy() or OffloadPolicy(), "
            f"got {type(policy).__name__}"
        )
    return type(policy).__name__ == "CPUOffloadPolicy"


class FSDP2Mesh(NamedTuple):
    """``mesh=`` as FSDP2 reads it (:func:`read_mesh`): the job's ranks by dimension, HSDP's
    replicate and shard dimensions' names (None: one data-parallel dimension), the
    tensor-parallel dimension's name ('' without) and every dimension by name as given (an
    unnamed mesh's as torchtitan names them; None: no ``mesh=``)."""

    parallel_dims: ParallelDims
    hsdp_names: tuple[str, str] | None
    tp_name: str
    named: dict[str, int] | None

    def stated(self, tp: bool) -> dict[str, int] | None:
        """The mesh as ``Report.config`` states it: every dimension as given under tensor
        (``tp``) or context parallelism, HSDP's replicate and shard dimensions (FSDP's
        ``dp_shard_cp``), None for one data-parallel dimension."""
        dims = self.parallel_dims
        if self.named is not None and (tp or dims.cp > 1):
            return dict(self.named)
        if self.hsdp_names is None:
            return None
        return dict(zip(self.hsdp_names, (dims.dp_replicate, dims.dp_shard_cp), strict=True))


def read_mesh(kwargs: Mapping[str, Any], plan: Any) -> FSDP2Mesh:
    """``kwargs``' ``mesh=`` (and ``world_size=``, which must agree with it) as FSDP2 takes
    it with ``parallelize_plan=plan``: one or two data-parallel dimensions (shard, or
    replicate x shard: HSDP), a ``cp`` dimension after them, a tensor-parallel one last where
    a plan is given; no mesh: ``world_size`` ranks in one dimension.

    Example::

        read_mesh({"mesh": ("dp_replicate", 2, "dp_shard", 4)}, None).parallel_dims.hsdp  # True
    """
    mesh = kwargs.get("mesh")
    all_sizes, all_names = parse_mesh(mesh, 4)
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
    dp = sizes or ()  # the data-parallel dimensions: shard, or replicate x shard (HSDP)
    hsdp = len(dp) == 2
    if hsdp and not names:
        names = ("replicate", "shard")
    ws = mesh_ranks(kwargs, all_sizes) if all_sizes is not None else world_size(kwargs)
    dims = ParallelDims(world_size=ws, dp_replicate=dp[0] if hsdp else 1,
                        dp_shard=dp[-1] if dp else ws, cp=cp_size, tp=tp_size,
                        hsdp=hsdp)  # fmt: skip
    return FSDP2Mesh(
        dims,
        (str(names[0]), str(names[1])) if hsdp else None,
        tp_name,
        _named_dims(all_sizes, all_names, plan is not None),
    )


def parse_fsdp2_options(kwargs: dict[str, Any]) -> FSDP2Options:
    check_keywords(kwargs, "FSDP2", "FSDP2 option")
    plan = kwargs.get("parallelize_plan")
    mesh = read_mesh(kwargs, plan)
    hsdp = mesh.parallel_dims.hsdp
    offload = offloads(kwargs.get("offload_policy"))
    mp = checked_mp_policy(kwargs.get("mp_policy"))
    raf = _check_reshard(kwargs.get("reshard_after_forward"))
    rules = torch_rules(kwargs)
    if kwargs.get("ignored_params") is not None and not rules.ignored_params:
        raise FSDPConfigError(
            f"ignored_params: fully_shard of {rules.name} has no ignored_params (torch 2.7 "
            "added it); leave those modules out of fully_shard=, or plan for torch 2.7+"
        )
    trace = _check_trace(kwargs.get("trace", "meta"))
    job = parse_job_options(kwargs, "FSDP2")
    after_backward = _accumulating(kwargs, "reshard_after_backward", job.grad_accum)
    all_reduce = _accumulating(kwargs, "requires_all_reduce", job.grad_accum)
    if not all_reduce and not hsdp:
        raise ConfigError(
            "requires_all_reduce=False skips HSDP's all-reduce across the replicas of a 2-D "
            "mesh; this plan has none (pass mesh=(replicas, shard ranks))"
        )
    return FSDP2Options(
        parallel_dims=mesh.parallel_dims,
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
        mesh_names=mesh.hsdp_names,
        offload=offload,
        parallelize_plan=plan,
        tp_name=mesh.tp_name,
        mesh=mesh.named,
        job=job,
        torch=rules,
        reshard_after_backward=after_backward,
        requires_all_reduce=all_reduce,
        shard_placement_fn=_placement_option(kwargs.get("shard_placement_fn")),
        unshard_in_backward=check_unshard_in_backward(kwargs.get("unshard_in_backward", True)),
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
    value = check_switch(name, kwargs.get(name, True))
    if not value and grad_accum < 2:
        # kept gathered after the last backward too, the next step's forward finds each
        # group unsharded (FSDPParamGroup.unshard returns at once) and computes with the
        # parameters from before the optimizer step, which updated only the shards
        why = (
            "; kept gathered after the last backward too, the next step's forward would "
            "compute with the parameters from before the optimizer step"
            if name == "reshard_after_backward"
            else ""
        )
        raise ConfigError(
            f"{name}=False is what the micro-steps before the last do (FSDP2's "
            f"set_{name}(False), then True for the last one{why}): pass grad_accum=N for "
            "N micro-steps per optimizer step"
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


def parse_mesh(mesh: Any, most: int) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
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
