"""The timeline's groups of lanes: what is drawn in each, and how its units are numbered.

One group per rank of a recording (ranks aligned by the wall-clock time they started
recording, the events where they diverge marked), one per plan of a comparison (the
second plan's units matched to the first's by their parameters, the first difference
marked), one per pipeline rank of a pipeline's report, one for a prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fsdpviz.api.comparison import Comparison
from fsdpviz.schema.pipeline import stage_root
from fsdpviz.schema.report import Report
from fsdpviz.views.timeline_lanes import MemoryOption

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun

__all__ = ["LaneGroup", "lane_groups"]


@dataclass
class LaneGroup:
    """One group of lanes: a report, how its units map to the data's units, its clock."""

    name: str
    report: Report
    units: dict[str, int]
    offset: float = 0.0
    memory: MemoryOption = None
    # iteration, index, text, kind ("diverge", "stuck", "difference")
    marks: list[tuple[int, int, str, str]] = field(default_factory=list)
    palette: Report | None = None  # whose units' colours (a pipeline's: the job's)


def lane_groups(
    obj: Report | Sequence[Report] | RecordedRun | Comparison,
    rank_names: Sequence[str] | None,
    memory: MemoryOption,
) -> tuple[list[LaneGroup], str]:
    from fsdpviz.recording import RecordedRun  # lazy: loads torch, which the views do without

    if isinstance(obj, Comparison):
        return _comparison_groups(obj, memory), "comparison"
    if isinstance(obj, RecordedRun):
        return _run_groups(obj, rank_names, memory), "recording"
    ranks = [obj] if isinstance(obj, Report) else list(obj)
    if not ranks:
        raise ValueError("timeline_data needs at least one report")
    job = ranks[0]
    if len(ranks) == 1 and isinstance(job, Report) and job.pipeline and job.pipeline.ranks:
        return _pipeline_groups(job, rank_names, memory), job.source
    for r in ranks:
        if not isinstance(r, Report):
            raise TypeError(
                f"timeline_data takes reports, a RecordedRun or a Comparison, not "
                f"{type(r).__name__}"
            )
    names = list(rank_names) if rank_names is not None else _rank_names(ranks)
    if len(names) != len(ranks):
        raise ValueError(f"{len(names)} rank names for {len(ranks)} reports")
    units: dict[str, int] = {}
    for r in ranks:
        for u in r.units:
            units.setdefault(u.module, len(units))
    groups = [
        LaneGroup(name, r, units, memory=memory if g == 0 else None)
        for g, (name, r) in enumerate(zip(names, ranks, strict=True))
    ]
    return groups, ranks[0].source


def _pipeline_groups(
    job: Report, rank_names: Sequence[str] | None, memory: MemoryOption
) -> list[LaneGroup]:
    """A pipeline's report: a group of lanes per pipeline rank, each with its memory lane
    (each rank holds its own stages); the sends and receives name the stage's root."""
    assert job.pipeline is not None
    ranks = job.pipeline.ranks
    names = list(rank_names) if rank_names is not None else [
        f"pp rank {r.config.pp_rank} · stage"
        + ("s " if len(job.pipeline.stages_of(int(r.config.pp_rank or 0))) > 1 else " ")
        + ", ".join(str(st.index) for st in job.pipeline.stages_of(int(r.config.pp_rank or 0)))
        for r in ranks
    ]  # fmt: skip
    if len(names) != len(ranks):
        raise ValueError(f"{len(names)} rank names for {len(ranks)} pipeline ranks")
    units = {u.module: k for k, u in enumerate(job.units)}
    for st in job.pipeline.stages:  # the stages' roots (their hooks, where they compute)
        units.setdefault(stage_root(st.index), len(units))
    units.setdefault("", len(units))  # what sends and receives
    return [
        LaneGroup(name, r, units, memory=memory, palette=job)
        for name, r in zip(names, ranks, strict=True)
    ]


def _rank_names(ranks: list[Report]) -> list[str]:
    if len(ranks) == 1 and ranks[0].source == "prediction":
        return ["prediction"]
    return [
        f"rank {r.config.rank if r.config.rank is not None else i}" for i, r in enumerate(ranks)
    ]


def _run_groups(
    run: RecordedRun, rank_names: Sequence[str] | None, memory: MemoryOption
) -> list[LaneGroup]:
    if not run.ranks:
        raise ValueError("the recorded run has no ranks: nothing to draw")
    names = list(rank_names) if rank_names is not None else _rank_names(run.ranks)
    starts = [r.config.started_unix for r in run.ranks]
    known = [float(s) for s in starts if isinstance(s, int | float)]
    origin = min(known) if len(known) == len(starts) else None
    units: dict[str, int] = {}
    for r in run.ranks:
        for u in r.units:
            units.setdefault(u.module, len(units))
    run_marks = run.marks()
    groups = []
    for g, r in enumerate(run.ranks):
        offset = float(starts[g]) - origin if origin is not None else 0.0  # type: ignore[arg-type]
        rank = r.config.rank if r.config.rank is not None else g
        marks: list[tuple[int, int, str, str]] = [
            (m.iteration, m.index, m.text, m.kind) for m in run_marks if m.rank == rank
        ]
        groups.append(LaneGroup(names[g], r, units, offset, memory if g == 0 else None, marks))
    return groups


def _comparison_groups(cmp: Comparison, memory: MemoryOption) -> list[LaneGroup]:
    if cmp.reports is None:
        raise ValueError("this comparison was read back without its plans; compare() again")
    a, b = cmp.reports
    units: dict[str, int] = {}
    for u in a.units:
        units.setdefault(u.module, len(units))
    units_b: dict[str, int] = {}
    b_index = {u.module: i for i, u in enumerate(b.units)}
    for u in b.units:
        units_b[u.module] = len(units) + b_index[u.module]
    first = _first_difference(cmp, a, b)
    text = f"first difference between {cmp.name_a} and {cmp.name_b}"
    marks_a = [] if first is None else [(len(a.iterations) - 1, first, text, "difference")]
    marks_b = [] if first is None else [(len(b.iterations) - 1, first, text, "difference")]
    mem_b = memory if memory == "auto" else None
    return [
        LaneGroup(cmp.name_a, a, units, memory=memory, marks=marks_a),
        LaneGroup(cmp.name_b, b, units_b, memory=mem_b, marks=marks_b),
    ]


def _first_difference(cmp: Comparison, a: Report, b: Report) -> int | None:
    """Index of the first steady-state event where the plans differ (units matched)."""
    to_a = {p.b: p.a for p in cmp.pairs if p.a is not None and p.b is not None}
    ea = a.iterations[-1] if a.iterations else []
    eb = b.iterations[-1] if b.iterations else []
    for i, (x, y) in enumerate(zip(ea, eb, strict=False)):
        same = (
            x.kind == y.kind
            and x.phase == y.phase
            and x.prefetch == y.prefetch
            and to_a.get(y.unit, "\0") == x.unit
        )
        if not same:
            return i
    return None if len(ea) == len(eb) else min(len(ea), len(eb))
