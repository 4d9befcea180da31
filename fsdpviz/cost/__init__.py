"""The memory and time model of a schedule: bytes per rank and modelled time at every event.

May import the layers below it (schema, trace, plan, schedule, recording); it reads reports
only. See the README, "Memory and time". Comparing configurations (``fsdpviz.sweep``) and
replaying a report under other options (:func:`fsdpviz.replan.replay`) live in
:mod:`fsdpviz.replan`; searching them for the fastest that fits in :mod:`fsdpviz.tuning`.

Example::

    report = fsdpviz.analyze(model, ids, auto_wrap_policy=policy, world_size=64)
    report.memory.peak              # bytes per rank, where, what dominates
    report.timeline.summary()       # step time and exposed communication on H100s
    fsdpviz.cost.memory_model(report, optimizer="sgd_momentum")
    fsdpviz.cost.timeline(report, machine("a100", network="roce-100"))
"""

from fsdpviz.cost.hardware import GPUS, INTER_NODE, INTRA_NODE, Machine, machine
from fsdpviz.cost.memory import (
    MemoryLane,
    memory_lane,
    memory_model,
    memory_series,
)
from fsdpviz.cost.slow_causes import slowdowns
from fsdpviz.cost.time import timeline
from fsdpviz.schema.memory import CATEGORIES, MemoryReport
from fsdpviz.schema.timeline import Timeline

__all__ = [
    "CATEGORIES",
    "GPUS",
    "INTER_NODE",
    "INTRA_NODE",
    "Machine",
    "MemoryLane",
    "MemoryReport",
    "Timeline",
    "machine",
    "memory_lane",
    "memory_model",
    "memory_series",
    "slowdowns",
    "timeline",
]
