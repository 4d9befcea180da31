"""``ComparisonView``: two plans side by side, what ``compare(a, b).show()`` and a
comparison as a cell's last line show.

The differences first, as ``print(cmp)`` says them (the verdict, each cost of both plans
with the change, whether each fits; :func:`fsdpviz.views.card.comparison_html`), then both
plans' timelines on one time axis, units matched, the first difference marked
(:class:`TimelineWidget`). Saved in a notebook, the output keeps both (the table as HTML,
the timeline's data for fsdpviz's JupyterLab extension, a static SVG).

Example::

    cmp = fsdpviz.compare(fsdp1, fsdp2)
    cmp                       # last line of a cell: the view
    view = cmp.show()
    view.timeline.step = 12
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

import ipywidgets as w

from fsdpviz.schema.keywords import MimeBundleKwargs, TimelineKwargs
from fsdpviz.views.card import comparison_html
from fsdpviz.widgets.front_end import with_saved_views
from fsdpviz.widgets.timeline_widget import TimelineWidget

if TYPE_CHECKING:
    from fsdpviz.api.comparison import Comparison

__all__ = ["ComparisonView"]


class ComparisonView(w.VBox):  # type: ignore[misc]
    """The differences of two plans and their timelines (see the module docstring);
    ``kwargs`` as :class:`TimelineWidget` takes them."""

    def __init__(self, comparison: Comparison, **kwargs: Unpack[TimelineKwargs]) -> None:
        self.comparison = comparison
        self.differences = w.HTML(comparison_html(comparison))
        """The verdict and the costs of both plans with the change, as HTML."""
        self.timeline = TimelineWidget(comparison, **kwargs)
        super().__init__([self.differences, self.timeline])
        self.add_class("fsdpviz-comparison")

    def _repr_mimebundle_(self, **kwargs: Unpack[MimeBundleKwargs]) -> dict[str, object] | None:
        """The live view and, for the notebook once saved, the differences (HTML) and the
        timeline's data and a static SVG of it."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        cmp = self.comparison
        text = cmp.summary()
        title = f"fsdpviz comparison: {cmp.name_a} vs {cmp.name_b}"
        states = {"timeline": self.timeline.page_state()}
        report = self.timeline.shown_report()
        saved = with_saved_views(bundle, states, report, title, text)
        return saved | {"text/html": self.differences.value}
