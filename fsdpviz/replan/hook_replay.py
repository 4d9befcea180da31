"""The same wrap plan under other settings, without tracing the model again.

A traced report records, in ``report.profile``, every FSDP hook call in the
order torch's autograd made them. Settings that do not change that order can
be predicted by feeding the recorded calls through FSDP's runtime state
machine again (what ``analyze`` already does for the steady state):

- FSDP1: ``world_size``, ``backward_prefetch``, ``sharding_strategy`` (with
  ``shard_group_size``). Backward prefetching and resharding only change which
  collectives are issued, never when autograd reaches a hook; the unit sizes are
  recomputed for the new shard world size (padding, alignment).
- FSDP2: ``world_size``, ``reshard_after_forward``, ``forward_prefetch`` /
  ``backward_prefetch`` maps.

Anything that changes the autograd graph needs a new trace: the wrap policy,
FSDP1's ``forward_prefetch`` (it creates a prefetched unit's views earlier),
``use_orig_params``, mixed precision (input casts), the inputs.
``tests/test_cost_sweep.py`` checks that a replay equals a fresh ``analyze``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch

from fsdpviz.cost.sizes import itemsize
from fsdpviz.errors import ConfigError, FSDPConfigError
from fsdpviz.schema.profile import StepProfile, TraceProfile
from fsdpviz.schema.report import Event, Report, Unit

REPLAYABLE = {
    "FSDP1": {"world_size", "backward_prefetch", "sharding_strategy", "shard_group_size"},
    "FSDP2": {"world_size", "reshard_after_forward", "forward_prefetch", "backward_prefetch"},
}
_PLACEHOLDER = nn.Module()


def replay(report: Report, **changes: Any) -> Report:
    """``report``'s wrap plan with ``changes`` applied, predicted without a new trace.

    Example::

        base = fsdpviz.analyze(model, ids, auto_wrap_policy=policy, world_size=8)
        other = replay(base, world_size=64, backward_prefetch=None)
    """
    if report.profile is None:
        raise ConfigError(
            "this report has no trace profile (a recording, trace='fx' or profile=False), so "
            "its hook calls cannot be replayed; call fsdpviz.analyze with the new settings"
        )
    api = str(report.config.get("api", "FSDP1"))
    unknown = set(changes) - REPLAYABLE[api]
    if unknown:
        raise ConfigError(
            f"{', '.join(sorted(unknown))} cannot be replayed from a trace ({api} replays "
            f"{', '.join(sorted(REPLAYABLE[api]))}); they change the autograd graph, so call "
            "fsdpviz.analyze again"
        )
    if api == "FSDP2":
        return _replay_fsdp2(report, changes)
    return _replay_fsdp1(report, changes)


def _shapes(report: Report) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for m in report.modules:
        for name, shape in m.params.items():
            out[f"{m.fqn}.{name}" if m.fqn else name] = list(shape)
    return out


def _numel(shape: list[int]) -> int:
    return math.prod(shape)


# -------------------------------------------------------------------- FSDP1
def _replay_fsdp1(report: Report, changes: dict[str, Any]) -> Report:
    from fsdpviz.plan.fsdp1 import PlannedUnit, UnitConfig
    from fsdpviz.plan.fsdp1_options import parse_fsdp1_options
    from fsdpviz.schedule.fsdp1_runtime import FSDP1Runtime

    cfg = report.config
    given = {
        "world_size": changes.get("world_size", cfg.get("world_size", 8)),
        "sharding_strategy": changes.get("sharding_strategy", cfg.get("sharding_strategy")),
        "backward_prefetch": changes.get("backward_prefetch", cfg.get("backward_prefetch")),
    }
    if changes.get("shard_group_size") is not None:
        given["shard_group_size"] = changes["shard_group_size"]
    opts = parse_fsdp1_options(given)
    bp: BackwardPrefetch | None = opts.backward_prefetch
    use_orig = bool(cfg.get("use_orig_params", False))
    shapes = _shapes(report)
    units = [_resize_fsdp1(u, opts, use_orig, shapes) for u in report.units]
    planned = [
        PlannedUnit(
            fqn=u.module,
            module=_PLACEHOLDER,
            config=UnitConfig(opts.sharding_strategy, None, bp, bool(cfg.get("forward_prefetch"))),
            param_infos=[(_PLACEHOLDER, p, p) for p in u.params],
            requires_grad=u.requires_grad is not False,
        )
        for u in units
    ]
    runtime = FSDP1Runtime(planned, use_orig, lambda h: None)
    index = {u.module: i for i, u in enumerate(units)}
    assert report.profile is not None
    iterations, steps = _run(runtime, report.profile, index, _fsdp1_entry)
    config = dict(cfg)
    config.update(opts.describe())
    for key in ("auto_wrap_policy", "forward_prefetch", "use_orig_params", "mixed_precision"):
        config[key] = cfg.get(key)
    config["trace"] = cfg.get("trace")
    config["replayed"] = True
    return _report(
        report, config, units, [h.name for h in runtime.pre_forward_order], iterations, steps
    )


def _resize_fsdp1(u: Unit, opts: Any, use_orig: bool, shapes: dict[str, list[int]]) -> Unit:
    if not u.params:
        return replace(u, sharding_strategy=opts.sharding_strategy.name)
    ws = opts.shard_world_size
    total = 0
    # FSDP1 aligns to 16 bytes of the forward/backward (compute) dtype.
    aligned = 16 // itemsize(u.compute_dtype or u.dtype) if use_orig else 0
    for p in u.params:
        if aligned > 0 and 0 < aligned - total % aligned < aligned:
            total += aligned - total % aligned
        total += _numel(shapes[p])
    if aligned > 0 and 0 < ws - total % ws < ws:
        total += ws - total % ws
    sharded = math.ceil(total / ws)
    return replace(
        u,
        flat_numel=total,
        padded_numel=sharded * ws,
        sharded_numel=sharded,
        sharding_strategy=opts.sharding_strategy.name,
    )


def _fsdp1_entry(name: str, index: int, arg: Any) -> tuple[str, int, Any]:
    return (name, index, bool(arg))


# -------------------------------------------------------------------- FSDP2
def _replay_fsdp2(report: Report, changes: dict[str, Any]) -> Report:
    from fsdpviz.plan.fsdp2 import Group
    from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime

    cfg = report.config
    ws = int(changes.get("world_size", cfg.get("world_size", 8)))
    if ws < 1:
        raise ConfigError(f"world_size must be a positive int, got {ws!r}")
    names: list[str] = list(cfg.get("fully_shard", []))
    raf = changes.get("reshard_after_forward", cfg.get("reshard_after_forward"))
    with_params = {u.module: u for u in report.units}
    groups: list[Group] = []
    for name in names:
        fqns = tuple(name.split(", ")) if name else ("",)
        value = _raf(raf, name, fqns)
        if not isinstance(value, bool) and (value < 1 or value > ws or ws % value):
            raise FSDPConfigError(
                f"reshard_after_forward={value} for {name or '<root>'!r}: if passing "
                f"reshard_after_forward as an int, it should be a factor of {ws} "
                "(FSDP2 raises this)"
            )
        groups.append(
            Group(
                name=name,
                modules=tuple(_PLACEHOLDER for _ in fqns),
                fqns=fqns,
                params=[nn.Parameter(torch.empty(0, device="meta"))] if name in with_params else [],
                reshard_after_forward=value,
            )
        )
    runtime = FSDP2Runtime(groups, ws)
    where = {f: i for i, g in enumerate(groups) for f in g.fqns}
    fwd = changes.get("forward_prefetch", cfg.get("forward_prefetch") or {})
    bwd = changes.get("backward_prefetch", cfg.get("backward_prefetch") or {})
    runtime.set_prefetch(_indices(fwd, where), _indices(bwd, where))
    index = {g.name: i for i, g in enumerate(groups)}
    assert report.profile is not None
    iterations, steps = _run(runtime, report.profile, index, _fsdp2_entry)
    shapes = _shapes(report)
    units = []
    for u in report.units:
        g = groups[index[u.module]]
        sharded = sum(math.ceil(shapes[p][0] / ws) * _numel(shapes[p][1:]) for p in u.params)
        strategy = "FULL_SHARD" if g.reshard_after_forward is not False else "SHARD_GRAD_OP"
        units.append(
            replace(u, padded_numel=sharded * ws, sharded_numel=sharded, sharding_strategy=strategy)
        )
    forward_order: list[str] = []
    for name, i, _ in runtime.log:
        if name == "final_callback":
            break
        if name == "pre_forward" and groups[i].params and groups[i].name not in forward_order:
            forward_order.append(groups[i].name)
    config = dict(cfg)
    config.update(
        world_size=ws,
        reshard_after_forward={g.name: g.reshard_after_forward for g in groups},
        forward_prefetch=fwd,
        backward_prefetch=bwd,
        replayed=True,
    )
    return _report(report, config, units, forward_order, iterations, steps)


def _raf(raf: Any, name: str, fqns: tuple[str, ...]) -> bool | int:
    """``fully_shard``'s ``reshard_after_forward`` for one group, as ``analyze`` reads it."""
    if isinstance(raf, dict):
        for key in (name, *fqns):
            if key in raf:
                value: bool | int = raf[key]
                return value
        raf = None
    if raf is None:
        return fqns != ("",)  # torch's default: reshard all but the root
    result: bool | int = raf
    return result


def _indices(spec: dict[str, list[str]], where: dict[str, int]) -> dict[int, list[int]]:
    try:
        return {where[k]: [where[v] for v in vs] for k, vs in spec.items()}
    except KeyError as e:
        raise ConfigError(
            f"prefetch map names {e.args[0]!r}, which is not a fully_shard module"
        ) from e


def _fsdp2_entry(name: str, index: int, arg: Any) -> tuple[str, int, Any]:
    if name == "post_forward":
        return (name, index, tuple(arg))
    if name == "final_callback":
        return (name, index, {int(k): bool(v) for k, v in arg.items()})
    return (name, index, arg)


# ------------------------------------------------------------------- shared
def _run(
    runtime: Any, profile: TraceProfile, index: dict[str, int], entry: Any
) -> tuple[list[list[Event]], list[StepProfile]]:
    """Replay each iteration's hook calls; return its events and re-pointed profile."""
    iterations: list[list[Event]] = []
    steps: list[StepProfile] = []
    for step in profile.iterations:
        event_hook: list[int] = []
        for k, (name, unit, arg) in enumerate(step.hooks):
            runtime.replay([entry(name, index[unit], arg)])
            event_hook.extend([k] * (len(runtime.events) - len(event_hook)))
        iterations.append(runtime.take_events())
        steps.append(replace(step, event_hook=event_hook))
    return iterations, steps


def _report(
    base: Report,
    config: dict[str, Any],
    units: list[Unit],
    forward_order: list[str],
    iterations: list[list[Event]],
    steps: list[StepProfile],
) -> Report:
    assert base.profile is not None
    return replace(
        base,
        config=config,
        units=units,
        forward_order=forward_order,
        iterations=iterations,
        profile=replace(base.profile, iterations=steps),
    )
