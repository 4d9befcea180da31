"""``RecordedRun``: every rank of a run recorded by :func:`fsdpviz.record`, read back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Unpack

from fsdpviz.recording._diverge import Divergence, find_divergence, module_path
from fsdpviz.recording._writer import RankFiles, read_rank, recorded_ranks
from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.events import Event, ModuleEvent
from fsdpviz.schema.extensions import run_method
from fsdpviz.schema.keywords import SaveKwargs, ShowKwargs
from fsdpviz.schema.report import SCHEMA_VERSION, Report, Unit

_CONFIG_KEYS = ("api", "world_size", "rank", "backend", "started_unix")
DIVERGE_TEXT = "first event where the ranks diverge"


@dataclass(frozen=True)
class RunMark:
    """An event a view of a run marks: event ``index`` of ``iteration`` (an index into
    ``ranks[i].iterations``) of rank ``rank``, with the ``text`` its hover shows. ``kind``:
    ``"diverge"`` (where the ranks first disagree) or ``"stuck"`` (where a rank stopped)."""

    rank: int
    iteration: int
    index: int
    text: str
    kind: Literal["diverge", "stuck"] = "diverge"


def rank_report(files: RankFiles) -> Report:
    """One rank's files as a :class:`Report` (``source="recording"``), timestamps kept."""
    h = files.header
    module_events = [
        [ModuleEvent.from_dict(m) for m in it.get("module_events", [])] for it in files.iterations
    ]
    return Report(
        source="recording",
        config=ReportConfig.from_dict(
            {
                **{k: h.get(k) for k in _CONFIG_KEYS},
                "complete_iterations": files.complete_iterations,
            }
        ),
        units=[Unit.from_dict(u) for u in h["units"]],
        forward_order=list(h["forward_order"]),
        iterations=[[Event.from_dict(e) for e in it["events"]] for it in files.iterations],
        module_events=module_events if any(module_events) else [],
    )


@dataclass
class RecordedRun:
    """A real FSDP run recorded on every rank (what :func:`fsdpviz.load` returns for a directory).

    ``ranks[i]`` is one rank's recording (its rank is ``ranks[i].config.rank``)
    as a :class:`Report` of the same types as a prediction: ``units``,
    ``forward_order``, one event list per iteration with ``t`` (seconds since
    that rank started recording; ``config.started_unix`` is the wall-clock
    start) and ``duration``, and ``module_events`` per iteration. Iterations
    end at FSDP's final backward callback; when a rank stopped mid-iteration
    (an exception, or a forward with no backward before the block ended) the
    events of that iteration come last and ``config.complete_iterations``
    counts the others. ``notes`` says what was incomplete (ranks that crashed,
    a line cut short).

    Example::

        run = fsdpviz.load("fsdpviz-run")
        run.ranks[0].iterations[1][:3]         # steady-state events of rank 0
        print(run.divergence() or "all ranks agree")
        print(fsdpviz.diff(run, fsdpviz.analyze(model, batch, world_size=2, ...)))
    """

    ranks: list[Report]
    path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> RecordedRun:
        """Read a directory :func:`fsdpviz.record` wrote: every finished iteration of every rank."""
        out = Path(path)
        if not out.is_dir():
            raise FileNotFoundError(
                f"{str(out)!r} is not a directory; pass the out_dir given to fsdpviz.record"
            )
        numbers = recorded_ranks(out)
        if not numbers:
            raise FileNotFoundError(
                f"{str(out)!r} holds no rank*.json: record into it with "
                "fsdpviz.record(model, out_dir=...) on every rank"
            )
        files = {r: read_rank(out, r) for r in numbers}
        sizes = sorted({int(f.header["world_size"]) for f in files.values()})
        if len(sizes) > 1:
            raise ValueError(
                f"{str(out)!r} mixes recordings of runs with world sizes {sizes}; "
                "record each run into its own empty directory"
            )
        notes = _notes(files, sizes[0])
        ranks = [rank_report(files[r]) for r in numbers if r < sizes[0]]
        return cls(ranks, out, notes)

    @property
    def world_size(self) -> int:
        return self.ranks[0].config.ranks

    def divergence(self) -> Divergence | None:
        """The first event where ranks disagree, or ``None``; see :class:`Divergence`."""
        return find_divergence(self.ranks)

    def marks(self) -> list[RunMark]:
        """The events the timeline marks: each rank's event at the first divergence."""
        div = self.divergence()
        if div is None:
            return []
        return [
            RunMark(r.rank, div.iteration, div.index, DIVERGE_TEXT)
            for r in div.ranks
            if r.event is not None
        ]

    def findings(self) -> tuple[str, list[str]]:
        """What a page's header says of the ranks: one line, and the details below it."""
        div = self.divergence()
        if div is None:
            return "all agree", list(self.notes)
        return str(div).splitlines()[0].rstrip(":") + " (below)", [str(div), *self.notes]

    def module_path(self, rank: int, iteration: int, index: int) -> tuple[str, ...]:
        """The modules (outermost first) that were running when rank ``rank`` issued that event."""
        report = self.rank(rank)
        return module_path(report, iteration, report.iterations[iteration][index])

    def rank(self, rank: int) -> Report:
        """The recording of rank ``rank``."""
        for report in self.ranks:
            if report.config.rank == rank:
                return report
        have = [r.config.rank for r in self.ranks]
        raise KeyError(f"rank {rank} was not recorded; this run has ranks {have}")

    def to_dict(self) -> dict[str, Any]:
        """Every rank's :meth:`Report.to_dict` (``"ranks"``) and the ``"notes"``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "source": "recorded_run",
            "ranks": [r.to_dict() for r in self.ranks],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: Path | None = None) -> RecordedRun:
        """Read what :meth:`to_dict` wrote (also the ``.json`` trace of :meth:`save`)."""
        return cls([Report.from_dict(r) for r in d["ranks"]], path, list(d.get("notes", [])))

    def show(self, **kwargs: Unpack[ShowKwargs]) -> Any:
        """The interactive views of the run: every rank's timeline on the recorded clock
        (a lane group per rank, the first event where ranks diverge marked on each), and the
        first rank's units and prefetch graph. Returns a :class:`fsdpviz.widgets.Dashboard`
        (``kwargs`` as it takes).

        Example::

            view = fsdpviz.load("fsdpviz-run").show()
            view.timeline.step = 10
        """
        if not self.ranks:
            raise ValueError("the recorded run has no ranks: nothing to show")
        return run_method("show")(self, **kwargs)

    def save(self, path: str | Path, **kwargs: Unpack[SaveKwargs]) -> Path:
        """Write every rank's events; see :func:`fsdpviz.export.save`."""
        save: Callable[..., Path] = run_method("save")
        return save(self, path, **kwargs)

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: object
    ) -> dict[str, object]:
        """The compact summary a notebook shows for a run in a cell's last line."""
        card: Callable[[RecordedRun], dict[str, object]] = run_method("card")
        return card(self)

    def summary(self) -> str:
        first = self.ranks[0]
        counts = sorted({len(r.iterations) for r in self.ranks})
        lines = [
            f"fsdpviz recording of {len(self.ranks)} of {self.world_size} ranks "
            f"({first.config.api}, {len(first.units)} units), "
            f"{'/'.join(map(str, counts))} iterations per rank"
        ]
        div = self.divergence()
        lines.append(
            "  all ranks agree"
            if div is None
            else f"  ranks diverge in iteration {div.iteration} at event {div.index}"
        )
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()


def _notes(files: dict[int, RankFiles], world_size: int) -> list[str]:
    notes: list[str] = []
    missing = [r for r in range(world_size) if r not in files]
    if missing:
        notes.append(f"ranks {missing} wrote no recording here")
    for r, f in sorted(files.items()):
        if r >= world_size:
            notes.append(f"rank{r}.json is beyond world size {world_size} and is ignored")
            continue
        if not f.header.get("finished"):
            done = f.complete_iterations
            partial = len(f.iterations) - done
            notes.append(
                f"rank {r} did not finish recording (it crashed, raised or is still running); "
                f"its {done} finished iterations are loaded"
                + (f", then the {partial} it was in when it stopped" if partial else "")
            )
        if f.torn_line:
            notes.append(f"rank {r}: its last iteration line was cut short and is skipped")
    return notes
