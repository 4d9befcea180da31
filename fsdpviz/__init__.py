"""fsdpviz: see what PyTorch FSDP will do with your model, before you launch the job.

Example::

    import fsdpviz
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    report = fsdpviz.analyze(model, {"input_ids": ids},
                             auto_wrap_policy=ModuleWrapPolicy({Block}), world_size=8)
    report.units, report.forward_order, report.iterations
"""

from __future__ import annotations

import json
from pathlib import Path

from fsdpviz import _conveniences  # noqa: F401  (report.memory, .show(), .save(), ...)
from fsdpviz._version import __version__
from fsdpviz.configs import (
    ConfigNote,
    HFModel,
    TorchtitanJob,
    TrainerConfig,
    from_accelerate,
    from_lightning,
    from_torchtitan,
    hf_model,
)
from fsdpviz.errors import ConfigError, ExportError, FSDPConfigError, FsdpvizError, TraceError
from fsdpviz.notebook import load_ipython_extension
from fsdpviz.recording import (
    Diagnosis,
    Divergence,
    FlightRecorderRun,
    FSDP1Recorder,
    FSDP2Recorder,
    RecordedRun,
    ScheduleDiff,
    diff,
    dump_flight_recorder,
    load_flight_recorder,
    load_profile,
    record,
    record_fsdp1,
)
from fsdpviz.replan import suggest, sweep
from fsdpviz.schedule.comparison import Comparison, compare
from fsdpviz.schedule.predict import analyze
from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.report import Event, FsdpWarning, ModuleEvent, ModuleInfo, Report, Unit

__all__ = [
    "Comparison",
    "ConfigError",
    "ConfigNote",
    "Diagnosis",
    "Divergence",
    "Event",
    "ExportError",
    "FSDP1Recorder",
    "FSDP2Recorder",
    "FSDPConfigError",
    "FlightRecorderRun",
    "FsdpWarning",
    "FsdpvizError",
    "HFModel",
    "ModuleEvent",
    "ModuleInfo",
    "RecordedRun",
    "Report",
    "ReportConfig",
    "ScheduleDiff",
    "TorchtitanJob",
    "TraceError",
    "TrainerConfig",
    "Unit",
    "__version__",
    "analyze",
    "compare",
    "diff",
    "dump_flight_recorder",
    "from_accelerate",
    "from_lightning",
    "from_torchtitan",
    "hf_model",
    "load",
    "load_flight_recorder",
    "load_ipython_extension",
    "load_profile",
    "record",
    "record_fsdp1",
    "suggest",
    "sweep",
]


def load(path: str | Path) -> Report | RecordedRun:
    """Read a report file, or a directory of a run recorded with :func:`record`.

    A ``.json`` file saved with ``report.to_json(path)`` or ``report.save(path)`` (a
    Chrome trace that also holds the report) gives a :class:`Report`; a directory
    written by ``fsdpviz.record(model, out_dir=path)``, or the ``.json`` of
    ``run.save(path)``, gives a :class:`RecordedRun` (``.ranks``: one recorded
    :class:`Report` per rank).

    Example::

        report = fsdpviz.load("report.json")
        run = fsdpviz.load("fsdpviz-run")
        run.ranks[0].iterations[0][:3], run.divergence()
    """
    p = Path(path)
    if p.is_dir():
        return RecordedRun.load(p)
    if p.suffix.lower() == ".json" and p.is_file():
        data = json.loads(p.read_text())
        if isinstance(data, dict) and "ranks" in data and "units" not in data:
            return RecordedRun.from_dict(data, p)
        if isinstance(data, dict):
            return Report.from_dict(data)
    return Report.from_json(path)
