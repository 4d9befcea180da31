"""What the flight recorder dumps of a hung or desynced job say, in FSDP's terms.

Three questions, answered from the dumps alone and, given a prediction
(:func:`fsdpviz.analyze` of the same model and options), in FSDP's terms:

- where each rank stopped: its last collective (NCCL: the first one that never completed;
  gloo records no completion), the unit, phase, hook and iteration it belongs to, and
  which ranks of its group never issued it (the ones it waits for);
- the first collective the ranks disagree on, group by group, by sequence number: a
  different kind, size or dtype (what torch's ``fr_trace`` checks), a rank that never
  issued it, FSDP hooks that differ (read from the stacks: one rank in the forward, another
  in the backward), or, with a prediction, another unit's collective of the same shape;
- where each rank left the predicted schedule, and what it did instead.

The comparing is :mod:`fsdpviz.flight._compare`'s; here is :class:`Diagnosis`, the
answer in plain sentences (``str()``) and drawn (``show()``, ``save()``).
"""

from __future__ import annotations

import html
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from fsdpviz.flight._align import Alignment, Departure, Predicted
from fsdpviz.flight._compare import Disagreement, RankStop, Reason, compare_ranks
from fsdpviz.flight._dump import Collective, GroupInfo
from fsdpviz.recording import RecordedRun
from fsdpviz.schema.extensions import run_method
from fsdpviz.schema.keywords import SaveKwargs, ShowKwargs
from fsdpviz.schema.report import Report, unit_label

__all__ = ["Diagnosis", "diagnose"]


@dataclass
class Diagnosis:
    """The dumps' answer: where each rank stopped and where the ranks first disagree.

    ``str(diagnosis)`` is the whole answer in words. ``divergence`` is the first
    disagreement of any kind; ``mismatch`` the first by kind, size, dtype or a rank that
    never joined (what ``python -m torch.distributed.flight_recorder.fr_trace`` reports
    first), the same or later. With a prediction, ``departures[r]`` says where rank ``r``
    left the predicted schedule. ``show()`` draws a lane group per rank on the recorded
    clock with both marked; ``save(path)`` writes the page.

    Example::

        run = fsdpviz.load_flight_recorder("fr-dumps")
        d = run.diagnose(fsdpviz.analyze(model, batch, world_size=8, auto_wrap_policy=policy))
        print(d)
        d.divergence.seq, d.stops[1].predicted.event.unit
        d.show()
    """

    world_size: int
    backend: str
    stops: list[RankStop]
    divergence: Disagreement | None
    mismatch: Disagreement | None
    disagreements: list[Disagreement]
    groups: dict[str, GroupInfo]
    collectives: Mapping[int, list[Collective]] = field(default_factory=dict)  # per rank
    prediction: Report | None = None
    alignments: dict[int, dict[str, Alignment]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    iterations: dict[int, int] = field(default_factory=dict)  # rank -> last iteration seen
    last_step: str = ""
    view: RecordedRun | None = None  # what show() and save() draw

    @property
    def healthy(self) -> bool:
        """Whether every group's ranks issued the same collectives up to the same one."""
        return self.divergence is None

    @property
    def departures(self) -> dict[int, list[Departure]]:
        """Per rank, where it left the prediction (empty without one)."""
        out: dict[int, list[Departure]] = {}
        for rank, by_group in self.alignments.items():
            deps = [d for a in by_group.values() for d in a.departures]
            out[rank] = sorted(deps, key=lambda d: d.recorded.t if d.recorded else float("inf"))
        return out

    def stop(self, rank: int) -> RankStop:
        """Where rank ``rank`` stopped."""
        for s in self.stops:
            if s.rank == rank:
                return s
        raise KeyError(f"rank {rank} has no dump here; dumps: {[s.rank for s in self.stops]}")

    def summary(self) -> str:
        """One line: the verdict."""
        present = [s.rank for s in self.stops if s.collective is not None]
        if len(present) < 2:
            who = f"rank {present[0]}'s" if present else "no rank's"
            return f"only {who} collectives are here: nothing to compare them with"
        if self.divergence is None:
            return "no divergence" + (f"; {self.last_step}" if self.last_step else "")
        d = self.divergence
        where = f"collective #{d.seq} of {d.group.label()}"
        return f"the ranks diverge at {where} ({reasons_text(d.reasons)})"

    def __str__(self) -> str:
        return "\n".join(diagnosis_text(self))

    def __repr__(self) -> str:
        return f"<Diagnosis: {self.summary()}>"

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: object
    ) -> dict[str, object]:

        text = str(self)
        bundle: dict[str, object] = {
            "text/plain": text,
            "text/html": '<pre style="white-space:pre-wrap;font-size:12px;line-height:1.4">'
            f"{html.escape(text)}</pre>",
        }
        if self.view is None:  # nothing to draw
            return bundle
        # the views of the recording as show() draws them, for a saved notebook
        options = {"memory": None, "iteration": None, "machine": None}
        return run_method("bundle")(self.view, bundle, **options)  # type: ignore[no-any-return]

    def show(self, **kwargs: Unpack[ShowKwargs]) -> Any:
        """A lane group per rank on the recorded clock, every iteration in the dumps, the
        first divergent collectives and each rank's last one marked (with a prediction:
        named by unit, with the model's wrap units beside). ``kwargs`` as
        :class:`fsdpviz.widgets.Dashboard` takes."""
        options = {"memory": None, "iteration": None, "machine": None, **kwargs}
        return run_method("show")(self._view(), **options)

    def save(self, path: str | Path, **kwargs: Unpack[SaveKwargs]) -> Path:
        """Write the diagnosis as :func:`fsdpviz.export.save` writes a recorded run (``.html``:
        the page, its header holding this text)."""
        name = str(path).lower()
        options: dict[str, Any] = {}
        if not name.endswith((".graphml", ".nodelink.json")):  # a graph takes none of these
            options = {"iteration": None, "machine": None}
            if not name.endswith(".json"):
                options["memory"] = None
            if name.endswith(".html"):
                options["title"] = f"fsdpviz flight recorder: {self.summary()}"
        save: Callable[..., Path] = run_method("save")
        return save(self._view(), path, **{**options, **kwargs})

    def _view(self) -> RecordedRun:
        if self.view is None:
            raise ValueError("this diagnosis has no recording to draw; use run.diagnose()")
        return self.view


def diagnose(
    collectives: Mapping[int, list[Collective]],
    groups: dict[str, GroupInfo],
    world_size: int,
    backend: str,
    prediction: Report | None = None,
    notes: Iterable[str] = (),
) -> Diagnosis:
    """The diagnosis of one job's dumps (``collectives``: per rank, in record order)."""
    ranks = compare_ranks(collectives, groups, prediction)
    diagnosis = Diagnosis(
        world_size=world_size,
        backend=backend,
        stops=ranks.stops,
        divergence=ranks.disagreements[0] if ranks.disagreements else None,
        mismatch=ranks.mismatches[0] if ranks.mismatches else None,
        disagreements=ranks.disagreements,
        groups=groups,
        collectives=collectives,
        prediction=prediction,
        alignments=ranks.alignments,
        notes=list(notes),
    )
    diagnosis.iterations, diagnosis.last_step = last_step(diagnosis, collectives)
    return diagnosis


# ---------------------------------------------------------------------------- words


_VERB = {
    "all_gather": "gathered",
    "reduce_scatter": "reduce-scattered",
    "all_reduce": "all-reduced",
}


def last_step(
    d: Diagnosis, collectives: Mapping[int, list[Collective]]
) -> tuple[dict[int, int], str]:
    """Per rank, the last iteration its dump reaches; the last step in words."""
    last: dict[int, int] = {}
    for s in d.stops:
        if s.predicted is not None:
            last[s.rank] = s.predicted.iteration - s.base
        else:
            phases = [c.phase for c in collectives.get(s.rank, []) if c.phase is not None]
            if phases:
                last[s.rank] = sum(
                    1 for a, b in itertools.pairwise(phases) if a == "backward" and b == "forward"
                )
    if d.divergence is not None or not d.stops or d.stops[0].collective is None:
        return last, ""
    s = d.stops[0]
    c = s.collective
    assert c is not None
    if s.predicted is not None:
        p = s.predicted
        a = d.alignments.get(s.rank, {}).get(c.group)
        nxt = a.expected_next if a is not None else None
        done = nxt is None or nxt.iteration != p.iteration
        it = p.iteration - s.base
        what = f"the {p.kind} of {unit_label(p.event.unit)}, {p.event.hook or p.phase}"
        if done:
            return last, (
                f"the last completed step is iteration {it}: every rank's last collective, "
                f"#{c.seq} ({what}), is that iteration's last"
            )
        return last, f"every rank stopped in iteration {it}, at #{c.seq} ({what}), before its end"
    if s.rank in last:
        return last, (
            f"the dumps end in the {c.phase or 'last'} of iteration {last[s.rank]} "
            f"(iterations counted in the dumps from FSDP's hooks in the stacks; give the "
            f"prediction to tell whether that step finished)"
        )
    return last, f"every rank's last collective is #{c.seq} of {_group(d, c)}"


def diagnosis_text(d: Diagnosis) -> list[str]:
    """The diagnosis in lines of text."""
    present = [s.rank for s in d.stops]
    missing = [r for r in range(d.world_size) if r not in present]
    api = _api(d)
    head = (
        f"fsdpviz: flight recorder dumps of {len(present)} of {d.world_size} ranks"
        f" ({d.backend or 'backend unknown'}{', ' + api if api else ''})"
    )
    if d.prediction is not None:
        p = d.prediction
        head += (
            f", read against the prediction ({p.config.api}, {len(p.units)} units, "
            f"world size {p.config.world_size})"
        )
    lines = [head + "."]
    if missing:
        lines.append(
            f"No readable dump from rank{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing))}: {'they' if len(missing) > 1 else 'it'} may have "
            "died, or never written or finished one; the answer below is partial."
        )
    lines.append("")
    if d.divergence is None:
        lines += _healthy(d)
    else:
        lines += _divergence(d, d.divergence)
    lines.append("")
    lines += _stops(d)
    if d.prediction is not None:
        lines.append("")
        lines += _departures(d)
    if d.notes:
        lines.append("")
        lines.append("Notes:")
        lines += [f"  - {n}" for n in d.notes]
    return lines


def _api(d: Diagnosis) -> str:
    names = {
        f.filename.replace("\\", "/")
        for s in d.stops
        if s.collective is not None
        for f in s.collective.frames
    }
    if any("/fsdp/_fully_shard/" in n for n in names):
        return "FSDP2"
    if any("/fsdp/_runtime_utils" in n or "/fsdp/_flat_param" in n for n in names):
        return "FSDP1"
    return ""


def _healthy(d: Diagnosis) -> list[str]:
    present = [s for s in d.stops if s.collective is not None]
    if len(present) < 2:
        who = f"rank {present[0].rank}'s" if present else "no rank's"
        lines = [
            f"Only {who} collectives are here: there is no other rank to compare them with, "
            "so where the ranks diverge is not known."
        ]
        return lines + ([d.last_step[0].upper() + d.last_step[1:] + "."] if d.last_step else [])
    counts = []
    for g in d.groups.values():
        seqs = [
            s.collective.seq
            for s in d.stops
            if s.collective is not None and s.collective.group == g.name
        ]
        if seqs:
            counts.append(f"#{max(seqs)} on {g.label()}")
    lines = [
        "No divergence: on every process group the ranks issued the same collectives, "
        "in the same order, of the same kinds and sizes"
        + (
            " and from the same FSDP hooks"
            if any(s.collective and s.collective.frames for s in d.stops)
            else ""
        )
        + (
            ", matching the prediction"
            if d.prediction is not None and not any(d.departures.values())
            else ""
        )
        + (f" (up to {', '.join(counts)})" if counts else "")
        + "."
    ]
    if d.last_step:
        lines.append(d.last_step[0].upper() + d.last_step[1:] + ".")
    return lines


def _divergence(d: Diagnosis, dis: Disagreement) -> list[str]:
    when = time.strftime("%H:%M:%S", time.localtime(dis.t)) + f".{int(dis.t % 1 * 1000):03d}"
    ranks = ", ".join(map(str, dis.group.ranks))
    lines = [
        f"The ranks diverge at collective #{dis.seq} of {dis.group.label()} "
        f"(ranks {ranks}{'; ' + dis.group.dimension() if dis.group.dimension() else ''}), "
        f"issued {when}: {reasons_text(dis.reasons)}."
    ]
    for r, c in sorted(dis.entries.items()):
        p = dis.predicted.get(r)
        base = _base(d, r, dis.group.name)
        if c is None:
            theirs = [x.seq for x in _of(d, r, dis.group.name)]
            last = f"its last collective there is #{max(theirs)}" if theirs else "none recorded"
            lines.append(f"  rank {r}: never issued it ({last})")
            continue
        what = c.describe()
        if p is not None:
            what += f" = {_pred_text(p, base)}"
        elif d.prediction is not None and c.fsdp:
            what += " (not in the prediction)"
        if c.caller is not None and not c.fsdp:
            what += f", called from {c.caller}"
        lines.append(f"  rank {r}: {what}")
    lines += _iterations_apart(d, dis)
    m = d.mismatch
    if m is not None and (m.group.name, m.seq) != (dis.group.name, dis.seq):
        lines.append(
            f"torch's fr_trace would report the first mismatch only at #{m.seq} of "
            f"{m.group.label()} ({reasons_text(m.reasons)}); from #{dis.seq} on, the ranks' "
            "collectives already pair different work."
        )
    elif m is None:
        lines.append(
            "torch's fr_trace finds no mismatch here: the collectives agree in kind, size "
            "and dtype, so they pair up and run, silently wrong."
        )
    else:
        lines.append("This is also the first mismatch torch's fr_trace reports.")
    for other in d.disagreements[1:]:
        lines.append(
            f"Also: {other.group.label()} first disagrees at #{other.seq} "
            f"({reasons_text(other.reasons)})."
        )
    return lines


def _iterations_apart(d: Diagnosis, dis: Disagreement) -> list[str]:
    """With a prediction: ranks that never issued the collective because they finished an
    iteration the others went past."""
    if "missing" not in dis.reasons or d.prediction is None:
        return []
    ahead = {r: p for r, p in dis.predicted.items() if dis.entries.get(r) is not None and p}
    behind = [r for r, c in dis.entries.items() if c is None]
    ended = []
    for r in behind:
        a = d.alignments.get(r, {}).get(dis.group.name)
        last = next((p for p in reversed(a.matched) if p is not None), None) if a else None
        nxt = a.expected_next if a is not None else None
        if last is None or (nxt is not None and nxt.iteration == last.iteration):
            return []
        ended.append((r, last.iteration - a.base if a else last.iteration))
    if not ahead or not ended:
        return []
    r_ahead, p = next(iter(sorted(ahead.items())))
    its = sorted({it for _, it in ended})
    who = ", ".join(str(r) for r, _ in ended)
    return [
        f"Rank {r_ahead} is in iteration {p.iteration - _base(d, r_ahead, dis.group.name)} while "
        f"rank{'s' if len(ended) > 1 else ''} {who} finished iteration "
        f"{'/'.join(map(str, its))} and issued nothing more on this group: the ranks ran "
        "different numbers of iterations (data of another length on some ranks? a rank that "
        "left the loop early?)."
    ]


def reasons_text(reasons: Sequence[Reason]) -> str:
    """How collectives disagree, in words."""
    words = {
        "kind": "collectives of different kinds",
        "size": "different sizes",
        "dtype": "different dtypes",
        "missing": "not every rank issued it",
        "hook": "the same kind and size, issued by different FSDP hooks",
        "identity": "the same kind, size and hook, but (by the prediction) different "
        "units' collectives",
    }
    return "; ".join(words[r] for r in reasons)


def _stops(d: Diagnosis) -> list[str]:
    lines = ["Where each rank stopped:"]
    tracks = any(s.completed is not None for s in d.stops)
    for s in d.stops:
        c = s.collective
        if c is None:
            lines.append(f"  rank {s.rank}: its dump holds no collective")
            continue
        state = "" if s.completed is None else (" (completed)" if s.completed else f" ({c.state})")
        line = f"  rank {s.rank}: {c.describe()} on {_group(d, c)}{state}"
        if s.predicted is not None:
            line += f"\n      = {_pred_text(s.predicted, s.base)}"
        elif d.prediction is not None and c.fsdp:
            line += "\n      (a collective the prediction does not have)"
        elif c.phase is not None and s.rank in d.iterations:
            line += f"\n      in the {c.phase} of iteration {d.iterations[s.rank]} of the dump"
        if c.caller is not None:
            line += f"; called from {c.caller}"
        g = d.groups.get(c.group)
        unseen = g.unseen + sum(r not in d.collectives for r in g.ranks) if g else 0
        if unseen and s.stuck:
            line += (
                f"\n      {unseen} rank{'s' if unseen > 1 else ''} of its group "
                f"{'have' if unseen > 1 else 'has'} no dump here: whether "
                f"{'they' if unseen > 1 else 'it'} issued it is not known"
            )
        if s.waits_for:
            who = ", ".join(map(str, s.waits_for))
            line += (
                f"\n      rank{'s' if len(s.waits_for) > 1 else ''} {who} of its group never "
                "issued it: this rank waits for " + ("them" if len(s.waits_for) > 1 else "it")
            )
        elif s.completed is None and s.paired and d.divergence is not None:
            line += (
                "\n      every rank of its group issued it alike: it completed, and this rank "
                "issued no collective after it (finished, or busy outside collectives)"
            )
        lines.append(line)
    if not tracks and d.backend == "gloo" and d.divergence is not None:
        lines.append(
            "  (gloo records no start or completion: a last collective that another rank of "
            "its group never issued, or issued differently, is the one the rank waited in)"
        )
    return lines


def _departures(d: Diagnosis) -> list[str]:
    lines = ["Against the prediction:"]
    deps = d.departures
    for s in d.stops:
        mine = deps.get(s.rank, [])
        if s.collective is None:
            continue
        if not mine:
            aligned = sum(1 for a in d.alignments.get(s.rank, {}).values() for p in a.matched if p)
            its = ""
            if s.predicted is not None:
                its = f", up to iteration {s.predicted.iteration - s.base}"
            lines.append(f"  rank {s.rank}: as predicted ({aligned} FSDP collectives{its})")
            continue
        lines.append(f"  rank {s.rank}: " + _narrate(d, s.rank, mine[0]))
        if len(mine) > 1:
            lines.append(
                f"      then {len(mine) - 1} more collective{'s' if len(mine) > 2 else ''} off "
                "the prediction (matched by kind and size; units of the same size may be "
                "told apart wrongly)"
            )
    return lines


def _narrate(d: Diagnosis, rank: int, dep: Departure) -> str:
    c = dep.recorded
    group = c.group if c is not None else None
    base = _base(d, rank, group or "")
    if dep.what == "skipped":
        first = dep.predicted[0]
        it = first.iteration - base
        forward = all(
            p.event.hook == "pre_forward" and p.kind == "all_gather" for p in dep.predicted
        )
        units = [p.event.unit for p in dep.predicted]
        if forward and len(dep.candidates) > len(units):
            what = (
                f"skipped the forward of one of {_units(dep.candidates, 'or')} (their all-gathers "
                "are alike, the same kind and size: the dumps cannot tell which)"
            )
        elif forward:
            what = f"skipped the forward of {_units(units)}"
        else:
            what = "did not issue " + ", ".join(
                f"the {p.kind} of {unit_label(p.event.unit)} ({p.event.hook})"
                for p in dep.predicted
            )
            if len(dep.candidates) > len(units):
                what += (
                    f" (or of another of {_units(dep.candidates, 'or')}: alike in kind and size)"
                )
        text = f"in iteration {it} it {what}"
        if c is None:
            return text + ", and issued nothing after"
        return text + "; " + _instead(d, rank, c)
    if c is None:
        return "left the prediction"
    if dep.what == "extra":
        where = f" (from {c.caller})" if c.caller is not None else ""
        like = f" (it looks like that of {_units(dep.candidates, 'or')})" if dep.candidates else ""
        return (
            f"issued {c.describe()} on {_group(d, c)}{where}, a collective the prediction "
            "does not have there: a module it did not see run (a data-dependent branch?) "
            f"or a collective outside FSDP{like}; " + _instead(d, rank, c, extra=True)
        )
    p = dep.predicted[0]
    return (
        f"in iteration {p.iteration - base} it issued the {p.kind} of "
        f"{unit_label(p.event.unit)} from {c.how() or 'no FSDP hook'} ({c.phase}), where the "
        f"prediction has it from {p.event.hook} ({p.phase}); " + _instead(d, rank, c)
    )


def _instead(d: Diagnosis, rank: int, c: Collective, extra: bool = False) -> str:
    """``from #12 on it gathered X while rank 0 gathered Y`` (``extra``: ``at #12 ...``)."""
    me = _matched_of(d, rank, c)
    mine = _did(c, me)
    others = []
    g = d.groups.get(c.group)
    for r in g.ranks if g is not None else ():
        if r == rank:
            continue
        theirs = next((x for x in _of(d, r, c.group) if x.seq == c.seq), None)
        if theirs is None:
            continue
        others.append(f"rank {r} {_did(theirs, _matched_of(d, r, theirs))}")
    listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    if extra:
        return f"at #{c.seq} {listed}" if others else f"no other rank issued #{c.seq}"
    return f"from #{c.seq} on it {mine}" + (f" while {listed}" if others else "")


def _did(c: Collective, p: Predicted | None) -> str:
    """``gathered 'blocks.2' (pre_backward)``: a collective as the prediction names it."""
    if p is None:
        return f"issued {c.describe()}"
    verb = _VERB.get(c.kind, f"issued the {c.kind} of")
    how = c.how() or p.event.hook or p.phase
    return f"{verb} {unit_label(p.event.unit)} ({how})"


def _matched_of(d: Diagnosis, rank: int, c: Collective) -> Predicted | None:
    a = d.alignments.get(rank, {}).get(c.group)
    if a is None:
        return None
    for x, p in zip(a.collectives, a.matched, strict=True):
        if x.record_id == c.record_id:
            return p
    return None


def _of(d: Diagnosis, rank: int, group: str) -> list[Collective]:
    return [c for c in d.collectives.get(rank, []) if c.group == group]


def _base(d: Diagnosis, rank: int, group: str) -> int:
    a = d.alignments.get(rank, {}).get(group)
    return a.base if a is not None else 0


def _group(d: Diagnosis, c: Collective) -> str:
    g = d.groups.get(c.group)
    return g.label() if g is not None else f"group {c.group}"


def _units(units: Sequence[str], word: str = "and") -> str:
    labels = [unit_label(u) for u in units]
    if len(labels) <= 2:
        return f" {word} ".join(labels)
    return ", ".join(labels[:-1]) + f" {word} " + labels[-1]


def _pred_text(p: Predicted, base: int) -> str:
    """``'blocks.1' in iteration 1 (backward; prefetched by the pre_backward of 'blocks.2')``."""
    e = p.event
    how: str = e.phase
    if e.hook is not None and e.prefetch:
        how = f"{e.phase}; prefetched by the {e.hook} of {unit_label(e.hook_unit)}"
    elif e.hook is not None:
        how = f"{e.phase}; {e.hook} of {unit_label(e.hook_unit)}"
    name = f"{e.kind} {e.module!r}" if e.module is not None else f"{e.kind} {unit_label(e.unit)}"
    return f"{name} in iteration {p.iteration - base} ({how})"
