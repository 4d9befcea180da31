"""``SweepView``: a sweep's table as an interactive view; a row opens its configuration's views.

One row per configuration of :func:`fsdpviz.sweep`: what was swept, peak memory per rank
(and whether it fits the budget), exposed communication, step time and bytes moved. A
click on a column's heading sorts by it (again: the other way); the row that
:meth:`~fsdpviz.replan.SweepTable.best` picks is starred. "open" shows that row's
:class:`~fsdpviz.widgets.Dashboard` below the table (its explorer, prefetch graph and
timeline), in place of the one open before.

Example::

    view = fsdpviz.sweep(model, ids, world_size=[8, 64], policies={...}).show()
    view.sort("peak_bytes")
    view.open_row(2)                 # view.opened: the row shown; view.dashboard: its views
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING, Any, Unpack

import ipywidgets as w
import traitlets

from fsdpviz.errors import ConfigError
from fsdpviz.export import object_bundle
from fsdpviz.replan.sweep_table import SweepRow, SweepTable
from fsdpviz.schema.keywords import MimeBundleKwargs
from fsdpviz.widgets._errors import ErrorOutput
from fsdpviz.widgets.dashboard import Dashboard

if TYPE_CHECKING:
    from fsdpviz.schema.keywords import DashboardKwargs

__all__ = ["SweepView"]

_CELL = "padding:2px 8px;white-space:nowrap"
# The best row: JupyterLab's own text on its raised background, edged in its brand colour,
# so it reads in the light and the dark theme alike.
_BEST = (
    "color:var(--jp-ui-font-color0);background:var(--jp-layout-color2);"
    "box-shadow:inset 0 -1px var(--jp-brand-color1),inset 0 1px var(--jp-brand-color1)"
)

Column = tuple[str, str, Callable[[SweepRow], Any], Callable[[SweepRow], str]]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def gib(n: float) -> str:
    """Bytes in GiB to the hundredth, as the printed table (``table.summary()``) writes them."""
    return f"{n / 2**30:.2f} GiB"


def _config(key: str) -> tuple[Callable[[SweepRow], Any], Callable[[SweepRow], str]]:
    def value(row: SweepRow) -> str:
        return str(row["config"].get(key, ""))

    def text(row: SweepRow) -> str:
        return str(row["config"].get(key, "-"))

    return value, text


def _peak(row: SweepRow) -> str:
    over = " (over budget)" if row["fits"] is False else ""
    return gib(row["peak_bytes"]) + over


def _columns(table: SweepTable) -> list[Column]:
    """``(key, heading, sort value, text)`` of every column, the swept options first."""
    axes: list[str] = []
    for row in table.rows:
        for k in row["config"]:
            if k not in axes:
                axes.append(k)
    cols: list[Column] = [(f"config.{k}", k, *_config(k)) for k in axes]
    cols += [
        ("api", "API", lambda r: r["api"], lambda r: str(r["api"])),
        ("units", "units", lambda r: r["units"], lambda r: str(r["units"])),
        ("peak_bytes", "peak per rank", lambda r: r["peak_bytes"], _peak),
        ("exposed_comm_s", "exposed comm", lambda r: r["exposed_comm_s"],
         lambda r: _ms(r["exposed_comm_s"])),
        ("step_s", "step", lambda r: r["step_s"], lambda r: _ms(r["step_s"])),
        ("bytes_moved", "moved", lambda r: r["bytes_moved"],
         lambda r: gib(r["bytes_moved"])),
    ]  # fmt: skip
    return cols


class SweepView(w.VBox):  # type: ignore[misc]
    """A :class:`~fsdpviz.replan.SweepTable` as a sortable table whose rows open their views.

    ``opened``: the row (index into ``table.rows``) whose views are shown, or ``None``;
    ``dashboard``: those views. ``model=`` and ``inputs=`` (and ``analyze`` keywords) are
    passed to each opened :class:`~fsdpviz.widgets.Dashboard`, so its controls re-plan.
    """

    opened = traitlets.Int(None, allow_none=True)

    def __init__(self, table: SweepTable, **dashboard_kwargs: Unpack[DashboardKwargs]) -> None:
        if len(table.reports) != len(table.rows):
            raise ValueError(
                "this sweep table has no reports to open (it was read back from a file); "
                "run fsdpviz.sweep again to show it"
            )
        self.table = table
        self.dashboard: Any = None
        self._kwargs = dashboard_kwargs
        self._columns = _columns(table)
        self._order = list(range(len(table.rows)))
        self._sorted_by: tuple[str, bool] | None = None
        try:
            best = table.best()
            self._best = next(i for i, r in enumerate(table.rows) if r is best)
        except ConfigError:
            self._best = -1
        self.errors = ErrorOutput()
        self.grid = w.GridBox(layout=w.Layout(grid_gap="0px", overflow="auto"))
        self.grid.add_class("fsdpviz-sweep")
        self.views = w.Box(layout=w.Layout(width="100%"))
        budget = f"; budget {gib(table.budget)} per rank" if table.budget is not None else ""
        head = w.HTML(
            f"<b>Sweep</b>: {len(table.rows)} configurations from {table.traces} trace(s) "
            f"and {table.replays} replay(s){budget}. Click a heading to sort, "
            "<i>open</i> to see a configuration's views below; ★ is "
            "<code>table.best()</code>."
        )
        super().__init__([head, self.grid, self.errors, self.views])
        self._draw()

    def _repr_mimebundle_(self, **kwargs: Unpack[MimeBundleKwargs]) -> dict[str, object] | None:
        """The live table and, for the notebook once saved, the table as HTML and the views
        of its best row (★; else the first) for fsdpviz's JupyterLab extension, with a
        static SVG of them (:func:`fsdpviz.export.object_bundle`)."""
        bundle: dict[str, object] | None = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        text = self.table.summary()
        row = max(self._best, 0)
        table = {
            "text/plain": text,
            "text/html": '<pre class="fsdpviz-sweep-table" style="font-size:12px">'
            f"{escape(text)}\n(the views below: row {row})</pre>",
        }
        try:
            shown: dict[str, object] = object_bundle(self.table.reports[row], base=bundle | table)
            return shown
        except (ValueError, TypeError, KeyError, IndexError) as e:
            return bundle | table | {"text/plain": f"{text}\n(no saved views: {e})"}

    def sort(self, key: str, descending: bool | None = None) -> None:
        """Sort the rows by the column ``key`` (``"peak_bytes"``, ``"config.world_size"``...);
        ``descending`` defaults to ascending first, then the other way on a second call."""
        col = next((c for c in self._columns if c[0] == key), None)
        if col is None:
            keys = ", ".join(c[0] for c in self._columns)
            raise KeyError(f"no column {key!r}; columns: {keys}")
        if descending is None:
            descending = self._sorted_by == (key, False)
        self._order.sort(key=lambda i: col[2](self.table.rows[i]), reverse=descending)
        self._sorted_by = (key, descending)
        self._draw()

    def open_row(self, row: int) -> Any:
        """Show the views of ``table.rows[row]`` below the table; returns its dashboard."""
        if not 0 <= row < len(self.table.rows):
            raise IndexError(f"row {row} is out of range: the table has {len(self.table.rows)}")
        report = self.table.reports[row]
        self.dashboard = Dashboard(report, **self._kwargs)
        config = ", ".join(f"{k}={v}" for k, v in self.table.rows[row]["config"].items())
        title = w.HTML(f"<b>Row {row}</b>: {config or 'the only configuration'}")
        self.views.children = [w.VBox([title, self.dashboard], layout=w.Layout(width="100%"))]
        self.opened = row
        self._draw()
        return self.dashboard

    def _draw(self) -> None:
        cols = self._columns
        cells: list[w.Widget] = [w.HTML(f'<div style="{_CELL}"></div>')]
        for key, heading, _, _ in cols:
            arrow = ""
            if self._sorted_by is not None and self._sorted_by[0] == key:
                arrow = " ▼" if self._sorted_by[1] else " ▲"
            b = w.Button(
                description=heading + arrow,
                tooltip=f"sort by {heading}",
                layout=w.Layout(width="auto"),
            )
            b.add_class("fsdpviz-sweep-heading")
            b.on_click(self.errors.guard(lambda _, key=key: self.sort(key)))
            cells.append(b)
        for i in self._order:
            row = self.table.rows[i]
            shown = self.opened == i
            style = _CELL + (";" + _BEST if i == self._best else "")
            b = w.Button(
                description="shown" if shown else "open",
                tooltip=f"the views of row {i}",
                button_style="info" if shown else "",
                layout=w.Layout(width="auto"),
            )
            b.add_class("fsdpviz-sweep-open")
            b.on_click(self.errors.guard(lambda _, i=i: self.open_row(i)))
            cells.append(b)
            for k, (_, _, _, text) in enumerate(cols):
                star = "★ " if k == 0 and i == self._best else ""
                weight = ";font-weight:600" if shown else ""
                best = ' class="fsdpviz-sweep-best"' if i == self._best else ""
                cells.append(w.HTML(f'<div{best} style="{style}{weight}">{star}{text(row)}</div>'))
        self.grid.layout.grid_template_columns = f"repeat({len(cols) + 1}, auto)"
        self.grid.children = cells
