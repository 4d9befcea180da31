"""FSDP1 keyword arguments, accepted as ``FullyShardedDataParallel(...)`` takes them."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
)

from fsdpviz.errors import ConfigError
from fsdpviz.plan.options import DEFAULT_WORLD_SIZE, check_keywords, world_size
from fsdpviz.schema.config import FSDP1_KEYS, ReportConfig, TraceMode
from fsdpviz.schema.report import dtype_name

# Keywords of ``FullyShardedDataParallel.__init__`` and what fsdpviz does with them.
_MODELLED = {
    "sharding_strategy",
    "auto_wrap_policy",
    "backward_prefetch",
    "mixed_precision",
    "ignored_modules",
    "ignored_states",
    "forward_prefetch",
    "use_orig_params",
    "cpu_offload",
    # No effect on which units exist or on the order of collectives and frees:
    "limit_all_gathers",  # only makes the CPU wait on a free event
    "device_id",  # where the module is moved; fsdpviz traces on meta
    "sync_module_states",  # one broadcast at construction, before any iteration
    "param_init_fn",  # how meta modules are materialised
}
_REJECTED = {
    "process_group": "pass world_size=N (and shard_group_size=M for hybrid sharding) instead",
    "device_mesh": "pass world_size=N (and shard_group_size=M for hybrid sharding) instead",
}
_FSDPVIZ = {"world_size", "loss", "trace", "progress", "shard_group_size"}
_HYBRID = {ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2}


@dataclass
class FSDP1Options:
    """Validated FSDP1 configuration plus the fsdpviz-only knobs."""

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
    shard_group_size: int | None = None
    loss: Callable[[Any], torch.Tensor] | None = None
    trace: TraceMode = "meta"
    progress: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def shard_world_size(self) -> int:
        """Ranks one FlatParameter is sharded over."""
        if self.sharding_strategy == ShardingStrategy.NO_SHARD:
            return 1
        if self.sharding_strategy in _HYBRID:
            return self.shard_group_size or self.world_size
        return self.world_size

    def describe(self) -> ReportConfig:
        """These options as ``Report.config`` states them."""
        mp = self.mixed_precision
        return ReportConfig(
            api="FSDP1",
            world_size=self.world_size,
            shard_world_size=self.shard_world_size,
            sharding_strategy=self.sharding_strategy.name,
            auto_wrap_policy=describe_policy(self.auto_wrap_policy),
            backward_prefetch=self.backward_prefetch.name if self.backward_prefetch else None,
            forward_prefetch=self.forward_prefetch,
            use_orig_params=self.use_orig_params,
            mixed_precision=None
            if mp is None
            else {
                "param_dtype": dtype_name(mp.param_dtype),
                "reduce_dtype": dtype_name(mp.reduce_dtype),
                "buffer_dtype": dtype_name(mp.buffer_dtype),
            },
            trace=self.trace,
            stated=FSDP1_KEYS,
        )


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


def _enum(value: Any, enum: Any, name: str) -> Any:
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        key = value.upper().replace("-", "_")
        if key in enum.__members__:
            return enum[key]
    choices = ", ".join(f"{enum.__name__}.{m}" for m in enum.__members__)
    raise ConfigError(f"{name}={value!r} is not valid; use one of {choices}")


def parse_fsdp1_options(kwargs: dict[str, Any]) -> FSDP1Options:
    """Check ``kwargs`` the way ``FullyShardedDataParallel`` would, plus fsdpviz's own."""
    check_keywords(kwargs, _MODELLED | _FSDPVIZ, _REJECTED, "option")
    opts = FSDP1Options()
    opts.world_size = ws = world_size(kwargs)
    if "sharding_strategy" in kwargs and kwargs["sharding_strategy"] is not None:
        opts.sharding_strategy = _enum(
            kwargs["sharding_strategy"], ShardingStrategy, "sharding_strategy"
        )
    if "backward_prefetch" in kwargs:
        bp = kwargs["backward_prefetch"]
        opts.backward_prefetch = (
            None if bp is None else _enum(bp, BackwardPrefetch, "backward_prefetch")
        )
    for flag in ("forward_prefetch", "use_orig_params", "limit_all_gathers"):
        if flag in kwargs:
            value = kwargs[flag]
            if not isinstance(value, bool):
                raise ConfigError(f"{flag} must be True or False, got {value!r}")
            setattr(opts, flag, value)
    mp = kwargs.get("mixed_precision")
    if mp is not None and not isinstance(mp, MixedPrecision):
        raise ConfigError(
            "mixed_precision must be a torch.distributed.fsdp.MixedPrecision, got "
            f"{type(mp).__name__}"
        )
    if mp is not None and mp.keep_low_precision_grads:
        opts.extra["keep_low_precision_grads"] = True
    opts.mixed_precision = mp
    offload = kwargs.get("cpu_offload")
    if offload is not None:
        if not isinstance(offload, CPUOffload):
            raise ConfigError(f"cpu_offload must be a CPUOffload, got {type(offload).__name__}")
        if offload.offload_params:
            raise ConfigError(
                "cpu_offload=CPUOffload(offload_params=True) is not modelled by fsdpviz yet; "
                "analyse without it (the all-gather/free/reduce-scatter order does not "
                "include the host copies it adds)"
            )
    opts.auto_wrap_policy = kwargs.get("auto_wrap_policy")
    opts.ignored_modules = kwargs.get("ignored_modules")
    opts.ignored_states = kwargs.get("ignored_states")
    sgs = kwargs.get("shard_group_size")
    if sgs is not None:
        if opts.sharding_strategy not in _HYBRID:
            raise ConfigError("shard_group_size only applies to HYBRID_SHARD / _HYBRID_SHARD_ZERO2")
        if not isinstance(sgs, int) or sgs < 1 or ws % sgs:
            raise ConfigError(
                f"shard_group_size={sgs!r} must be a positive divisor of world_size={ws}"
            )
        opts.shard_group_size = sgs
    elif opts.sharding_strategy in _HYBRID:
        opts.shard_group_size = min(8, ws) if ws % min(8, ws) == 0 else ws
    loss = kwargs.get("loss")
    if loss is not None and not callable(loss):
        raise ConfigError("loss must be a callable from the model output to a scalar tensor")
    opts.loss = loss
    trace = kwargs.get("trace", "meta")
    if trace not in ("meta", "real", "fx"):
        raise ConfigError(f"trace={trace!r} is not valid; use 'meta' (default), 'real' or 'fx'")
    opts.trace = trace
    opts.progress = kwargs.get("progress")
    return opts
