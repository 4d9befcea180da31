"""A pipeline rank's step as the cost model walks it: its hook calls, each with the compute
measured before it, stitched from its stages' traces.

Each stage was traced on one microbatch (:class:`~fsdpviz.schema.profile.StepProfile`: the
compute before each of its hook calls, the bytes of activations and temporaries alive then).
A rank runs many microbatches of its stages, interleaved: each replayed hook call takes the
compute its stage's trace measured before the same call, and the bytes alive then are those
of its own microbatch plus those of every other microbatch in flight on the rank (forward
done, backward not yet: their activations and the stage output kept for the backward):

- a microbatch's forward ends with its stage's ``forward_end`` mark (after the last stage's
  loss); from there until its backward starts it holds that mark's activations and forward
  temporaries;
- gradients are allocated by a stage's first backward of the step and accumulated in place
  by the others, until ``REDUCE_GRAD`` reduces them; FSDP2 keeps them in the reduce dtype
  from the first backward's post-backward on (a ``float32`` copy of ``bfloat16`` gradients
  under ``MixedPrecisionPolicy(reduce_dtype=torch.float32)``), each later microbatch's own
  gradient alive until its post-backward adds it in;
- the last stage keeps each microbatch's output until the step ends (``output_chunks``,
  merged for ``step()``'s return, a copy as large at the step's end);
- a zero-bubble schedule's ``I`` holds what its stage's split trace measured
  (:mod:`fsdpviz.schedule.pipeline_split`), and from its end until the microbatch's ``W``
  what it keeps for ``W``; ``W`` holds its own most and sets the gradients where there
  were none; the input's gradient ``I`` leaves in its ``.grad`` stays to the step's end.

Actions that run no FSDP hook (``UNSHARD``, ``RESHARD``, the sends and receives, the
shape inference's reshard) are calls of hook ``pipeline`` with the action as their
argument and no compute; ``REDUCE_GRAD`` is each group's ``post_backward`` and the root's
``final_callback``, as FSDP runs them. The zero-bubble schedules' ``I`` and ``W`` split the
backward's matrix multiplies evenly (a linear's backward is one for its input's gradient
and one for its weight's): ``I`` runs the rest of the backward.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from fsdpviz.schema.events import Event
from fsdpviz.schema.profile import StepProfile

if TYPE_CHECKING:
    from fsdpviz.schedule.pipeline_split import SplitBackward, SplitKey, SplitTraces


@dataclass
class Call:
    """One hook call of a rank's step: what ran it and the events it issued."""

    hook: str
    unit: str
    arg: Any
    events: list[Event] = field(default_factory=list)
    stage: int | None = None
    mark: int | None = None  # the stage trace's hook call whose compute precedes it
    microbatch: int | None = None  # None: shape inference's
    part: str = ""  # "F", "B", "I", "W", "R" (REDUCE_GRAD) or "" (no compute)
    split: SplitKey | None = None  # I and W: which of the stage's split traces holds them


@dataclass(frozen=True)
class StageShape:
    """What the stitching needs of a stage beyond its profile."""

    forward_end: int  # index of the forward_end mark in its hook calls
    last: bool
    output_bytes: int
    units: frozenset[str] = frozenset()
    loss_bytes: int = 0  # the last stage's loss of one microbatch
    input_grad_bytes: int = 0  # the gradient of its inputs it sends back
    # its next stage is on the same rank (a V schedule): its output becomes that stage's
    # input buffer (PipelineStage.set_local_fwd_input), which no longer holds memory of its own
    output_local: bool = False
    split: SplitTraces | None = None  # its backward as I and W hold it (zero-bubble)


def rank_step_profile(
    calls: list[Call],
    profiles: dict[int, StepProfile],
    shapes: dict[int, StageShape],
    upcast: dict[str, float] | None = None,
    loop: str = "",
    microbatches: int = 0,
    cast_peaks: dict[str, int] | None = None,
) -> tuple[StepProfile, list[Event]]:
    """The rank's :class:`StepProfile` of one step, and its events in order. ``upcast``:
    the units whose reduce dtype is not their compute dtype, each with the one's size over
    the other's (FSDP2 keeps the gradients a backward without sync leaves in the reduce
    dtype, in more bytes or in fewer). ``loop``: ``"GPipe"`` or
    ``"1F1B"``, the schedule's own loop, else (``""``) torch's runtime of actions, which
    hold the tensors of a step differently (see :func:`_sent_until`); ``microbatches``: of
    the step; ``cast_peaks``: per unit, the most its cast to the reduce dtype holds above
    the gradients cast (``to_accumulated_grad_if_needed``, one parameter at a time), which
    the compute after the hook that casts starts from."""
    upcast = upcast or {}
    pending: dict[str, int] = {}  # unit -> what its reduce-dtype copy adds at post-backward
    unadded: dict[str, int] = {}  # unit -> a later microbatch's gradient, until added
    began: dict[str, tuple[int, int | None]] = {}  # unit -> the backward its pending began in
    events: list[Event] = []
    hooks: list[tuple[str, str, Any]] = []
    event_hook: list[int] = []
    cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
    inflight: dict[tuple[int, int | None], tuple[int, int]] = {}
    kept = 0  # the last stage's outputs, kept until the step ends
    losses = 0  # the last stage's losses, kept until the step's backwards are done
    sent: dict[tuple[int, int], int] = {}  # input gradients made, still referenced
    last_output = 0  # a loop's variable ``output``: its last forward's, to the step's end
    local: dict[tuple[int, int | None], int] = {}  # in-flight outputs that are input buffers
    allocated: dict[int, set[str]] = {}  # by stage: units whose unsharded gradients exist
    casting = 0  # the last call's casts to the reduce dtype: their most above its end

    def add(values: Stretch) -> None:
        if casting:  # the stretch starts at the cast's most
            end = cols["activations"][-1] + cols["forward_temp"][-1] + cols["backward_temp"][-1]
            values["peak"] = max(values["peak"], end + casting)
        _append(cols, values)

    waiting: dict[tuple[int, int | None], tuple[int, int]] = {}  # what I keeps until its W
    graded: dict[tuple[int, int], int] = {}  # inputs' gradients I leaves in their .grad
    for n, c in enumerate(calls):
        hooks.append((c.hook, c.unit, _json(c.arg)))
        for e in c.events:
            events.append(e)
            event_hook.append(n)
        key = (c.stage if c.stage is not None else -1, c.microbatch)
        if c.part == "R" and loop and c.stage is not None:
            # the schedule's loop hands its losses on, then reduces: its variable ``loss``
            # keeps the last microbatch's
            losses = min(losses, shapes[c.stage].loss_bytes)
        held = kept + losses + sum(sent.values()) + sum(graded.values()) + last_output
        # an output that is the next stage's input buffer is counted there; the call's own
        # (its first backward call) is left out with its in-flight temporaries below
        held -= sum(n for k, n in local.items() if k != key)
        others_act = sum(a for k, (a, _) in [*inflight.items(), *waiting.items()] if k != key)
        others_temp = held + sum(t for k, (_, t) in [*inflight.items(), *waiting.items()]
                                 if k != key)  # fmt: skip
        if (
            c.part == "W" and c.stage is not None and c.split is not None
        ):  # the other half of the backward's compute
            prof, shape = profiles[c.stage], shapes[c.stage]
            marks = range(shape.forward_end + 1, len(prof.hooks))
            values = _quiet(others_act, others_temp)
            values["flops_backward"] = 0.5 * sum(prof.flops_backward[k] for k in marks)
            values["kernels"] = [r for k in marks for r in _scaled(prof.kernels[k], "W")]
            split = None
            if shape.split is not None and c.split is not None:
                split = shape.split[c.split]
            if split is not None and key in waiting:
                _weight_backward(values, shape, split)
                mine = allocated.setdefault(c.stage, set())
                for unit, nbytes in values["grads"].items():
                    # a unit FSDP keeps in the reduce dtype: its next post-backward moves
                    # the new .grad into the copy (made then) or adds it there and frees it
                    if unit in upcast and unit not in mine:
                        pending[unit] = int(nbytes * (upcast[unit] - 1.0))
                    elif unit in upcast:
                        unadded[unit] = unadded.get(unit, 0) + nbytes
                mine.update(values["grads"])
                del waiting[key]
            add(values)
            casting = 0
        elif c.mark is None or c.stage is None:  # no compute: every microbatch in flight
            if c.part == "I" and key in inflight:
                # an I that finds no input needing a gradient (no autograd): the graph
                # goes with its outputs' detach_, they wait for W (backward_state)
                del inflight[key]
                local.pop(key, None)  # an input buffer of the next stage, counted there
                waiting[key] = (0, _output_to_w(shapes[key[0]]))
                kept += shapes[key[0]].output_bytes if shapes[key[0]].last else 0
                losses += shapes[key[0]].loss_bytes if shapes[key[0]].last else 0
            elif c.part == "W":
                waiting.pop(key, None)
            pairs = [*inflight.values(), *waiting.values()]
            act = sum(a for a, _ in pairs)  # its own too (a send of its output)
            values = _quiet(act, sum(t for _, t in pairs) + held - local.get(key, 0))
            if c.hook == "post_backward" and c.part == "R" and c.unit in unadded:
                # REDUCE_GRAD's post-backward first adds the .grad a W left into FSDP2's
                # reduce-dtype copy and frees it (accumulate_unsharded_grad_if_needed: an
                # in-place add across the dtypes, no cast made), then reshards and reduces
                values["grads"] = {c.unit: -unadded.pop(c.unit)}
            add(values)
            casting = 0
        else:
            prof = profiles[c.stage]
            # the memory of I as the stage's trace of it measured (its compute: below)
            traces = shapes[c.stage].split
            split = None
            if c.part == "I" and traces is not None and c.split is not None:
                split = traces[c.split]
            mem = split.profile if split is not None and split.profile is not None else prof
            k = c.mark
            share = 0.5 if c.part == "I" else 1.0  # the weight gradient's FLOPs run in W
            grads = {} if c.microbatch is None else mem.grads[k]
            mine = allocated.setdefault(c.stage, set())
            in_place = False
            if grads and set(grads) <= mine:
                # accumulated in place into the gradients already there; but a unit FSDP
                # keeps in the reduce dtype has no .grad (to_accumulated_grad_if_needed
                # moved it into the copy): autograd makes it anew, and the unit's
                # post-backward adds it into the copy and frees it
                grads = {u: n for u, n in grads.items() if u in upcast}
                in_place = not grads and k < len(mem.peak_in_place)  # absent in old profiles
            for unit, nbytes in grads.items():
                if unit not in upcast:
                    continue
                if unit not in mine:
                    pending[unit] = int(nbytes * (upcast[unit] - 1.0))
                    began[unit] = key
                elif unit in pending and began.get(unit) == key:
                    # more of the first gradients of the unit, in the same backward (its
                    # backward split into stretches by hook calls: a tensor-parallel
                    # collective between two of its linears): its post-backward casts them
                    # all
                    pending[unit] += int(nbytes * (upcast[unit] - 1.0))
                else:
                    unadded[unit] = unadded.get(unit, 0) + nbytes
            made = sum(grads.values())
            # FSDP2's post-backward without gradient sync: the unit's gradient is kept in
            # the reduce dtype (to_accumulated_grad_if_needed); the final callback runs it
            # for the units whose post-backward did not fire
            converted = [c.unit] if c.hook == "post_backward" else []
            if c.hook == "final_callback" and c.part in ("B", "I"):
                converted = [u for u in [*pending, *unadded] if u in shapes[c.stage].units]
            moved, top = 0, 0  # what the casts add, and their most above it (cast_peaks)
            for unit in converted:
                if c.microbatch is None:
                    continue
                if unit in pending:
                    top = max(top, moved + pending[unit] + (cast_peaks or {}).get(unit, 0))
                    moved += pending[unit]
                    grads = {**grads, unit: grads.get(unit, 0) + pending.pop(unit)}
                elif unit in unadded:
                    moved -= unadded[unit]
                    grads = {**grads, unit: grads.get(unit, 0) - unadded.pop(unit)}
            cast_next = max(0, top - moved)
            new = sum(grads.values())
            peak_grads = mem.peak_grads[k] if new or made else 0
            peak = mem.peak[k] - mem.peak_grads[k] + peak_grads
            peak_act, peak_fwd = mem.peak_activations[k], mem.peak_forward_temp[k]
            if in_place:
                # autograd adds each new gradient into the one an earlier microbatch left and
                # frees it (AccumulateGrad): the most the trace saw with new gradients as
                # temporaries until added, not where the first microbatch's peak was
                peak, peak_act, peak_fwd = mem.peak_in_place[k]
            # the trace keeps the stage's output to its end; one that is the next stage's
            # input buffer is counted there from the forward's end on
            shape = shapes[c.stage]
            buffer = shape.output_bytes if shape.output_local and c.part in ("B", "I") else 0
            buffer = 0 if c.microbatch is None else buffer
            add(
                {
                    "flops_forward": prof.flops_forward[k] * share,
                    "flops_backward": prof.flops_backward[k] * share,
                    "kernels": _scaled(prof.kernels[k] if k < len(prof.kernels) else [], c.part),
                    "activations": mem.activations[k] + others_act,
                    "forward_temp": mem.forward_temp[k] - buffer + others_temp,
                    "backward_temp": mem.backward_temp[k],
                    "peak": peak - buffer + others_act + others_temp,
                    "peak_activations": peak_act + others_act,
                    "peak_forward_temp": peak_fwd - buffer + others_temp,
                    "peak_grads": peak_grads,
                    "grads": dict(grads),
                },
            )
            casting = cast_next
            mine |= set(grads)
            if c.part == "F" and k == shape.forward_end:
                inflight[key] = (prof.activations[k], prof.forward_temp[k])
                if shape.output_local and c.microbatch is not None:
                    local[key] = shape.output_bytes  # counted with the inputs already
            elif c.part in ("B", "I") and key in inflight:
                del inflight[key]  # its backward holds them now, as its own trace did
                local.pop(key, None)  # the input buffer holds it on, counted there
            # its backward's end: FSDP's final callback, or a frozen stage's action
            ended = c.hook in ("final_callback", "pipeline")
            if c.part in ("B", "I") and ended and c.microbatch is not None:
                if shape.last:
                    kept += shape.output_bytes
                    losses += shape.loss_bytes
                elif loop and c.microbatch == microbatches - 1:
                    last_output = shape.output_bytes
                if loop == "1F1B":  # its list of send ops is replaced after this backward
                    for other in [k for k in sent if k[0] == c.stage]:
                        del sent[other]
                if split is not None and c.part == "I":
                    held_act, held_temp = split.held
                    waiting[key] = (held_act, held_temp + _output_to_w(shape))
                    if shape.input_grad_bytes:  # to the next step's clear_runtime_states
                        graded[(c.stage, c.microbatch)] = shape.input_grad_bytes
                elif shape.input_grad_bytes:
                    sent[(c.stage, c.microbatch)] = shape.input_grad_bytes
        reshard = c.hook == "pipeline" and isinstance(c.arg, str) and c.arg.endswith("RESHARD")
        if reshard and c.microbatch is None and c.stage is not None:
            inflight.pop((c.stage, None), None)  # shape inference's clean-up drops what it left
        if c.hook == "final_callback" and c.part == "R" and c.stage is not None:
            allocated.pop(c.stage, None)  # REDUCE_GRAD reduced them
        sending = _SEND_B.match(c.arg) if c.hook == "pipeline" and isinstance(c.arg, str) else None
        if sending and not (
            loop == "1F1B" or (loop == "GPipe" and c.microbatch == microbatches - 1)
        ):
            sent.pop((int(sending[1]), int(sending[2])), None)
    # after the last call, the step's end: step() returns the last stage's outputs merged
    # (merge_chunks: torch.cat of output_chunks, which it keeps), a new tensor as large
    end = _quiet(0, kept + sum(graded.values()))
    end["peak"] += kept
    end["peak_forward_temp"] += kept
    add(end)
    columns: dict[str, Any] = cols  # each a list, one entry per stretch
    step = StepProfile(hooks=hooks, event_hook=event_hook, **columns)
    return step, events


def _weight_backward(values: Stretch, shape: StageShape, split: SplitBackward) -> None:
    """``values``, a ``W``'s stretch of the quiet others, with what the ``W`` of a stage
    traced as ``I`` and ``W`` holds (:mod:`fsdpviz.schedule.pipeline_split`): its most, and
    the gradients it sets where there were none."""
    extra = _output_to_w(shape)
    most, act, fwd = split.most
    values["peak"] += most + extra
    values["peak_activations"] += act
    values["peak_forward_temp"] += fwd + extra
    values["grads"] = dict(split.grads)


def _output_to_w(shape: StageShape) -> int:
    """The stage's output, kept from ``I`` to ``W`` (``PipelineStage.backward_state``): the
    last stage's is kept to the step's end anyway, one that is the next stage's input buffer
    is that buffer."""
    return 0 if shape.last or shape.output_local else shape.output_bytes


# Where a stage's gradient of its inputs goes after its backward: ``PipelineStage`` keeps it
# (``bwd_cache``) until ``get_bwd_send_ops`` puts it in the list of ops that sends it. Torch's
# runtime of actions drops that list at once (``send_ops`` keeps the sends' works); GPipe's
# loop holds it in ``ops`` until the next microbatch's receive (the last one's to the end of
# the step); 1F1B's in ``bwd_sends`` until the next backward is done (the last one's, to
# the end). The last stage's losses (``_internal_losses``) are kept to the end of its
# backwards: the loops hand them on before ``perform_reduce_grad`` (keeping the last one in
# a variable), the runtime at the end of the step. The loops' variable ``output`` keeps
# the last forward's output past its backward (the runtime's is local to each action).
_SEND_B = re.compile(r"^(\d+)SEND_B(\d+)$")

_COLUMNS = (
    "flops_forward", "flops_backward", "activations", "forward_temp", "backward_temp", "peak",
    "peak_activations", "peak_forward_temp", "peak_grads", "grads", "kernels",
)  # fmt: skip


class Stretch(TypedDict):
    """One stretch of the step's profile (a :class:`StepProfile` column each, by name)."""

    flops_forward: float
    flops_backward: float
    kernels: list[list[Any]]
    activations: int
    forward_temp: int
    backward_temp: int
    peak: int
    peak_activations: int
    peak_forward_temp: int
    peak_grads: int
    grads: dict[str, int]


def _quiet(activations: int, temp: int) -> Stretch:
    """No compute: what the other microbatches hold."""
    return {
        "flops_forward": 0.0, "flops_backward": 0.0, "kernels": [],
        "activations": activations, "forward_temp": temp, "backward_temp": 0,
        "peak": activations + temp, "peak_activations": activations,
        "peak_forward_temp": temp, "peak_grads": 0, "grads": {},
    }  # fmt: skip


def _append(cols: dict[str, list[Any]], values: Stretch) -> None:
    row: Mapping[str, object] = values
    for k in _COLUMNS:
        cols[k].append(row[k])


def _scaled(kernels: list[list[Any]], part: str) -> list[list[Any]]:
    """The kernels of a backward stretch that ``part`` runs: ``I`` (the input gradient)
    all of them but half of each matrix multiply, ``W`` (the weight gradient) the other
    half of the matrix multiplies (``M`` halved: ``["gemm", backward, M, N, K, ...]``)."""
    if part not in ("I", "W"):
        return [list(k) for k in kernels]
    out: list[list[Any]] = []
    for k in kernels:
        if k[0] == "gemm" and k[1]:
            out.append([k[0], k[1], max(1, int(k[2]) // 2), *k[3:-1], k[-1] / 2])
        elif part == "I":
            out.append(list(k))
    return out


def _json(arg: Any) -> Any:
    """A hook call's argument as JSON holds it (tuples as lists, keys as strings)."""
    if isinstance(arg, tuple):
        return [_json(a) for a in arg]
    if isinstance(arg, dict):
        return {str(k): v for k, v in arg.items()}
    return arg
