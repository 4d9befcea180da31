"""Where ranks stop and where they first disagree, read from their flight recorder dumps.

- where each rank stopped: its last collective (NCCL: the first one that never completed;
  gloo records no completion), the predicted collective it is, and which ranks of its group
  never issued it (the ones it waits for);
- the first collective the ranks disagree on, group by group, by sequence number: a
  different kind, size or dtype (what torch's ``fr_trace`` checks), a rank that never
  issued it, FSDP hooks that differ (read from the stacks: one rank in the forward, another
  in the backward), or, with a prediction, another unit's collective of the same shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fsdpviz.flight._align import Alignment, Predicted, align
from fsdpviz.flight._dump import Collective, GroupInfo
from fsdpviz.schema.report import Report

__all__ = [
    "RAW_REASONS", "Disagreement", "RankStop", "Ranks", "Reason", "compare_ranks",
    "fsdp_collectives",
]  # fmt: skip

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
class Ranks:
    """The ranks compared: ``alignments[rank][group]`` (with a prediction), each rank's
    ``stops``, the first ``disagreements`` of each group (earliest first) and the first
    ``mismatches`` torch's ``fr_trace`` also finds."""

    alignments: dict[int, dict[str, Alignment]]
    stops: list[RankStop]
    disagreements: list[Disagreement]
    mismatches: list[Disagreement]


def compare_ranks(
    collectives: Mapping[int, list[Collective]],
    groups: dict[str, GroupInfo],
    prediction: Report | None = None,
) -> Ranks:
    """Compare the ranks' collectives (per rank, in record order), and each with
    ``prediction``'s."""
    alignments = _alignments(collectives, groups, prediction) if prediction is not None else {}
    matched = _matched(alignments)
    firsts = [_first_disagreements(g, collectives, matched) for g in groups.values()]
    found = sorted((f for f, _ in firsts if f is not None), key=lambda d: d.t)
    raw = sorted((r for _, r in firsts if r is not None), key=lambda d: d.t)
    index = _Index.of(collectives)
    stops = [_stop(r, cs, groups, index, matched) for r, cs in sorted(collectives.items())]
    return Ranks(alignments, stops, found, raw)


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
