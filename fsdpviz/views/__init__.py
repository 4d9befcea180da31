"""Plotly figures of a :class:`~fsdpviz.Report` and the data behind them: pure functions.

May import every layer up to fsdpviz.replan, and fsdpviz.graphs; never widgets or export.

- :func:`explorer_figure`: the module tree as an icicle/treemap coloured by wrap unit;
  :func:`explorer_data`: the same as JSON-ready columns (what the exported page draws);
- :func:`prefetch_figure`: units in forward order with forward-order and prefetch edges;
  :func:`prefetch_data`: the same as JSON-ready columns (what the exported page draws);
- :func:`timeline_figure`: lanes per rank and the memory curve;
- :func:`timeline_data`: the timeline as JSON-ready columns (what the JS widget draws);
- :func:`unit_details`: the explorer's detail panel of each unit, as data;
- :func:`tune_figure`: a tuning's configurations, tokens/s against memory per rank, and its
  knob table; :func:`tune_data`: the same as JSON-ready data (what the front end draws).

Example::

    from fsdpviz.views import explorer_figure
    explorer_figure(report, kind="treemap").write_html("units.html")
"""

from __future__ import annotations

from fsdpviz.views.detail import unit_details
from fsdpviz.views.explorer import explorer_data, explorer_figure
from fsdpviz.views.prefetch import (
    PrefetchAnalysis,
    prefetch_analysis,
    prefetch_data,
    prefetch_figure,
)
from fsdpviz.views.style import PALETTE, format_bytes, template, unit_colors
from fsdpviz.views.timeline_lanes import MemorySeries, MemorySource
from fsdpviz.views.timeline_view import timeline_data
from fsdpviz.views.timeline_view_figure import timeline_figure
from fsdpviz.views.tree import ModuleTree, module_tree
from fsdpviz.views.tune_view import tune_data, tune_figure

__all__ = [
    "PALETTE",
    "MemorySeries",
    "MemorySource",
    "ModuleTree",
    "PrefetchAnalysis",
    "explorer_data",
    "explorer_figure",
    "format_bytes",
    "module_tree",
    "prefetch_analysis",
    "prefetch_data",
    "prefetch_figure",
    "template",
    "timeline_data",
    "timeline_figure",
    "tune_data",
    "tune_figure",
    "unit_colors",
    "unit_details",
]
