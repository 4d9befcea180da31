"""fsdpviz: see what PyTorch FSDP will do with your model, before you launch the job.

Example::

    import fsdpviz
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    report = fsdpviz.analyze(model, {"input_ids": ids},
                             auto_wrap_policy=ModuleWrapPolicy({Block}), world_size=8)
    report.units, report.forward_order, report.iterations
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpviz import _conveniences  # noqa: F401  (report.memory, .show(), .save(), ...)
from fsdpviz._version import __version__
from fsdpviz.errors import ConfigError, ExportError, FSDPConfigError, FsdpvizError, TraceError
from fsdpviz.schema.report import Report

# The public names, each imported from its module when first used: ``import fsdpviz`` loads
# neither torch nor plotly, so the command line answers a mistake at once and a first
# ``fsdpviz.analyze`` loads only what planning needs.
_PUBLIC = {
    "fsdpviz.configs": (
        "ConfigNote", "HFModel", "TorchtitanJob", "TrainerConfig", "from_accelerate",
        "from_lightning", "from_torchtitan", "hf_model",
    ),
    "fsdpviz.flight": (
        "Diagnosis", "FlightRecorderRun", "dump_flight_recorder", "load_flight_recorder",
        "load_run",
    ),
    "fsdpviz.notebook": ("load_ipython_extension",),
    "fsdpviz.recording": (
        "Divergence", "FSDP1Recorder", "FSDP2Recorder", "PipelineRecorder", "RecordedRun",
        "ScheduleDiff", "diff", "load_profile", "record", "record_fsdp1",
    ),
    "fsdpviz.replan": ("sweep",),
    "fsdpviz.tuning": ("Candidate", "Tuning", "suggest", "tune"),
    "fsdpviz.schema.checkpointing": ("CheckpointEvery", "SelectiveCheckpoint"),
    "fsdpviz.api.comparison": ("Comparison", "compare"),
    "fsdpviz.api.predict": ("analyze",),
    "fsdpviz.schema.config": ("ReportConfig",),
    "fsdpviz.schema.events": ("Event", "ModuleEvent"),
    "fsdpviz.schema.report": ("FsdpWarning", "ModuleInfo", "Report", "Unit"),
}  # fmt: skip
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}
# Subpackages reached as attributes (``fsdpviz.cost.machine(...)``) after ``import fsdpviz``.
_SUBPACKAGES = frozenset(
    {"api", "configs", "cost", "export", "flight", "graphs", "plan", "recording", "replan",
     "schedule", "schema", "trace", "tuning", "views", "widgets", "examples", "notebook", "cli"}
)  # fmt: skip

if TYPE_CHECKING:
    from fsdpviz.api.comparison import Comparison, compare
    from fsdpviz.api.predict import analyze
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
    from fsdpviz.flight import (
        Diagnosis,
        FlightRecorderRun,
        dump_flight_recorder,
        load_flight_recorder,
        load_run,  # noqa: F401  (fsdpviz.load_run, as before)
    )
    from fsdpviz.notebook import load_ipython_extension
    from fsdpviz.recording import (
        Divergence,
        FSDP1Recorder,
        FSDP2Recorder,
        PipelineRecorder,
        RecordedRun,
        ScheduleDiff,
        diff,
        load_profile,
        record,
        record_fsdp1,
    )
    from fsdpviz.replan import sweep
    from fsdpviz.schema.checkpointing import CheckpointEvery, SelectiveCheckpoint
    from fsdpviz.schema.config import ReportConfig
    from fsdpviz.schema.events import Event, ModuleEvent
    from fsdpviz.schema.report import FsdpWarning, ModuleInfo, Unit
    from fsdpviz.tuning import Candidate, Tuning, suggest, tune

__all__ = [
    "Candidate",
    "CheckpointEvery",
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
    "PipelineRecorder",
    "RecordedRun",
    "Report",
    "ReportConfig",
    "ScheduleDiff",
    "SelectiveCheckpoint",
    "TorchtitanJob",
    "TraceError",
    "TrainerConfig",
    "Tuning",
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
    "tune",
]


def __getattr__(name: str) -> Any:
    """A public name (or a subpackage), imported when first used (PEP 562)."""
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"fsdpviz.{name}")
    else:
        raise AttributeError(f"module 'fsdpviz' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})


def load(path: str | Path) -> Report | RecordedRun:
    """Read a report file, a directory of a run recorded with :func:`record`, or torch's
    flight recorder dumps.

    A path that does not exist raises ``FileNotFoundError``, a file that is not a
    report (not JSON, a page, a graph, a profiler trace) :class:`ConfigError`, and a
    directory that holds neither a recording nor dumps ``FileNotFoundError``, each
    saying what it found and what to pass.

    A ``.json`` file saved with ``report.to_json(path)`` or ``report.save(path)`` (a
    Chrome trace that also holds the report) gives a :class:`Report`; a directory
    written by ``fsdpviz.record(model, out_dir=path)``, or the ``.json`` of
    ``run.save(path)``, gives a :class:`RecordedRun` (``.ranks``: one recorded
    :class:`Report` per rank); a directory of flight recorder dumps (one file per rank,
    ``nccl_trace_rank_0``, ...), or one dump, gives what :func:`load_flight_recorder`
    gives, a :class:`FlightRecorderRun` (``.diagnose()``).

    Example::

        report = fsdpviz.load("report.json")
        run = fsdpviz.load("fsdpviz-run")
        run.ranks[0].iterations[0][:3], run.divergence()
        print(fsdpviz.load("/tmp/fr").diagnose())   # flight recorder dumps
    """
    from fsdpviz.flight import load_run  # lazy: loads torch, which `import fsdpviz` does not
    from fsdpviz.recording import RecordedRun  # lazy: loads torch

    p = Path(path)
    if p.is_dir():
        return load_run(p)
    if not p.is_file():
        raise FileNotFoundError(
            f"{str(p)!r} does not exist: fsdpviz.load reads a report's .json (written by "
            "report.save('report.json') or report.to_json(path)), the directory "
            "fsdpviz.record(model, out_dir=...) wrote, or a directory of torch flight "
            "recorder dumps"
        )
    try:
        data = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        dump = _flight_dump(p) if isinstance(e, UnicodeDecodeError) else None
        if dump is not None:  # the pickle torch writes
            return dump
        raise ConfigError(_not_a_report(p, _what_it_is(p, e))) from None
    if isinstance(data, dict) and "ranks" in data and "units" not in data:
        return RecordedRun.from_dict(data, p)
    if isinstance(data, dict) and "entries" in data and "units" not in data:
        dump = _flight_dump(p)  # the JSON form of a flight recorder dump
        if dump is not None:
            return dump
    if not isinstance(data, dict) or "units" not in data:
        raise ConfigError(_not_a_report(p, _what_json_is(data)))
    try:
        return Report.from_dict(data)
    except (KeyError, TypeError, AttributeError) as e:
        raise ConfigError(
            _not_a_report(p, f"a report with a missing or malformed field ({e!r})")
        ) from None


def _flight_dump(path: Path) -> FlightRecorderRun | None:
    """One rank's flight recorder dump, read as :func:`load_flight_recorder` reads it; None
    when the file is not one."""
    from fsdpviz.flight import load_flight_recorder  # lazy: loads torch

    try:
        return load_flight_recorder(path)
    except ValueError:
        return None


def _not_a_report(path: Path, what: str) -> str:
    return (
        f"{str(path)!r} is {what}, not an fsdpviz report: fsdpviz.load reads the .json of "
        "report.save('report.json') / report.to_json(path) (or run.save), or the directory "
        "fsdpviz.record wrote"
    )


def _what_it_is(path: Path, error: Exception) -> str:
    if isinstance(error, UnicodeDecodeError):
        return "not a text file"
    head = path.read_text(errors="replace")[:200].lstrip().lower()
    if head.startswith(("<!doctype html", "<html")):
        return "an HTML page (the report's page shows it; save the report as .json to load it)"
    assert isinstance(error, json.JSONDecodeError)
    return f"not JSON ({error.msg} at line {error.lineno}, column {error.colno})"


def _what_json_is(data: object) -> str:
    if isinstance(data, dict) and "traceEvents" in data:
        return (
            "a Chrome trace without a report in it (a torch.profiler trace is read by "
            "fsdpviz.load_profile)"
        )
    if isinstance(data, dict) and "nodes" in data and "edges" in data:
        return "a graph (.nodelink.json: networkx.node_link_graph reads it)"
    return f"JSON holding a {type(data).__name__} without 'units'"
