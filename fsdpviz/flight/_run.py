"""``load_flight_recorder``: a folder of torch flight recorder dumps as a run fsdpviz can draw.

Each rank's collectives become a recorded :class:`~fsdpviz.Report` on the dumps' clock
(``Event.t``: seconds since that rank's oldest kept collective; ``config.started_unix``:
when that was), so the timeline draws a lane group per rank as it does for a run
recorded with :func:`fsdpviz.record`. Without a prediction a collective's unit is not
known: collectives are named by their size (``"size 72"``: a tensor of 72 elements; an
FSDP unit's all-gather and reduce-scatter have the same) and iterations are counted from
FSDP's hooks in the stacks. :meth:`FlightRecorderRun.diagnose` with a prediction names
them by unit and iteration.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Unpack

import torch
import torch.distributed as dist

from fsdpviz.flight._align import Alignment, guess_roles
from fsdpviz.flight._diagnosis import Diagnosis, diagnose
from fsdpviz.flight._dump import (
    Collective,
    DumpError,
    GroupInfo,
    RankDump,
    infer_groups,
    rank_of,
    read_dump,
    read_dumps,
)
from fsdpviz.recording import RecordedRun, RunMark, is_recording
from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.events import Event
from fsdpviz.schema.keywords import SaveKwargs, ShowKwargs
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.names import some_names
from fsdpviz.schema.report import Report, Unit

__all__ = ["FlightRecorderRun", "dump_flight_recorder", "load_flight_recorder", "load_run"]

DIVERGE_TEXT = "first collective where the ranks disagree"
STUCK_TEXT = "where this rank stopped: its last collective"
_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"  # torch's, when TORCH_FR_DUMP_TEMP_FILE is unset


@dataclass(repr=False)
class FlightRecorderRun(RecordedRun):
    """Torch flight recorder dumps of one job, one per rank, read by
    :func:`load_flight_recorder`.

    ``collectives[r]``: rank ``r``'s kept collectives in the order it issued them
    (:class:`Collective`: sequence number, kind, bytes, process group, state, times,
    stack); ``groups``: the process groups they ran on (:class:`GroupInfo`, with the mesh
    dimension each is). ``ranks`` (per-rank :class:`~fsdpviz.Report`), ``show()``,
    ``save()`` and the card work as for a recorded run; :meth:`diagnose` answers where each
    rank stopped and where the ranks diverge. ``divergence()``, the recorder's event
    check, does not apply to dumps: it is ``None``; read :meth:`diagnose`.

    Example::

        run = fsdpviz.load_flight_recorder("/tmp/fr")      # nccl_trace_rank_0, _1, ...
        print(run.diagnose())                             # from the dumps alone
        print(run.diagnose(fsdpviz.analyze(model, batch, world_size=8, ...)))
        run.collectives[1][-1]                            # rank 1's last collective
    """

    collectives: dict[int, list[Collective]] = field(default_factory=dict)
    groups: dict[str, GroupInfo] = field(default_factory=dict)
    size: int = 0
    backend: str = ""
    version: str = ""
    run_marks: list[RunMark] = field(default_factory=list)
    # (rank, record_id) -> (iteration index, event index) of each collective in ``ranks``
    placement: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    diagnosis: Diagnosis | None = field(default=None, compare=False)

    @property
    def world_size(self) -> int:
        return self.size

    def divergence(self) -> None:
        return None

    def diagnose(self, prediction: Report | None = None) -> Diagnosis:
        """Where each rank stopped and where the ranks first disagree, in words
        (``str()``), and drawn (``.show()``, ``.save(path)``); see :class:`Diagnosis`.

        ``prediction``: :func:`fsdpviz.analyze` of the job's model and FSDP options (its
        world size), to name each collective by unit, phase, hook and iteration and to
        tell same-shaped collectives of different units apart.
        """
        if prediction is None and self.diagnosis is not None:
            return self.diagnosis
        if prediction is not None and not isinstance(prediction, Report):
            raise TypeError(
                f"prediction must be a fsdpviz.Report (fsdpviz.analyze(...)), not "
                f"{type(prediction).__name__}"
            )
        groups = guess_roles(self.groups, self.collectives, prediction)
        notes = list(self.notes)
        size = self.size
        if prediction is not None:
            ws = prediction.config.world_size
            if ws is not None and ws > size:  # the job's ranks beyond the last dump
                notes.append(f"no dump from ranks {size} to {ws - 1} (the prediction's world size)")
                size = ws
            elif ws is not None and ws < size:
                notes.append(
                    f"the prediction is for world size {ws}, the dumps for {size}: sizes per "
                    f"rank may not match; analyze with world_size={size}"
                )
        d = diagnose(self.collectives, groups, size, self.backend, prediction, notes)
        stuck = _stuck(d)
        if prediction is None:
            self.diagnosis = d
            self.ranks, self.placement = _reports(self, {}, None, stuck)
            self.run_marks = _marks(d, self.placement)
            d.view = self
            return d
        ranks, where = _reports(self, d.alignments, prediction, stuck)
        view = FlightRecorderRun(
            ranks,
            self.path,
            list(self.notes),
            collectives=self.collectives,
            groups=groups,
            size=self.size,
            backend=self.backend,
            version=self.version,
            placement=where,
        )
        view.diagnosis = d
        view.run_marks = _marks(d, where)
        d.view = view
        return d

    def marks(self) -> list[RunMark]:
        """Each rank's collective where the ranks first disagree (``"diverge"``) and, when
        they disagree, the one each rank stopped in (``"stuck"``)."""
        self.diagnose()  # (made once: the run's marks with it)
        return list(self.run_marks)

    def findings(self) -> tuple[str, list[str]]:
        d = self.diagnose()
        return d.summary(), [str(d)]

    def show(self, **kwargs: Unpack[ShowKwargs]) -> Any:
        """:meth:`Diagnosis.show` of :meth:`diagnose` (the dumps alone)."""
        return self.diagnose().show(**kwargs)

    def save(self, path: str | Path, **kwargs: Unpack[SaveKwargs]) -> Path:
        """:meth:`Diagnosis.save` of :meth:`diagnose` (the dumps alone)."""
        return self.diagnose().save(path, **kwargs)

    def summary(self) -> str:
        n = sum(len(c) for c in self.collectives.values())
        lines = [
            f"fsdpviz flight recorder dumps of {len(self.collectives)} of {self.size} ranks "
            f"({self.backend or 'backend unknown'}, {n} collectives)",
            "  " + self.diagnose().summary(),
        ]
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: object
    ) -> dict[str, Any]:
        return self.diagnose()._repr_mimebundle_()


def load_flight_recorder(path: str | Path) -> FlightRecorderRun:
    """Read torch's flight recorder dumps: a folder with one file per rank (the pickle torch
    writes on a timeout or returns from ``_dump_fr_trace()``, or the JSON of
    ``_dump_fr_trace_json()``), the rank read from the end of each file's name
    (``nccl_trace_rank_3``, ``rank3.json``), or one such file.

    Files that are not dumps are skipped; ranks whose dump is missing or cut short are
    named in ``run.notes`` and the diagnosis is partial.

    Example::

        run = fsdpviz.load_flight_recorder("/tmp/fr")
        print(run.diagnose())
    """
    p = Path(path)
    if p.is_file():
        dumps = {(r := rank_of(p) or 0): read_dump_or_raise(p, r)}
        notes: list[str] = []
        named = set(dumps)
        folder = p.parent
    elif p.is_dir():
        dumps, notes, named = read_dumps(p)
        folder = p
        if not dumps:
            names = sorted(x.name for x in p.iterdir())[:6]
            raise FileNotFoundError(
                f"{str(p)!r} holds no flight recorder dump (files named <prefix><rank>, as "
                f"torch writes them: nccl_trace_rank_0, ...); it holds {names or 'nothing'}"
                + (f"; {'; '.join(notes)}" if notes else "")
            )
    else:
        raise FileNotFoundError(
            f"{str(p)!r} does not exist; pass the folder the ranks dumped into "
            "(TORCH_FR_DUMP_TEMP_FILE's directory, /tmp by default)"
        )
    return from_dumps(dumps, folder, notes, named)


def load_run(path: str | Path) -> RecordedRun:
    """A folder of a run: one :func:`fsdpviz.record` wrote (a :class:`RecordedRun`), or torch
    flight recorder dumps (a :class:`FlightRecorderRun`, as :func:`load_flight_recorder`
    reads them; one dump file too). A folder that holds neither raises ``FileNotFoundError``
    naming what it holds.
    """
    p = Path(path)
    if p.is_file():
        return load_flight_recorder(p)
    if not p.is_dir():
        raise FileNotFoundError(
            f"{str(p)!r} does not exist; pass the folder fsdpviz.record(model, out_dir=...) "
            "wrote, or the one torch's flight recorder dumped into (TORCH_FR_DUMP_TEMP_FILE's "
            "directory, /tmp by default)"
        )
    if is_recording(p):
        return RecordedRun.load(p)
    dumps, notes, named = read_dumps(p)
    if dumps:
        return from_dumps(dumps, p, notes, named)
    names = sorted(x.name for x in p.iterdir())
    held = some_names(names, 6)
    raise FileNotFoundError(
        f"{str(p)!r} is neither a run fsdpviz.record wrote (rank<N>.json and rank<N>.jsonl "
        "per rank) nor torch flight recorder dumps (a file per rank named <prefix><rank>, as "
        f"torch writes them: nccl_trace_rank_0, ...): it holds {held or 'nothing'}"
    )


def read_dump_or_raise(path: Path, rank: int) -> RankDump:
    try:
        return read_dump(path, rank)
    except DumpError as exc:
        raise ValueError(f"{str(path)!r} is not a readable flight recorder dump: {exc}") from None


def from_dumps(
    dumps: dict[int, RankDump], path: Path | None, notes: list[str], named: set[int] | None = None
) -> FlightRecorderRun:
    """A run from dumps already read (``{rank: RankDump}``); ``named``: ranks whose dump
    files were found, read or not. The world size is the most any of them tells: the
    highest rank, a group's members, the size of a group's all-gather."""
    collectives = {r: d.collectives for r, d in sorted(dumps.items())}
    groups = guess_roles(infer_groups(dumps), collectives)
    seen = {*(named or ()), *dumps}
    size = max(
        [*(max(g.ranks) + 1 for g in groups.values() if g.ranks),
         *(g.size for g in groups.values()), *(r + 1 for r in seen)]
    )  # fmt: skip
    notes = list(notes)
    missing = [r for r in range(size) if r not in seen]
    if missing:
        notes.append(f"no dump from rank{'s' if len(missing) > 1 else ''} {_list(missing)}")
    for r, d in sorted(dumps.items()):
        if not d.collectives:
            notes.append(
                f"rank {r}'s dump holds no collective (was TORCH_FR_BUFFER_SIZE set before "
                "the process group was created?)"
            )
            continue
        first = d.collectives[0]
        if first.record_id > 0:
            notes.append(
                f"rank {r}'s ring buffer overwrote its oldest {first.record_id} collectives: "
                f"it keeps {len(d.collectives)}, from #{first.seq} of "
                f"{groups[first.group].label() if first.group in groups else first.group} "
                "(a bigger TORCH_FR_BUFFER_SIZE keeps more)"
            )
    unlisted = [g for g in groups.values() if not g.listed]
    if unlisted and len(dumps) > 1:
        notes.append(
            "the dumps list no members for "
            + ", ".join(g.label() for g in unlisted[:4])
            + (
                " (gloo's, in this torch)"
                if any(d.backend == "gloo" for d in dumps.values())
                else ""
            )
            + ": members are the ranks whose dumps use them"
        )
    versions = sorted({d.version for d in dumps.values()})
    backends = [d.backend for d in dumps.values() if d.backend]
    run = FlightRecorderRun(
        [],
        path,
        notes,
        collectives=collectives,
        groups=groups,
        size=size,
        backend=max(set(backends), key=backends.count) if backends else "",
        version="/".join(versions),
    )
    run.diagnose()  # the views' reports, and what they mark
    return run


def dump_flight_recorder(folder: str | Path | None = None, *, json: bool = False) -> Path:
    """Write this rank's flight recorder where :func:`load_flight_recorder` (and torch's
    ``fr_trace``) reads it: ``folder/rank<r>``, or torch's own place,
    ``$TORCH_FR_DUMP_TEMP_FILE<r>`` (default ``/tmp/nccl_trace_rank_<r>``). ``json=True``
    writes the JSON form (no stacks). Call it where a collective raised (gloo's timeout),
    in an ``except`` block; NCCL writes its own with ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``.

    Example::

        try:
            train()
        except Exception:
            fsdpviz.dump_flight_recorder("fr-dumps")
            raise
    """
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        target = Path(folder) / f"rank{rank}{'.json' if json else ''}"
    else:
        prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", _DEFAULT_PREFIX)
        target = Path(f"{prefix}{rank}{'.json' if json else ''}")
    c10d: Any = torch._C._distributed_c10d
    data: bytes = c10d._dump_fr_trace_json() if json else c10d._dump_fr_trace()
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)  # whole or absent: a reader never sees half a dump
    return target


# ---------------------------------------------------------------------------- the views' data


def _stuck(d: Diagnosis) -> set[tuple[int, int]]:
    """``(rank, record_id)`` of the collectives ranks stopped in, when the ranks diverged."""
    if d.divergence is None:
        return set()
    return {(s.rank, s.collective.record_id) for s in d.stops if s.collective and s.stuck}


def _reports(
    run: FlightRecorderRun,
    alignments: dict[int, dict[str, Alignment]],
    prediction: Report | None,
    stuck: set[tuple[int, int]],
) -> tuple[list[Report], dict[tuple[int, int], tuple[int, int]]]:
    """A recorded report per rank, and where each collective landed:
    ``(rank, record_id) -> (iteration index, event index)``. A collective in ``stuck`` is
    drawn for its timeout (the rank waited in it that long)."""
    reports: list[Report] = []
    where: dict[tuple[int, int], tuple[int, int]] = {}
    for rank, cs in run.collectives.items():
        mine = {rid for r, rid in stuck if r == rank}
        report, placed = _rank_report(run, rank, cs, alignments.get(rank, {}), prediction, mine)
        reports.append(report)
        where.update({(rank, rid): at for rid, at in placed.items()})
    return reports, where


def _rank_report(
    run: FlightRecorderRun,
    rank: int,
    cs: Sequence[Collective],
    alignments: dict[str, Alignment],
    prediction: Report | None,
    stuck: set[int],
) -> tuple[Report, dict[int, tuple[int, int]]]:
    matched = {
        c.record_id: (p, a.base)
        for a in alignments.values()
        for c, p in zip(a.collectives, a.matched, strict=True)
        if p is not None
    }
    units: dict[str, Unit] = {u.module: u for u in prediction.units} if prediction else {}
    if prediction is None:  # the sizes' units under one root, as the explorer draws a model
        units[""] = Unit("", "(no prediction: units named by size)", [])
    start = cs[0].t if cs else 0.0
    iteration = 0
    phase: str | None = None
    rows: list[tuple[int, Collective, Event]] = []
    for c in cs:
        hit = matched.get(c.record_id)
        if hit is not None:
            p, base = hit
            iteration = p.iteration - base
            e = p.event
            event = Event(
                e.kind, e.unit, c.phase or e.phase, c.prefetch if c.hook else e.prefetch,  # type: ignore[arg-type]
                c.hook or e.hook, e.hook_unit, c.t - start, _duration(c, c.record_id in stuck),
                e.group, e.module,
                e.nbytes,
            )  # fmt: skip
        else:
            if not alignments and c.phase == "forward" and phase == "backward":
                iteration += 1
            event = _unmatched(c, run.groups.get(c.group), units, prediction, start)
            if c.record_id in stuck:
                event = replace(event, duration=_duration(c, True))
        if c.phase is not None:
            phase = c.phase
        rows.append((iteration, c, event))
    first = min((it for it, _, _ in rows), default=0)
    iterations: list[list[Event]] = [
        [] for _ in range(max((it for it, _, _ in rows), default=0) - first + 1)
    ]
    placed: dict[int, tuple[int, int]] = {}
    for it, c, event in rows:
        k = max(it - first, 0)
        placed[c.record_id] = (k, len(iterations[k]))
        iterations[k].append(event)
    api = prediction.config.api if prediction is not None else _api(cs)
    config = ReportConfig.from_dict(
        {
            "api": api,
            "world_size": run.size,
            "rank": rank,
            "backend": run.backend or None,
            "started_unix": start,
            "iteration_offset": first,
        }
    )
    report = Report(
        source="recording",
        config=config,
        units=list(units.values()),
        forward_order=list(prediction.forward_order) if prediction is not None else [],
        iterations=iterations if rows else [],
        modules=list(prediction.modules) if prediction is not None else [],
    )
    return report, placed


def _unmatched(
    c: Collective,
    group: GroupInfo | None,
    units: dict[str, Unit],
    prediction: Report | None,
    start: float,
) -> Event:
    """A collective no predicted one matches: named by its size (FSDP's) or its op."""
    role = group.role if group is not None else None
    fsdp = c.fsdp or not c.frames
    if fsdp and c.kind in ("all_gather", "reduce_scatter", "all_reduce"):
        name = f"size {c.numel:,}" + (" (not predicted)" if prediction is not None else "")
        kind = c.kind
    else:
        name = f"{c.op} (not FSDP's)" if c.frames else f"{c.op}"
        kind = c.kind if c.kind in ("all_gather", "reduce_scatter", "all_reduce") else "all_reduce"
    module = None if kind == c.kind else c.op
    event_group = None
    if role == "tp":
        kind = {"all_gather": "tp_all_gather", "reduce_scatter": "tp_reduce_scatter"}.get(
            kind, "tp_all_reduce"
        )
        event_group = "tp"
        module = module or c.op
    elif role == "replicate" and kind == "all_reduce":
        event_group = "replicate"
    if name not in units:
        size = max(group.ranks.__len__() if group is not None else 1, 1)
        itemsize = c.nbytes // c.numel if c.numel else 4
        units[name] = Unit(
            module=name,
            module_class=f"{c.kind} of {size_text(c.nbytes)}",
            params=[],
            numel=c.numel,
            flat_numel=c.numel,
            padded_numel=c.numel,
            sharded_numel=c.numel // size,
            dtype=_dtype(c),
            itemsize=itemsize,
        )
    return Event(
        kind,  # type: ignore[arg-type]
        name,
        c.phase or "forward",  # type: ignore[arg-type]
        c.prefetch,
        c.hook,
        None,
        c.t - start,
        _duration(c),
        event_group,  # type: ignore[arg-type]
        module,
        c.nbytes if kind.startswith("tp_") else None,
    )


def _duration(c: Collective, stuck: bool = False) -> float | None:
    """Seconds the collective ran: NCCL's device time, else from its recorded start and end;
    a rank's last one that never completed, its timeout (it waited that long, then raised)."""
    if c.duration is not None:
        return c.duration
    if c.elapsed is not None:
        return c.elapsed
    if stuck and c.state != "completed" and c.timeout is not None:
        return c.timeout
    return None


def _dtype(c: Collective) -> str | None:
    names = {"Float": "float32", "BFloat16": "bfloat16", "Half": "float16", "Double": "float64"}
    dtypes = c.output_dtypes or c.input_dtypes
    return names.get(dtypes[0]) if dtypes else None


def _api(cs: Sequence[Collective]) -> str:
    names = {f.filename.replace("\\", "/") for c in cs[-50:] for f in c.frames}
    return "FSDP2" if any("/fsdp/_fully_shard/" in n for n in names) else "FSDP1"


def _marks(d: Diagnosis, where: dict[tuple[int, int], tuple[int, int]]) -> list[RunMark]:
    marks: list[RunMark] = []
    if d.divergence is not None:
        for r, c in sorted(d.divergence.entries.items()):
            if c is not None and (r, c.record_id) in where:
                it, k = where[(r, c.record_id)]
                marks.append(RunMark(r, it, k, DIVERGE_TEXT, "diverge"))
        for s in d.stops:
            c = s.collective
            if c is not None and s.stuck and (s.rank, c.record_id) in where:
                it, k = where[(s.rank, c.record_id)]
                marks.append(RunMark(s.rank, it, k, STUCK_TEXT, "stuck"))
    return marks


def _list(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))
