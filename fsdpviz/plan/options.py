"""Checks shared by the FSDP1 and FSDP2 option parsers, one per option."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from fsdpviz.errors import ConfigError, FSDPConfigError, did_you_mean
from fsdpviz.plan.option_specs import OPTIONS, RESHARD
from fsdpviz.plan.torch_fsdp import TorchFSDP, torch_fsdp

# Options of one API given to the other: what each is, and what to pass instead.
_FSDP2_ONLY = {
    "fully_shard", RESHARD.name, "mp_policy", "offload_policy", "mesh",
    "parallelize_plan", "shard_placement_fn", "ignored_params", "reshard_after_backward",
    "requires_all_reduce",
}  # fmt: skip
_FSDP1_ONLY = {
    "auto_wrap_policy", "sharding_strategy", "mixed_precision", "cpu_offload",
    "use_orig_params", "limit_all_gathers", "sync_module_states", "ignored_modules",
    "ignored_states", "param_init_fn", "device_id", "shard_group_size", "process_group",
    "device_mesh",
}  # fmt: skip


def check_keywords(
    kwargs: Mapping[str, Any],
    known: Iterable[str],
    rejected: Mapping[str, str],
    what: str,
    api: str,
) -> None:
    """Unknown keywords get a suggestion; known but unmodelled ones say what to do instead;
    an option of the other FSDP API (``api`` is the plan's: ``"FSDP1"`` or ``"FSDP2"``)
    says so."""
    names = sorted(set(known) | set(rejected))
    fsdp2 = api == "FSDP2"
    for key in kwargs:
        if key not in names and not fsdp2 and key in _FSDP2_ONLY:
            raise ConfigError(
                f"{key!r} is an option of FSDP2's fully_shard, and this plan is FSDP1's "
                "(no fully_shard=): pass fully_shard=[<module classes>] to plan FSDP2"
            )
        if key not in names and fsdp2 and key in _FSDP1_ONLY:
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


def check_dtypes(policy: Any, fields: tuple[str, ...], what: str) -> None:
    """Dtype fields of a mixed-precision policy must be ``torch.dtype`` or None: FSDP fails
    on a string (``'bfloat16'``) when it first casts (``TypeError`` / ``Invalid device
    string``)."""
    for name in fields:
        value = getattr(policy, name)
        if value is not None and not isinstance(value, torch.dtype):
            hint = getattr(torch, str(value), None)
            fix = f"torch.{value}" if isinstance(hint, torch.dtype) else "a torch.dtype"
            raise FSDPConfigError(
                f"{what}({name}={value!r}): FSDP needs a torch.dtype and fails when it first "
                f"casts with {value!r}; pass {fix}"
            )


def torch_rules(kwargs: Mapping[str, Any]) -> TorchFSDP:
    """Whose FSDP to plan: ``torch_version`` from ``kwargs`` (``"2.8"``), else the installed
    torch's."""
    return torch_fsdp(kwargs.get("torch_version"))
