"""Compare configurations side by side: peak memory, exposed communication, bytes moved.

:func:`sweep` takes the keyword arguments of :func:`fsdpviz.analyze`; an option
given as a **list** is an axis of the grid. Wrap plans go in ``policies``. The
model is traced once per wrap plan (and per value of an option that changes the
autograd graph: FSDP1 ``forward_prefetch``, ``use_orig_params``, mixed
precision); every other configuration is replayed from that trace
(:mod:`fsdpviz.replan.hook_replay`), which costs milliseconds.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict, Unpack, cast

from torch import nn

from fsdpviz.api.predict import analyze
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.memory import memory_model
from fsdpviz.cost.sizes import parse_bytes
from fsdpviz.cost.time import timeline
from fsdpviz.errors import ConfigError
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.replan.hook_replay import REPLAYABLE, replay
from fsdpviz.schema.extensions import show_method
from fsdpviz.schema.keywords import DashboardKwargs
from fsdpviz.schema.report import Report
from fsdpviz.schema.serial import key, record_dict
from fsdpviz.schema.tables import dataframe
from fsdpviz.trace.copy import check_model

AXES = {
    "world_size",
    "backward_prefetch",
    "forward_prefetch",
    "sharding_strategy",
    "shard_group_size",
    "use_orig_params",
    "mixed_precision",
    "mp_policy",
    RESHARD.name,
    "limit_all_gathers",
}


class SweepRow(TypedDict):
    """One configuration of a :class:`SweepTable`: what was swept (``config``: option
    names to readable values, ``policy`` first where wrap plans were swept), the plan's
    ``api`` and ``units``, peak memory per rank (``peak_bytes``, ``peak_gib``,
    ``reserved_bytes``, ``headroom_bytes``, ``peak_where``, ``dominant``, ``fits`` the
    budget or ``None`` without one), the timeline's totals and ``bytes_moved``;
    ``traced``: whether the model ran for it (else replayed from a trace)."""

    config: dict[str, object]
    api: str
    units: int
    peak_bytes: int
    peak_gib: float
    reserved_bytes: int
    headroom_bytes: int
    peak_where: str
    dominant: str | None
    fits: bool | None
    step_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    all_gather_bytes: float
    reduce_scatter_bytes: float
    bytes_moved: float
    traced: NotRequired[bool]


class SweepTableDict(TypedDict):
    """:meth:`SweepTable.to_dict`: the rows and what the sweep cost."""

    rows: list[SweepRow]
    traces: int
    replays: int
    seconds: float
    budget: int | None


@dataclass
class SweepTable:
    """One row per configuration (see :func:`sweep`), and what the sweep cost.

    ``traces``: how many times the model ran (one per wrap plan and graph-changing
    option); ``replays``: configurations predicted from a trace without running it.
    """

    rows: list[SweepRow]
    traces: int
    replays: int
    seconds: float
    budget: int | None = None
    reports: list[Report] = field(default_factory=list, repr=False, metadata=key(saved=False))

    def records(self) -> list[SweepRow]:
        return [r.copy() for r in self.rows]

    def to_pandas(self) -> Any:
        """The records as a ``pandas.DataFrame`` (needs pandas)."""
        return dataframe(self.records(), flatten=True)

    def to_dict(self) -> SweepTableDict:
        return cast(SweepTableDict, record_dict(self))

    def show(self, **kwargs: Unpack[DashboardKwargs]) -> Any:
        """The table as an interactive view: sort by a column, open a row to see that
        configuration's explorer, prefetch graph and timeline below it. Returns a
        :class:`fsdpviz.widgets.SweepView` (``kwargs`` as it takes: ``model=`` and
        ``inputs=`` let the opened views re-plan).

        Example::

            table = fsdpviz.sweep(model, ids, world_size=[8, 64], policies={...})
            view = table.show()
            view.open(0)            # the first row's views
        """
        return show_method("sweep")(self, **kwargs)

    def best(self) -> SweepRow:
        """The row that fits the budget with the least exposed communication (then step time)."""
        fitting = [r for r in self.rows if r["fits"] is not False]
        if not fitting:
            budget = (self.budget or 0) / 2**30
            raise ConfigError(
                f"no configuration fits in {budget:.1f} GiB (budget); the smallest "
                f"peak is {min(r['peak_gib'] for r in self.rows):.1f} GiB. Add ranks, shard "
                "finer, or use activation checkpointing"
            )
        # times equal to the nanosecond are a tie: the lower peak wins
        return min(
            fitting,
            key=lambda r: (round(r["exposed_comm_s"], 9), round(r["step_s"], 9), r["peak_bytes"]),
        )

    def summary(self) -> str:
        cols = (
            f"{'peak GiB':>9} {'exposed ms':>11} {'step ms':>9} {'tok/s/GPU':>10} {'MFU':>6} "
            f"{'moved GiB':>9}"
        )
        head = f"{'configuration':<60} {cols}"
        lines = [head]
        for r in self.rows:
            name = ", ".join(f"{k}={v}" for k, v in r["config"].items())
            fit = "" if r["fits"] is not False else "  (over budget)"
            lines.append(
                f"{name[:60]:<60} {r['peak_gib']:>9.2f} {r['exposed_comm_s'] * 1e3:>11.1f} "
                f"{r['step_s'] * 1e3:>9.1f} {r['tokens_per_s']:>10,.0f} {r['mfu']:>6.1%} "
                f"{r['bytes_moved'] / 2**30:>9.2f}{fit}"
            )
        lines.append(
            f"{len(self.rows)} configurations from {self.traces} trace(s) and {self.replays} "
            f"replay(s) in {self.seconds:.2f} s"
        )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()


def sweep(
    model: nn.Module,
    inputs: Any,
    *,
    policies: Mapping[str, object] | None = None,
    memory_budget: str | int | None = None,
    machine: Machine | str = "h100",
    optimizer: str | int | None = "adamw",
    iteration: int = -1,
    **options: Any,
) -> SweepTable:
    """Peak memory, exposed communication and bytes moved for every configuration of a grid.

    ``options`` are :func:`fsdpviz.analyze` keywords; those in ``AXES`` given as a
    list are swept. ``policies`` maps a name to a wrap plan: an FSDP1
    ``auto_wrap_policy``, a list for FSDP2's ``fully_shard=``, or a dict of
    ``analyze`` keywords (``{"fully_shard": fn}`` for an FSDP2 callable).
    ``memory_budget`` (``"80GiB"``) marks the rows that fit (``fits``: the peak within it);
    ``headroom_bytes`` is what each row leaves of the ``machine``'s memory
    (``MemoryReport.headroom``: negative where it does not fit there), ``reserved_bytes``
    the allocator's reserved estimate. The reports are planned for ``machine``.

    Example::

        table = fsdpviz.sweep(
            model, {"input_ids": ids}, world_size=[8, 64],
            backward_prefetch=[BackwardPrefetch.BACKWARD_PRE, None],
            policies={"layer": ModuleWrapPolicy({Block}), "root": None},
            memory_budget="80GiB",
        )
        table.best(), table.to_pandas()
    """
    check_model(model, "sweep")
    t0 = time.perf_counter()
    budget = None if memory_budget is None else parse_bytes(memory_budget)
    axes = {k: list(v) for k, v in options.items() if k in AXES and isinstance(v, (list, tuple))}
    fixed = {k: v for k, v in options.items() if k not in axes}
    plans = _plans(policies)
    traced: dict[tuple[str, ...], Report] = {}
    rows: list[SweepRow] = []
    reports: list[Report] = []
    replays = 0
    for (plan_name, plan_kw), values in itertools.product(plans.items(), _grid(axes)):
        kw = {**fixed, **plan_kw, **values}
        api = "FSDP2" if "fully_shard" in kw else "FSDP1"
        limit = bool(kw.pop("limit_all_gathers", True)) if api == "FSDP1" else True
        changes = {k: v for k, v in kw.items() if k in REPLAYABLE[api]}
        key = (plan_name, *(_label(kw[k]) for k in sorted(kw) if k in AXES and k not in changes))
        base = traced.get(key)
        if base is None:
            report = traced[key] = _analyze(model, inputs, kw, machine)
            from_trace = True
        else:
            report = replay(base, **changes)
            replays += 1
            from_trace = False
        reports.append(report)
        rows.append(_row(plan_name, values, report, budget, machine, optimizer, iteration, limit))
        rows[-1]["traced"] = from_trace
    return SweepTable(rows, len(traced), replays, time.perf_counter() - t0, budget, reports)


def _analyze(model: nn.Module, inputs: Any, kw: dict[str, Any], machine: Machine | str) -> Report:
    kw = {"progress": False, "machine": machine, **kw}
    return analyze(model, inputs, **kw)


def _plans(policies: Mapping[str, object] | None) -> dict[str, dict[str, object]]:
    if policies is None:
        return {"": {}}
    if not isinstance(policies, dict) or not policies:
        raise ConfigError("policies must be a non-empty dict {name: wrap plan}")
    out: dict[str, dict[str, object]] = {}
    for name, plan in policies.items():
        if isinstance(plan, dict):
            out[name] = dict(plan)
        elif isinstance(plan, (list, tuple)):
            out[name] = {"fully_shard": list(plan)}
        else:
            out[name] = {"auto_wrap_policy": plan}
    return out


def _grid(axes: dict[str, list[Any]]) -> list[dict[str, object]]:
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*axes.values())]


def _label(value: Any) -> Any:
    """A JSON-friendly, readable form of an option value."""
    if isinstance(value, enum.Enum):
        return value.name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _label(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_label(v) for v in value]
    fields = getattr(value, "__dataclass_fields__", None)
    if fields:
        inner = ", ".join(f"{k}={_label(getattr(value, k))}" for k in fields if getattr(value, k))
        return f"{type(value).__name__}({inner})"
    return getattr(value, "__name__", None) or type(value).__name__


def _row(
    plan: str,
    values: dict[str, object],
    report: Report,
    budget: int | None,
    machine: Machine | str,
    optimizer: str | int | None,
    iteration: int,
    limit: bool,
) -> SweepRow:
    mem = memory_model(report, optimizer=optimizer, iteration=iteration, machine=machine)
    tl = timeline(
        report, machine, iteration=iteration, optimizer=optimizer, limit_all_gathers=limit
    )
    config = ({"policy": plan} if plan else {}) | {k: _label(v) for k, v in values.items()}
    t = tl.totals
    peak = int(mem.peak["bytes"])
    return {
        "config": config,
        "api": report.config.api,
        "units": len(report.units),
        "peak_bytes": peak,
        "peak_gib": peak / 2**30,
        "reserved_bytes": int(mem.reserved.get("bytes", 0)),
        "headroom_bytes": mem.headroom,
        "peak_where": mem.peak["where"],
        "dominant": mem.peak["dominant"],
        "fits": None if budget is None else peak <= budget,
        "step_s": t["step_s"],
        "tokens_per_s": t["tokens_per_s"],
        "mfu": t["mfu"],
        "hfu": t["hfu"],
        "compute_s": t["compute_s"],
        "comm_s": t["comm_s"],
        "exposed_comm_s": t["exposed_comm_s"],
        "all_gather_bytes": t["all_gather_bytes"],
        "reduce_scatter_bytes": t["reduce_scatter_bytes"],
        "bytes_moved": t["all_gather_bytes"] + t["reduce_scatter_bytes"],
    }
