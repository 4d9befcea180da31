"""FSDP2 (``fully_shard``) parameter groups: one :class:`Group` per ``fully_shard`` call.

``fully_shard=`` lists what the user would call ``fully_shard`` on: module
classes (or their names, as the command line takes them: a string that is no
module's FQN but a class name of the model's modules), module FQNs, a tuple of
FQNs for one grouped call, or a callable ``(name, module) -> bool``. Calls are
applied bottom-up (post-order, as FSDP2 recipes do) and the root last. Each call
manages the parameters of its modules' subtrees that no earlier call manages
(``_get_managed_modules`` / ``_get_managed_states``); each parameter is sharded
on dim 0 and padded so the dim divides the shard world size, or on the dim its call's
``shard_placement_fn`` returns (see :mod:`fsdpviz.plan.fsdp2_shards`). Each group is
given its resharding after forward by the options (:meth:`FSDP2Options.reshard`) and checked
against the mesh here, and its explicit prefetches are read as group indices; the options
themselves are read in :mod:`fsdpviz.plan.fsdp2_options`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from fsdpviz.errors import ConfigError, FSDPConfigError
from fsdpviz.plan.fsdp1 import closest_class, model_classes
from fsdpviz.plan.fsdp2_group import Group, accumulated_grad_dtype
from fsdpviz.plan.fsdp2_options import FSDP2Options
from fsdpviz.plan.fsdp2_shards import (
    check_placements_reshard,
    group_unit,
    placement_fn_of,
    shard_dim,
)
from fsdpviz.plan.job import JobOptions
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.schema.names import group_names, param_names
from fsdpviz.schema.report import dtype_name, unit_label


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
    groups = [
        opts.reshard(
            Group(
                name=claim.name, modules=claim.modules, fqns=claim.fqns, params=list(claim.params)
            )
        )
        for claim in claims
    ]
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
    # each unit named without the wrapper segments, as a recording names it
    for claim, name in zip(out, group_names([c.name.split(", ") for c in out]), strict=True):
        claim.name = name
    return out


def finalize_groups(
    model: nn.Module, groups: list[Group], opts: FSDP2Options, memo: GroupMemo | None = None
) -> None:
    """Name each group's parameters by their first FQN (as its unit lists them: without
    wrapper segments) and compute its sizes."""
    first_fqn, aliases = (
        (memo.first_fqn, memo.aliases) if memo is not None else _parameter_names(model)
    )
    placements = opts.tp.placements(model) if opts.tp is not None else {}
    # a tp group of one rank redistributes a partial gradient with no collective
    tp = opts.tp if opts.tp is not None and opts.tp.size > 1 else None
    partial = tp.partial_grads(model) if tp is not None else set()
    compute = opts.mp_policy.param_dtype
    _check_named_calls(opts.unshard_in_backward, groups, "unshard_in_backward")
    shown = param_names([*first_fqn.values(), *(a for ps in aliases.values() for a in ps)])
    for group in groups:
        group.unshard_in_backward = opts.unshards_in_backward(group)
        group.param_paths = [first_fqn[p] for p in group.params]
        group.param_fqns = [shown[f] for f in group.param_paths]
        trainable = {p.dtype for p in group.params if p.requires_grad}
        if len(trainable) > 1:
            raise FSDPConfigError(
                f"fully_shard group {unit_label(group.name)}: FSDP expects uniform original "
                f"parameter dtype but got {sorted(str(d) for d in trainable)} (FSDP2 raises "
                "this at the first forward); shard the modules of each dtype separately"
            )
        group.shared_paths = {k: v for p in group.params for k, v in aliases.get(p, {}).items()}
        shared = {shown[k]: shown[v] for k, v in group.shared_paths.items()}
        group.schema = group_unit(group, opts, shared, placements)
        # the gradient of the unsharded parameter, in its dtype (the compute dtype), as
        # FSDPParam.unsharded_grad_data redistributes it
        group.tp_partial_grads = [
            (f, p.numel() * (compute or p.dtype).itemsize, dtype_name(compute or p.dtype))
            for f, p in zip(group.param_fqns, group.params, strict=True)
            if p in partial and p.requires_grad
        ]
        group.tp_accumulated_dtype = accumulated_grad_dtype(
            group.schema.compute_dtype, group.schema.reduce_dtype
        )


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


def check_reshard_ints(
    groups: list[Group],
    world_size: int,
    tp_groups: Iterable[str] | None = None,
    float8_groups: Iterable[str] = (),
) -> None:
    """Raise as FSDP2 does for a group resharded after forward to a number of ranks that does
    not divide the ranks (:meth:`Group.check_reshard_ranks`), or that reshards a group holding
    tensor-parallel (DTensor) parameters to a smaller mesh, or one whose weights it gathers in
    float8. ``tp_groups``: the names of the groups that hold DTensor parameters (default:
    those whose unit has ``tp_placements``); ``float8_groups``: those holding weights FSDP2
    all-gathers in float8 (:func:`float8_gathered_groups`)."""
    for g in groups:
        g.check_reshard_ranks(world_size)
    check_placements_reshard(groups, world_size)
    placed = (
        set(tp_groups)
        if tp_groups is not None
        else {g.name for g in groups if g.schema is not None and g.schema.tp_placements}
    )
    in_float8 = set(float8_groups)
    for g in groups:
        if g.post_forward_ranks(world_size) is None:
            continue
        if g.name in placed:
            raise FSDPConfigError(
                f"{g.reshard_text()}, whose parameters are tensor-parallel DTensors: FSDP2 "
                "cannot reshard them to a smaller mesh after forward (NotImplementedError in "
                "FSDPParam.to_sharded_post_forward, at its first forward); use "
                f"{RESHARD.code(True)} or False for it"
            )
        if g.name in in_float8:
            raise FSDPConfigError(
                f"{g.reshard_text()}, whose float8 weights FSDP2 all-gathers in float8 "
                "(torchao's enable_fsdp_float8_all_gather): FSDP2 cannot all-gather them again "
                "from the smaller mesh it reshards them to after forward (NotImplementedError "
                "in FSDPParam.all_gather_inputs, at the backward's all-gather); use "
                f"{RESHARD.code(True)} or False for it, or gather them in bf16"
            )


def check_groups(model: nn.Module, groups: list[Group], opts: FSDP2Options) -> None:
    """:func:`check_reshard_ints` for ``opts``' groups of ``model``, those it all-gathers in
    float8 found (:func:`float8_gathered_groups`)."""
    f8 = float8_gathered_groups(model, groups, opts.job)
    check_reshard_ints(groups, opts.parallel_dims.dp_shard_cp, float8_groups=f8)


def float8_gathered_groups(model: nn.Module, groups: list[Group], job: JobOptions) -> list[str]:
    """The groups holding weights FSDP2 all-gathers in float8 (``job``'s float8 with
    ``enable_fsdp_float8_all_gather``: torchao's ``WeightWithDynamicFloat8CastTensor``)."""
    spec = job.float8
    if spec is None or not spec.enable_fsdp_float8_all_gather:
        return []
    weights = {id(m.weight) for m in job.float8_modules(model)}
    return [g.name for g in groups if any(id(p) in weights for p in g.params)]


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
    _check_named_calls(value, groups, "shard_placement_fn")
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


def _check_named_calls(value: Any, groups: list[Group], name: str) -> None:
    """Raise where option ``name``'s mapping (if ``value`` is one) names a module that is
    not one ``fully_shard`` is applied to."""
    if not isinstance(value, Mapping):
        return
    known = {k for g in groups for k in (g.name, *g.fqns)}
    unknown = [k for k in value if k not in known]
    if unknown:
        listed = ", ".join(repr(g.name) for g in groups[:6])
        raise ConfigError(
            f"{name}: {unknown[0]!r} is not a module fully_shard is applied to "
            f"(the calls: {listed}{', ...' if len(groups) > 6 else ''}); key the mapping by "
            "those modules' FQNs"
        )
