"""Recording real FSDP runs into the same report types as a prediction, and comparing them.

May import the layers below it: schema, trace, plan, schedule.
"""

from fsdpviz.recording._diff import AlignedEvent, IterationDiff, ScheduleDiff, diff
from fsdpviz.recording._diverge import Divergence, RankEvent
from fsdpviz.recording._flight_compare import Disagreement, RankStop
from fsdpviz.recording._flight_diagnosis import Diagnosis
from fsdpviz.recording._flight_dump import Collective, Frame, GroupInfo
from fsdpviz.recording._flight_run import (
    FlightRecorderRun,
    dump_flight_recorder,
    load_flight_recorder,
    load_run,
)
from fsdpviz.recording._fsdp1 import FSDP1Recorder, record_fsdp1
from fsdpviz.recording._fsdp2 import FSDP2Recorder
from fsdpviz.recording._pipeline import PipelineRecorder
from fsdpviz.recording._profile import load_profile
from fsdpviz.recording._recorded import RecordedRun, RunMark
from fsdpviz.recording._run import RunRecorder, record

__all__ = [
    "AlignedEvent",
    "Collective",
    "Diagnosis",
    "Disagreement",
    "Divergence",
    "FSDP1Recorder",
    "FSDP2Recorder",
    "FlightRecorderRun",
    "Frame",
    "GroupInfo",
    "IterationDiff",
    "PipelineRecorder",
    "RankEvent",
    "RankStop",
    "RecordedRun",
    "RunMark",
    "RunRecorder",
    "ScheduleDiff",
    "diff",
    "dump_flight_recorder",
    "load_flight_recorder",
    "load_profile",
    "load_run",
    "record",
    "record_fsdp1",
]
