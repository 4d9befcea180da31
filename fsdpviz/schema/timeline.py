"""The time model's result: :class:`Timeline`, when each event starts and ends.

How it is modelled is documented in :mod:`fsdpviz.cost.time`, which computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsdpviz.schema.names import unit_label
from fsdpviz.schema.rows import (
    Bottleneck,
    Bubble,
    ComputeStretch,
    HookTime,
    MicroStep,
    Scalar,
    StepWork,
    TimedEvent,
    Wait,
)
from fsdpviz.schema.serial import Record, each, key
from fsdpviz.schema.tables import dataframe


@dataclass
class Timeline(Record):
    """Start and end (seconds from the start of the iteration) of every event.

    ``events``: per event ``index``, ``kind``, ``unit``, ``phase``, ``stream``, ``issued`` (when
    the CPU issued it: the CPU clock when its hook ran, after any wait of FSDP1's rate limiter;
    never after ``start``), ``compute_t`` (where the compute stream is at that hook: a free
    takes effect there), ``start``, ``end``, ``bytes`` (sent by this rank), ``exposed`` (compute
    time lost waiting for it, the step's tail waiting for the last collective included), and why
    it ran when it did: ``hook`` and ``hook_unit`` (who issued it), ``prefetch``,
    ``rate_limited_s`` (how long FSDP1's rate limiter held the CPU before issuing it), ``held``
    (what its start waited for beyond its issue: ``"stream"``, the collective before it;
    ``"copy_out"``, FSDP2's copy-out of the all-gather ``held_by``; ``"h2d"``, its shard's copy
    to the device; ``"compute"``, the compute producing its gradients; ``"rate_limiter"``,
    issued when the limiter let it; ``"optimizer"``, the optimizer step, which the float8
    scales' all-reduce of ``precompute_float8_dynamic_scale_for_fsdp`` follows; ``""``) and
    ``held_by`` (that event, -1 for none), ``group`` where the event states one (``"shard"``:
    an all-reduce of float8 amaxes over FSDP's shard group, no gradient's). ``compute``: per
    stretch of compute ``hook``, ``unit`` (the hook call it precedes), ``owner`` (whose
    forward or backward it is: the unit a pre-forward or pre-backward hook opened last
    and no post hook closed yet, ``""`` outside every unit),
    ``phase``, ``next_event`` (the first event issued at or after that hook call), ``start``,
    ``end``, ``duration``, ``flops``, ``flops_per_s`` (achieved) and ``peak_share`` (of the
    GPU's dense peak in the compute dtype). ``totals``: ``step_s``, ``compute_s``, ``comm_s``,
    ``exposed_comm_s``, ``overlap`` (share of communication hidden by compute), ``optimizer_s``,
    ``all_gather_bytes``, ``reduce_scatter_bytes``, and the exposed communication by phase of
    the collective waited for, ``exposed_forward_s`` and ``exposed_backward_s`` (their sum is
    ``exposed_comm_s``); the compute by kind, ``matmul_s``, ``attention_s``, ``memory_bound_s``,
    ``copy_s`` (FSDP2's copy-out), ``cpu_bound_s`` (time the GPU waited for the CPU to issue
    kernels); throughput, ``micro_batches``, ``micro_step_s``, ``tokens`` (per step and GPU),
    ``tokens_per_s`` (per GPU), ``model_flops`` / ``hardware_flops`` (per step and GPU),
    ``mfu``, ``hfu`` (0 when the report has no trace profile). Times, bytes and exposure of
    ``events``, ``compute`` and ``waits`` are those of the micro-step ``iteration`` chose (by
    default the step's last). ``hooks``: per hook call ``hook``, ``unit``, ``t`` (when the CPU
    runs it: the CPU runs ahead of the GPU, by the kernels' launch time, and waits only where
    FSDP makes it), ``compute_t`` (where the compute stream is then, in its own order) and
    ``events`` (the indices it issued). ``waits``: every stretch of time the compute stream
    spends waiting for communication (as much as the wait adds), ``start``, ``end``, ``event``
    (the collective waited for), ``phase`` (its phase), ``tail`` (the final wait for the last
    collective, after the last compute). ``micro_steps``: per micro-step of the optimizer step
    (one without gradient accumulation), ``iteration`` (its index in ``report.iterations``),
    ``start``, ``end``, ``sync`` (whether it reduces gradients) and its own ``compute_s``,
    ``comm_s``, ``exposed_comm_s``, bytes and compute by kind; the ``totals`` are their sums
    (per optimizer step). ``machine["topology"]``: where each mesh dimension's groups sit
    (:class:`fsdpviz.cost.topology.Span`, with ``role`` and ``link``). ``step_work``: the
    compute after the last micro-step (:class:`~fsdpviz.schema.rows.StepWork`: the optimizer
    step, and torchao's float8 scale precomputation around its all-reduce), where
    ``iteration`` is the step's last micro-step (else empty), in its time (a pipeline job's:
    every pipeline rank's, each with its ``rank``, in the time of that rank's own last
    micro-step).

    Why is it slow: :meth:`bottlenecks` ranks the waits; :meth:`bottleneck_table` prints them.

    Example::

        tl = fsdpviz.cost.timeline(report, machine("a100", network="roce-100"))
        tl.totals["exposed_comm_s"], tl.summary()
        tl.bottlenecks()[0]["reason"]
    """

    machine: dict[str, Any] = field(metadata=key(read=dict))
    events: list[TimedEvent] = field(metadata=key(read=each(TimedEvent.from_dict)))
    compute: list[ComputeStretch] = field(metadata=key(read=each(ComputeStretch.from_dict)))
    totals: dict[str, float] = field(metadata=key(read=dict))
    notes: list[str] = field(default_factory=list, metadata=key(read=list))
    hooks: list[HookTime] = field(default_factory=list, metadata=key(read=each(HookTime.from_dict)))
    waits: list[Wait] = field(default_factory=list, metadata=key(read=each(Wait.from_dict)))
    micro_steps: list[MicroStep] = field(
        default_factory=list, metadata=key(read=each(MicroStep.from_dict))
    )
    step_work: list[StepWork] = field(
        default_factory=list, metadata=key(read=each(StepWork.from_dict))
    )

    def records(self) -> list[dict[str, Scalar]]:
        """One plain dict per event (what :meth:`to_pandas` shows)."""
        return [r.to_dict() for r in self.events]

    def arrays(self) -> dict[str, list[float]]:
        """``{"start": [...], "end": [...], "exposed": [...]}`` per event."""
        return {
            "start": [float(r.start) for r in self.events],
            "end": [float(r.end) for r in self.events],
            "exposed": [float(r.exposed) for r in self.events],
        }

    def to_pandas(self) -> Any:
        """The records as a ``pandas.DataFrame`` (needs pandas)."""
        return dataframe(self.records())

    def summary(self) -> str:
        t = self.totals
        d = duration_text
        ranks = int(t.get("pp_ranks", 0))
        over = f" (summed over its {ranks} pipeline ranks)" if ranks > 1 else ""
        text = (
            f"step {d(t['step_s'])} on {self.machine['name']}: compute {d(t['compute_s'])}, "
            f"communication {d(t['comm_s'])} of which {d(t['exposed_comm_s'])} exposed "
            f"({t['overlap']:.0%} hidden){over}"
        )
        if t.get("bubble_s", 0.0) > 0:
            share = t["bubble_s"] / (t["step_s"] * max(1, ranks)) if t["step_s"] > 0 else 0.0
            text += f"; pipeline bubbles {d(t['bubble_s'])} ({share:.0%} of the GPU time)"
        if t.get("tokens_per_s", 0.0) > 0:
            text += "\n" + throughput_line(t)
        return text

    def __repr__(self) -> str:
        return f"Timeline({self.summary()})"

    def bottlenecks(self) -> list[dict[str, Scalar]]:
        """The collectives the compute waited for, most exposed time first.

        One mapping per event with exposed time: ``unit``, ``kind``, ``phase``, ``exposed_s``
        (compute time lost waiting for it), ``share`` (of the step's exposed communication),
        ``cause`` (``"first"``: the step's first all-gather, with no compute before it;
        ``"not_prefetched"``: its own hook issued it when its compute needed it;
        ``"rate_limited"``: FSDP1's ``limit_all_gathers`` held its issue; ``"queued"``:
        behind other collectives on the communication stream; ``"copy_out"``: FSDP2 waits
        for the previous all-gather's copy-out; ``"cpu_offload"``: its shard's copy to the
        device; ``"short_window"``: prefetched, but with less compute ahead than it takes;
        ``"tensor_parallel"``: tensor parallelism's collective, needed at once;
        ``"context_parallel"``: ring attention's exchange, longer than a block of attention
        (compiled: waited for once issued);
        ``"tail"``:
        the step's end waits for it after the last compute), ``reason`` in words, and
        ``event``, ``hook``, ``hook_unit``, ``prefetch``, ``issued``, ``start``, ``end``,
        ``duration_s``, ``needed_at`` (when the compute wanted it; None for a tail) and
        ``tail_s`` (the part of ``exposed_s`` spent at the step's tail).

        The ``exposed_s`` add up to ``totals["exposed_comm_s"]`` exactly, summed in this
        order (``sum(b["exposed_s"] for b in tl.bottlenecks())``). Under gradient
        accumulation the events are the step's last micro-step's, and they add up to its own
        exposed communication, ``micro_steps[-1]["exposed_comm_s"]``.

        Example::

            for b in report.timeline.bottlenecks()[:3]:
                print(b["kind"], b["unit"], b["exposed_s"], b["reason"])
        """
        return [b.to_dict() for b in self.bottleneck_records()]

    def bottleneck_records(self) -> list[Bottleneck]:
        """:meth:`bottlenecks` as typed records (:class:`~fsdpviz.schema.rows.Bottleneck`)."""
        by_index = {r.index: r for r in self.events}
        if len(self.micro_steps) > 1:
            total = self.micro_steps[-1].exposed_comm_s
        else:
            total = self.totals.get("exposed_comm_s", 0.0)
        rows: list[Bottleneck] = []
        for r in self.events:
            if r.exposed <= 0:
                continue
            waits = [w for w in self.waits if w.event == r.index]
            tail = sum(w.end - w.start for w in waits if w.tail)
            needed = min((w.start for w in waits if not w.tail), default=None)
            cause, reason = _explain(r, by_index, self.compute, needed, tail)
            rows.append(
                Bottleneck(
                    unit=r.unit,
                    kind=r.kind,
                    phase=r.phase,
                    exposed_s=r.exposed,
                    share=r.exposed / total if total > 0 else 0.0,
                    cause=cause,
                    reason=reason,
                    event=r.index,
                    hook=r.hook,
                    hook_unit=r.hook_unit,
                    prefetch=bool(r.prefetch),
                    issued=r.issued,
                    start=r.start,
                    end=r.end,
                    duration_s=r.end - r.start,
                    needed_at=needed,
                    tail_s=tail,
                )
            )
        rows.sort(key=lambda b: (-b.exposed_s, b.event))
        return rows

    def bubbles(self) -> list[dict[str, Scalar]]:
        """Under pipeline parallelism, the compute's waits for another pipeline rank (the
        pipeline's bubbles), longest first: per receive the compute waited for, ``rank``,
        ``stage``, ``microbatch``, ``peer`` (the stage that sends), ``what``
        (``"activations"`` or ``"gradients"``), ``waited_s``, ``event``, ``action`` and
        ``reason`` in words (``"rank 3 waits 41 ms for microbatch 5's activations from
        stage 2"``). They add up to ``totals["bubble_s"]``.

        Example::

            report.timeline.bubbles()[0]["reason"]
        """
        return [b.to_dict() for b in self.bubble_records()]

    def bubble_records(self) -> list[Bubble]:
        """:meth:`bubbles` as typed records (:class:`~fsdpviz.schema.rows.Bubble`)."""
        rows: list[Bubble] = []
        for r in self.events:
            waited = float(r.bubble or 0.0)
            if waited <= 0:
                continue
            forward = r.phase == "forward"
            stage = int(r.stage or 0)
            peer = stage - 1 if forward else stage + 1
            what = "activations" if forward else "gradients"
            rank = r.rank
            who = f"rank {rank}" if rank is not None else "this rank"
            rows.append(
                Bubble(
                    rank=rank,
                    stage=stage,
                    microbatch=r.microbatch,
                    peer=peer,
                    what=what,
                    waited_s=waited,
                    event=r.index,
                    action=r.action,
                    reason=f"{who} waits {duration_text(waited)} for microbatch "
                    f"{r.microbatch}'s {what} from stage {peer} (stage {stage}'s "
                    f"{r.action})",
                )
            )
        rows.sort(key=lambda b: (-b.waited_s, b.event))
        return rows

    def bottleneck_table(self, limit: int | None = 10) -> str:
        """:meth:`bottlenecks` as a table for people, the ``limit`` largest (None: all).

        Example::

            print(report.timeline.bottleneck_table())
        """
        rows = self.bottleneck_records()
        t = self.totals
        head = (
            f"exposed communication {duration_text(t['exposed_comm_s'])} of a "
            f"{duration_text(t['step_s'])} step, {len(rows)} wait(s)"
        )
        bubbles = self.bubble_records()
        if bubbles:
            head = (
                f"pipeline bubbles {duration_text(t['bubble_s'])}, "
                f"{len(bubbles)} wait(s) for another rank; the longest: "
                + "; ".join(b.reason for b in bubbles[:3])
                + "\n"
                + head
            )
        if not rows:
            return head + ": the compute never waits for communication"
        lines = [head, f"{'exposed':>9} {'share':>5}  {'event':<36} why"]
        events = {r.index: r for r in self.events}
        shown = rows if limit is None else rows[:limit]
        for b in shown:
            kind = f"float8 amax {b.kind}" if events[b.event].group == "shard" else b.kind
            what = f"#{b.event} {kind} {unit_label(b.unit)} ({b.phase})"
            lines.append(f"{duration_text(b.exposed_s):>9} {b.share:>5.0%}  {what:<36} {b.reason}")
        if len(rows) > len(shown):
            rest = rows[len(shown) :]
            causes: dict[str, int] = {}
            for b in rest:
                causes[b.cause] = causes.get(b.cause, 0) + 1
            why = ", ".join(f"{n} {c}" for c, n in sorted(causes.items(), key=lambda x: -x[1]))
            lost = duration_text(sum(b.exposed_s for b in rest))
            lines.append(f"… {len(rest)} more wait(s), {lost} ({why})")
        return "\n".join(lines)


def duration_text(seconds: float) -> str:
    """``seconds`` to three significant figures in s, ms or µs: ``"48.8 µs"``, ``"2.45 ms"``."""
    for unit, scale in (("µs", 1e-6), ("ms", 1e-3)):
        text = f"{seconds / scale:.3g}"
        if abs(float(text)) < 1000:
            return f"{text} {unit}"
    return f"{seconds:.3g} s"


def throughput_line(totals: dict[str, float]) -> str:
    """``"5,762 tokens/s per GPU, MFU 33.8%, HFU 41.0%"`` from a timeline's totals."""
    return (
        f"{totals['tokens_per_s']:,.0f} tokens/s per GPU, MFU {totals['mfu']:.1%}, "
        f"HFU {totals['hfu']:.1%}"
    )


def _explain(
    r: TimedEvent,
    by_index: dict[int, TimedEvent],
    compute: list[ComputeStretch],
    needed: float | None,
    tail: float,
) -> tuple[str, str]:
    """Why the compute waited for event ``r``: a cause and a sentence (see ``bottlenecks``)."""
    d = duration_text
    kind, unit = r.kind, unit_label(r.unit)
    hook = r.hook
    issuer = f"{hook} of {unit_label(r.hook_unit)}" if hook else "its hook"
    own = not r.prefetch and r.hook_unit == r.unit and kind == "all_gather"
    how = f"not prefetched, {issuer} issued it" if own else f"issued by {issuer}"
    if r.prefetch:
        how = f"prefetched by {issuer}"
        if hook == "post_backward":
            how += " (BACKWARD_POST: after that unit's backward; BACKWARD_PRE issues it earlier)"
    lasts = d(r.end - r.start)
    other = by_index.get(r.held_by)
    other_text = _named(other) if other is not None else "?"
    held = r.held
    parts: list[tuple[str, str]] = []
    if needed is not None:
        late = d(r.start - r.issued)
        window = (
            f"{d(needed - r.start)} before" if needed > r.start else f"{d(r.start - needed)} after"
        )
        hint = ""
        if own:
            hint = (
                "; forward prefetch (FSDP1 forward_prefetch=True, FSDP2 "
                "set_modules_to_forward_prefetch) issues it a unit earlier"
                if r.phase == "forward"
                else "; backward prefetch (FSDP1 BACKWARD_PRE, FSDP2 "
                "set_modules_to_backward_prefetch) issues it a unit earlier"
            )
        if kind.startswith("tp_"):
            module = repr(r.module) if r.module else "a module"
            parts.append(
                ("tensor_parallel",
                 f"tensor parallelism's {kind.removeprefix('tp_')} of {module} in {unit}: the "
                 f"compute after it needs its result, so nothing overlaps its {lasts}")
            )  # fmt: skip
        elif kind.startswith("cp_"):
            module = repr(r.module) if r.module else "a module"
            what = "keys and values" if kind == "cp_all_gather" else "key and value gradients"
            why = (
                f"only one block of attention ran while it took {lasts}"
                if needed is None or needed - r.start > 1e-9  # (sums of floats: to a ns)
                else f"no attention ran while it took {lasts} (a compiled ring waits for each "
                "of its collectives as soon as it is issued)"
            )
            parts.append(
                ("context_parallel",
                 f"context parallelism's {kind.removeprefix('cp_')} of the {what} of "
                 f"{module}'s ring attention in {unit}: the ring's next block needs them, and "
                 f"{why}")
            )  # fmt: skip
        elif held == "stream":
            # issuing it earlier helps only to get ahead of a reduction, not of all-gathers;
            # or of its own float8 amax all-reduces, which go with it
            reduction = other is not None and (
                other.kind == "reduce_scatter"
                or (other.kind == "all_reduce" and other.group != "shard")
                or (other.group == "shard" and other.unit == r.unit and other.module is not None)
            )
            parts.append(
                ("queued",
                 f"queued behind {other_text} on the communication stream: {how}, it started "
                 f"{late} after its issue, {window} its compute needed it, and took "
                 f"{lasts} (the collectives ahead of it take longer than the compute between "
                 f"them){hint if reduction else ''}")
            )  # fmt: skip
        elif held == "rate_limiter":
            parts.append(
                ("rate_limited",
                 f"rate-limited: FSDP1's limit_all_gathers (at most two all-gathers in flight) "
                 f"held the CPU {d(r.rate_limited_s)} until {other_text} ran, so "
                 f"{issuer} issued it only {window} its compute needed it; it took "
                 f"{lasts}")
            )  # fmt: skip
        elif held == "copy_out":
            parts.append(
                ("copy_out",
                 f"{how}, it started {late} after its issue, once {other_text} was copied out "
                 f"(FSDP2 starts an all-gather only after the previous one's copy-out on the "
                 f"compute stream): {window} its compute needed it, and it took {lasts}")
            )  # fmt: skip
        elif held == "h2d":
            parts.append(
                ("cpu_offload",
                 f"waited {late} for its shard's copy from host memory (CPU offload), then "
                 f"took {lasts}, {window} its compute needed it")
            )  # fmt: skip
        elif not any(c.start < r.start for c in compute):
            parts.append(
                ("first",
                 f"the step's first {kind}{_float8_aside(r)}: no compute runs before it to "
                 f"hide its {lasts} ({how})")
            )  # fmt: skip
        elif own:
            parts.append(
                ("not_prefetched",
                 f"{how} when its compute needed it ({window}), so nothing hides its "
                 f"{lasts}{hint}")
            )  # fmt: skip
        else:
            parts.append(
                ("short_window",
                 f"{how} {window} its compute needed it, and it takes "
                 f"{lasts}: communication longer than the compute that hides it")
            )  # fmt: skip
    if tail > 0 and held == "optimizer":
        parts.append(
            ("tail",
             f"the step's tail: {_named(r)} starts after the optimizer step and torchao's "
             f"norms of the float8 weights' shards, and takes {lasts}, and nothing overlaps "
             "it: the scales' clamp after it waits "
             "for it on the compute stream, and the next step's first float8 all-gather after "
             "that")
        )  # fmt: skip
    elif tail > 0 and r.group == "shard" and r.module is None:
        behind = f", queued behind {other_text}" if held == "stream" else ""
        parts.append(
            ("tail",
             f"the step's tail: {_named(r)} runs after the last compute and the step ends "
             f"{d(tail)} later ({behind.removeprefix(', ')}{'; ' if behind else ''}it took "
             f"{lasts})")
        )  # fmt: skip
    elif tail > 0:
        behind = f", queued behind {other_text}" if held == "stream" else ""
        parts.append(
            ("tail",
             f"the step's tail: the final callback waits {d(tail)} for this {kind} of {unit} "
             f"({how}{behind}; it took {lasts}) after the last compute")
        )  # fmt: skip
    cause = "tail" if tail >= r.exposed - tail else parts[0][0]
    return cause, "; then ".join(text for _, text in parts)


def _named(r: TimedEvent) -> str:
    """Event ``r`` as a text names it: its kind and unit (``"reduce_scatter 'layers.0'"``),
    or, for an all-reduce over FSDP's shard group, the float8 amaxes it reduces (torchao's
    float8 all-gather: no gradient; see [Note: float8 all-gather amaxes])."""
    if r.group == "shard" and r.module is not None:
        unit = unit_label(r.unit)
        return f"the float8 amax all-reduce of {r.module!r} (before the all-gather of {unit})"
    if r.group == "shard":
        return (f"the float8 scales' all-reduce of {unit_label(r.unit)} (every float8 weight's "
                "amax, reduced by precompute_float8_dynamic_scale_for_fsdp after the optimizer "
                "step)")  # fmt: skip
    return f"{r.kind} {unit_label(r.unit)}"


def _float8_aside(r: TimedEvent) -> str:
    """After an event's kind, what it is where its kind does not say it (see :func:`_named`)."""
    return f", {_named(r)}" if r.group == "shard" else ""
