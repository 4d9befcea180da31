"""Recording real FSDP runs into the same report types as a prediction, and comparing them.

May import the layers below it: schema, trace, plan, schedule.
"""

from fsdpviz.recording._diff import AlignedEvent, IterationDiff, ScheduleDiff, diff
from fsdpviz.recording._diverge import Divergence, RankEvent
from fsdpviz.recording._fsdp1 import FSDP1Recorder, record_fsdp1
from fsdpviz.recording._fsdp2 import FSDP2Recorder
from fsdpviz.recording._pipeline import PipelineRecorder
from fsdpviz.recording._profile import load_profile
from fsdpviz.recording._recorded import RecordedRun, RunMark
from fsdpviz.recording._run import RunRecorder, record
from fsdpviz.recording._writer import is_recording

__all__ = [
    "AlignedEvent",
    "Divergence",
    "FSDP1Recorder",
    "FSDP2Recorder",
    "IterationDiff",
    "PipelineRecorder",
    "RankEvent",
    "RecordedRun",
    "RunMark",
    "RunRecorder",
    "ScheduleDiff",
    "diff",
    "is_recording",
    "load_profile",
    "record",
    "record_fsdp1",
]
