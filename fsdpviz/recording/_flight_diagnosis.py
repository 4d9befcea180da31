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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fsdpviz.recording._flight_align import (
    Alignment,
    Departure,
    Predicted,
    align,
)
from fsdpviz.recording._flight_dump import Collective, GroupInfo
from fsdpviz.recording._flight_words import diagnosis_text, last_step, reasons_text
from fsdpviz.recording._recorded import RecordedRun
from fsdpviz.schema.extensions import run_method
from fsdpviz.schema.report import Report

__all__ = ["Diagnosis", "Disagreement", "RankStop", "diagnose"]

Reason = Literal["kind", "size", "dtype", "missing", "hook", "identity"]
RAW_REASONS: tuple[Reason, ...] = ("kind", "size", "dtype", "missing")
"""What torch's ``fr_trace`` finds too: the collectives' kinds, sizes and dtypes, and ranks
that never joined."""


@dataclass(frozen=True)
class RankStop:
    """Where one rank stopped: ``collective`` (``None``: its dump holds none), whether it
    ``completed`` (``None``: the backend does not record it), the ``predicted`` collective
    it is, ``waits_for``: ranks of its group that never issued it, and ``paired``: whether
    every other member issued it alike (without completion records, a sign it completed)."""

    rank: int
    collective: Collective | None
    completed: bool | None
    predicted: Predicted | None = None
    waits_for: tuple[int, ...] = ()
    base: int = 0  # iteration numbers shown count from this one
    paired: bool = False  # every other member of its group issued the same collective

    @property
    def stuck(self) -> bool:
        """Whether the rank waited in it: NCCL saw it not complete; without completion
        records (gloo), another member of its group never issued it or issued another."""
        if self.collective is None or self.completed is True:
            return False
        return self.completed is False or not self.paired


@dataclass(frozen=True)
class Disagreement:
    """The first collective of one group (``seq``) the member ranks disagree on.

    ``entries[r]``: what rank ``r`` issued as that collective (``None``: it never did);
    ``predicted[r]``: the predicted collective it matches (with a prediction); ``reasons``:
    how they disagree (``kind``, ``size``, ``dtype``, ``missing``, ``hook``, ``identity``).
    """

    group: GroupInfo
    seq: int
    reasons: tuple[Reason, ...]
    entries: Mapping[int, Collective | None]
    predicted: Mapping[int, Predicted | None] = field(default_factory=dict)
    t: float = 0.0

    @property
    def raw(self) -> bool:
        """Whether torch's ``fr_trace`` sees it (kind, size, dtype or a missing rank)."""
        return any(r in RAW_REASONS for r in self.reasons)


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
        self, include: Any = None, exclude: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        import html

        text = str(self)
        return {
            "text/plain": text,
            "text/html": '<pre style="white-space:pre-wrap;font-size:12px;line-height:1.4">'
            f"{html.escape(text)}</pre>",
        }

    def show(self, **kwargs: Any) -> Any:
        """A lane group per rank on the recorded clock, every iteration in the dumps, the
        first divergent collectives and each rank's last one marked (with a prediction:
        named by unit, with the model's wrap units beside). ``kwargs`` as
        :class:`fsdpviz.widgets.Dashboard` takes."""
        options = {"memory": None, "iteration": None, "machine": None, **kwargs}
        return run_method("show")(self._view(), **options)

    def save(self, path: str | Path, **kwargs: Any) -> Path:
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


# ---------------------------------------------------------------------------- analysis


def diagnose(
    collectives: Mapping[int, list[Collective]],
    groups: dict[str, GroupInfo],
    world_size: int,
    backend: str,
    prediction: Report | None = None,
    notes: Iterable[str] = (),
) -> Diagnosis:
    """The diagnosis of one job's dumps (``collectives``: per rank, in record order)."""
    alignments = _alignments(collectives, groups, prediction) if prediction is not None else {}
    matched = _matched(alignments)
    firsts = [_first_disagreements(g, collectives, matched) for g in groups.values()]
    found = sorted((f for f, _ in firsts if f is not None), key=lambda d: d.t)
    raw = sorted((r for _, r in firsts if r is not None), key=lambda d: d.t)
    index = _Index.of(collectives)
    stops = [_stop(r, cs, groups, index, matched) for r, cs in sorted(collectives.items())]
    diagnosis = Diagnosis(
        world_size=world_size,
        backend=backend,
        stops=stops,
        divergence=found[0] if found else None,
        mismatch=raw[0] if raw else None,
        disagreements=found,
        groups=groups,
        collectives=collectives,
        prediction=prediction,
        alignments=alignments,
        notes=list(notes),
    )
    diagnosis.iterations, diagnosis.last_step = last_step(diagnosis, collectives)
    return diagnosis


def fsdp_collectives(cs: Sequence[Collective]) -> list[Collective]:
    """FSDP's collectives of a rank (all of them when its dump has no stacks to tell)."""
    if not any(c.frames for c in cs):
        return list(cs)
    return [c for c in cs if c.fsdp or (c.hook is None and not c.frames)]


def _alignments(
    collectives: Mapping[int, list[Collective]],
    groups: dict[str, GroupInfo],
    prediction: Report,
) -> dict[int, dict[str, Alignment]]:
    out: dict[int, dict[str, Alignment]] = {}
    for rank, cs in collectives.items():
        mine = fsdp_collectives(cs)
        for name, g in groups.items():
            if g.role is None:
                continue
            role = g.role
            # tensor parallelism's collectives come from DTensor, not from FSDP's hooks
            on = [c for c in (cs if role == "tp" else mine) if c.group == name]
            a = align(on, prediction, role) if on else None
            if a is not None:
                out.setdefault(rank, {})[name] = a
    return out


_Key = tuple[int, str, int]  # rank, group, seq


def _matched(
    alignments: dict[int, dict[str, Alignment]],
) -> dict[_Key, tuple[Predicted | None, int]]:
    """(rank, group, seq) -> (the predicted collective it is, the iteration base)."""
    out: dict[_Key, tuple[Predicted | None, int]] = {}
    for rank, by_group in alignments.items():
        for name, a in by_group.items():
            for c, p in zip(a.collectives, a.matched, strict=True):
                out[(rank, name, c.seq)] = (p, a.base)
    return out


def _first_disagreements(
    g: GroupInfo,
    collectives: Mapping[int, list[Collective]],
    matched: Mapping[_Key, tuple[Predicted | None, int]],
) -> tuple[Disagreement | None, Disagreement | None]:
    """The first collective of group ``g`` its ranks disagree on in any way, and the first
    they disagree on as torch's ``fr_trace`` sees it (:data:`RAW_REASONS`)."""
    first: Disagreement | None = None
    members = [r for r in g.ranks if r in collectives]
    if len(members) < 2:
        return None, None
    # a coalesced group of ops shares one sequence number (NCCL): compared as a whole
    on: dict[int, dict[int, list[Collective]]] = {r: {} for r in members}
    for r in members:
        for c in collectives[r]:
            if c.group == g.name and not c.is_p2p:
                on[r].setdefault(c.seq, []).append(c)
    windows = {r: (min(s), max(s)) for r, s in on.items() if s}
    for seq in sorted(set().union(*(s.keys() for s in on.values()))):
        here: dict[int, Collective | None] = {}
        ops: dict[int, list[Collective]] = {}
        for r in members:
            lo_hi = windows.get(r)
            if seq in on[r]:
                ops[r] = on[r][seq]
                here[r] = ops[r][0]
            elif lo_hi is None or seq > lo_hi[1]:
                here[r] = None  # it never issued it
            # else: its ring buffer overwrote it: that rank says nothing here
        present = [c for c in here.values() if c is not None]
        if len(here) < 2 or not present:
            continue
        reasons: list[Reason] = []
        if any(c is None for c in here.values()):
            reasons.append("missing")
        if len({tuple((c.op, c.kind) for c in cs) for cs in ops.values()}) > 1:
            reasons.append("kind")
        elif len({tuple((c.input_sizes, c.output_sizes) for c in cs) for cs in ops.values()}) > 1:
            reasons.append("size")
        if len({tuple((c.input_dtypes, c.output_dtypes) for c in cs) for cs in ops.values()}) > 1:
            reasons.append("dtype")
        raw = bool(reasons)
        predicted = {r: matched[(r, g.name, seq)][0] for r in here if (r, g.name, seq) in matched}
        if first is None:
            hooked = [c for c in present if c.hook is not None]
            if len(hooked) == len(present) and len({(c.hook, c.prefetch) for c in hooked}) > 1:
                reasons.append("hook")
            if not reasons and len(predicted) == len(here):
                ids = {_identity(p) for p in predicted.values()}
                if len(ids) > 1:
                    reasons.append("identity")
        if reasons:
            t = min(c.t for c in present)
            found = Disagreement(g, seq, tuple(reasons), here, predicted, t)
            first = first or found
            if raw:
                return first, found
    return first, None


def _identity(p: Predicted | None) -> tuple[Any, ...] | None:
    if p is None:
        return None
    return (p.iteration, p.event.unit, p.event.kind, p.event.hook, p.event.prefetch)


def _stop(
    rank: int,
    cs: list[Collective],
    groups: dict[str, GroupInfo],
    index: _Index,
    matched: Mapping[_Key, tuple[Predicted | None, int]],
) -> RankStop:
    if not cs:
        return RankStop(rank, None, None)
    tracks = any(c.state != "scheduled" for c in cs)
    stuck = next((c for c in cs if c.state != "completed"), None) if tracks else cs[-1]
    c = stuck if stuck is not None else cs[-1]
    completed = (c.state == "completed") if tracks else None
    g = groups.get(c.group)
    others = [r for r in g.ranks if r != rank] if g is not None else []
    # ranks of its group whose dumps end before it (a rank without a dump: not known)
    seen = [r for r in others if r in index.ranks]
    waits = [] if completed else [r for r in seen if index.last.get((r, c.group), 0) < c.seq]
    p, base = matched.get((rank, c.group, c.seq), (None, 0))
    mine = index.signatures.get((rank, c.group, c.seq))
    paired = (
        g is not None
        and not g.unseen
        and len(seen) == len(others)
        and all(index.signatures.get((r, c.group, c.seq)) == mine for r in others)
    )
    return RankStop(rank, c, completed, p, tuple(waits), base, paired)


@dataclass
class _Index:
    """Each rank's last sequence number per group, and each collective's signature(s)."""

    ranks: set[int]
    last: dict[tuple[int, str], int]
    signatures: dict[_Key, tuple[Any, ...]]

    @classmethod
    def of(cls, collectives: Mapping[int, list[Collective]]) -> _Index:
        last: dict[tuple[int, str], int] = {}
        signatures: dict[_Key, tuple[Any, ...]] = {}
        for rank, cs in collectives.items():
            for c in cs:
                last[(rank, c.group)] = max(last.get((rank, c.group), 0), c.seq)
                key = (rank, c.group, c.seq)
                signatures[key] = (*signatures.get(key, ()), c.signature())
        return cls(set(collectives), last, signatures)
