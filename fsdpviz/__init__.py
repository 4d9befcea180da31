"""fsdpviz: see what PyTorch FSDP will do with your model, before you launch the job.

Example::

    import fsdpviz
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    report = fsdpviz.analyze(model, {"input_ids": ids},
                             auto_wrap_policy=ModuleWrapPolicy({Block}), world_size=8)
    report.units, report.forward_order, report.iterations
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fsdpviz.analyze import analyze
from fsdpviz.core.compare import Comparison, compare
from fsdpviz.core.schema import Event, FsdpWarning, ModuleInfo, Report, Unit
from fsdpviz.errors import ConfigError, FSDPConfigError, FsdpvizError, TraceError
from fsdpviz.record import FSDP1Recorder, FSDP2Recorder, record_fsdp1

try:
    __version__ = version("fsdpviz")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "Comparison",
    "ConfigError",
    "Event",
    "FSDP1Recorder",
    "FSDP2Recorder",
    "FSDPConfigError",
    "FsdpWarning",
    "FsdpvizError",
    "ModuleInfo",
    "Report",
    "TraceError",
    "Unit",
    "__version__",
    "analyze",
    "compare",
    "load",
    "record_fsdp1",
]


def load(path: str) -> Report:
    """Read a report saved with ``report.to_json(path)``."""
    return Report.from_json(path)
