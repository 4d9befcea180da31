"""Which modules FSDP1 wraps and what each unit's FlatParameter holds.

The wrap targets come from FSDP's own ``_auto_wrap`` (the same policy code,
post-order traversal and mixed-precision overrides), run on fsdpviz's meta
copy of the model with a wrapper that only records. Unit construction then
follows ``FlatParamHandle``: post-order claiming, first-FQN naming of shared
parameters, alignment padding for ``use_orig_params=True`` and padding to a
multiple of the shard world size.
"""

from __future__ import annotations

import difflib
import functools
import math
import types
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp._init_utils import _init_ignored_module_states
from torch.distributed.fsdp._wrap_utils import _auto_wrap
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

from fsdpviz.errors import FSDPConfigError
from fsdpviz.plan.fsdp1_options import (
    FSDP1Options,
    effective_backward_prefetch,
    effective_strategy,
    offloaded_low_precision_grads,
)
from fsdpviz.schema.report import FsdpWarning, Unit, dtype_name, unit_label

_SHARDED = {
    ShardingStrategy.FULL_SHARD,
    ShardingStrategy.SHARD_GRAD_OP,
    ShardingStrategy.HYBRID_SHARD,
    ShardingStrategy._HYBRID_SHARD_ZERO2,
}
RESHARD_AFTER_FORWARD = {ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD}
NO_RESHARD_AFTER_FORWARD = {ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy._HYBRID_SHARD_ZERO2}
ALIGNMENT_BYTES = 16  # torch.distributed.fsdp._flat_param._get_aligned_numel


@dataclass
class UnitConfig:
    """The FSDP arguments one unit was built with (policies may override per unit)."""

    sharding_strategy: ShardingStrategy
    mixed_precision: MixedPrecision | None
    backward_prefetch: BackwardPrefetch | None
    forward_prefetch: bool
    # Hybrid sharding: the shard groups whose gradient shards are all-reduced (else 1).
    replicas: int = 1
    # CPUOffload(offload_params=True): the shard is copied from host memory before each
    # all-gather, the sharded gradient to host memory after its reduction.
    offload_params: bool = False


@dataclass
class PlannedUnit:
    """A unit on fsdpviz's meta copy: the module and its FlatParameter layout."""

    fqn: str
    module: nn.Module
    config: UnitConfig
    # (owning submodule, attribute name, FQN) of each flattened parameter, in order.
    param_infos: list[tuple[nn.Module, str, str]] = field(default_factory=list)
    params: list[nn.Parameter] = field(default_factory=list)
    # (submodule, attribute name, FQN, FQN of the primary) for shared references.
    shared_infos: list[tuple[nn.Module, str, str, str]] = field(default_factory=list)
    # Split sizes of the flat parameter, padding included, and which are padding.
    split_numels: list[int] = field(default_factory=list)
    is_padding: list[bool] = field(default_factory=list)
    shapes: list[torch.Size] = field(default_factory=list)
    requires_grad: bool = False
    dtype: torch.dtype | None = None
    schema: Unit | None = None

    @property
    def has_params(self) -> bool:
        return bool(self.param_infos)

    @property
    def uses_sharded_strategy(self) -> bool:
        return self.config.sharding_strategy in _SHARDED


@dataclass(frozen=True)
class FlatLayout:
    """How a FlatParameter lays out its parameters: their numels in order, with padding."""

    split_numels: list[int]  # parameters and padding, in order
    is_padding: list[bool]
    shard_world_size: int

    @property
    def numel(self) -> int:
        """Elements of the parameters (no padding)."""
        return sum(n for n, pad in zip(self.split_numels, self.is_padding, strict=True) if not pad)

    @property
    def flat_numel(self) -> int:
        """Elements of the FlatParameter, padding included."""
        return sum(self.split_numels)

    @property
    def sharded_numel(self) -> int:
        """Elements each rank holds."""
        return math.ceil(self.flat_numel / self.shard_world_size)

    @property
    def padded_numel(self) -> int:
        """Elements of the all-gathered FlatParameter (a multiple of the shard world size)."""
        return self.sharded_numel * self.shard_world_size

    def trainable(self, trains: Sequence[bool]) -> tuple[int, int]:
        """Elements of the parameters flagged in ``trains`` (one flag per parameter, in
        order): in all, and the most of them one rank's shard holds. With
        ``use_orig_params=True`` each parameter is a view of its part of the rank's shard,
        and the optimizer keeps state for the parts of those that train."""
        held = [sum(parts.values()) for parts in self.shard_parts(trains)]
        return sum(held), max(held, default=0)

    def shard_parts(self, trains: Sequence[bool]) -> list[dict[int, int]]:
        """For each rank, the elements of its shard that each parameter flagged in
        ``trains`` holds, by the parameter's index (those with none left out)."""
        spans: list[tuple[int, int, int]] = []  # (parameter index, start, end)
        start, index = 0, 0
        for n, pad in zip(self.split_numels, self.is_padding, strict=True):
            if not pad:
                if trains[index]:
                    spans.append((index, start, start + n))
                index += 1
            start += n
        size = self.sharded_numel
        return [
            {i: part for i, a, b in spans if (part := min(b, lo + size) - max(a, lo)) > 0}
            for lo in range(0, size * self.shard_world_size, size)
        ]


def flat_param_layout(
    numels: list[int],
    itemsize: int,
    *,
    use_orig_params: bool,
    shard_world_size: int,
    pad_to: int | None = None,
) -> FlatLayout:
    """The layout ``FlatParamHandle`` gives parameters of ``numels`` elements.

    With ``use_orig_params=True`` each parameter starts at a multiple of
    :data:`ALIGNMENT_BYTES` (of the compute dtype, ``itemsize`` bytes per element)
    and the whole is padded to a multiple of ``pad_to``, the size of FSDP's process group
    (default ``shard_world_size``; under ``NO_SHARD`` too, which shards over one rank);
    otherwise the parameters are packed and only the shard is rounded up.
    """
    align = ALIGNMENT_BYTES // itemsize if use_orig_params else 0
    split: list[int] = []
    padding: list[bool] = []
    total = 0

    def add(n: int, pad: bool) -> None:
        nonlocal total
        if n or not pad:
            split.append(n)
            padding.append(pad)
            total += n

    for n in numels:
        if align:
            add(-total % align, True)
        add(n, False)
    if align:
        add(-total % (pad_to or shard_world_size), True)
    return FlatLayout(split, padding, shard_world_size)


@dataclass
class Plan:
    units: list[PlannedUnit]  # FSDP's handle order (depth-first, root first)
    warnings: list[FsdpWarning]
    ignored_params: set[nn.Parameter]


@dataclass
class WrapMemo:
    """What :func:`plan_fsdp1` works out from the model alone, kept across the plans of one
    model copy whose structure does not change (fsdpviz.replan's stored traces): the
    modules' names, and the wrap targets and FSDP's messages of each auto-wrap policy that
    :func:`policy_key` can name. Plans with ignored states or mixed precision do not use it
    (both change what FSDP's auto-wrap does)."""

    named: list[tuple[str, nn.Module]] = field(default_factory=list)  # named_modules()
    names: dict[nn.Module, str] = field(default_factory=dict)
    targets: dict[Any, tuple[list[nn.Module], list[str]]] = field(default_factory=dict)
    # a module -> named_modules(remove_duplicate=False) of it
    subtrees: dict[nn.Module, list[tuple[str, nn.Module]]] = field(default_factory=dict)
    # (policy key, use_orig_params) -> what each unit takes, in the order they are built
    claims: dict[Any, list[_Claim]] = field(default_factory=dict)

    @classmethod
    def of(cls, root: nn.Module) -> WrapMemo:
        named = list(root.named_modules())
        return cls(named=named, names={m: n for n, m in named})

    def subtree(self, module: nn.Module) -> list[tuple[str, nn.Module]]:
        found = self.subtrees.get(module)
        if found is None:
            found = self.subtrees[module] = list(module.named_modules(remove_duplicate=False))
        return found


def _parameters(subtree: list[tuple[str, nn.Module]], skip: set[int]) -> list[nn.Parameter]:
    """``module.parameters()`` of the module whose subtree this is, as registered now,
    less the parameters whose ``id`` is in ``skip``."""
    seen: set[int] = set()
    out: list[nn.Parameter] = []
    for _, m in subtree:
        if id(m) in seen:
            continue  # named_modules() would not enter a module twice
        seen.add(id(m))
        for p in m._parameters.values():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                if id(p) not in skip:
                    out.append(p)
    return out


def policy_key(policy: Any) -> Any:
    """A hashable stand-in for an auto-wrap policy whose targets are FSDP's root arguments
    with nothing per module (``ModuleWrapPolicy``, ``transformer_auto_wrap_policy`` and
    ``size_based_auto_wrap_policy`` with their usual arguments, or none), else ``None``: two
    policies with one key wrap the same modules of one model."""
    if policy is None:
        return ("root only",)
    if type(policy) is ModuleWrapPolicy:
        return ("classes", frozenset(policy._module_classes))
    if type(policy) is not functools.partial or policy.args:
        return None
    kw = policy.keywords
    if policy.func is transformer_auto_wrap_policy and set(kw) == {"transformer_layer_cls"}:
        return ("classes", frozenset(kw["transformer_layer_cls"]))
    if policy.func is size_based_auto_wrap_policy and set(kw) <= {"min_num_params"}:
        return ("size", kw.get("min_num_params"))
    return None


def _recorded_targets(
    root: nn.Module, opts: FSDP1Options, ignored_modules: set[nn.Module], ignored_params: set[Any]
) -> tuple[list[tuple[nn.Module, dict[str, Any]]], list[str]]:
    """Run FSDP's own auto-wrap with a wrapper that records instead of wrapping."""
    targets: list[tuple[nn.Module, dict[str, Any]]] = []

    def record(module: nn.Module, **kwargs: Any) -> nn.Module:
        targets.append((module, kwargs))
        return module

    root_kwargs: dict[str, Any] = {
        "process_group": None,
        "sharding_strategy": opts.sharding_strategy,
        "cpu_offload": None,
        "backward_prefetch": opts.backward_prefetch,
        "mixed_precision": opts.mixed_precision,
        "param_init_fn": None,
        "device_id": None,
        "sync_module_states": False,
        "forward_prefetch": opts.forward_prefetch,
        "limit_all_gathers": opts.limit_all_gathers,
        "use_orig_params": opts.use_orig_params,
        "ignored_states": ignored_params,
        "device_mesh": None,
    }
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _auto_wrap(
                root, opts.auto_wrap_policy, ignored_modules, ignored_params, root_kwargs, record
            )
        except (ValueError, AssertionError, TypeError) as e:
            raise FSDPConfigError(f"FSDP would reject this auto_wrap_policy: {e}") from e
    messages.extend(str(w.message) for w in caught)
    return targets, messages


def _unit_config(
    kwargs: dict[str, Any], opts: FSDP1Options, found: list[FsdpWarning]
) -> UnitConfig:
    """The options one FSDP instance runs with: the root's, or a ``CustomPolicy``'s own,
    taken as FSDP takes them (a string strategy or prefetch, one-rank process groups)."""
    strategy = opts.sharding_strategy
    if kwargs.get("sharding_strategy") not in (None, strategy):
        strategy, warned = effective_strategy(
            kwargs["sharding_strategy"], opts.process_group_size, "CustomPolicy sharding_strategy"
        )
        found.extend(warned)
    prefetch = opts.backward_prefetch
    if kwargs.get("backward_prefetch", prefetch) != prefetch:
        prefetch, warned = effective_backward_prefetch(
            kwargs["backward_prefetch"], "CustomPolicy backward_prefetch"
        )
        found.extend(warned)
    return UnitConfig(
        sharding_strategy=strategy,
        mixed_precision=kwargs.get("mixed_precision", opts.mixed_precision),
        backward_prefetch=prefetch,
        forward_prefetch=bool(kwargs.get("forward_prefetch", opts.forward_prefetch)),
        replicas=opts.parallel_dims(strategy).dp_replicate,
        offload_params=opts.offload_params,
    )


def _named_params_with_duplicates(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in module._parameters.items() if p is not None]


@dataclass
class _Claim:
    """What one unit takes of the model: the same for every plan with one wrap policy
    (and ``use_orig_params``), whatever the sharding, world size or prefetch."""

    param_infos: list[tuple[nn.Module, str, str]] = field(default_factory=list)
    params: list[nn.Parameter] = field(default_factory=list)
    shared_infos: list[tuple[nn.Module, str, str, str]] = field(default_factory=list)
    shapes: list[torch.Size] = field(default_factory=list)
    requires_grad: bool = False
    mixed_grads: bool = False  # frozen and trainable parameters
    dtype: torch.dtype | None = None


def _claim(
    fqn: str,
    module: nn.Module,
    claimable: list[nn.Parameter],
    opts: FSDP1Options,
    subtree: list[tuple[str, nn.Module]],
) -> _Claim:
    claim = _Claim()
    if not claimable:
        return claim
    params_set = {id(p) for p in claimable}
    scalar = next((p for p in claimable if p.dim() == 0), None)
    if scalar is not None:
        # _init_utils._verify_managed_params, before the FlatParameter is built
        name = next(n for n, p in module.named_parameters() if p is scalar)
        raise FSDPConfigError(
            f"unit {unit_label(fqn)}: FSDP doesn't support scalar parameters. Change {name} "
            "to a 1D tensor with numel equal to 1. (FSDP raises this when it wraps the module; "
            "a parameter in ignored_states is not checked.)"
        )
    dtypes = {p.dtype for p in claimable}
    if len(dtypes) > 1:
        a, b = sorted(str(d) for d in dtypes)[:2]
        raise FSDPConfigError(
            f"unit {unit_label(fqn)}: Must flatten tensors with uniform dtype but got {a} "
            f"and {b} (FSDP raises this). Wrap the modules of each dtype as separate units."
        )
    dtype = claimable[0].dtype
    if not dtype.is_floating_point:
        raise FSDPConfigError(f"unit {unit_label(fqn)}: Cannot flatten integer dtype tensors")
    grads = {p.requires_grad for p in claimable}
    if len(grads) > 1 and not opts.use_orig_params:
        raise FSDPConfigError(
            f"unit {unit_label(fqn)}: Must flatten tensors with uniform `requires_grad` when "
            "`use_orig_params=False` (FSDP raises this). Wrap the frozen parameters as their own "
            "unit, or pass use_orig_params=True."
        )
    memo: dict[int, str] = {}
    for sub_name, sub in subtree:
        for name, p in _named_params_with_duplicates(sub):
            if id(p) not in params_set:
                continue
            full = _join(fqn, _join(sub_name, name))
            if id(p) in memo:
                claim.shared_infos.append((sub, name, full, memo[id(p)]))
                continue
            memo[id(p)] = full
            claim.param_infos.append((sub, name, full))
            claim.params.append(p)
            claim.shapes.append(p.shape)
    claim.requires_grad, claim.mixed_grads, claim.dtype = any(grads), len(grads) > 1, dtype
    return claim


def _build_unit(
    fqn: str, module: nn.Module, config: UnitConfig, claim: _Claim, opts: FSDP1Options
) -> PlannedUnit:
    unit = PlannedUnit(
        fqn=fqn,
        module=module,
        config=config,
        param_infos=list(claim.param_infos),
        params=list(claim.params),
        shared_infos=list(claim.shared_infos),
        shapes=list(claim.shapes),
    )
    dtype = claim.dtype
    if dtype is None:
        return unit
    itemsize = dtype.itemsize
    # FlatParamHandle aligns to the forward/backward dtype (mixed precision's).
    fwd_dtype = (config.mixed_precision.param_dtype if config.mixed_precision else None) or dtype
    layout = flat_param_layout(
        [p.numel() for p in unit.params],
        fwd_dtype.itemsize,
        use_orig_params=opts.use_orig_params,
        shard_world_size=opts.shard_world_size if unit.uses_sharded_strategy else 1,
        pad_to=opts.process_group_size,
    )
    unit.split_numels, unit.is_padding = layout.split_numels, layout.is_padding
    unit.requires_grad = claim.requires_grad
    unit.dtype = dtype
    mp = config.mixed_precision
    compute = (mp.param_dtype if mp else None) or dtype
    reduce = (mp.reduce_dtype if mp else None) or compute
    unit.schema = Unit(
        module=fqn,
        module_class=opts.job.class_name(module, fqn),
        params=[info[2] for info in unit.param_infos],
        shared_params={info[2]: info[3] for info in unit.shared_infos},
        numel=layout.numel,
        flat_numel=layout.flat_numel,
        padded_numel=layout.padded_numel,
        sharded_numel=layout.sharded_numel,
        dtype=dtype_name(dtype),
        compute_dtype=dtype_name(compute),
        reduce_dtype=dtype_name(reduce),
        requires_grad=None if claim.mixed_grads else unit.requires_grad,
        sharding_strategy=config.sharding_strategy.name,
        itemsize=itemsize,
    )
    trains = [p.requires_grad for p in unit.params]
    fields = optimizer_fields(unit.schema.params, trains, layout, opts.use_orig_params)
    unit.schema = replace(unit.schema, **fields)
    return unit


def optimizer_fields(
    fqns: Sequence[str], trains: Sequence[bool], layout: FlatLayout, use_orig_params: bool
) -> dict[str, Any]:
    """``Unit``'s trainable fields (:func:`trainable_fields`) where the optimizer does not
    step the whole shard of the FlatParameter: where it mixes frozen and trainable
    parameters, and with ``use_orig_params=True`` (the optimizer steps the original
    parameters, views of their parts of the shard: the padding has no state). Empty
    otherwise, and for a unit that does not train (``Unit.requires_grad`` says so)."""
    if not any(trains) or (all(trains) and not use_orig_params):
        return {}
    return trainable_fields(fqns, trains, layout)


def trainable_fields(
    fqns: Sequence[str], trains: Sequence[bool], layout: FlatLayout
) -> dict[str, Any]:
    """``Unit``'s fields for a FlatParameter of frozen and trainable parameters
    (``use_orig_params=True``, one flag per parameter in ``trains``): the frozen ones, and
    the trainable elements in all and in one rank's shard (:meth:`FlatLayout.trainable`)."""
    total, most = layout.trainable(trains)
    return {
        "frozen_params": [f for f, t in zip(fqns, trains, strict=True) if not t],
        "trainable_numel": total,
        "trainable_sharded_numel": most,
    }


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


def plan_fsdp1(
    root: nn.Module,
    opts: FSDP1Options,
    ignored_modules: Any,
    ignored_states: Any,
    memo: WrapMemo | None = None,
) -> Plan:
    """Build the units FSDP1 would build for ``root`` (fsdpviz's own copy; it is modified).

    ``ignored_modules`` / ``ignored_states`` must already refer to modules and
    parameters of ``root``. ``memo`` (made by :meth:`WrapMemo.of` for this ``root``) keeps
    what does not depend on ``opts`` for the next plan of the same copy.
    """
    if memo is not None and (
        ignored_modules is not None or ignored_states is not None or opts.mixed_precision
    ):
        memo = None  # both change which modules FSDP wraps and which parameters it takes
    if memo is not None:
        return _plan(root, opts, set(), set(), memo)

    try:
        state = _init_ignored_module_states(
            types.SimpleNamespace(),
            root,
            ignored_modules,
            ignored_states,
        )
    except ValueError as e:
        raise FSDPConfigError(str(e)) from e
    return _plan(root, opts, state._ignored_modules, state._ignored_params, WrapMemo.of(root))


def _plan(
    root: nn.Module,
    opts: FSDP1Options,
    ignored_mods: set[nn.Module],
    ignored_params: set[nn.Parameter],
    memo: WrapMemo,
) -> Plan:
    fsdp_warnings: list[FsdpWarning] = list(opts.warnings)
    targets: list[tuple[nn.Module, dict[str, Any]]] = []
    key = policy_key(opts.auto_wrap_policy)  # None for a policy it cannot name
    key = None if key is None else (key, opts.use_orig_params)
    if opts.auto_wrap_policy is not None:
        if key in memo.targets:  # the same modules; their arguments are the root's
            modules, messages = memo.targets[key]
            targets = [(m, {}) for m in modules]
        else:
            targets, messages = _recorded_targets(root, opts, ignored_mods, ignored_params)
            if key is not None:
                memo.targets[key] = ([m for m, _ in targets], messages)
        for msg in messages:
            code = "frozen_mixed" if "requires_grad=True and False" in msg else "fsdp"
            if "mixed precision disabled" in msg:
                code = "mixed_precision_override"
            fsdp_warnings.append(FsdpWarning(code=code, message=msg))
    fsdp_warnings.extend(missing_class_warnings(root, opts.auto_wrap_policy))
    fsdp_warnings.extend(offloaded_low_precision_grads(root, opts, ignored_params))
    names = memo.names
    skip = {id(p) for p in ignored_params}  # and, once flattened, a unit's parameters
    by_module: dict[nn.Module, PlannedUnit] = {}
    claims = memo.claims.get(key) if key is not None else None
    made: list[_Claim] = []
    for k, (module, kwargs) in enumerate([*targets, (root, {})]):
        fqn = names.get(module, "")
        if claims is not None:
            claim = claims[k]
        else:
            subtree = memo.subtree(module)
            claimable = _parameters(subtree, skip)
            claim = _claim(fqn, module, claimable, opts, subtree)
            if opts.use_orig_params:  # the originals stay registered but are marked flattened
                skip.update(id(p) for p in claimable)
        made.append(claim)
        config = _unit_config(kwargs, opts, fsdp_warnings)
        unit = _build_unit(fqn, module, config, claim, opts)
        by_module[module] = unit
        if not opts.use_orig_params:
            # FSDP1 replaces the originals by views of its FlatParameter, so an
            # enclosing unit no longer sees them unless another module shares them.
            for sub, name, _ in unit.param_infos:
                del sub._parameters[name]
            for sub, name, _, _ in unit.shared_infos:
                del sub._parameters[name]
    if key is not None:
        memo.claims[key] = made
    ordered = [by_module[m] for _, m in memo.named if m in by_module]
    unique = list({(w.code, w.message): w for w in fsdp_warnings}.values())
    return Plan(units=ordered, warnings=unique, ignored_params=ignored_params)


def policy_classes(policy: Any) -> tuple[str, list[type[nn.Module]]]:
    """The module classes an auto-wrap policy names, and how the user spelled the policy:
    ``ModuleWrapPolicy({A})`` or ``partial(transformer_auto_wrap_policy,
    transformer_layer_cls={A})``; other policies name no class."""
    if isinstance(policy, ModuleWrapPolicy):
        return "ModuleWrapPolicy", list(policy._module_classes)
    if isinstance(policy, functools.partial) and policy.func is transformer_auto_wrap_policy:
        layers = policy.keywords.get("transformer_layer_cls", ())
        return "transformer_auto_wrap_policy", list(layers)
    return "", []


def model_classes(root: nn.Module, limit: int = 6) -> str:
    """The classes of the root's submodules with parameters: containers before leaves,
    repeated ones first, the bigger of equals first (the likely blocks), as in
    ``'Qwen2DecoderLayer (x24), Qwen2MLP (x24), ...'``."""
    counts: dict[str, int] = {}
    leaf: dict[str, bool] = {}
    size: dict[str, int] = {}
    for m in root.modules():
        numel = sum(p.numel() for p in m.parameters())
        if m is not root and numel and not isinstance(m, (nn.ModuleList, nn.ModuleDict)):
            name = type(m).__name__
            counts[name] = counts.get(name, 0) + 1
            leaf[name] = not any(True for _ in m.children())
            size[name] = max(size.get(name, 0), numel)
    order = sorted(counts, key=lambda n: (leaf[n], -counts[n], -size[n], n))
    ranked = [(n, counts[n]) for n in order[:limit]]
    return ", ".join(f"{name} (x{n})" if n > 1 else name for name, n in ranked)


def closest_class(root: nn.Module, name: str) -> str | None:
    """The class of the model's modules a mistyped or guessed class name most likely means:
    a near spelling (``LlamaDecoderLayr``); for a name of a block or layer, the model's
    repeated block (``Qwen2Block`` -> ``Qwen2DecoderLayer``, not ``Qwen2Model``); else the
    closest name, else the likeliest block."""
    every = sorted({type(m).__name__ for m in root.modules()})
    typo = difflib.get_close_matches(name, every, n=1, cutoff=0.85)
    if typo:
        return typo[0]
    blocks = [c.split(" (x")[0] for c in model_classes(root, limit=len(every)).split(", ")]
    blocks = [c for c in blocks if c]
    counts = {c: sum(1 for m in root.modules() if type(m).__name__ == c) for c in blocks}
    repeated = [c for c in blocks if counts[c] > 1]
    if repeated and name.lower().rstrip("s").endswith(("block", "layer")):
        return repeated[0]  # what the name asks for: the model's repeated block
    near = difflib.get_close_matches(name, every, n=1)
    if near:
        return near[0]
    return repeated[0] if repeated else None


def missing_class_warnings(root: nn.Module, policy: Any) -> list[FsdpWarning]:
    """A warning when no module of the model is an instance of any class the policy names:
    FSDP1 then wraps nothing but the root, silently. It names the classes the model has.
    (A policy may name classes some models lack, as ``_no_split_modules`` lists do.)"""
    spelled, classes = policy_classes(policy)
    if not classes or any(isinstance(m, tuple(classes)) for m in root.modules()):
        return []
    names = ", ".join(sorted(c.__name__ for c in classes))
    return [
        FsdpWarning(
            code="wrap_class_missing",
            message=f"{spelled} names {names}, but no module of {type(root).__name__} is an "
            "instance (FSDP1 does not check): the root is the only unit. The model's classes "
            f"with parameters: {model_classes(root)}",
        )
    ]
