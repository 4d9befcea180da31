"""The conveniences of :class:`~fsdpviz.Report` and :class:`~fsdpviz.RecordedRun`, wired to the
layers that implement them (see :mod:`fsdpviz.schema.extensions`).

``import fsdpviz`` imports this module. Each implementation is imported when first
used, as the methods did when they lived on the data types: ``import fsdpviz`` does
not load plotly or the widgets.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from fsdpviz.schema.extensions import (
    register_report_method,
    register_run_method,
    register_save,
    register_show,
)
from fsdpviz.schema.memo import ReportMemo

if TYPE_CHECKING:
    from fsdpviz.api.comparison import Comparison
    from fsdpviz.recording import RecordedRun
    from fsdpviz.replan.sweep_table import SweepTable
    from fsdpviz.schema.keywords import (
        DashboardKwargs,
        PageKwargs,
        SaveKwargs,
        ShowKwargs,
        TimelineKwargs,
        TuneSaveKwargs,
        TuneShowKwargs,
        ViewKwargs,
    )
    from fsdpviz.schema.memory import MemoryReport
    from fsdpviz.schema.report import Report
    from fsdpviz.schema.timeline import Timeline
    from fsdpviz.tuning import Tuning


@register_report_method("memory")
def memory(report: Report) -> MemoryReport:
    from fsdpviz.cost.memory import memory_model  # lazy: keeps numpy out of `import fsdpviz`

    return memory_model(report)


@register_report_method("timeline")
def timeline(report: Report) -> Timeline:
    from fsdpviz.cost.time import timeline  # lazy: keeps numpy out of `import fsdpviz`

    return timeline(report)


@register_report_method("module_graph")
def module_graph(report: Report) -> Any:
    from fsdpviz.graphs import module_graph  # lazy: keeps networkx out of `import fsdpviz`

    return module_graph(report)


@register_report_method("unit_graph")
def unit_graph(report: Report, iteration: int = -1) -> Any:
    from fsdpviz.graphs import unit_graph  # lazy: keeps networkx out of `import fsdpviz`

    return unit_graph(report, iteration)


@register_report_method("show")
def show(report: Report, **kwargs: Unpack[DashboardKwargs]) -> Any:
    from fsdpviz.widgets import show  # lazy: keeps plotly, anywidget out of `import fsdpviz`

    return show(report, **kwargs)


@register_run_method("show")
def show_run(run: RecordedRun, **kwargs: Unpack[ShowKwargs]) -> Any:
    from fsdpviz.widgets import Dashboard  # lazy: keeps plotly, anywidget out of `import fsdpviz`

    return Dashboard(run.ranks[0], ranks=run, **kwargs)


@register_show("comparison")
def show_comparison(comparison: Comparison, **kwargs: Unpack[TimelineKwargs]) -> Any:
    from fsdpviz.widgets import ComparisonView  # lazy: plotly, anywidget, not in `import fsdpviz`

    return ComparisonView(comparison, **kwargs)


@register_save("comparison")
def save_comparison(comparison: Comparison, path: str | Path, **kwargs: Unpack[PageKwargs]) -> Path:
    from fsdpviz.export import save  # lazy: keeps plotly out of `import fsdpviz`

    return save(comparison, path, **kwargs)


@register_show("sweep")
def show_sweep(table: SweepTable, **kwargs: Unpack[DashboardKwargs]) -> Any:
    from fsdpviz.widgets import SweepView  # lazy: keeps plotly, anywidget out of `import fsdpviz`

    return SweepView(table, **kwargs)


@register_show("tuning")
def show_tuning(tuning: Tuning, **kwargs: Unpack[TuneShowKwargs]) -> Any:
    from fsdpviz.widgets import TuneView  # lazy: keeps plotly, anywidget out of `import fsdpviz`

    return TuneView(tuning, **kwargs)


@register_save("tuning")
def save_tuning(tuning: Tuning, path: str | Path, **kwargs: Unpack[TuneSaveKwargs]) -> Path:
    from fsdpviz.export import save_tuning  # lazy: keeps plotly out of `import fsdpviz`

    return save_tuning(tuning, path, **kwargs)


@register_report_method("save")
@register_run_method("save")
def save(obj: Report | RecordedRun, path: str | Path, **kwargs: Unpack[SaveKwargs]) -> Path:
    from fsdpviz.export import save  # lazy: keeps plotly out of `import fsdpviz`

    return save(obj, path, **kwargs)


# The cards of the last reports shown: a notebook redraws an output, and shows a report
# again, without its card (the saved views of every unit) being made again; a report
# changed since gets a new one (see fsdpviz.schema.memo).
_CARDS: ReportMemo[dict[str, Any]] = ReportMemo(size=4)


@register_report_method("card")
def report_card(report: Report) -> dict[str, Any]:
    from fsdpviz.views.card import report_bundle  # lazy: keeps plotly out of `import fsdpviz`

    return dict(_CARDS.get(report, lambda: run_bundle(report, base=report_bundle(report))))


@register_run_method("card")
def run_card(run: RecordedRun) -> dict[str, Any]:
    from fsdpviz.views.card import run_bundle as card  # lazy: keeps plotly out of `import fsdpviz`

    return run_bundle(run, base=card(run))


@register_run_method("bundle")
def run_bundle(
    obj: Report | RecordedRun, base: dict[str, Any], **options: Unpack[ViewKwargs]
) -> dict[str, Any]:
    """``base`` (a card, a diagnosis' text) with the views' data for fsdpviz's JupyterLab
    extension and a static SVG of them; ``base`` alone where those cannot be made (a
    card is always shown), its ``text/plain`` saying why."""
    from fsdpviz.export import object_bundle  # lazy: keeps plotly out of `import fsdpviz`

    try:
        return object_bundle(obj, base=base, **options)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        text = base.get("text/plain", "")
        return {**base, "text/plain": f"{text}\n(no saved views: {type(e).__name__}: {e})"}
