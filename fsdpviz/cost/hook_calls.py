"""One iteration as a sequence of FSDP hook calls, each with the compute before it.

Both cost models walk this *tape*: for every hook call, first the compute that
ran before it (FLOPs, activation and temporary bytes, unsharded gradients
created, from ``report.profile``), then the events the hook issued, in order.
Reports without a profile (recordings of real runs, ``trace="fx"``) get a tape
with one hook call per event and no measured compute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from fsdpviz.errors import ConfigError
from fsdpviz.schema.events import Event
from fsdpviz.schema.profile import StepProfile
from fsdpviz.schema.report import Report


@dataclass(frozen=True)
class HookCall:
    """One FSDP hook call and the compute measured before it."""

    hook: str
    unit: str
    events: tuple[int, ...]  # indices into the iteration's events
    flops_forward: float
    flops_backward: float
    activations: int
    forward_temp: int
    backward_temp: int
    peak: int  # most activations + temp + new gradients during the compute before it
    peak_activations: int  # activations at that moment
    peak_forward_temp: int  # forward temp at that moment
    peak_grads: int  # new gradients at that moment (the rest is backward temp)
    grads: dict[str, int]  # unsharded gradient bytes created by that compute, by unit
    kernels: tuple[tuple[Any, ...], ...] = ()  # the GPU kernels of that compute (StepProfile)
    # (peak, activations, forward temp) with new gradients left out: the compute's peak when
    # it adds each gradient into one an earlier micro-step left (None: not measured)
    peak_in_place: Sequence[int] | None = None
    # the same less the gradients one forward call of a unit made that autograd held for
    # another call's (None: not measured; StepProfile.peak_unbuffered)
    peak_unbuffered: Sequence[int] | None = None
    arg: Any = None  # what the hook was called with (a pipeline action's name, a ring
    # attention's wait: the kind)
    # unit -> [bytes of float8 weights' saved scales freed before ``peak``, by the end]
    scales_freed: Mapping[str, Sequence[int]] = field(default_factory=dict)
    # unit -> the compute's peak (peak, activations, forward temp, grads, then in place:
    # peak, activations, forward temp) when the last tensor the unit's forward saved that
    # views its parameters was freed in it (StepProfile.param_views_freed)
    param_views_freed: Mapping[str, Sequence[int]] = field(default_factory=dict)

    @property
    def backward(self) -> bool:
        return self.hook in (
            "pre_backward", "post_backward", "post_backward_reshard_only", "final_callback",
            "tp_backward",  # a tensor-parallel collective in backward
            "cp_backward", "cp_backward_wait",  # ring attention's, in backward
        )  # fmt: skip


@dataclass(frozen=True)
class Tape:
    events: list[Event]
    calls: list[HookCall]
    tail: HookCall  # compute after the last hook call
    measured: bool  # False when the report has no profile
    # whether the profile has the float8 scales saved weights' backward nodes let go
    # (HookCall.scales_freed; absent in reports saved before they were measured)
    scales_measured: bool = False
    # whether the profile has the stretches where saved views of parameters were freed
    # (HookCall.param_views_freed; absent in reports saved before they were measured)
    views_measured: bool = False
    # what the memory model's moments call each event and hook call, by id (made once)
    described: dict[int, tuple[Any, str]] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def kernel_kinds(self) -> tuple[bool, bool]:
        """Whether any stretch's kernels hold a float32 matrix multiply, and a fused region
        (what the time model's notes say; looked at once per tape)."""
        kernels = [k for c in (*self.calls, self.tail) for k in c.kernels]
        return any(k[0] == "gemm" and k[6] == 4 for k in kernels), any(
            k[0] == "fused" for k in kernels
        )


def iteration_index(report: Report, iteration: int) -> int:
    n = len(report.iterations)
    if n == 0:
        raise ConfigError("the report has no iterations to model")
    if not -n <= iteration < n:
        raise ConfigError(f"iteration={iteration} is out of range for {n} iterations")
    return iteration % n


_TAPES: dict[tuple[int, int, int], tuple[list[Event], Any, Tape]] = {}


def tape(report: Report, iteration: int) -> Tape:
    """The tape of ``report.iterations[iteration]``, remembered for that event list and
    profile (the memory and time models read a report's tapes again for every option,
    machine and iteration they are asked about)."""
    i = iteration_index(report, iteration)
    events = report.iterations[i]
    profile = report.profile
    step = profile.iterations[i] if profile is not None and i < len(profile.iterations) else None
    key = (id(events), id(step), len(events))  # (an event list grown since: a new tape)
    found = _TAPES.get(key)
    if found is not None and found[0] is events and found[1] is step:
        return found[2]
    if step is None or len(step.event_hook) != len(events):
        made = _unmeasured(events)
    else:
        made = _measured(events, step)
    if len(_TAPES) >= 64:
        _TAPES.clear()
    _TAPES[key] = (events, step, made)
    return made


def _measured(events: list[Event], step: StepProfile) -> Tape:
    by_hook: dict[int, list[int]] = {}
    for e, k in enumerate(step.event_hook):
        by_hook.setdefault(k, []).append(e)
    n = len(step.hooks)
    # the peaks of in-place accumulation (absent in reports saved before they were measured)
    in_place = step.peak_in_place if len(step.peak_in_place) > n else [None] * (n + 1)
    calls = [
        _call(step, k, hook, unit, tuple(by_hook.get(k, ())), in_place[k], arg)
        for k, (hook, unit, arg) in enumerate(step.hooks)
    ]
    tail = _call(step, n, "end", "", (), in_place[n])
    return Tape(
        events, calls, tail, True, len(step.scales_freed) > n, len(step.param_views_freed) > n
    )


def _call(
    step: StepProfile,
    k: int,
    hook: str,
    unit: str,
    events: tuple[int, ...],
    in_place: Sequence[int] | None,
    arg: Any = None,
) -> HookCall:
    return HookCall(
        hook=hook,
        unit=unit,
        events=events,
        flops_forward=step.flops_forward[k],
        flops_backward=step.flops_backward[k],
        activations=step.activations[k],
        forward_temp=step.forward_temp[k],
        backward_temp=step.backward_temp[k],
        peak=step.peak[k],
        peak_activations=step.peak_activations[k],
        peak_forward_temp=step.peak_forward_temp[k],
        peak_grads=step.peak_grads[k],
        grads=step.grads[k],
        kernels=tuple(map(tuple, step.kernels[k])) if k < len(step.kernels) else (),
        peak_in_place=in_place,
        arg=arg,
        scales_freed=step.scales_freed[k] if k < len(step.scales_freed) else {},
        param_views_freed=(step.param_views_freed[k] if k < len(step.param_views_freed) else {}),
        peak_unbuffered=(
            None if step.peak_unbuffered is None else step.peak_unbuffered.get(k, in_place)
        ),
    )


def _bare(hook: str, unit: str, events: tuple[int, ...]) -> HookCall:
    """A hook call that measured nothing."""
    return HookCall(hook, unit, events, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, {})


def _unmeasured(events: list[Event]) -> Tape:
    """A tape of a report with no trace profile: each event its own hook call, but for a
    float8 weight's amax all-reduce (``group="shard"``), which goes with the event after it:
    torchao's ``fsdp_pre_all_gather`` runs it inside the unit's all-gather
    (``foreach_all_gather``), so it may not stand as a hook call between them."""
    calls: list[HookCall] = []
    held: list[int] = []
    for i, e in enumerate(events):
        following = events[i + 1] if i + 1 < len(events) else None
        if e.group == "shard" and following is not None and following.hook == e.hook:
            held.append(i)
            continue
        calls.append(_bare(e.hook or "unknown", e.hook_unit or e.unit, (*held, i)))
        held = []
    return Tape(events, calls, _bare("end", "", ()), False)
