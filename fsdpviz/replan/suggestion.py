"""Propose a wrap plan that fits a memory budget with the least exposed communication.

PyTorch once had an FSDP auto-wrap policy that solved an integer program over
per-module memory and runtime *estimates* (reverted). :func:`suggest` instead
evaluates each candidate plan with fsdpviz's exact schedule: every
all-gather, free, prefetch and reduce-scatter FSDP would issue, the activations
the trace measured, and the time model; the settings that do not change the
autograd graph (resharding, backward prefetch) are replayed from one trace per
plan. Candidates come from the model's structure:

- the root alone (no wrapping);
- each repeated block (the shallowest module class repeated at least twice that
  holds at least half the parameters, e.g. ``LlamaDecoderLayer``);
- the blocks plus the large modules outside them (embeddings, output head), each
  a unit of its own (grouped when they share parameters);
- FSDP2: pairs of consecutive blocks in one ``fully_shard`` call (fewer, larger
  collectives);
- the blocks' large children (attention, MLP) instead of the blocks (finer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.hardware import machine as make_machine
from fsdpviz.cost.sizes import parse_bytes
from fsdpviz.errors import ConfigError
from fsdpviz.plan.options import DEFAULT_WORLD_SIZE
from fsdpviz.replan.sweep_table import SweepTable, sweep
from fsdpviz.schema.report import Report
from fsdpviz.trace.copy import check_model

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


@dataclass
class Suggestion:
    """The proposed plan, why, and every candidate that was evaluated.

    ``kwargs``: pass them to :func:`fsdpviz.analyze` (or use them to call
    ``fully_shard`` / ``FullyShardedDataParallel``); ``plan``: a readable name;
    ``report``: the chosen configuration's :class:`~fsdpviz.Report`; ``table``:
    all candidates (:class:`~fsdpviz.replan.sweep_table.SweepTable`); ``explanation``:
    lines for people.
    """

    plan: str
    kwargs: dict[str, Any]
    row: dict[str, Any]
    report: Report
    table: SweepTable
    explanation: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "row": dict(self.row),
            "explanation": list(self.explanation),
            "table": self.table.to_dict(),
        }

    def __repr__(self) -> str:
        return "\n".join(self.explanation)


def suggest(
    model: nn.Module,
    inputs: Any,
    *,
    memory_budget: str | int = "80GiB",
    world_size: int = DEFAULT_WORLD_SIZE,
    api: str = "fsdp2",
    machine: Machine | str = "h100",
    optimizer: str | int | None = "adamw",
    **options: Any,
) -> Suggestion:
    """Evaluate candidate wrap plans and return the one that fits ``memory_budget`` per rank
    with the least exposed communication (then the shortest step, then the lowest peak).

    ``api``: ``"fsdp2"`` (``fully_shard`` lists, with ``reshard_after_forward`` True
    and False) or ``"fsdp1"`` (``auto_wrap_policy``, with ``FULL_SHARD`` /
    ``SHARD_GRAD_OP`` and ``BACKWARD_PRE`` / ``BACKWARD_POST``). ``options`` are
    passed to :func:`fsdpviz.analyze` (``mp_policy``, ``mixed_precision``, ``loss``, ...).

    Example::

        s = fsdpviz.suggest(model, {"input_ids": ids}, memory_budget="80GiB", world_size=64)
        print(s)                       # the plan and why
        fsdpviz.analyze(model, {"input_ids": ids}, world_size=64, **s.kwargs)
    """
    check_model(model, "suggest")
    budget = parse_bytes(memory_budget)
    kind = api.lower()
    if kind not in ("fsdp1", "fsdp2"):
        raise ConfigError(f"api must be 'fsdp1' or 'fsdp2', got {api!r}")
    plans = _candidates(model, kind)
    axes: dict[str, Any]
    if kind == "fsdp2":
        axes = {"reshard_after_forward": [True, False]}
    else:
        from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

        axes = {
            "sharding_strategy": [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP],
            "backward_prefetch": [BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST],
        }
    table = sweep(
        model,
        inputs,
        policies={name: kw for name, kw in plans.items()},
        memory_budget=budget,
        machine=machine,
        optimizer=optimizer,
        world_size=world_size,
        **axes,
        **options,
    )
    fitting = [r for r in table.rows if r["fits"]]
    pool = fitting or table.rows
    key: Callable[[dict[str, Any]], Any] = (
        (lambda r: (r["exposed_comm_s"], r["step_s"], r["peak_bytes"]))
        if fitting
        else (lambda r: r["peak_bytes"])
    )
    best = min(pool, key=key)
    i = table.rows.index(best)
    name = best["config"]["policy"]
    kwargs = {**plans[name], **{k: v for k, v in _values(best, axes).items()}}
    m = make_machine(machine) if isinstance(machine, str) else machine
    lines = _explain(best, table, budget, world_size, m, optimizer, bool(fitting))
    return Suggestion(name, kwargs, best, table.reports[i], table, lines)


def _values(row: dict[str, Any], axes: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, choices in axes.items():
        label = row["config"][key]
        out[key] = next(c for c in choices if getattr(c, "name", c) == label)
    return out


def _explain(
    best: dict[str, Any],
    table: SweepTable,
    budget: int,
    world_size: int,
    m: Machine,
    optimizer: str | int | None,
    fits: bool,
) -> list[str]:
    gib = 2**30
    cfg = ", ".join(f"{k}={v}" for k, v in best["config"].items())
    lines = [
        f"Budget {budget / gib:.1f} GiB per rank, {world_size} ranks, optimizer {optimizer}, "
        f"{m.name} ({m.network}); {len(table.rows)} configurations from {table.traces} traces.",
    ]
    if fits:
        lines.append(
            f"Proposed: {cfg}. Peak {best['peak_gib']:.1f} GiB ({best['peak_bytes'] / budget:.0%} "
            f"of the budget) {best['peak_where']}, dominated by {best['dominant']}; exposed "
            f"communication {best['exposed_comm_s'] * 1e3:.1f} ms of a "
            f"{best['step_s'] * 1e3:.1f} ms step; {best['bytes_moved'] / 1e9:.2f} GB moved "
            "per rank."
        )
        n = sum(1 for r in table.rows if r["fits"])
        lines.append(
            f"Why: {n} of {len(table.rows)} configurations fit; this one exposes the least "
            "communication (ties broken by step time, then peak memory)."
        )
    else:
        lines.append(
            f"Nothing fits. The lowest peak is {best['peak_gib']:.1f} GiB with {cfg}, "
            f"dominated by {best['dominant']}: add ranks, use activation checkpointing or "
            "mixed precision, or lower the batch."
        )
    lines.append("Alternatives:")
    for r in sorted(table.rows, key=lambda r: (not r["fits"], r["exposed_comm_s"])):
        if r is best:
            continue
        verdict = "fits" if r["fits"] else "over budget"
        name = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        lines.append(
            f"  {name}: peak {r['peak_gib']:.1f} GiB ({verdict}, {r['dominant']}), exposed "
            f"{r['exposed_comm_s'] * 1e3:.1f} ms, step {r['step_s'] * 1e3:.1f} ms"
        )
    return lines


# ---------------------------------------------------------------- candidates
def _candidates(model: nn.Module, api: str) -> dict[str, dict[str, Any]]:
    named = dict(model.named_modules())
    total = sum(p.numel() for p in model.parameters())
    block = _block_class(named, total)
    plans: dict[str, dict[str, Any]] = {"root only": _plan(api, [], named, set())}
    if block is None:
        return plans
    blocks = [n for n, m in named.items() if type(m) is block]
    outside = _large_outside(named, blocks, total)
    cls = block.__name__
    plans[f"per {cls}"] = _plan(api, [(b,) for b in blocks], named, set())
    # FSDP1 policies go by class (the copy fsdpviz traces has other module objects):
    # outside modules are wrapped only when their class does not occur inside the blocks.
    inner = {type(m) for b in blocks for m in named[b].modules()}
    own_class = [g for g in outside if len(g) == 1 and type(named[g[0]]) not in inner]
    usable = outside if api == "fsdp2" else own_class
    if usable:
        label = ", ".join(" & ".join(g) for g in usable)
        plans[f"per {cls} + {label}"] = _plan(api, [*[(b,) for b in blocks], *usable], named, set())
    if api == "fsdp2" and len(blocks) >= 4:
        pairs = [tuple(blocks[i : i + 2]) for i in range(0, len(blocks), 2)]
        extra = f" + {', '.join(' & '.join(g) for g in outside)}" if outside else ""
        plans[f"pairs of {cls}{extra}"] = _plan(api, [*pairs, *outside], named, set())
    children = _large_children(named, blocks)
    kinds = {type(named[c]) for c in children}
    if children and not any(type(named[c]) in kinds for c in _outside_of(named, blocks)):
        label = ", ".join(sorted(k.__name__ for k in kinds))
        plans[f"per {cls} child ({label})"] = _plan(
            api, [*[(c,) for c in children], *usable], named, set()
        )
    return plans


def _plan(
    api: str, groups: list[tuple[str, ...]], named: dict[str, nn.Module], extra: set[type]
) -> dict[str, Any]:
    if api == "fsdp2":
        return {"fully_shard": [g if len(g) > 1 else g[0] for g in groups]}
    if not groups:
        return {"auto_wrap_policy": None}
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return {
        "auto_wrap_policy": ModuleWrapPolicy({type(named[n]) for g in groups for n in g} | extra)
    }


def _outside_of(named: dict[str, nn.Module], blocks: list[str]) -> list[str]:
    return [n for n in named if n and not any(n == b or n.startswith(b + ".") for b in blocks)]


def _numel(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _block_class(named: dict[str, nn.Module], total: int) -> type | None:
    """The repeated module class that holds at least half the parameters and is not
    mostly nested inside another such class (``LlamaDecoderLayer``, not ``Linear``)."""
    stats: dict[type, list[int]] = {}  # class -> [count, numel]
    for name, m in named.items():
        if name and not isinstance(m, _CONTAINERS):
            s = stats.setdefault(type(m), [0, 0])
            s[0] += 1
            s[1] += _numel(m)
    found = [c for c, s in stats.items() if s[0] >= 2 and s[1] * 2 >= total]
    outer: list[type] = []
    for c in found:
        roots = [
            n for n, m in named.items() if isinstance(m, tuple(d for d in found if d is not c))
        ]
        nested = sum(
            _numel(m)
            for n, m in named.items()
            if type(m) is c and any(n.startswith(r + ".") for r in roots)
        )
        if nested * 2 < stats[c][1]:
            outer.append(c)
    return max(outer, key=lambda c: stats[c][1]) if outer else None


def _large_outside(
    named: dict[str, nn.Module], blocks: list[str], total: int
) -> list[tuple[str, ...]]:
    """Modules outside the blocks whose own parameters are at least 5% of the model."""
    inside = {id(p) for b in blocks for p in named[b].parameters()}
    picked: list[str] = []
    for name in _outside_of(named, blocks):
        own = [p for p in named[name].parameters(recurse=False) if id(p) not in inside]
        if own and sum(p.numel() for p in own) * 20 >= total:
            picked.append(name)
    groups: list[list[str]] = []
    owners: dict[int, int] = {}
    for name in picked:
        ids = {id(p) for p in named[name].parameters()}
        shared = {owners[i] for i in ids if i in owners}
        if shared:
            g = min(shared)
            groups[g].append(name)
        else:
            g = len(groups)
            groups.append([name])
        for i in ids:
            owners[i] = g
    return [tuple(g) for g in groups]


def _large_children(named: dict[str, nn.Module], blocks: list[str]) -> list[str]:
    out: list[str] = []
    for b in blocks:
        size = _numel(named[b])
        for child, m in named[b].named_children():
            if _numel(m) * 10 >= size:
                out.append(f"{b}.{child}")
    return out
