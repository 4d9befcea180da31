"""Recording real FSDP runs into the same report types as a prediction, and comparing them.

May import the layers below it: schema, trace, plan, schedule.
"""

from fsdpviz.recording._diff import AlignedEvent, IterationDiff, ScheduleDiff, diff
from fsdpviz.recording._diverge import Divergence, RankEvent
from fsdpviz.recording._fsdp1 import FSDP1Recorder, record_fsdp1
from fsdpviz.recording._fsdp2 import FSDP2Recorder
from fsdpviz.recording._profile import load_profile
from fsdpviz.recording._recorded import RecordedRun
from fsdpviz.recording._run import RunRecorder, record

__all__ = [
    "AlignedEvent",
    "Divergence",
    "FSDP1Recorder",
    "FSDP2Recorder",
    "IterationDiff",
    "RankEvent",
    "RecordedRun",
    "RunRecorder",
    "ScheduleDiff",
    "diff",
    "load_profile",
    "record",
    "record_fsdp1",
]
