"""Notebook widgets over :mod:`fsdpviz.views`: the timeline, the explorer and the prefetch
graph (three views of fsdpviz's front end, ``js/``), the dashboard that links them under
the re-plan controls, two plans compared, a sweep's table, and a tuning's configurations
(``TuneWidget``, a fourth view of the front end) over the dashboard of the one selected
(``TuneView``).

May import every layer up to the views, and :mod:`fsdpviz.export` (a dashboard saves
itself as a page).

Example::

    import fsdpviz
    report = fsdpviz.analyze(model, ids, auto_wrap_policy=policy, world_size=8)
    view = report.show(model=model, inputs=ids)    # a Dashboard
    view.timeline.step = 40
    view.save("now.html")
"""

from __future__ import annotations

from fsdpviz.widgets.comparison import ComparisonView
from fsdpviz.widgets.dashboard import Dashboard, show
from fsdpviz.widgets.explorer import Explorer
from fsdpviz.widgets.explorer_widget import ExplorerWidget
from fsdpviz.widgets.prefetch_widget import PrefetchWidget
from fsdpviz.widgets.sweep import SweepView
from fsdpviz.widgets.timeline_widget import TimelineWidget
from fsdpviz.widgets.tune import TuneView
from fsdpviz.widgets.tune_widget import TuneWidget

__all__ = [
    "ComparisonView",
    "Dashboard",
    "Explorer",
    "ExplorerWidget",
    "PrefetchWidget",
    "SweepView",
    "TimelineWidget",
    "TuneView",
    "TuneWidget",
    "show",
]
