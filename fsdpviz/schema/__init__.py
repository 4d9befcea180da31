"""The data model every layer reads: a report of units and events, its config and trace profile.

Imports nothing of fsdpviz: every other package may import it.
"""

from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.events import Event, ModuleEvent
from fsdpviz.schema.profile import StepProfile, TraceProfile
from fsdpviz.schema.report import FsdpWarning, ModuleInfo, Report, Unit

__all__ = [
    "Event",
    "FsdpWarning",
    "ModuleEvent",
    "ModuleInfo",
    "Report",
    "ReportConfig",
    "StepProfile",
    "TraceProfile",
    "Unit",
]
