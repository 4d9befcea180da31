"""FSDP1 keyword arguments, accepted as ``FullyShardedDataParallel(...)`` takes them."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Unpack, cast

import torch
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
)

from fsdpviz.errors import ConfigError, FSDPConfigError
from fsdpviz.plan.job import JobOptions, parse_job_options
from fsdpviz.plan.option_specs import OptionSpec
from fsdpviz.plan.options import (
    DEFAULT_WORLD_SIZE,
    KEYWORDS,
    check_dtypes,
    check_keywords,
    check_switch,
    check_world_size,
    describe_precision,
    torch_rules,
    world_size,
)
from fsdpviz.plan.torch_fsdp import TorchFSDP, installed, torch_fsdp
from fsdpviz.schema.config import (
    FSDP1_KEYS,
    TRACE_MODES,
    ReportConfig,
    TraceMode,
    non_default_keys,
)
from fsdpviz.schema.keywords import PlanKwargs
from fsdpviz.schema.mesh import ParallelDims
from fsdpviz.schema.report import FsdpWarning, dtype_name

FSDP1_KEYWORDS = KEYWORDS["FSDP1"]
"""Every keyword ``analyze`` takes for FSDP1 (``FullyShardedDataParallel``'s and fsdpviz's)."""
_HYBRID = {ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2}


@dataclass(frozen=True, kw_only=True)
class FSDP1Options:
    """FSDP1's options as ``FullyShardedDataParallel(...)`` takes them, checked and read once
    (:func:`parse_fsdp1_options`), with fsdpviz's own. Frozen: a change is
    :meth:`replace`, which checks the changed options again.

    Attributes:
        world_size: ranks of the job (``world_size=``; default 8).
        sharding_strategy: the strategy FSDP runs with (``NO_SHARD`` where FSDP switched a
            process group of one rank to it; see ``requested_strategy``).
        auto_wrap_policy: the wrap policy as given (checked by :func:`check_policy`).
        backward_prefetch: ``BackwardPrefetch`` FSDP runs with (``None`` for a string,
            which FSDP1 never matches).
        forward_prefetch, use_orig_params, limit_all_gathers: as FSDP1 takes them.
        mixed_precision: ``MixedPrecision`` or ``None``.
        ignored_modules, ignored_states: as given (mapped onto the traced copy later).
        offload_params: ``CPUOffload(offload_params=True)``: shards live in host memory.
        shard_group_size: ranks of a shard group under hybrid sharding (else ``None``).
        loss: the callable from the model's output to a scalar the trace backpropagates.
        trace: ``"meta"``, ``"real"`` or ``"fx"``.
        progress: show a progress bar (``None``: when the trace is slow).
        profile: measure activations and FLOPs while tracing (``report.profile``).
        activation_checkpointing: module classes or a predicate run under non-reentrant
            checkpointing (``trace/checkpointing.py``).
        hybrid: ``HYBRID_SHARD`` / ``_HYBRID_SHARD_ZERO2`` was asked for: FSDP's process
            group is the shard group even where a shard group of one rank made FSDP switch
            the strategy to ``NO_SHARD``.
        requested_strategy: the strategy asked for, where FSDP switched it to ``NO_SHARD``
            on a one-rank process group.
        warnings: what FSDP would warn about the options themselves (strings, the switch
            to ``NO_SHARD``).
        job: the job around FSDP: gradient accumulation, torch.compile, float8, TF32
            (``plan/job.py``).
        torch: whose FSDP (``torch_version=``; default the installed torch's). FSDP1's
            runtime did not change from torch 2.6 to 2.14 in what fsdpviz models: only the
            config states it.
    """

    world_size: int = DEFAULT_WORLD_SIZE
    sharding_strategy: ShardingStrategy = ShardingStrategy.FULL_SHARD
    auto_wrap_policy: Any = None
    backward_prefetch: BackwardPrefetch | None = BackwardPrefetch.BACKWARD_PRE
    forward_prefetch: bool = False
    use_orig_params: bool = False
    mixed_precision: MixedPrecision | None = None
    ignored_modules: Iterable[nn.Module] | None = None
    ignored_states: Iterable[Any] | None = None
    limit_all_gathers: bool = True
    offload_params: bool = False
    shard_group_size: int | None = None
    loss: Callable[[Any], torch.Tensor] | None = None
    trace: TraceMode = "meta"
    progress: bool | None = None
    profile: bool = True
    activation_checkpointing: Any = None
    hybrid: bool = False
    requested_strategy: ShardingStrategy | None = None
    warnings: tuple[FsdpWarning, ...] = ()
    job: JobOptions = field(default_factory=JobOptions)
    torch: TorchFSDP = field(default_factory=installed)

    def __post_init__(self) -> None:
        check_world_size(self.world_size)
        for name in (*_SWITCHES, "profile"):
            check_switch(name, getattr(self, name))
        _check_trace(self.trace)
        _check_shard_group(self.shard_group_size, self.hybrid, self.world_size)

    def replace(self, **changes: Any) -> FSDP1Options:
        """A copy with ``changes`` (fields by name), checked as a new one is. The strategy
        FSDP runs with is not derived again: to re-plan a report under another world size,
        sharding or backward prefetch, use :meth:`from_config`.

        Example::

            opts.replace(forward_prefetch=True)
        """
        return dataclasses.replace(self, **changes)

    @property
    def keep_low_precision_grads(self) -> bool:
        """``MixedPrecision(keep_low_precision_grads=True)``: gradients stay in the
        parameters' low precision after the reduce-scatter."""
        mp = self.mixed_precision
        return mp is not None and bool(mp.keep_low_precision_grads)

    @property
    def shard_world_size(self) -> int:
        """Ranks one FlatParameter is sharded over."""
        return self.parallel_dims(self.sharding_strategy).dp_shard

    @property
    def process_group_size(self) -> int:
        """Ranks of FSDP's process group (``state.world_size``): the shard group when hybrid."""
        return _group_size(self.world_size, self.hybrid, self.shard_group_size)

    @property
    def replicas(self) -> int:
        """Shard groups whose gradients hybrid sharding all-reduces (1 when not hybrid)."""
        return self.parallel_dims(self.sharding_strategy).dp_replicate

    def parallel_dims(self, strategy: ShardingStrategy) -> ParallelDims:
        """The shard ranks and replicas of a unit under ``strategy`` (the options' own, or
        one a ``CustomPolicy`` gives a unit), on FSDP's process group: see
        :meth:`ParallelDims.fsdp1 <fsdpviz.schema.mesh.ParallelDims.fsdp1>`."""
        return ParallelDims.fsdp1(self.world_size, self.process_group_size, strategy.name)

    def describe(self) -> ReportConfig:
        """These options as ``Report.config`` states them."""
        job, job_keys = self.job.config()
        switched: dict[str, Any] = {  # stated where set
            "process_group_size": self.process_group_size if self.hybrid else None,
            "sharding_strategy_given": getattr(self.requested_strategy, "name", None),
            "cpu_offload": self.offload_params,
        }
        return ReportConfig(
            api="FSDP1",
            torch_version=self.torch.version,
            world_size=self.world_size,
            shard_world_size=self.shard_world_size,
            sharding_strategy=self.sharding_strategy.name,
            backward_prefetch=getattr(self.backward_prefetch, "name", None),
            auto_wrap_policy=describe_policy(self.auto_wrap_policy),
            forward_prefetch=self.forward_prefetch,
            use_orig_params=self.use_orig_params,
            mixed_precision=describe_mixed_precision(self.mixed_precision),
            trace=self.trace,
            **switched,
            **job,
            stated=FSDP1_KEYS + non_default_keys(switched) + job_keys,
        )

    def restate(self, config: ReportConfig) -> ReportConfig:
        """``config`` (of a report these options re-plan, :meth:`from_config`) with their
        world size, sharding and backward prefetch, stated as :meth:`describe` states them."""
        mine = self.describe()
        return config.replace(**{k: getattr(mine, k) for k in _RESTATED}).unstate(
            *(k for k in _RESTATED if k not in mine.stated)
        )

    @classmethod
    def from_config(cls, config: ReportConfig, **changes: Unpack[PlanKwargs]) -> FSDP1Options:
        """The options ``config`` (an FSDP1 prediction's) states, with ``changes`` to
        ``world_size``, ``sharding_strategy``, ``shard_group_size`` and
        ``backward_prefetch`` applied: what a replay re-plans with.

        A stated option is one FSDP already took (``describe`` wrote it), so only the changes
        are checked, as :func:`parse_fsdp1_options` checks them; the strategy FSDP runs with
        (``NO_SHARD`` on a process group of one rank) and its warnings are derived again
        for the new world size. Hybrid sharding keeps its shard group unless the world size
        or ``shard_group_size`` changes (a new world size gets the default group, as
        ``analyze`` without ``shard_group_size`` would). The wrap policy and mixed
        precision are not rebuilt (the config keeps their description, which
        :meth:`restate` leaves as it is).

        Example::

            opts = FSDP1Options.from_config(report.config, world_size=64)
            opts.shard_world_size, opts.restate(report.config).world_size   # 64, 64
        """
        rules = torch_fsdp(config.torch_version)
        ws = config.ranks
        if "world_size" in changes:
            ws = check_world_size(changes["world_size"])
        # the strategy asked for, where FSDP switched it to NO_SHARD on one rank
        stored = ShardingStrategy[config.sharding_strategy_given or config.sharding_strategy]
        given = changes.get("sharding_strategy", stored)
        group = changes.get("shard_group_size")
        if group is None and ws == config.ranks and given in _HYBRID:
            group = config.process_group_size
        sharding = _sharding(ws, given, group)
        warned: list[FsdpWarning] = []
        if "backward_prefetch" in changes:
            prefetch, warned = effective_backward_prefetch(changes["backward_prefetch"])
        else:
            name = config.backward_prefetch
            prefetch = None if name is None else BackwardPrefetch[name]
        return sharding.replace(
            forward_prefetch=config.forward_prefetch,
            use_orig_params=config.use_orig_params,
            offload_params=config.cpu_offload,
            trace=config.trace or "meta",
            torch=rules,
            backward_prefetch=prefetch,
            warnings=sharding.warnings + tuple(warned),
        )


_RESTATED = (
    "world_size", "shard_world_size", "sharding_strategy", "backward_prefetch",
    "process_group_size", "sharding_strategy_given",
)  # fmt: skip
"""The config fields a re-plan under another world size, sharding or backward prefetch
changes (:meth:`FSDP1Options.restate`)."""


def checked_mixed_precision(mp: Any) -> MixedPrecision | None:
    """``mixed_precision`` as FSDP1 takes it: None or a ``MixedPrecision`` whose dtypes are
    ``torch.dtype``s (else :class:`~fsdpviz.errors.ConfigError` says what was given)."""
    if mp is not None and not isinstance(mp, MixedPrecision):
        raise ConfigError(
            "mixed_precision must be a torch.distributed.fsdp.MixedPrecision, got "
            f"{type(mp).__name__}"
        )
    if mp is not None:
        check_dtypes(mp, "MixedPrecision")
    return mp


def describe_mixed_precision(mp: MixedPrecision | None) -> dict[str, Any] | None:
    """A ``MixedPrecision`` as ``Report.config`` states it: its three dtypes, and each of its
    other fields only where it is not torch's default (``cast_forward_inputs``,
    ``cast_root_forward_inputs``, ``keep_low_precision_grads``; ``_module_classes_to_ignore``
    by class name), so a report says all FSDP was given.

    Example::

        describe_mixed_precision(MixedPrecision(param_dtype=torch.bfloat16))
        # {'param_dtype': 'bfloat16', 'reduce_dtype': None, 'buffer_dtype': None}
    """
    return None if mp is None else describe_precision(mp, every=False)


def describe_policy(policy: Any) -> str | None:
    """A short human-readable name of an FSDP1 auto-wrap policy."""
    if policy is None:
        return None
    if isinstance(policy, functools.partial):
        kw = ", ".join(f"{k}={_short(v)}" for k, v in policy.keywords.items())
        return f"{getattr(policy.func, '__name__', repr(policy.func))}({kw})"
    cls = type(policy).__name__
    classes = getattr(policy, "_module_classes", None)
    if classes is not None:
        return f"{cls}({_short(classes)})"
    return cls if cls not in ("function",) else getattr(policy, "__name__", repr(policy))


def _short(v: Any) -> str:
    if isinstance(v, (set, frozenset, list, tuple)):
        names = sorted(getattr(x, "__name__", repr(x)) for x in v)
        return "{" + ", ".join(names) + "}"
    return getattr(v, "__name__", repr(v))


def enum_value(spec: OptionSpec, value: Any) -> Any:
    """An option's value as fsdpviz stores it, as FSDP1 takes it: an enum option's member
    name as the torch enum (``"FULL_SHARD"`` -> ``ShardingStrategy.FULL_SHARD``), None and
    any other option's value as they are. For names fsdpviz itself stores
    (``Report.config``, the CLI, the widgets), never for what a user passes to ``analyze``.

    Example::

        enum_value(OPTIONS["backward_prefetch"], "BACKWARD_POST")  # BackwardPrefetch.BACKWARD_POST
    """
    if value is None or spec.enum is None:
        return value
    return getattr(torch.distributed.fsdp, spec.enum)[value]


def _enum_hint(value: str, enum: Any) -> str:
    key = value.upper().replace("-", "_")
    if key in enum.__members__:
        return f"pass {enum.__name__}.{key}"
    return "pass one of " + ", ".join(f"{enum.__name__}.{m}" for m in enum.__members__)


def effective_strategy(
    value: Any, fsdp_world_size: int, where: str = "sharding_strategy"
) -> tuple[ShardingStrategy, list[FsdpWarning]]:
    """The strategy one FSDP1 instance runs with, as ``_init_core_state`` decides it.

    FSDP1 keeps ``sharding_strategy`` as given. On a process group of one rank it switches
    every strategy to ``NO_SHARD`` (with a warning). Elsewhere a string fails, because FSDP
    looks it up among ``ShardingStrategy`` members (``KeyError: 'FULL_SHARD'``).
    """
    found: list[FsdpWarning] = []
    given = ShardingStrategy.FULL_SHARD if value is None else value
    if not isinstance(given, (str, ShardingStrategy)):
        raise ConfigError(
            f"{where}={value!r} is not valid; use one of "
            + ", ".join(f"ShardingStrategy.{m}" for m in ShardingStrategy.__members__)
        )
    if isinstance(given, str) and fsdp_world_size > 1:
        raise FSDPConfigError(
            f"{where}={given!r} is a string: FSDP1 keeps it as given and fails with "
            f"KeyError: {given!r} when it builds the first FlatParameter (it looks the strategy "
            f"up among ShardingStrategy members); {_enum_hint(given, ShardingStrategy)}"
        )
    if fsdp_world_size > 1:
        assert isinstance(given, ShardingStrategy)
        return given, found
    if isinstance(given, str):
        found.append(
            FsdpWarning(
                code="string_option",
                message=f"{where}={given!r} is a string, which FSDP1 cannot use; it does no "
                "harm on one rank only because FSDP switches to NO_SHARD there "
                f"({_enum_hint(given, ShardingStrategy)})",
            )
        )
    if given != ShardingStrategy.NO_SHARD:
        found.append(
            FsdpWarning(
                code="no_shard_world_size_1",
                message=f"FSDP is switching to use `NO_SHARD` instead of {given} since the "
                "world size is 1.",
            )
        )
    return ShardingStrategy.NO_SHARD, found


def effective_backward_prefetch(
    value: Any, where: str = "backward_prefetch"
) -> tuple[BackwardPrefetch | None, list[FsdpWarning]]:
    """The backward prefetch FSDP1 runs with: a string never equals a ``BackwardPrefetch``
    member in ``_get_handle_to_prefetch``, so FSDP prefetches nothing in backward."""
    if value is None or isinstance(value, BackwardPrefetch):
        return value, []
    if not isinstance(value, str):
        raise ConfigError(
            f"{where}={value!r} is not valid; use None or one of "
            + ", ".join(f"BackwardPrefetch.{m}" for m in BackwardPrefetch.__members__)
        )
    return None, [
        FsdpWarning(
            code="string_option",
            message=f"{where}={value!r} is a string: FSDP1 keeps it as given and compares it "
            "with BackwardPrefetch members, which a string never equals, so nothing is "
            f"prefetched in backward; to prefetch, {_enum_hint(value, BackwardPrefetch)}",
        )
    ]


def check_policy(policy: Any) -> Any:
    """``auto_wrap_policy`` as FSDP1 takes it: a policy object or a callable policy. Module
    classes (a class, or a set of them as Lightning takes it) and class names fail in FSDP
    with a message about its own internals; say what to pass instead."""
    if isinstance(policy, (set, frozenset, list, tuple)) and policy:
        items = list(policy)
    elif isinstance(policy, (type, str)):
        items = [policy]
    else:
        return policy
    if not all(isinstance(c, str) or (isinstance(c, type) and issubclass(c, nn.Module))
               for c in items):  # fmt: skip
        return policy
    names = sorted(c if isinstance(c, str) else c.__name__ for c in items)
    by_name = any(isinstance(c, str) for c in items)
    given = (
        f"the class {names[0]}" if isinstance(policy, type)
        else f"the name {policy!r}" if isinstance(policy, str)
        else f"a {type(policy).__name__} of module {'names' if by_name else 'classes'}"
    )  # fmt: skip
    wrap = "ModuleWrapPolicy({" + ", ".join(names) + "})"
    listed = ", ".join(repr(n) if by_name else n for n in names)
    how = (
        "with the classes imported from their modules (names are for the command line's "
        "--policy transformer:NAME)"
        if by_name
        else "(from torch.distributed.fsdp.wrap)"
    )
    raise ConfigError(
        f"auto_wrap_policy is {given}, but FullyShardedDataParallel takes a policy: pass "
        f"auto_wrap_policy={wrap} {how}, or fully_shard=[{listed}] to plan FSDP2"
    )


_SWITCHES = ("forward_prefetch", "use_orig_params", "limit_all_gathers")


def _check_trace(trace: Any) -> TraceMode:
    if trace not in TRACE_MODES:
        raise ConfigError(f"trace={trace!r} is not valid; use 'meta' (default), 'real' or 'fx'")
    return cast(TraceMode, trace)


def _check_shard_group(sgs: Any, hybrid: bool, ws: int) -> None:
    if sgs is None:
        return
    if not hybrid:
        raise ConfigError("shard_group_size only applies to HYBRID_SHARD / _HYBRID_SHARD_ZERO2")
    if not isinstance(sgs, int) or isinstance(sgs, bool) or sgs < 1 or ws % sgs:
        raise ConfigError(f"shard_group_size={sgs!r} must be a positive divisor of world_size={ws}")


def _group_size(ws: int, hybrid: bool, sgs: int | None) -> int:
    """FSDP's process group: the shard group under hybrid sharding, else every rank."""
    return (sgs or ws) if hybrid else ws


def _sharding(ws: int, given: Any, sgs: Any) -> FSDP1Options:
    """Options of the world size, shard group and strategy FSDP runs with, from the world
    size, the ``sharding_strategy`` and the ``shard_group_size`` given, with what FSDP warns
    about them (the other fields their defaults: the parsers replace them)."""
    hybrid = given in _HYBRID
    if sgs is not None:
        if isinstance(given, str):
            raise ConfigError(
                f"sharding_strategy={given!r} is a string, which FSDP1 cannot use (it looks "
                f"the strategy up among ShardingStrategy members); "
                f"{_enum_hint(given, ShardingStrategy)}"
            )
        _check_shard_group(sgs, hybrid, ws)
    elif hybrid:
        sgs = min(8, ws) if ws % min(8, ws) == 0 else ws
    strategy, found = effective_strategy(given, _group_size(ws, hybrid, sgs))
    asked = ShardingStrategy.FULL_SHARD if given is None else given
    requested = asked if isinstance(asked, ShardingStrategy) and asked != strategy else None
    if hybrid and strategy == ShardingStrategy.NO_SHARD and ws > 1:
        found.append(
            FsdpWarning(
                code="hybrid_not_synchronized",
                message=(
                    f"{getattr(given, 'name', given)} with shard groups of one rank: FSDP "
                    "switches each shard group to NO_SHARD, whose all-reduce spans that one "
                    f"rank, and never all-reduces across the {ws} replicas, so every rank "
                    "keeps its own gradients. Use shard groups of 2+ ranks, or NO_SHARD / "
                    "DistributedDataParallel over all ranks"
                ),
            )
        )
    return FSDP1Options(
        world_size=ws,
        hybrid=hybrid,
        shard_group_size=sgs,
        sharding_strategy=strategy,
        requested_strategy=requested,
        warnings=tuple(found),
    )


def parse_fsdp1_options(kwargs: dict[str, Any]) -> FSDP1Options:
    """Check ``kwargs`` the way ``FullyShardedDataParallel`` would, plus fsdpviz's own.

    Options take effect as FSDP1 applies them: a string for an enum option is kept as
    given (``backward_prefetch="BACKWARD_PRE"`` prefetches nothing; ``sharding_strategy``
    as a string fails), and a process group of one rank runs ``NO_SHARD``.
    """
    check_keywords(kwargs, "FSDP1", "option")
    rules = torch_rules(kwargs)
    sharding = _sharding(
        world_size(kwargs), kwargs.get("sharding_strategy"), kwargs.get("shard_group_size")
    )
    prefetch: BackwardPrefetch | None = BackwardPrefetch.BACKWARD_PRE
    warned: list[FsdpWarning] = []
    if "backward_prefetch" in kwargs:
        prefetch, warned = effective_backward_prefetch(kwargs["backward_prefetch"])
    flags = {name: check_switch(name, kwargs[name]) for name in _SWITCHES if name in kwargs}
    mp = checked_mixed_precision(kwargs.get("mixed_precision"))
    offload = kwargs.get("cpu_offload")
    if offload is not None and not isinstance(offload, CPUOffload):
        raise ConfigError(f"cpu_offload must be a CPUOffload, got {type(offload).__name__}")
    policy = check_policy(kwargs.get("auto_wrap_policy"))
    loss = kwargs.get("loss")
    if loss is not None and not callable(loss):
        raise ConfigError("loss must be a callable from the model output to a scalar tensor")
    return sharding.replace(
        backward_prefetch=prefetch,
        **flags,
        mixed_precision=mp,
        offload_params=offload.offload_params if offload is not None else False,
        auto_wrap_policy=policy,
        ignored_modules=kwargs.get("ignored_modules"),
        ignored_states=kwargs.get("ignored_states"),
        loss=loss,
        trace=_check_trace(kwargs.get("trace", "meta")),
        progress=kwargs.get("progress"),
        activation_checkpointing=kwargs.get("activation_checkpointing"),
        job=parse_job_options(kwargs, "FSDP1"),
        torch=rules,
        warnings=sharding.warnings + tuple(warned),
    )


def offloaded_low_precision_grads(
    root: nn.Module, opts: FSDP1Options, ignored: set[nn.Parameter]
) -> list[FsdpWarning]:
    """A warning where FSDP1 fails from the second iteration: CPU offload with
    ``keep_low_precision_grads`` and parameters in another dtype than ``param_dtype``. The
    final callback's cast (``prepare_gradient_for_optim``: ``flat_param.grad =
    flat_param._cpu_grad``, then ``cast_grad_to_param_dtype_if_needed``) turns the host
    gradient buffer ``_cpu_grad`` itself into the low precision; after ``zero_grad()``
    (``set_to_none=True``, torch's default) the next backward assigns it to the
    full-precision FlatParameter's ``.grad``, which autograd refuses."""
    mp = opts.mixed_precision
    if not opts.offload_params or mp is None or not mp.keep_low_precision_grads:
        return []
    low = mp.param_dtype
    if low is None or not any(
        p.dtype != low for p in root.parameters() if p.requires_grad and p not in ignored
    ):
        return []
    return [
        FsdpWarning(
            code="offload_low_precision_grads",
            message="CPUOffload(offload_params=True) with MixedPrecision("
            f"param_dtype={low}, keep_low_precision_grads=True): the first iteration runs, "
            "but its final callback casts the host gradient buffer (_cpu_grad) to "
            f"{dtype_name(low)} in place, and after zero_grad() the next backward assigns it "
            "to the full-precision FlatParameter's .grad and fails (RuntimeError: "
            "attempting to assign a gradient with dtype ... to a tensor with ... 'Float', "
            "in prepare_gradient_for_optim); use keep_low_precision_grads=False with CPU "
            "offload",
        )
    ]
