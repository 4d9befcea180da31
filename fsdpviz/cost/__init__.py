"""Memory and time model of an FSDP schedule (see the README, "Memory and time").

Example::

    report = fsdpviz.analyze(model, ids, auto_wrap_policy=policy, world_size=64)
    report.memory.peak              # bytes per rank, where, what dominates
    report.timeline.summary()       # step time and exposed communication on H100s
    fsdpviz.cost.memory_model(report, optimizer="sgd_momentum")
    fsdpviz.cost.timeline(report, machine("a100", network="roce-100"))
    fsdpviz.sweep(model, ids, world_size=[8, 64], backward_prefetch=[...], policies={...})
    fsdpviz.suggest(model, ids, memory_budget="80GiB", world_size=64)
"""

from fsdpviz.cost.machine import GPUS, INTER_NODE, INTRA_NODE, Machine, machine
from fsdpviz.cost.memory import CATEGORIES, MemoryReport, memory_model, memory_series
from fsdpviz.cost.time import Timeline, timeline
from fsdpviz.replan.hook_replay import replay
from fsdpviz.replan.suggestion import Suggestion, suggest
from fsdpviz.replan.sweep_table import SweepTable, sweep

__all__ = [
    "CATEGORIES",
    "GPUS",
    "INTER_NODE",
    "INTRA_NODE",
    "Machine",
    "MemoryReport",
    "Suggestion",
    "SweepTable",
    "Timeline",
    "machine",
    "memory_model",
    "memory_series",
    "replay",
    "suggest",
    "sweep",
    "timeline",
]
