"""Mixed precision that a replay applies: another gradient reduction dtype.

FSDP's ``reduce_dtype`` decides only what happens to the gradients once autograd made
them: the dtype (and so the bytes) of the reduce-scatter's or all-reduce's input and the
cast copy into it, the reduced shard (FSDP1 casts it back to the parameter dtype, FSDP2
keeps the sharded parameter's), and under FSDP2's gradient accumulation without sync
the unsharded gradients upcast to it (``FSDPParam.to_accumulated_grad_if_needed``). The
forward and backward, the hook calls and every measurement of the trace stay as they
are while the parameter dtype and the input and output casts do. In a report that is
each unit's ``Unit.reduce_dtype`` and the config's ``mixed_precision`` / ``mp_policy``;
the memory and time models read the rest from them, and :func:`replay`'s fit check
redoes the ``out_of_memory`` warning.

So a replay takes a ``mixed_precision=MixedPrecision(...)`` (FSDP1) or
``mp_policy=MixedPrecisionPolicy(...)`` (FSDP2) that differs from the report's in
``reduce_dtype`` alone. Not replayed (a new trace is needed):

- another ``param_dtype`` (the compute's dtype), FSDP2's ``output_dtype`` and
  ``cast_forward_inputs``, FSDP1's ``buffer_dtype``, ``cast_forward_inputs``,
  ``cast_root_forward_inputs``, ``keep_low_precision_grads`` and
  ``_module_classes_to_ignore`` (the casts the trace ran, the units FSDP1 wraps);
- FSDP1 with or without a ``MixedPrecision`` at all (``_module_classes_to_ignore``
  wraps normalisation layers as units of their own when one is given);
- FSDP1 units whose precision is not the report's ``MixedPrecision`` (a ``CustomPolicy``'s
  own, or mixed precision disabled for ``_module_classes_to_ignore``): the report does not
  say what each would reduce in.

Example::

    base = fsdpviz.analyze(model, ids, fully_shard=[Block], mp_policy=MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    bf16 = replay(base, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp1_options import checked_mixed_precision, describe_mixed_precision
from fsdpviz.plan.fsdp2_options import checked_mp_policy, describe_mp_policy
from fsdpviz.schema.report import Report

PRECISION_OPTION = {"FSDP1": "mixed_precision", "FSDP2": "mp_policy"}
"""The option that sets mixed precision, per API."""


def traced_precision(api: str, policy: Any) -> tuple[Any, ...]:
    """What of mixed precision ``policy`` (``mixed_precision`` / ``mp_policy`` as
    ``analyze`` takes it) a trace depends on: everything but the reduce dtype. Two
    policies with the same one replay from each other's trace.

    Example::

        traced_precision("FSDP2", MixedPrecisionPolicy(torch.bfloat16, torch.float32)) == \\
            traced_precision("FSDP2", MixedPrecisionPolicy(torch.bfloat16))   # True
    """
    described = _described(api, policy)
    if described is None:
        return ()
    return tuple(sorted((k, str(v)) for k, v in described.items() if k != "reduce_dtype"))


def with_reduce_dtype(report: Report, policy: Any) -> Report:
    """``report`` with mixed precision ``policy``, which must differ from the report's in
    the reduce dtype alone (else :class:`~fsdpviz.errors.ConfigError` says what does and
    what to do): each unit's ``reduce_dtype`` as ``analyze`` derives it, the config's
    policy restated. Events, hook calls and the trace profile stay as they are."""
    api = report.config.api
    option = PRECISION_OPTION[api]
    new = _described(api, policy)
    old = report.config.mixed_precision if api == "FSDP1" else report.config.mp_policy
    if new == old:
        return report
    if option not in report.config.stated:
        raise ConfigError(
            f"this report does not state its {option}, so another one cannot be replayed "
            f"on it; call fsdpviz.analyze with the new {option}"
        )
    if new is None or old is None:
        raise ConfigError(
            f"mixed_precision={_shown(policy)} cannot be replayed on a plan with "
            f"mixed_precision={_shown_stated(old)}: FSDP1 wraps _module_classes_to_ignore's "
            "modules as units of their own whenever a MixedPrecision is given, so a replay "
            "changes only the reduce_dtype of the MixedPrecision the report was planned "
            "with; call fsdpviz.analyze with the new mixed_precision"
        )
    other = sorted(k for k in {*new, *old} - {"reduce_dtype"} if new.get(k) != old.get(k))
    if other:
        raise ConfigError(
            f"{option} changes {', '.join(other)} (from {_shown_stated(old)}), which changes "
            "the casts the trace ran (only reduce_dtype, the gradient reduction's dtype, is "
            f"replayed from a trace); call fsdpviz.analyze with the new {option}"
        )
    reduce = new["reduce_dtype"]
    if api == "FSDP1":
        _check_fsdp1_units(report, old)
        units = [
            u if u.reduce_dtype is None else replace(u, reduce_dtype=reduce or u.compute_dtype)
            for u in report.units
        ]
        config = report.config.replace(mixed_precision=new)
    else:
        param = new["param_dtype"]
        units = [replace(u, reduce_dtype=reduce or param or u.dtype) for u in report.units]
        config = report.config.replace(mp_policy=new)
    return replace(report, config=config, units=units, warnings=list(report.warnings))


def replays_precision(report: Report, policy: Any) -> bool:
    """Whether :func:`replay` applies mixed precision ``policy`` to ``report`` (the same
    as the report's, or another reduce dtype where the report says each unit's)."""
    try:
        with_reduce_dtype(report, policy)
    except ConfigError:
        return False
    return True


def same_precision(report: Report, policy: Any) -> bool:
    """Whether ``report`` was planned with mixed precision ``policy``."""
    api = report.config.api
    stated = report.config.mixed_precision if api == "FSDP1" else report.config.mp_policy
    return PRECISION_OPTION[api] in report.config.stated and _described(api, policy) == stated


def _described(api: str, policy: Any) -> dict[str, Any] | None:
    """``policy`` checked as ``analyze`` checks it, and stated as a report states it."""
    if api == "FSDP2":
        return describe_mp_policy(checked_mp_policy(policy))
    return describe_mixed_precision(checked_mixed_precision(policy))


def _check_fsdp1_units(report: Report, stated: Mapping[str, Any]) -> None:
    """Refuse a plan where a unit may not follow the report's ``MixedPrecision``: one
    FSDP disabled it for (``_module_classes_to_ignore``), a ``CustomPolicy``'s (it may give
    a unit its own), or a unit whose dtypes are not what the report's derives."""
    why = ""
    if any(w.code == "mixed_precision_override" for w in report.warnings):
        why = "FSDP disabled mixed precision for some units (_module_classes_to_ignore)"
    elif (report.config.auto_wrap_policy or "").startswith("CustomPolicy"):
        why = "a CustomPolicy may give a unit a MixedPrecision of its own"
    else:
        param = stated.get("param_dtype")
        for u in report.units:
            if u.reduce_dtype is None:
                continue
            compute = param or u.dtype
            reduce = stated.get("reduce_dtype") or compute
            if (u.compute_dtype, u.reduce_dtype) != (compute, reduce):
                why = f"unit {u.module!r} computes or reduces in dtypes of its own"
                break
    if why:
        raise ConfigError(
            f"mixed_precision cannot be replayed on this plan: {why}, and the report does "
            "not say which dtype each such unit would reduce in; call fsdpviz.analyze with "
            "the new mixed_precision"
        )


def _shown(policy: Any) -> str:
    return "None" if policy is None else type(policy).__name__ + "(...)"


def _shown_stated(stated: Mapping[str, Any] | None) -> str:
    if stated is None:
        return "None"
    return "(" + ", ".join(f"{k}={v}" for k, v in stated.items()) + ")"


__all__ = [
    "PRECISION_OPTION",
    "replays_precision",
    "same_precision",
    "traced_precision",
    "with_reduce_dtype",
]
