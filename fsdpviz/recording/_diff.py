"""``fsdpviz.diff``: a recorded schedule against a prediction, event by event.

Events are aligned per iteration with :class:`difflib.SequenceMatcher` on
their untimed form (kind, unit, phase, prefetch, hook, hook unit), so one
extra or missing all-gather shows up as one row, not as a shifted tail. A
recording has one event list per iteration; a prediction has two (first
iteration, steady state): recorded iteration ``i`` is compared with predicted
iteration ``min(i, 1)``. A prediction of gradient accumulation over ``N`` micro-steps
has two optimizer steps of ``N``: recorded micro-step ``i`` is compared with the same
micro-step of the first step, or of the steady one from the second step on.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Literal, get_args

from fsdpviz.recording._recorded import RecordedRun
from fsdpviz.schema.events import CP_KINDS, TP_KINDS, Event, EventKind
from fsdpviz.schema.report import Report, unit_label

Status = Literal["equal", "differs", "extra", "missing"]
_COMPARED = ("kind", "unit", "phase", "prefetch", "hook", "hook_unit")


@dataclass(frozen=True)
class AlignedEvent:
    """One row of an alignment.

    ``status``: ``equal``; ``differs`` (both have an event here, some field
    differs); ``extra`` (only the recording has it); ``missing`` (only the
    prediction has it).
    """

    status: Status
    recorded: Event | None
    predicted: Event | None

    def explain(self) -> str:
        r, p = self.recorded, self.predicted
        if r is not None and p is not None:
            if self.status == "equal":
                return f"both issue {r.describe()}"
            diffs = [
                f"{name} {getattr(r, name)!r} vs {getattr(p, name)!r}"
                for name in _COMPARED
                if getattr(r, name) != getattr(p, name)
            ]
            return (
                f"the run issued {r.describe()} where the prediction has {p.describe()} "
                f"(recorded vs predicted: {'; '.join(diffs)})"
            )
        if r is not None:
            return f"the run issued {r.describe()}, which the prediction does not have"
        if p is not None:
            return f"the prediction has {p.describe()}, which the run did not issue"
        return "no event on either side"


@dataclass(frozen=True)
class IterationDiff:
    """The alignment of one recorded iteration (of one rank) with the prediction."""

    rank: int | None
    iteration: int
    predicted_iteration: int
    rows: list[AlignedEvent]

    @property
    def equal(self) -> bool:
        return all(row.status == "equal" for row in self.rows)

    def first_mismatch(self) -> int | None:
        """Index into ``rows`` of the first row that is not ``equal``."""
        return next((i for i, row in enumerate(self.rows) if row.status != "equal"), None)

    def explain(self, context: int = 3) -> str:
        """The first mismatch in words, with ``context`` rows either side."""
        i = self.first_mismatch()
        where = f"rank {self.rank}, " if self.rank is not None else ""
        head = f"{where}iteration {self.iteration} (predicted iteration {self.predicted_iteration})"
        if i is None:
            return f"{head}: {len(self.rows)} events, all equal"
        lines = [f"{head}, row {i}: {self.rows[i].explain()}", "    recorded | predicted"]
        for j in range(max(0, i - context), min(len(self.rows), i + context + 1)):
            row = self.rows[j]
            rec = row.recorded.describe() if row.recorded is not None else "-"
            pred = row.predicted.describe() if row.predicted is not None else "-"
            lines.append(f"{'>>' if j == i else '  '} {j:3d} {rec} | {pred}")
        return "\n".join(lines)


@dataclass
class ScheduleDiff:
    """What :func:`fsdpviz.diff` found: ``equal``, ``problems``, per-iteration alignments.

    ``problems`` are differences outside the event lists (units, forward order,
    world size); ``iterations`` holds one :class:`IterationDiff` per recorded
    iteration and rank; ``kinds`` the event kinds compared (``None``: all).
    """

    iterations: list[IterationDiff]
    problems: list[str] = field(default_factory=list)
    kinds: tuple[str, ...] | None = None

    @property
    def equal(self) -> bool:
        return not self.problems and all(it.equal for it in self.iterations)

    def first(self) -> IterationDiff | None:
        """The first iteration (lowest rank first) whose events differ."""
        return next((it for it in self.iterations if not it.equal), None)

    def __str__(self) -> str:
        scope = f" (kinds compared: {', '.join(self.kinds)})" if self.kinds else ""
        if self.equal:
            return f"recording equals prediction: {len(self.iterations)} iterations compared{scope}"
        lines = [f"recording differs from prediction{scope}:"]
        lines.extend(f"  {p}" for p in self.problems)
        first = self.first()
        if first is not None:
            lines.append(first.explain())
        return "\n".join(lines)


def align(recorded: list[Event], predicted: list[Event]) -> list[AlignedEvent]:
    """Event-by-event alignment of two event lists, ignoring timestamps."""
    a = [e.untimed() for e in recorded]
    b = [e.untimed() for e in predicted]
    rows: list[AlignedEvent] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        rec, pred = recorded[i1:i2], predicted[j1:j2]
        if tag == "equal":
            rows.extend(AlignedEvent("equal", r, p) for r, p in zip(rec, pred, strict=True))
            continue
        paired = min(len(rec), len(pred))
        rows.extend(AlignedEvent("differs", r, p) for r, p in zip(rec, pred, strict=False))
        rows.extend(AlignedEvent("extra", r, None) for r in rec[paired:])
        rows.extend(AlignedEvent("missing", None, p) for p in pred[paired:])
    return rows


def _report_problems(recorded: Report, predicted: Report) -> list[str]:
    problems: list[str] = []
    ws_r, ws_p = recorded.config.world_size, predicted.config.world_size
    if ws_r is not None and ws_p is not None and ws_r != ws_p:
        problems.append(
            f"recorded on world size {ws_r}, predicted for {ws_p}: analyze with world_size={ws_r}"
        )
    if recorded.units:
        r_names = [u.module for u in recorded.units]
        p_names = [u.module for u in predicted.units]
        if r_names != p_names:
            problems.append(f"units differ: recorded {r_names}, predicted {p_names}")
        for r, p in zip(recorded.units, predicted.units, strict=False):
            rd, pd = r.to_dict(), p.to_dict()
            keys = [k for k in rd if rd[k] != pd.get(k)]
            if r.module == p.module and keys:
                what = "; ".join(f"{k} {rd[k]!r} vs {pd.get(k)!r}" for k in keys)
                problems.append(
                    f"unit {unit_label(r.module)} differs (recorded vs predicted): {what}"
                )
    ro, po = recorded.forward_order, predicted.forward_order
    if ro and ro != po:
        k = next((i for i, (a, b) in enumerate(zip(ro, po, strict=False)) if a != b), None)
        k = min(len(ro), len(po)) if k is None else k
        problems.append(
            f"forward order differs at position {k}: recorded {ro[k : k + 3]}, "
            f"predicted {po[k : k + 3]}"
        )
    return problems


def diff(
    recorded: Report | RecordedRun,
    predicted: Report,
    *,
    kinds: Collection[str] | None = None,
) -> ScheduleDiff:
    """Compare a recording (a :class:`RecordedRun`: every rank) with a prediction.

    Units, forward order and world size are checked, then each recorded
    iteration is aligned event by event with the prediction's (steady state
    from the second iteration on); ``str()`` of the result explains the first
    mismatch. ``kinds`` restricts the comparison to some event kinds; by default
    a report from :func:`fsdpviz.load_profile` is compared on the kinds its
    trace shows (``config.kinds``), and a recording without tensor parallelism's
    collectives (FSDP's recorders do not see them) on every kind but those. A recording
    that starts later than the
    first iteration says so in ``config.iteration_offset``.

    Example::

        d = fsdpviz.diff(fsdpviz.load("fsdpviz-run"), fsdpviz.analyze(model, batch, world_size=2))
        d.equal      # True when every rank did what was predicted
        print(d)     # otherwise: the first mismatch, explained, with context
    """
    reports = recorded.ranks if isinstance(recorded, RecordedRun) else [recorded]
    if not predicted.iterations:
        raise ValueError("the prediction has no iterations to compare with")
    problems: list[str] = []
    iterations: list[IterationDiff] = []
    compared: tuple[str, ...] | None = None
    for report in reports:
        chosen = kinds if kinds is not None else report.config.kinds
        if chosen is None and _tp_unrecorded(report, predicted):
            chosen = [k for k in get_args(EventKind) if k not in TP_KINDS]
        if chosen is None and _cp_unrecorded(report, predicted):
            chosen = [k for k in get_args(EventKind) if k not in CP_KINDS]
        elif chosen is not None and _cp_unrecorded(report, predicted):
            chosen = [k for k in chosen if k not in CP_KINDS]
        compared = tuple(chosen) if chosen is not None else None
        rank = report.config.rank
        prefix = f"rank {rank}: " if len(reports) > 1 else ""
        problems.extend(prefix + p for p in _report_problems(report, predicted))
        offset = report.config.iteration_offset
        for i, events in enumerate(report.iterations):
            n = offset + i
            p = _predicted_index(n, predicted)
            rec, pred = events, predicted.iterations[p]
            if compared is not None:
                rec = [e for e in rec if e.kind in compared]
                pred = [e for e in pred if e.kind in compared]
            iterations.append(IterationDiff(rank, n, p, align(rec, pred)))
    return ScheduleDiff(iterations, problems, compared)


def _predicted_index(n: int, predicted: Report) -> int:
    """The predicted iteration recorded iteration ``n`` is compared with."""
    accum = predicted.config.grad_accum
    last = len(predicted.iterations) - 1
    if accum > 1 and len(predicted.iterations) == 2 * accum:
        return n if n < 2 * accum else accum + n % accum
    return min(n, last)


def _cp_unrecorded(recorded: Report, predicted: Report) -> bool:
    """Whether the prediction has ring attention's collectives the recording lacks (the
    recorders follow FSDP and tensor parallelism, not context parallelism)."""
    has = any(e.context_parallel for it in predicted.iterations for e in it)
    return has and not any(e.context_parallel for it in recorded.iterations for e in it)


def _tp_unrecorded(recorded: Report, predicted: Report) -> bool:
    """Whether the prediction has tensor-parallel collectives the recording lacks."""
    has = any(e.tensor_parallel for it in predicted.iterations for e in it)
    return has and not any(e.tensor_parallel for it in recorded.iterations for e in it)
