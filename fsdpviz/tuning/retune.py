"""What :meth:`fsdpviz.Tuning.retune` keeps of a search: its traces, and what the model and
its inputs were when they were traced.

A trace does not depend on the machine (``analyze(..., machine=...)`` states it in
``report.config.machine`` and judges the fit against it), the memory budget, the optimizer
or the world size (the ranks replay: :func:`fsdpviz.replan.replay`), so a search for
another of those takes the earlier search's trace of every trace key it meets again
(:class:`StoredTrace`, keyed as :class:`~fsdpviz.tuning.evaluation.Evaluations` keys them)
and traces only the keys it has not seen. One machine's trace does not hold on another
where tensor parallelism's mm strategies were picked for its nodes and torch picks others
on the other's (``report.config.tp_strategy_gpus_per_node``: :func:`holds_on_machine`);
that key is traced again. A trace is taken as the new search's own trace
where it was made with the same keywords its key leaves out (the replayed knobs': resharding,
the mesh's data-parallel dimensions, ...; the precision policy, whose reduce dtype replays)
as the configuration that meets it first; otherwise that configuration is replayed from it,
as the search replays every other configuration of a key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from fsdpviz.cost.fit import check_fit, machine_named, machine_spec
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.topology import tp_strategies_moved
from fsdpviz.errors import ConfigError
from fsdpviz.schema.report import Report
from fsdpviz.tuning.space import TuneKwargs

__all__ = [
    "RETUNABLE",
    "StoredTrace",
    "check_retune",
    "fingerprint",
    "holds_on_machine",
    "on_machine",
    "same_changes",
]

RETUNABLE = (
    "machine", "world_size", "memory_budget", "optimizer", "tokens_per_step", "allow", "knobs",
    "exhaustive", "workers", "progress",
)  # fmt: skip
"""The arguments of :func:`fsdpviz.tune` a retune may change: none changes what a trace
key's trace is (the model, its inputs cut to a micro-batch, and the configuration's
keywords, which the knobs' values name)."""


class StoredTrace(NamedTuple):
    """One trace of a search: the report ``analyze`` made, and the keywords its trace key
    leaves out (the replayed knobs', the precision policy) it was made with."""

    report: Report
    changes: TuneKwargs


def same_changes(a: TuneKwargs, b: TuneKwargs) -> bool:
    """Whether two traces' keywords left out of their key (:attr:`StoredTrace.changes`) are
    the same; one without a plain ``==`` is not (its trace is replayed, as any other's)."""
    try:
        return bool(a == b)
    except Exception:
        return False


def check_retune(changes: Mapping[str, Any]) -> None:
    """Refuse what a retune cannot change without tracing everything again."""
    refused = [k for k in changes if k not in RETUNABLE]
    if refused:
        names = ", ".join(repr(k) for k in refused)
        raise ConfigError(
            f"retune cannot change {names}: it changes the model's traces (the model, its "
            f"inputs, the API or the configuration's keywords); call fsdpviz.tune again with "
            f"it. retune changes {', '.join(RETUNABLE)}"
        )


def fingerprint(model: nn.Module, inputs: Any, config: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What the traces of ``model`` depend on and a user may change between calls: the
    module tree (names and types), each parameter's and buffer's name, shape, dtype and
    ``requires_grad``, the inputs' structure (tensors' shapes and dtypes) and the
    configuration's entries (compared by identity)."""
    modules = tuple(
        (name, type(m).__module__, type(m).__qualname__)
        for name, m in model.named_modules(remove_duplicate=False)
    )
    params = tuple(
        (name, tuple(p.shape), p.dtype, p.requires_grad)
        for name, p in model.named_parameters(remove_duplicate=False)
    )
    buffers = tuple(
        (name, tuple(b.shape), b.dtype) for name, b in model.named_buffers(remove_duplicate=False)
    )
    entries = () if config is None else tuple((k, id(v)) for k, v in dict(config).items())
    return modules, params, buffers, _structure(inputs), entries


def _structure(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, Mapping):
        return ("map", tuple((k, _structure(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_structure(v) for v in value))
    return ("value", type(value).__qualname__, repr(value)[:200])


def holds_on_machine(report: Report, machine: Machine | str) -> bool:
    """Whether ``report``'s trace is the one ``analyze(..., machine=machine)`` makes: not
    where DTensor's mm strategies of its tensor parallelism were picked for nodes on which
    torch costs its tp group otherwise than on ``machine``'s
    (:func:`~fsdpviz.cost.topology.tp_strategies_moved`)."""
    node = machine_named(machine_spec(machine)).gpus_per_node
    return tp_strategies_moved(report.config, node) is None


def on_machine(report: Report, machine: Machine | str) -> Report:
    """``report`` as ``analyze(..., machine=machine)`` makes it: the machine stated in its
    config and its fit judged there (a new report: the stored one is left as it is).
    ``ConfigError`` where the trace does not hold there (:func:`holds_on_machine`)."""
    spec = machine_spec(machine)
    if report.config.machine == spec:
        return report
    moved = tp_strategies_moved(report.config, machine_named(spec).gpus_per_node)
    if moved is not None:
        raise ConfigError(moved)
    out = dataclasses.replace(
        report, config=report.config.replace(machine=spec), warnings=list(report.warnings)
    )
    check_fit(out)
    return out
