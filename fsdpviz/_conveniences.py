"""The conveniences of :class:`~fsdpviz.Report` and :class:`~fsdpviz.RecordedRun`, wired to the
layers that implement them (see :mod:`fsdpviz.schema.extensions`).

``import fsdpviz`` imports this module. Each implementation is named by its module, which is
imported when the method is first called: ``import fsdpviz`` does not load numpy,
networkx, plotly or the widgets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Unpack

from fsdpviz.schema.extensions import (
    register_report_method,
    register_run_method,
    register_save,
    register_show,
)

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun
    from fsdpviz.schema.keywords import ShowKwargs

register_report_method("memory", "fsdpviz.cost.memory:memory_model")
register_report_method("timeline", "fsdpviz.cost.time:timeline")
register_report_method("module_graph", "fsdpviz.graphs:module_graph")
register_report_method("unit_graph", "fsdpviz.graphs:unit_graph")
register_report_method("show", "fsdpviz.widgets:show")
register_report_method("save", "fsdpviz.export:save")
register_report_method("card", "fsdpviz._cards:report_card")
register_run_method("save", "fsdpviz.export:save")
register_run_method("card", "fsdpviz._cards:run_card")
register_run_method("bundle", "fsdpviz._cards:run_bundle")
register_show("comparison", "fsdpviz.widgets:ComparisonView")
register_save("comparison", "fsdpviz.export:save")
register_show("sweep", "fsdpviz.widgets:SweepView")
register_show("tuning", "fsdpviz.widgets:TuneView")
register_save("tuning", "fsdpviz.export:save_tuning")


def show_run(run: RecordedRun, **kwargs: Unpack[ShowKwargs]) -> Any:
    from fsdpviz.widgets import Dashboard  # lazy: plotly, torch; `import fsdpviz` imports us

    return Dashboard(run.ranks[0], ranks=run, **kwargs)


register_run_method("show", show_run)
