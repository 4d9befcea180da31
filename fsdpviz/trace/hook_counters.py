"""The probe's counters at each FSDP hook call (`Mark`), cut into one profile per iteration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fsdpviz.schema.profile import StepProfile, StretchMoments, TraceProfile


@dataclass
class Mark:
    """Counters when one FSDP hook was called, for the compute since the previous one."""

    kernels: list[list[Any]]  # the GPU kernels of the stretch, merged (see StepProfile)
    flops_forward: float
    flops_backward: float
    activations: int
    forward_temp: int
    backward_temp: int
    peak: int  # most activations + temp + new gradients since the previous mark
    peak_activations: int  # activations when ``peak`` was reached
    peak_forward_temp: int  # forward temp when ``peak`` was reached
    peak_grads: int  # new gradients when ``peak`` was reached
    grads: dict[str, int]  # new unsharded gradient bytes by unit
    n_events: int  # events issued before this hook in the current iteration
    measured: bool  # False for hook calls replayed without running the model
    # (peak, activations, forward temp) with new gradients left out: what the stretch
    # reaches when each gradient is added into an existing one in place and freed
    peak_in_place: tuple[int, int, int] = (0, 0, 0)
    # unit -> [float8 weights' saved scales freed before ``peak``, by the stretch's end]
    scales_freed: dict[str, list[int]] = field(default_factory=dict)
    # unit -> the stretch's peak and in-place peak when the last tensor its forward saved
    # that views its parameters was freed (StepProfile.param_views_freed)
    param_views_freed: dict[str, list[int]] = field(default_factory=dict)
    moments: StretchMoments | None = None  # its moments, where kept (StepProfile.moments)
    # ``peak_in_place`` less the gradients one forward call of a unit made that autograd
    # holds for another call's (StepProfile.peak_unbuffered)
    peak_unbuffered: tuple[int, int, int] = (0, 0, 0)
    # each checkpointed region's frame let go of in the stretch (StepProfile.frames_released)
    frames_released: list[tuple[tuple[int, ...], int | None]] = field(default_factory=list)


EMPTY_MARK = Mark([], 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, {}, 0, True)


def without_backward(
    marks: list[Mark], tails: dict[int, Mark], log: list[Any], n_events: list[int]
) -> tuple[list[Mark], dict[int, Mark], list[Any]]:
    """The marks, tails and hook log of a step that ran no backward (a frozen pipeline stage
    whose inputs need no gradient), ended where its compute ended, as if by a final callback."""
    tail = tails.get(len(marks), EMPTY_MARK)
    ended = dataclasses.replace(tail, n_events=n_events[-1], measured=True)
    return [*marks, ended], {}, [*log, ("final_callback", 0, {})]


def cut_profile(
    marks: list[Mark],
    tails: dict[int, Mark],
    log: list[Any],
    n_events: list[int],
    unit_names: list[str],
    base: TraceProfile,
    call_gradients: bool = False,
) -> TraceProfile | None:
    """``base`` with one :class:`StepProfile` per iteration.

    ``marks[k]`` was recorded at ``log[k]``; ``tails[k]`` is the compute after
    the last hook of a step that ended with ``k`` marks; ``n_events[i]`` is the
    number of events of iteration ``i``. An iteration ends at its
    ``final_callback``. An iteration replayed without running the model (the
    steady state) takes the compute of the last measured one (the steady state's, where a
    second was traced), hook call by hook call. None when the log cannot be cut into that
    many iterations.
    """
    ends = [i + 1 for i, e in enumerate(log) if e[0] == "final_callback"]
    if len(ends) < len(n_events) or len(marks) != len(log) or not n_events:
        return None
    starts = [0, *ends[: len(n_events) - 1]]
    spans = list(zip(starts, ends[: len(n_events)], strict=True))
    # the last one measured: the steady state's (FSDP1 with forward prefetch traces it a
    # second time, its backward in another order; the micro-steps after replay it)
    measured = [s for s in spans if all(m.measured for m in marks[s[0] : s[1]])]
    source = measured[-1] if measured else None
    if source is None:
        return None
    steps: list[StepProfile] = []
    for (start, end), n in zip(spans, n_events, strict=True):
        own = marks[start:end]
        if all(m.measured for m in own):
            data = [*own, tails.get(end, EMPTY_MARK)]
        else:
            data = _matched(log, (start, end), source, marks, tails.get(source[1], EMPTY_MARK))
        bounds = [m.n_events for m in own[1:]] + [n]
        event_hook: list[int] = []
        for k, m in enumerate(own):
            event_hook.extend([k] * (bounds[k] - m.n_events))
        steps.append(
            StepProfile(
                hooks=[(str(e[0]), unit_names[e[1]], _json_arg(e[2])) for e in log[start:end]],
                event_hook=event_hook,
                flops_forward=[m.flops_forward for m in data],
                kernels=[[list(k) for k in m.kernels] for m in data],
                flops_backward=[m.flops_backward for m in data],
                activations=[m.activations for m in data],
                forward_temp=[m.forward_temp for m in data],
                backward_temp=[m.backward_temp for m in data],
                peak=[m.peak for m in data],
                peak_activations=[m.peak_activations for m in data],
                peak_forward_temp=[m.peak_forward_temp for m in data],
                peak_grads=[m.peak_grads for m in data],
                grads=[dict(m.grads) for m in data],
                peak_in_place=[list(m.peak_in_place) for m in data],
                peak_unbuffered=(
                    {
                        k: list(m.peak_unbuffered)
                        for k, m in enumerate(data)
                        if m.peak_unbuffered != m.peak_in_place
                    }
                    if call_gradients
                    else None
                ),
                scales_freed=[dict(m.scales_freed) for m in data],
                param_views_freed=[dict(m.param_views_freed) for m in data],
                moments=[m.moments for m in data],
                frames_released=[list(m.frames_released) for m in data],
            )
        )
    base.iterations = steps
    return base


def _matched(
    log: list[Any], span: tuple[int, int], source: tuple[int, int], marks: list[Mark], tail: Mark
) -> list[Mark]:
    """For each hook call of ``span``, the source's mark of the same call: the k-th call
    of a hook on a unit takes the compute before the k-th such call in the source."""
    where: dict[tuple[str, int, int], int] = {}
    seen: dict[tuple[str, int], int] = {}
    for i in range(*source):
        key = (log[i][0], log[i][1])
        where[(*key, seen.get(key, 0))] = i
        seen[key] = seen.get(key, 0) + 1
    seen.clear()
    out: list[Mark] = []
    for i in range(*span):
        key = (log[i][0], log[i][1])
        j = where.get((*key, seen.get(key, 0)))
        seen[key] = seen.get(key, 0) + 1
        out.append(marks[j] if j is not None else EMPTY_MARK)
    return [*out, tail]


def _json_arg(arg: Any) -> Any:
    """A runtime log argument as JSON: tuples become lists, dict keys strings."""
    if isinstance(arg, tuple):
        return list(arg)
    if isinstance(arg, dict):
        return {str(k): v for k, v in arg.items()}
    return arg
