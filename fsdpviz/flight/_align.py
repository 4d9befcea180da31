"""A rank's recorded collectives matched to the collectives a prediction says it issues.

The prediction (:func:`fsdpviz.analyze`) gives every collective of the first iteration and
of the steady state; unrolled, iteration after iteration, that is the stream each rank
should issue on each process group: FSDP's own group (all-gathers, reduce-scatters,
``NO_SHARD``'s all-reduces), the replicate group of hybrid sharding (all-reduces) and the
tensor-parallel group. A recorded collective matches a predicted one of the same kind and
size (elements; bytes for tensor parallelism's); its FSDP hook, read from the stack, should
agree too. Where a rank left the predicted stream, a small edit-distance alignment finds the
fewest skipped and extra collectives that explain it.

Collectives of the same kind and size (two decoder layers' all-gathers) cannot be told
apart by a flight recorder: where a skipped or extra collective could be any of a run of
such twins, every candidate is kept (:attr:`Departure.candidates`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from fsdpviz.flight._dump import Collective, GroupInfo, Role
from fsdpviz.schema.events import TP_KINDS, Event
from fsdpviz.schema.report import Report, Unit

__all__ = [
    "Alignment", "Departure", "Predicted", "Role", "align", "expected_streams", "guess_roles",
    "role_of_event",
]  # fmt: skip

_GAP = 1.0  # a predicted collective the rank skipped
_EXTRA = 1.05  # a recorded one the prediction does not have: a skip that explains one is likelier
_HOOK_COST = 0.4  # the same collective issued by another hook of the same phase
_PHASE_COST = 1.5  # ... in the other phase: less likely than a skipped collective
_MAX_DP = 3_000_000  # cells of the alignment table; beyond, the rest stays unmatched
_TP_KIND = {
    "tp_all_gather": "all_gather",
    "tp_reduce_scatter": "reduce_scatter",
    "tp_all_reduce": "all_reduce",
    "tp_all_to_all": "all_to_all",
}


@dataclass(frozen=True)
class Predicted:
    """One collective of the unrolled prediction: ``iteration`` (from 0), ``index`` (its
    event's place in the prediction's event list of that iteration) and the event."""

    iteration: int
    index: int
    event: Event
    kind: str
    size: int  # elements; bytes for tensor parallelism's collectives
    by_bytes: bool

    @property
    def phase(self) -> str:
        return self.event.phase

    def token(self) -> tuple[object, ...]:
        """What a flight recorder can see of it: kind, size, hook (a twin has the same)."""
        return (self.kind, self.size, self.event.hook, self.event.prefetch)


@dataclass(frozen=True)
class Departure:
    """Where a rank left the predicted stream.

    ``what``: ``"skipped"`` (``predicted`` collectives it never issued), ``"extra"`` (a
    collective the prediction does not have) or ``"hook"`` (the predicted collective, issued
    by another hook or in the other phase). ``before``: the index, in the rank's recorded
    collectives of that group, of the collective it issued instead (or at). ``candidates``:
    the units it may be about when twins make it ambiguous.
    """

    what: Literal["skipped", "extra", "hook"]
    before: int
    predicted: tuple[Predicted, ...] = ()
    recorded: Collective | None = None
    candidates: tuple[str, ...] = ()


@dataclass
class Alignment:
    """A rank's collectives on one group matched to the prediction.

    ``matched[i]``: the predicted collective recorded collective ``i`` is, or ``None``;
    ``absolute``: whether iterations are counted from the job's start (the dump held its
    first collective, or its sequence numbers place it); ``departures`` in order.
    """

    role: Role
    collectives: list[Collective]
    matched: list[Predicted | None]
    departures: list[Departure] = field(default_factory=list)
    absolute: bool = True
    expected_next: Predicted | None = None  # what the prediction has next after the last one
    base: int = 0  # the iteration shown as 0 when not ``absolute`` (the dump's first)


def role_of_event(e: Event) -> Role:
    if e.kind in TP_KINDS:
        return "tp"
    return "replicate" if e.group == "replicate" else "shard"


def _size(e: Event, units: dict[str, Unit]) -> tuple[int, bool]:
    if e.kind in TP_KINDS or e.group == "shard":  # (a float8 amax all-reduce: its bytes)
        return int(e.nbytes or 0), True
    u = units.get(e.unit)
    if u is None:
        return 0, False
    padded = u.padded_numel or u.flat_numel or u.numel
    if e.kind == "all_reduce" and e.group == "replicate":
        return u.sharded_numel or padded, False
    return padded, False


def expected_streams(prediction: Report, iterations: int) -> dict[Role, list[Predicted]]:
    """The prediction's collectives per group role, unrolled over ``iterations`` iterations
    (the first, then the steady state repeated)."""
    units = {u.module: u for u in prediction.units}
    out: dict[Role, list[Predicted]] = {"shard": [], "replicate": [], "tp": []}
    if not prediction.iterations:
        return out
    for it in range(iterations):
        events = prediction.iterations[min(it, len(prediction.iterations) - 1)]
        for k, e in enumerate(events):
            if e.kind in ("free", "h2d", "d2h", "cast") or e.context_parallel:
                continue  # no collective, or ring attention's (its groups are not aligned)
            size, by_bytes = _size(e, units)
            kind = _TP_KIND.get(e.kind, e.kind)
            out[role_of_event(e)].append(Predicted(it, k, e, kind, size, by_bytes))
    return out


def per_iteration(prediction: Report, role: Role) -> tuple[int, int]:
    """Collectives of ``role`` in the first iteration and in each steady one."""
    first = expected_streams(prediction, 1)[role]
    two = expected_streams(prediction, 2)[role]
    return len(first), len(two) - len(first)


def _compatible(c: Collective, p: Predicted) -> bool:
    if c.kind != p.kind:
        return False
    return (c.nbytes if p.by_bytes else c.numel) == p.size


def _cost(c: Collective, p: Predicted) -> float | None:
    """0 for a perfect match, a little for another hook, ``None``: not this collective."""
    if not _compatible(c, p):
        return None
    if c.hook is None:  # no stack: kind and size are all there is
        return 0.0
    if c.phase != p.phase:
        return _PHASE_COST
    if c.hook != p.event.hook or c.prefetch != p.event.prefetch:
        return _HOOK_COST
    return 0.0


def align(collectives: Sequence[Collective], prediction: Report, role: Role) -> Alignment | None:
    """Match one rank's collectives of one group (in order) to the prediction's ``role``
    stream; ``None`` when the prediction has no collective there."""
    first, steady = per_iteration(prediction, role)
    if not collectives or first + steady == 0:
        return None
    n = len(collectives)
    iterations = 2 + (collectives[-1].seq + n) // max(steady, 1) if steady else 1
    stream = expected_streams(prediction, max(iterations, 2))[role]
    offset, absolute = _offset(collectives, stream, first, steady)
    need = offset + n + 2 * max(steady, first) + 2
    if len(stream) < need and steady:
        stream = expected_streams(prediction, 2 + need // steady)[role]
    matched: list[Predicted | None] = [None] * n
    departures: list[Departure] = []
    i, j = 0, offset
    while i < n and j < len(stream) and _cost(collectives[i], stream[j]) == 0.0:
        matched[i] = stream[j]
        i, j = i + 1, j + 1
    j = _rest(collectives, stream, i, j, matched, departures) if i < n else min(j, len(stream))
    return Alignment(
        role,
        list(collectives),
        matched,
        departures,
        absolute,
        stream[j] if j < len(stream) else None,
        0 if absolute else stream[offset].iteration,
    )


def _offset(
    collectives: Sequence[Collective], stream: list[Predicted], first: int, steady: int
) -> tuple[int, bool]:
    """Where in the stream the dump starts, and whether that is certain.

    A dump that holds the group's first collective starts at 0; one whose ring buffer
    overwrote its start is placed by its sequence numbers (the group's collectives are all
    FSDP's), else at the steady-state position its first collectives match best (its
    iteration numbers then count from the first iteration in the dump)."""
    by_seq = collectives[0].seq - 1
    candidates = [by_seq] + [first + r for r in range(steady)]
    look = min(len(collectives), first + 2 * max(steady, 1))

    def score(o: int) -> int:
        if o < 0 or o + look > len(stream):
            return -1
        return sum(_cost(collectives[i], stream[o + i]) == 0.0 for i in range(look))

    scores = [score(o) for o in candidates]
    best = max(range(len(candidates)), key=lambda k: (scores[k], k == 0))
    if scores[0] == scores[best] and scores[0] >= 0:
        return by_seq, True
    return candidates[best], False


def _rest(
    rec: Sequence[Collective],
    stream: list[Predicted],
    i0: int,
    j0: int,
    matched: list[Predicted | None],
    departures: list[Departure],
) -> int:
    """Edit-distance alignment of ``rec[i0:]`` with ``stream[j0:]``: every recorded
    collective used, the stream free to end early. Returns the stream position after it."""
    n = len(rec) - i0
    m = min(len(stream) - j0, n + 64)
    if m <= 0:
        for i in range(i0, len(rec)):
            departures.append(Departure("extra", i, (), rec[i]))
        return j0
    if n * m > _MAX_DP:
        n = max(1, _MAX_DP // m)
    inf = float("inf")
    dp = [[inf] * (m + 1) for _ in range(n + 1)]
    move = [[0] * (m + 1) for _ in range(n + 1)]  # 1 match, 2 skip predicted, 3 extra recorded
    dp[0][0] = 0.0
    for jj in range(1, m + 1):
        dp[0][jj] = dp[0][jj - 1] + _GAP
        move[0][jj] = 2
    for ii in range(1, n + 1):
        c = rec[i0 + ii - 1]
        row, prev = dp[ii], dp[ii - 1]
        mv = move[ii]
        row[0] = prev[0] + _EXTRA
        mv[0] = 3
        for jj in range(1, m + 1):
            best, how = prev[jj] + _EXTRA, 3
            skip = row[jj - 1] + _GAP
            if skip < best:
                best, how = skip, 2
            cost = _cost(c, stream[j0 + jj - 1])
            if cost is not None and prev[jj - 1] + cost <= best:
                best, how = prev[jj - 1] + cost, 1
            row[jj] = best
            mv[jj] = how
    end = min(range(m + 1), key=lambda jj: (dp[n][jj], jj))
    ops: list[tuple[int, int, int]] = []
    ii, jj = n, end
    while ii > 0 or jj > 0:
        how = move[ii][jj]
        ops.append((how, ii - 1, jj - 1))
        if how == 1:
            ii, jj = ii - 1, jj - 1
        elif how == 2:
            jj -= 1
        else:
            ii -= 1
    ops.reverse()
    skipped: list[Predicted] = []
    at = 0  # stream position of the first skipped one
    for how, ii, jj in ops:
        i = i0 + ii
        if how == 2:
            if not skipped:
                at = j0 + jj
            skipped.append(stream[j0 + jj])
            continue
        if skipped:
            departures.append(_skip(skipped, at, i, rec, stream))
            skipped = []
        if how == 1:
            p = stream[j0 + jj]
            matched[i] = p
            if _cost(rec[i], p):
                departures.append(Departure("hook", i, (p,), rec[i], (p.event.unit,)))
        else:
            departures.append(Departure("extra", i, (), rec[i], _twins_of(rec[i], stream, j0)))
    if skipped:
        departures.append(_skip(skipped, at, i0 + n, rec, stream))
    for i in range(i0 + n, len(rec)):
        departures.append(Departure("extra", i, (), rec[i]))
    return j0 + end


def _skip(
    skipped: list[Predicted], at: int, before: int, rec: Sequence[Collective],
    stream: list[Predicted],
) -> Departure:  # fmt: skip
    """Skipped collectives (from stream position ``at``), with the units they may be: a
    run of twins (same kind, size and hook, in the same iteration) around them."""
    token, first, last = skipped[0].token(), skipped[0], skipped[-1]
    lo, hi = at, at + len(skipped)
    while (
        lo > 0 and stream[lo - 1].token() == token and stream[lo - 1].iteration == first.iteration
    ):
        lo -= 1
    while (
        hi < len(stream) and stream[hi].token() == token and stream[hi].iteration == last.iteration
    ):
        hi += 1
    units = tuple(dict.fromkeys(p.event.unit for p in stream[lo:hi]))
    recorded = rec[before] if before < len(rec) else None
    return Departure("skipped", before, tuple(skipped), recorded, units)


def _twins_of(c: Collective, stream: list[Predicted], j0: int) -> tuple[str, ...]:
    """Units near the departure whose collective looks like ``c``: what an extra one may be."""
    near = stream[max(0, j0 - 8) : j0 + 8]
    return tuple(dict.fromkeys(p.event.unit for p in near if _compatible(c, p)))


def guess_roles(
    groups: dict[str, GroupInfo],
    collectives: dict[int, list[Collective]],
    prediction: Report | None = None,
) -> dict[str, GroupInfo]:
    """``groups`` with their FSDP role: from the mesh dimension a group's description names
    (``mesh_<dim>``; the prediction's mesh says which dimension is which), else from what
    FSDP issued on it (all-gathers and reduce-scatters: its shard group; all-reduces only,
    beside a shard group: hybrid sharding's replicate group)."""
    by_group: dict[str, list[Collective]] = {}
    for cs in collectives.values():
        for c in cs:
            by_group.setdefault(c.group, []).append(c)
    dims: dict[str, Role] = {}
    mesh = list((prediction.config.mesh or {}).keys()) if prediction is not None else []
    if prediction is not None and prediction.config.tp_world_size and mesh:
        dims[mesh.pop()] = "tp"
    if len(mesh) >= 2:
        dims[mesh[0]] = "replicate"
        for name in mesh[1:]:
            dims[name] = "shard"
    elif mesh:
        dims[mesh[0]] = "shard"
    shard_users = {
        c.rank
        for cs in by_group.values()
        for c in cs
        if c.fsdp and c.kind in ("all_gather", "reduce_scatter")
    }
    out = {}
    for name, g in groups.items():
        cs = by_group.get(name, [])
        role: Role | None = None
        dim = g.desc.removeprefix("mesh_") if g.desc.startswith("mesh_") else None
        if dim is not None and dim in dims:
            role = dims[dim]
        elif dim is not None and ("tp" in dim.split("_") or "tensor" in dim):
            role = "tp"
        elif dim is not None and "replicate" in dim:
            role = "replicate"
        elif any(c.fsdp and c.kind in ("all_gather", "reduce_scatter") for c in cs):
            role = "shard"
        elif any(c.fsdp and c.kind == "all_reduce" for c in cs):
            role = "replicate" if any(c.rank in shard_users for c in cs) else "shard"
        elif any("tensor" in f.filename for c in cs[:5] for f in c.frames):
            role = "tp"
        elif not any(c.frames for c in cs) and g.desc in ("default_pg", ""):
            role = "shard"  # no stacks (a JSON dump): the default group carries FSDP's
        out[name] = replace(g, role=role)
    return out
