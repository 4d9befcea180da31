"""Notebook widgets over :mod:`fsdpviz.views`: the explorer, the timeline, the dashboard and
a sweep's table.

May import every layer up to the views; not fsdpviz.export.

Example::

    import fsdpviz
    report = fsdpviz.analyze(model, ids, auto_wrap_policy=policy, world_size=8)
    view = report.show(model=model, inputs=ids)    # a Dashboard
    view.timeline.step = 40
"""

from __future__ import annotations

from fsdpviz.widgets.dashboard import Dashboard, show
from fsdpviz.widgets.explorer import Explorer
from fsdpviz.widgets.sweep import SweepView
from fsdpviz.widgets.timeline_widget import TimelineWidget

__all__ = ["Dashboard", "Explorer", "SweepView", "TimelineWidget", "show"]
