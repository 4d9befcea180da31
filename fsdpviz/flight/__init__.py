"""Torch's flight recorder: the dumps of a hung or desynced job read, matched to a
prediction, and diagnosed (where each rank stopped, where the ranks first disagree).

May import the layers below it (schema, trace, plan, schedule) and fsdpviz.recording, whose
types a flight recorder run shares: a :class:`FlightRecorderRun` is a
:class:`~fsdpviz.RecordedRun` the timeline draws as it draws a recording.

Example::

    run = fsdpviz.load_flight_recorder("fr-dumps")  # one file per rank
    print(run.diagnose(fsdpviz.analyze(model, batch, world_size=8)))
"""

from fsdpviz.flight._compare import Disagreement, RankStop
from fsdpviz.flight._diagnosis import Diagnosis
from fsdpviz.flight._dump import Collective, Frame, GroupInfo
from fsdpviz.flight._run import (
    FlightRecorderRun,
    dump_flight_recorder,
    load_flight_recorder,
    load_run,
)

__all__ = [
    "Collective",
    "Diagnosis",
    "Disagreement",
    "FlightRecorderRun",
    "Frame",
    "GroupInfo",
    "RankStop",
    "dump_flight_recorder",
    "load_flight_recorder",
    "load_run",
]
