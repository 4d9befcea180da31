"""Checks shared by the FSDP1 and FSDP2 option parsers, one per option."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from fsdpviz.errors import ConfigError, FSDPConfigError, did_you_mean
from fsdpviz.plan.option_specs import OPTIONS, RESHARD, Api
from fsdpviz.plan.torch_fsdp import TorchFSDP, torch_fsdp
from fsdpviz.schema.keywords import BothKwargs, FSDP1Kwargs, FSDP2Kwargs, FSDPKwargs, PlanKwargs
from fsdpviz.schema.report import dtype_name

# what both parsers take: BothKwargs' keywords and PlanKwargs' own (world_size, progress)
_BOTH = BothKwargs.__optional_keys__ | (PlanKwargs.__optional_keys__ - FSDPKwargs.__optional_keys__)
KEYWORDS: Mapping[Api, frozenset[str]] = {
    "FSDP1": FSDP1Kwargs.__optional_keys__ | _BOTH,
    "FSDP2": FSDP2Kwargs.__optional_keys__ | _BOTH,
}
"""Every keyword :func:`fsdpviz.analyze` takes for each API (FSDP's and fsdpviz's own), as
:class:`~fsdpviz.schema.keywords.FSDPKwargs` types them. Of FSDP1's, ``limit_all_gathers``,
``device_id``, ``sync_module_states`` and ``param_init_fn`` change neither which units exist
nor the order of collectives and frees: the first only makes the CPU wait on a free event,
the second says where the module is moved (fsdpviz traces on meta), the third is one
broadcast at construction, before any iteration, the last how meta modules are materialised."""

_ACCUMULATE = "N micro-steps per optimizer step, the first N - 1"
REJECTED: Mapping[Api, Mapping[str, str]] = {
    "FSDP1": {
        "process_group": "pass world_size=N (and shard_group_size=M for hybrid sharding) instead",
        "device_mesh": "pass world_size=N (and shard_group_size=M for hybrid sharding) instead",
        "no_sync": f"pass grad_accum=N: {_ACCUMULATE} under model.no_sync()",
        "requires_gradient_sync": "FSDP1's counterpart is no_sync(): pass grad_accum=N for "
        f"{_ACCUMULATE} under no_sync()",
    },
    "FSDP2": {
        "requires_gradient_sync": f"pass grad_accum=N: {_ACCUMULATE} after "
        "model.set_requires_gradient_sync(False)",
        "no_sync": "FSDP2's counterpart is set_requires_gradient_sync(False): pass grad_accum=N "
        f"for {_ACCUMULATE} without gradient sync",
    },
}
"""The keywords of each API that fsdpviz does not model, and what to pass instead."""


def check_keywords(kwargs: Mapping[str, Any], api: Api, what: str) -> None:
    """Unknown keywords get a suggestion; known but unmodelled ones say what to do instead;
    an option of the other FSDP API (``api`` is the plan's) says so."""
    rejected = REJECTED[api]
    names = sorted(KEYWORDS[api] | set(rejected))
    other: Api = "FSDP1" if api == "FSDP2" else "FSDP2"
    for key in kwargs:
        if key not in names and key in KEYWORDS[other] | set(REJECTED[other]):
            if other == "FSDP2":
                raise ConfigError(
                    f"{key!r} is an option of FSDP2's fully_shard, and this plan is FSDP1's "
                    "(no fully_shard=): pass fully_shard=[<module classes>] to plan FSDP2"
                )
            raise ConfigError(
                f"{key!r} is an option of FSDP1 (FullyShardedDataParallel), and fully_shard= "
                "plans FSDP2: drop fully_shard to plan FSDP1, or use FSDP2's own options "
                f"(mp_policy, offload_policy, {RESHARD.name}, mesh)"
            )
        if key not in names:
            tip = did_you_mean(key, names)
            raise ConfigError(f"unknown {what} {key!r}{tip}")
        if key in rejected:
            raise ConfigError(f"option {key!r} is not modelled by fsdpviz: {rejected[key]}")


def check_switch(name: str, value: Any) -> bool:
    """``value`` as a switch option ``name`` takes it: True or False."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return value


DEFAULT_WORLD_SIZE: int = OPTIONS["world_size"].default
"""The ranks :func:`fsdpviz.analyze` plans for unless told (``world_size=``)."""


def check_world_size(value: Any) -> int:
    """``value`` as a world size: a positive int."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"world_size must be a positive int, got {value!r}")
    return value


def world_size(kwargs: Mapping[str, Any]) -> int:
    """``world_size`` from ``kwargs`` (default: ``DEFAULT_WORLD_SIZE``)."""
    return check_world_size(kwargs.get("world_size", DEFAULT_WORLD_SIZE))


def check_dtypes(policy: Any, what: str) -> None:
    """The dtype fields of a mixed-precision policy (``what``: its class's name) must be
    ``torch.dtype`` or None: FSDP fails on a string (``'bfloat16'``) when it first casts
    (``TypeError`` / ``Invalid device string``)."""
    for name in (f.name for f in dataclasses.fields(policy) if f.name.endswith("_dtype")):
        value = getattr(policy, name)
        if value is not None and not isinstance(value, torch.dtype):
            hint = getattr(torch, str(value), None)
            fix = f"torch.{value}" if isinstance(hint, torch.dtype) else "a torch.dtype"
            raise FSDPConfigError(
                f"{what}({name}={value!r}): FSDP needs a torch.dtype and fails when it first "
                f"casts with {value!r}; pass {fix}"
            )


def describe_precision(policy: Any, every: bool) -> dict[str, Any]:
    """A mixed-precision policy (``MixedPrecision``, ``MixedPrecisionPolicy``) as
    ``Report.config`` states it: its dtypes by name, then its other fields, ``every`` one or
    only those that are not torch's default (module classes by name)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(policy):
        value = getattr(policy, f.name)
        if f.name.endswith("_dtype"):
            out[f.name] = dtype_name(value)
        elif isinstance(f.default, tuple):  # module classes (MixedPrecision's to ignore)
            if every or set(value) != set(f.default):
                out[f.name] = sorted(c.__name__ for c in value)
        elif every or value != f.default:
            out[f.name] = value
    return out


def torch_rules(kwargs: Mapping[str, Any]) -> TorchFSDP:
    """Whose FSDP to plan: ``torch_version`` from ``kwargs`` (``"2.8"``), else the installed
    torch's."""
    return torch_fsdp(kwargs.get("torch_version"))
