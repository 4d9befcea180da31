"""Where ranks stop doing the same thing: FSDP's ``DETAIL`` order check, offline.

Under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` FSDP1 all-gathers each unit's index
in every pre-forward of the first iteration and raises ``Forward order differs
across ranks`` when they disagree (``_exec_order_utils._ExecOrderData._check_order``).
Without ``DETAIL`` nothing checks, and ranks whose collectives pair different
units compute wrong results or hang. Here the check runs on the recordings
after the fact: every event (all-gathers, frees, reductions) of every
iteration all ranks recorded, in forward and backward, with the module path
that led each rank to its event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fsdpviz.schema.events import Event
from fsdpviz.schema.report import Report


def module_path(report: Report, iteration: int, event: Event | None) -> tuple[str, ...]:
    """The modules that led ``report``'s rank to ``event`` of ``iteration``, outermost first.

    In forward: the module call stack when the event was issued (the
    iteration's module events replayed up to the event's ``t``). In backward,
    where FSDP's hooks run from autograd rather than from a module call: the
    module whose FSDP hook issued the event and its ancestors that ran. Empty
    without module events or timestamps.
    """
    if event is None or event.t is None or iteration >= len(report.module_events):
        return ()
    events = report.module_events[iteration]
    if event.phase == "backward" and event.hook_unit is not None:
        ran = {m.module for m in events}
        parts = event.hook_unit.split(".") if event.hook_unit else []
        chain = ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]
        return tuple(name for name in chain if name in ran)
    stack: list[str] = []
    for m in events:
        if m.t > event.t:
            break
        if m.kind == "forward_enter":
            stack.append(m.module)
        elif m.kind == "forward_exit" and m.module in stack:
            del stack[len(stack) - 1 - stack[::-1].index(m.module) :]
    return tuple(stack)


def format_path(report: Report, path: Sequence[str]) -> str:
    """``Stack > blocks.1``: the root shown by its class, the rest by FQN."""
    if not path:
        return "(no module running)"
    root = next((u.module_class for u in report.units if u.module == ""), "<root>")
    return " > ".join(name or root for name in path)


@dataclass(frozen=True)
class RankEvent:
    """One rank's event at the point of divergence (``None``: its iteration had ended)."""

    rank: int
    event: Event | None
    module_path: tuple[str, ...]
    where: str


@dataclass(frozen=True)
class Divergence:
    """The first event where the ranks' recordings disagree.

    ``iteration`` and ``index`` locate it (index into each rank's event list of
    that iteration); ``ranks`` holds each rank's event there and the module
    path that led to it; ``previous`` is the last event all ranks agreed on.

    Example::

        d = fsdpviz.load("fsdpviz-run").divergence()
        if d is not None:
            print(d)                      # explained, rank by rank
            d.ranks[1].event.unit, d.ranks[1].module_path
    """

    iteration: int
    index: int
    ranks: tuple[RankEvent, ...]
    previous: Event | None

    def __str__(self) -> str:
        first = next((r.event for r in self.ranks if r.event is not None), None)
        phase = f" ({first.phase})" if first is not None else ""
        after = (
            f", after every rank issued {self.previous.describe()}"
            if self.previous is not None
            else " (its first event)"
        )
        lines = [
            f"Ranks diverge in iteration {self.iteration} at event {self.index}{phase}{after}:"
        ]
        grouped: dict[tuple[str, str], list[str]] = {}
        for r in self.ranks:
            what = r.event.describe() if r.event is not None else "nothing (its iteration ended)"
            grouped.setdefault((what, r.where), []).append(str(r.rank))
        for (what, where), ranks in grouped.items():
            label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}"
            lines.append(f"  {label}: {what}  in {where}")
        lines.append(
            "From here on the ranks' collectives pair different units, which gives wrong "
            "results or hangs; FSDP checks this only with TORCH_DISTRIBUTED_DEBUG=DETAIL "
            '("Forward order differs across ranks"). Make every rank run the same FSDP modules '
            "in the same order: look for rank- or data-dependent branches, generate() or eval "
            "forwards on some ranks only, and parameters frozen on some ranks only."
        )
        return "\n".join(lines)


def find_divergence(reports: Sequence[Report]) -> Divergence | None:
    """The first event, iteration by iteration, on which ``reports`` (one per rank) disagree.

    Iterations are compared up to the fewest any rank recorded (a rank that
    crashed early is not a divergence); within one, a rank that has no event
    where others have one disagrees. Timestamps are ignored.
    """
    if len(reports) < 2:
        return None
    for it in range(min(len(r.iterations) for r in reports)):
        lists = [[e.untimed() for e in r.iterations[it]] for r in reports]
        for i in range(max(len(events) for events in lists)):
            here = [events[i] if i < len(events) else None for events in lists]
            if all(e == here[0] for e in here[1:]):
                continue
            at: list[RankEvent] = []
            for report, events in zip(reports, lists, strict=True):
                event = report.iterations[it][i] if i < len(events) else None
                path = module_path(report, it, event)
                rank = len(at) if report.config.rank is None else report.config.rank
                at.append(RankEvent(rank, event, path, format_path(report, path)))
            return Divergence(it, i, tuple(at), lists[0][i - 1] if i else None)
    return None
