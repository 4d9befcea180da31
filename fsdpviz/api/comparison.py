"""Two plans side by side: "is my FSDP2 wrapping the same as my FSDP1 policy?", and "what
changes if I switch?".

Units are matched by the parameters they hold (FSDP1 names a unit by its
module, FSDP2 by its group's modules, so names alone cannot match them; the
prefixes activation checkpointing and ``torch.compile`` wrappers add are left out). For
each matched pair the comparison gives bytes per rank, position in the forward
order, how it is prefetched in backward and its event counts; parameters that
moved to another unit and units with no counterpart are listed.

What each plan costs, from the memory and time model (``report.memory`` and
``report.timeline``, each on the report's own machine): peak memory, the reserved
estimate, step time, exposed communication and tokens/s, side by side with the
difference (:data:`COSTS`). Two plans are identical only when these are too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Unpack

from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.schema.extensions import save_method, show_method
from fsdpviz.schema.keywords import PageKwargs, TimelineKwargs
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.names import unwrapped_fqn
from fsdpviz.schema.report import Report, Unit, unit_label
from fsdpviz.schema.timeline import duration_text

COSTS = ("peak_bytes", "reserved_bytes", "step_s", "exposed_comm_s", "tokens_per_s")
"""What a comparison costs each plan at: peak allocated and reserved bytes per rank
(``report.memory``), step time, exposed communication and tokens/s per GPU
(``report.timeline``)."""
_LABELS = {
    "peak_bytes": "peak",
    "reserved_bytes": "reserved",
    "step_s": "step",
    "exposed_comm_s": "exposed",
    "tokens_per_s": "tokens/s",
}


@dataclass(frozen=True)
class UnitPair:
    """One unit of A and the unit of B holding the same parameters (or None)."""

    a: str | None
    b: str | None
    params: int
    sharded_bytes_a: int
    sharded_bytes_b: int
    forward_index_a: int | None
    forward_index_b: int | None
    backward_prefetch_a: bool
    backward_prefetch_b: bool
    events_a: dict[str, int]
    events_b: dict[str, int]
    # Why bytes per rank differ (padding, dtype), when they do.
    bytes_note: str = ""

    @property
    def differs(self) -> list[str]:
        out = []
        if self.a is None or self.b is None:
            out.append("unit")
        if self.sharded_bytes_a != self.sharded_bytes_b:
            out.append("bytes per rank")
        if self.forward_index_a != self.forward_index_b:
            out.append("forward order")
        if self.backward_prefetch_a != self.backward_prefetch_b:
            out.append("backward prefetch")
        if self.events_a != self.events_b:
            out.append("events")
        return out


@dataclass
class Comparison:
    """The result of :func:`compare`; ``to_dict()`` is JSON-serialisable."""

    name_a: str
    name_b: str
    pairs: list[UnitPair]
    moved_params: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    bytes_per_rank: tuple[int, int] = (0, 0)
    events: tuple[dict[str, int], dict[str, int]] = ({}, {})
    costs: dict[str, tuple[float, float]] = field(default_factory=dict)
    """``{name: (a, b)}`` for each of :data:`COSTS`; empty when a plan has no trace profile
    (a recording, ``trace="fx"``), so its activations and compute are unknown."""
    reports: tuple[Report, Report] | None = field(default=None, repr=False, compare=False)
    """The two plans compared (what :meth:`show` draws); not part of :meth:`to_dict`."""

    @property
    def same_wrapping(self) -> bool:
        """Every unit holds the same parameters in both plans."""
        return not self.moved_params and all(
            p.a is not None and p.b is not None for p in self.pairs
        )

    @property
    def identical(self) -> bool:
        """Same wrapping, bytes, order, prefetch and event counts, and the same costs."""
        same_plan = self.same_wrapping and not any(p.differs for p in self.pairs)
        return same_plan and not self.cost_differs and not self.pipeline_differs

    @property
    def pipeline_differs(self) -> bool:
        """Whether the plans run in different pipelines (schedule, microbatches, ranks)."""
        if self.reports is None:
            return False
        a, b = (r.config for r in self.reports)
        keys = ("pipeline_schedule", "microbatches", "pp_world_size")
        return any(getattr(a, k) != getattr(b, k) for k in keys)

    @property
    def cost_differs(self) -> list[str]:
        """The costs (of :data:`COSTS`) that differ between the two plans."""
        return [k for k, (a, b) in self.costs.items() if not _same(a, b)]

    def delta(self, name: str) -> float:
        """``b - a`` of a cost (``"peak_bytes"``, ``"step_s"``, ...)."""
        a, b = self.costs[name]
        return b - a

    @property
    def verdict(self) -> str:
        """``identical``, ``different wrapping``, or what differs with the same wrapping:
        the schedule (forward order, prefetch, events), the bytes per rank, and the costs
        (``different memory`` / ``different time`` where only those differ)."""
        if self.identical:
            return "identical"
        if not self.same_wrapping:
            return "different wrapping"
        aspects = {d for p in self.pairs for d in p.differs}
        schedule = bool(aspects & {"forward order", "backward prefetch", "events"})
        schedule = schedule or self.pipeline_differs
        if not schedule and "bytes per rank" not in aspects:
            return f"same wrapping and schedule, {self._costs_word()}"
        if not schedule:
            return "same wrapping and schedule, different bytes per rank"
        if "bytes per rank" in aspects:
            return "same wrapping, different schedule and bytes per rank"
        return "same wrapping, different schedule"

    def _costs_word(self) -> str:
        memory = {"peak_bytes", "reserved_bytes"} & set(self.cost_differs)
        time = {"step_s", "exposed_comm_s", "tokens_per_s"} & set(self.cost_differs)
        what = [w for w, on in (("memory", memory), ("time", time)) if on]
        return "different " + " and ".join(what)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(replace(self, reports=None))
        del d["reports"]
        d["costs"] = {k: list(v) for k, v in self.costs.items()}
        d["verdict"] = self.verdict
        d["same_wrapping"] = self.same_wrapping
        d["identical"] = self.identical
        d["cost_differs"] = self.cost_differs
        for row, pair in zip(d["pairs"], self.pairs, strict=True):
            row["differs"] = pair.differs
        return d

    def show(self, **kwargs: Unpack[TimelineKwargs]) -> Any:
        """The differences (the verdict, each cost of both plans and the change, whether
        each fits) over both plans' timelines on one time axis, units matched, the first
        difference marked (a :class:`fsdpviz.widgets.ComparisonView`; ``kwargs`` as
        :class:`~fsdpviz.widgets.TimelineWidget` takes them).

        Example::

            fsdpviz.compare(fsdp1, fsdp2).show()
        """
        if self.reports is None:
            raise ValueError("this comparison was read back without its plans; compare() again")
        return show_method("comparison")(self, **kwargs)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, object]:
        """A comparison as a cell's last line: its view (:meth:`show`: the differences and
        both timelines), and its summary as text; the summary alone where the plans are
        not kept (a comparison read back)."""
        if self.reports is None:
            return {"text/plain": self.summary()}
        shown = self.show()._repr_mimebundle_()
        return dict(shown) if shown else {"text/plain": self.summary()}

    def save(self, path: str | Path, **kwargs: Unpack[PageKwargs]) -> Path:
        """The comparison as one self-contained page (``.html``): each plan's costs and
        whether it fits side by side, both plans' timelines on one time axis with their
        memory lanes on one byte scale, each with its capacity line. ``kwargs`` as
        :func:`fsdpviz.export.save` takes for a page (``theme``, ``iteration``, ``memory``,
        ``title``, ``machine``).

        Example::

            fsdpviz.compare(fsdp1, fsdp2).save("compare.html", theme="dark")
        """
        if self.reports is None:
            raise ValueError("this comparison was read back without its plans; compare() again")
        return Path(save_method("comparison")(self, path, **kwargs))

    def summary(self) -> str:
        a, b = self.name_a, self.name_b
        lines = [
            f"{a} vs {b}: {self.verdict}",
            *self.cost_lines(),
            f"  parameters per rank: {size_text(self.bytes_per_rank[0])} vs "
            f"{size_text(self.bytes_per_rank[1])}",
            f"  steady-state events: {_counts(self.events[0])} vs {_counts(self.events[1])}",
        ]
        for p in self.pairs:
            if p.differs:
                note = f" ({p.bytes_note})" if p.bytes_note else ""
                lines.append(
                    f"  {_name(p.a)} ~ {_name(p.b)}: differs in {', '.join(p.differs)}{note}"
                )
        for param, (ua, ub) in list(self.moved_params.items())[:20]:
            lines.append(f"  parameter {param}: unit {_name(ua)} in {a}, {_name(ub)} in {b}")
        return "\n".join(lines)

    def cost_lines(self) -> list[str]:
        """The costs side by side: ``"  peak: 23.9 MiB vs 22.4 MiB (-1.5 MiB, -6%)"``."""
        if not self.costs:
            return ["  costs: not modelled (a plan has no trace profile)"]
        lines = []
        for k in COSTS:
            if k not in self.costs:
                continue
            a, b = self.costs[k]
            lines.append(
                f"  {_LABELS[k]}: {cost_text(k, a)} vs {cost_text(k, b)} ({self.change_text(k)})"
            )
        return lines

    def change_text(self, name: str) -> str:
        """A cost's change from A to B: ``"+1.5 MiB, +6%"``, or ``"same"``."""
        a, b = self.costs[name]
        return "same" if _same(a, b) else signed_text(name, b - a) + _percent(a, b)

    def worse(self, name: str) -> bool:
        """Whether B is worse than A in this cost (more bytes or time, fewer tokens/s)."""
        a, b = self.costs[name]
        return not _same(a, b) and (b < a if name == "tokens_per_s" else b > a)

    def __repr__(self) -> str:
        return self.summary()


def plan_costs(report: Report) -> dict[str, float]:
    """A plan's :data:`COSTS` from its memory and time model (``report.memory`` and
    ``report.timeline``, computed once per report); ``{}`` without a trace profile.

    Example::

        plan_costs(report)["peak_bytes"] / 2**30
    """
    if not report.profiled or not report.iterations or not report.units:
        return {}
    memory, totals = report.memory, report.timeline.totals
    return {
        "peak_bytes": float(memory.peak["bytes"]),
        "reserved_bytes": float(memory.reserved.get("bytes", 0)),
        "step_s": totals["step_s"],
        "exposed_comm_s": totals["exposed_comm_s"],
        "tokens_per_s": totals.get("tokens_per_s", 0.0),
    }


def cost_label(name: str) -> str:
    """A cost's name as the comparison says it: ``"peak"``, ``"tokens/s"``."""
    return _LABELS[name]


def cost_text(name: str, value: float) -> str:
    """One cost as people read it: bytes in GiB/MiB, times in ms/µs, tokens/s with commas."""
    if name.endswith("_bytes"):
        return size_text(value)
    if name == "tokens_per_s":
        return f"{value:,.0f}"
    return duration_text(value)


def signed_text(name: str, delta: float) -> str:
    """A difference of a cost with its sign: ``"+1.2 GiB"``, ``"-3.1 ms"``, ``"-0.4"``
    tokens/s (a difference under one token is not written ``-0``)."""
    sign = "+" if delta > 0 else "-"
    if name == "tokens_per_s" and abs(delta) < 1:
        return sign + f"{abs(delta):.2g}"
    return sign + cost_text(name, abs(delta))


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def _percent(a: float, b: float) -> str:
    """``", +6%"``; a change under 1% with one decimal, under 0.1% as such (never ``-0%``)."""
    if not a:
        return ""
    r = (b - a) / abs(a)
    if abs(r) >= 0.01:
        return f", {r:+.0%}"
    if abs(r) >= 0.001:
        return f", {r:+.1%}"
    return ", under 0.1%"


def _name(unit: str | None) -> str:
    """A unit of one plan, ``None`` when the other plan has no counterpart."""
    return "(none)" if unit is None else unit_label(unit)


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or "none"


def _params(unit: Unit) -> frozenset[str]:
    return frozenset(unwrapped_fqn(p) for p in unit.params)


def _unit_of_param(report: Report) -> dict[str, str]:
    return {unwrapped_fqn(p): u.module for u in report.units for p in u.params}


def _facts(report: Report) -> tuple[dict[str, int], dict[str, bool], dict[str, Counter[str]]]:
    steady = report.iterations[-1] if report.iterations else []
    order = {name: i for i, name in enumerate(report.forward_order)}
    prefetched = {e.unit: True for e in steady if e.prefetch and e.phase == "backward"}
    events: dict[str, Counter[str]] = {}
    for e in steady:
        events.setdefault(e.unit, Counter())[e.kind] += 1
    return order, prefetched, events


def compare(a: Report, b: Report, names: tuple[str, str] | None = None) -> Comparison:
    """Compare two plans unit by unit, and what each costs (:data:`COSTS`, from
    ``report.memory`` and ``report.timeline`` on each report's machine).

    Example::

        fsdp1 = fsdpviz.analyze(model, ids, auto_wrap_policy=ModuleWrapPolicy({Block}))
        fsdp2 = fsdpviz.analyze(model, ids, fully_shard=[Block])
        cmp = fsdpviz.compare(fsdp1, fsdp2)
        cmp.same_wrapping, print(cmp)
        cmp.costs["peak_bytes"], cmp.delta("exposed_comm_s")
    """
    name_a, name_b = names or _labels(a, b)
    units_b = {_params(u): u for u in b.units if u.params}
    order_a, pref_a, ev_a = _facts(a)
    order_b, pref_b, ev_b = _facts(b)
    pairs: list[UnitPair] = []
    matched_b: set[str] = set()
    for ua in a.units:
        if not ua.params:
            continue
        ub = units_b.get(_params(ua))
        if ub is not None:
            matched_b.add(ub.module)
        pair = _pair(ua, ub, order_a, order_b, pref_a, pref_b, ev_a, ev_b)
        if ub is not None and "bytes per rank" in pair.differs:
            pair = replace(pair, bytes_note=bytes_note(ua, ub, a, b))
        pairs.append(pair)
    for ub in b.units:
        if ub.params and ub.module not in matched_b:
            pairs.append(_pair(None, ub, order_a, order_b, pref_a, pref_b, ev_a, ev_b))
    pa, pb = _unit_of_param(a), _unit_of_param(b)
    # Moved: now in a unit of other parameters under another name. A unit renamed
    # with the same parameters, or one that only gained some (such as the root),
    # keeps the parameters it had.
    moved = {
        p: (pa.get(p), pb.get(p))
        for p in sorted(set(pa) | set(pb))
        if pa.get(p) != pb.get(p) and _group_of(pa, p, a) != _group_of(pb, p, b)
    }
    total = (sum(u.sharded_bytes for u in a.units), sum(u.sharded_bytes for u in b.units))
    counts = (_kinds(a), _kinds(b))
    cost_a, cost_b = plan_costs(a), plan_costs(b)
    costs = {k: (cost_a[k], cost_b[k]) for k in COSTS if k in cost_a and k in cost_b}
    return Comparison(name_a, name_b, pairs, moved, total, counts, costs, (a, b))


def bytes_note(ua: Unit, ub: Unit, a: Report, b: Report) -> str:
    """Why two units holding the same parameters take other bytes per rank: their dtype,
    the ranks they are sharded over, and how each API pads (FSDP1 pads its one flat
    parameter, FSDP2 dim 0 of every parameter)."""
    if ua.dtype != ub.dtype:
        return f"dtype {ua.dtype} vs {ub.dtype}"
    ranks = [_shard_ranks(a, ua), _shard_ranks(b, ub)]
    over = f"{ranks[0]}" if ranks[0] == ranks[1] else f"{ranks[0]} vs {ranks[1]}"
    parts = [f"sharded over {over} ranks"]
    pads = [u.padded_numel - u.numel for u in (ua, ub)]
    how = [_padding(r, u, n) for r, u, n in zip((a, b), (ua, ub), ranks, strict=True)]
    said = how[0] if how[0] == how[1] else f"{how[0]}; {how[1]}"
    parts.append(f"padding {pads[0]:,} vs {pads[1]:,} elements: {said}")
    return "; ".join(parts)


def _shard_ranks(report: Report, unit: Unit) -> int:
    if unit.sharding_strategy == "NO_SHARD":
        return 1
    return report.config.parallel_dims.dp_shard_cp


def _padding(report: Report, unit: Unit, ranks: int) -> str:
    """How a unit is padded, without the rank count where ``ranks`` is given elsewhere."""
    if report.config.api == "FSDP2":
        return "FSDP2 pads dim 0 of each parameter to a multiple of the shard ranks"
    aligned = unit.flat_numel - unit.numel
    align = f" after {aligned:,} elements of alignment" if aligned > 0 else ""
    return f"FSDP1 pads its flat parameter to a multiple of the shard ranks{align}"


def _group_of(unit_of: dict[str, str], param: str, report: Report) -> frozenset[str] | None:
    unit = unit_of.get(param)
    return None if unit is None else _params(report.unit(unit))


def _kinds(report: Report) -> dict[str, int]:
    steady = report.iterations[-1] if report.iterations else []
    return dict(Counter(e.kind + (" (prefetch)" if e.prefetch else "") for e in steady))


def _pair(
    ua: Unit | None,
    ub: Unit | None,
    order_a: dict[str, int],
    order_b: dict[str, int],
    pref_a: dict[str, bool],
    pref_b: dict[str, bool],
    ev_a: dict[str, Counter[str]],
    ev_b: dict[str, Counter[str]],
) -> UnitPair:
    na = ua.module if ua else None
    nb = ub.module if ub else None
    either = ua or ub
    assert either is not None
    return UnitPair(
        a=na,
        b=nb,
        params=len(either.params),
        sharded_bytes_a=ua.sharded_bytes if ua else 0,
        sharded_bytes_b=ub.sharded_bytes if ub else 0,
        forward_index_a=order_a.get(na) if na is not None else None,
        forward_index_b=order_b.get(nb) if nb is not None else None,
        backward_prefetch_a=pref_a.get(na, False) if na is not None else False,
        backward_prefetch_b=pref_b.get(nb, False) if nb is not None else False,
        events_a=dict(ev_a.get(na, Counter())) if na is not None else {},
        events_b=dict(ev_b.get(nb, Counter())) if nb is not None else {},
    )


# What tells two plans of one API apart where their labels are the same, in this order.
_TELLS = (
    "world_size", "sharding_strategy", "backward_prefetch", "forward_prefetch",
    RESHARD.name, "mixed_precision", "mp_policy", "activation_checkpointing",
    "grad_accum", "compile", "float8", "machine",
)  # fmt: skip


def _labels(a: Report, b: Report) -> tuple[str, str]:
    """Each plan's label; where the two read the same (two FSDP2 plans), each with the first
    option that differs (``FSDP2 prediction, world size 8``), else ``A`` and ``B``."""
    la, lb = _label(a), _label(b)
    if la != lb:
        return la, lb
    for key in _TELLS:
        va, vb = a.config.get(key), b.config.get(key)
        if va != vb:
            word = key.replace("_", " ")
            return f"{la}, {word} {_said(va)}", f"{lb}, {word} {_said(vb)}"
    return f"{la} (A)", f"{lb} (B)"


def _said(value: Any) -> str:
    """An option's value in a label: a per-unit map (FSDP2's resharding) by the value
    of its units but the root's where they all have one, else ``per unit``."""
    if isinstance(value, dict):
        units = {str(v) for k, v in value.items() if k != ""} or {str(v) for v in value.values()}
        return units.pop() if len(units) == 1 else "per unit"
    return "none" if value is None else str(value)


def _label(report: Report) -> str:
    api = report.config.api
    detail = report.config.auto_wrap_policy if api == "FSDP1" else None
    return f"{api} {report.source}" + (f" ({detail})" if detail else "")
