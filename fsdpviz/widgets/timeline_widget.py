"""``TimelineWidget``: the step-through timeline, a view of fsdpviz's front end (``js/``).

Stepping and playing run in the browser. ``step``, ``playing``, ``speed``, ``order``
and ``selected_unit`` are synced traitlets: ``view.step = 40`` moves the view (steps
are numbered from 0, in FSDP's issue order, as the page shows them), a click on an
event sets ``view.selected_unit`` and ``step``; ``order="stream"`` makes the arrows
walk the events by the time they start on their streams. While playing, the browser
sends ``step`` at most every ``sync_interval_ms``. ``machine`` places a profiled
prediction at modelled times (:func:`fsdpviz.views.timeline_data`; by default ``"auto"``,
the machine the report was planned for, whose device memory the memory lane draws as its
capacity line). ``iteration`` (default ``"auto"``): a recording opens on its first iteration
where the ranks diverge, anything else on its last.

Example::

    view = TimelineWidget(report)                  # memory="auto": the memory model's lane
    view.step = 40
    view.current_event                              # (0, Event(kind='all_gather', ...))
    view.jump_to_peak(); view.step == view.peak_step
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Unpack, cast

import traitlets

from fsdpviz.api.comparison import Comparison
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.memory import MemoryLane
from fsdpviz.recording import RecordedRun
from fsdpviz.schema.events import Event
from fsdpviz.schema.keywords import TimelineTraits
from fsdpviz.schema.report import Report
from fsdpviz.views.timeline_columns import TimelineData
from fsdpviz.views.timeline_lanes import MemoryOption
from fsdpviz.views.timeline_view import opening_iteration, timeline_data
from fsdpviz.widgets._memo import ReportMemo
from fsdpviz.widgets.front_end import DATA, FrontEnd, TraitChange, TraitProposal

if TYPE_CHECKING:
    from typing import TypeAlias

    Shown: TypeAlias = Report | Sequence[Report] | RecordedRun | Comparison

__all__ = ["TimelineWidget"]


class TimelineWidget(FrontEnd):
    """A lane group per rank (or plan): hook calls, compute, streams, memory; step and play."""

    view = traitlets.Unicode("timeline").tag(sync=True)
    data = traitlets.Dict().tag(**DATA)
    step = traitlets.Int(0).tag(sync=True)
    playing = traitlets.Bool(False).tag(sync=True)
    speed = traitlets.Float(20.0).tag(sync=True)
    order = traitlets.Enum(["issue", "stream"], "issue").tag(sync=True)
    selected_unit = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)
    """A line the page shows after the step (e.g. why the step moved after a re-plan)."""
    sync_interval_ms = traitlets.Int(150).tag(sync=True)
    current_unit = traitlets.Unicode(None, allow_none=True)
    """Unit of the event at ``step`` (Python side only; follows ``step``)."""

    PAGE_TRAITS: ClassVar[tuple[str, ...]] = ("data", "step", "speed", "order", "selected_unit")

    def __init__(
        self,
        reports: Shown,
        iteration: int | Literal["auto"] | None = "auto",
        *,
        memory: MemoryOption = "auto",
        rank_names: Sequence[str] | None = None,
        machine: Machine | str | None = "auto",
        **kwargs: Unpack[TimelineTraits],
    ) -> None:
        self._iteration = opening_iteration(reports, iteration)
        self._rank_names = rank_names
        self._machine = machine
        self._shown: Shown = []
        self._reports: list[Report] = []
        self._memo: ReportMemo[TimelineData] = ReportMemo()
        super().__init__(**kwargs)
        self.set_reports(reports, memory=memory)

    def shown_report(self) -> Report | None:
        """The first report (rank, or plan of a comparison) the timeline shows."""
        return self._reports[0] if self._reports else None

    def set_reports(self, reports: Shown, *, memory: MemoryOption = "auto") -> None:
        """Show other reports (e.g. after a re-plan). The selected event stays selected
        when the new plan has it (the same kind, unit, phase and occurrence); otherwise
        the step goes back to 0 and ``note`` says why. The new data, step and note reach
        the browser in one message, which also ends ``busy``."""
        before = self._identity(self.step) if self._reports and self.n_steps else None
        data = self._data(reports, memory)
        self._shown = reports
        self._reports = _reports_of(reports)
        with self.hold_sync(), self.hold_trait_notifications():
            self.data = cast("dict[str, Any]", data)  # (the traitlet's type of the same dict)
            self.busy = False
            if before is None:
                self.step = min(self.step, max(data["n_steps"] - 1, 0))
                self.note = ""
            else:
                found = self._find(before)
                self.step = 0 if found is None else found
                self.note = (
                    ""
                    if found is not None
                    else f"the event at the old step ({before[-1]}) is not in this plan: "
                    "back to step 0"
                )
        self._update_current()

    def _data(self, reports: Shown, memory: MemoryOption) -> TimelineData:
        """:func:`timeline_data` of ``reports``; of one report, made once per plan and
        memory lane (see ``_memo.py``; a callable or a series may differ from call to call)."""

        def make() -> TimelineData:
            return timeline_data(
                reports,
                self._iteration,
                memory=memory,
                rank_names=self._rank_names,
                machine=self._machine,
            )

        if not isinstance(reports, Report):
            return make()
        if memory is None or isinstance(memory, str):
            data = self._memo.get(reports, make, key=memory)
        elif isinstance(memory, MemoryLane):
            data = self._memo.get(reports, make, key="lane", same=memory)
        else:
            return make()
        self._keep_encoded(data)
        return data

    def _identity(self, step: int) -> tuple[Any, ...]:
        """What makes an event the same across plans: group, iteration, kind, unit, phase,
        prefetch and how many such events came before it; and a description."""
        keys = self._keys()
        key = keys[step]
        nth = keys[:step].count(key)
        rank_event = self._event_at(step)
        what = rank_event[1].describe() if rank_event is not None else str(step)
        return (*key, nth, what)

    def _keys(self) -> list[tuple[Any, ...]]:
        """The key of every step (of ``_identity``), read from the data once."""
        s = self.data["steps"]
        units = self.data["units"]
        names = [units[u] for u in s["unit"]]
        columns = (s["group"], s["iteration"], s["kind"], names, s["phase"], s["prefetch"])
        return list(zip(*columns, strict=True))

    def _find(self, identity: tuple[Any, ...]) -> int | None:
        *key, nth, _ = identity
        wanted = tuple(key)
        seen = 0
        for i, k in enumerate(self._keys()):
            if k == wanted:
                if seen == nth:
                    return i
                seen += 1
        return None

    @property
    def n_steps(self) -> int:
        return int(self.data.get("n_steps", 0))

    @property
    def peak_step(self) -> int | None:
        """Step of the memory peak (of the first lane group), ``None`` without a memory lane."""
        memory = self.data.get("memory") or []
        return int(memory[0]["peak"]["step"]) if memory else None

    @property
    def peak_bytes(self) -> int | None:
        """The memory peak the lane marks, in bytes (``report.memory.peak["bytes"]``)."""
        memory = self.data.get("memory") or []
        return int(memory[0]["peak"]["bytes"]) if memory else None

    @property
    def current_event(self) -> tuple[int, Event] | None:
        """``(group, event)`` at ``step`` (the group: a rank, or a plan of a comparison)."""
        return self._event_at(self.step) if self.n_steps else None

    def _event_at(self, step: int) -> tuple[int, Event] | None:
        s = self.data["steps"]
        group, index, it = s["group"][step], s["index"][step], s["iteration"][step]
        if group >= len(self._reports):
            return None
        return group, self._reports[group].iterations[it][index]

    def next_step_of(self, unit: str) -> int | None:
        """The next step after ``step`` whose event is ``unit``'s (wrapping around): where a
        click on the unit in another view moves the timeline. ``None`` when it has none."""
        n = self.n_steps
        if n == 0 or unit not in self.data["units"]:
            return None
        u = self.data["units"].index(unit)
        owner = self.data["steps"]["unit"]
        for k in range(1, n + 1):
            s = (self.step + k) % n
            if owner[s] == u:
                return s
        return None

    def jump_to_peak(self) -> None:
        """Move to the memory peak (``ValueError`` without a memory lane)."""
        if self.peak_step is None:
            raise ValueError("no memory lane: TimelineWidget(..., memory='auto') draws one")
        self.step = self.peak_step

    @traitlets.validate("step")
    def _valid_step(self, proposal: TraitProposal) -> int:
        n = int(self.data.get("n_steps", 0)) if self.data else 0
        return max(0, min(int(proposal["value"]), max(n - 1, 0)))

    @traitlets.observe("step")
    def _on_step(self, change: TraitChange) -> None:
        self._update_current()

    def _update_current(self) -> None:
        if self.n_steps == 0:
            self.current_unit = None
            return
        self.current_unit = self.data["units"][self.data["steps"]["unit"][self.step]]


def _reports_of(shown: Shown) -> list[Report]:
    """The report of each lane group."""
    if isinstance(shown, Report):
        return [shown]
    if isinstance(shown, RecordedRun):
        return list(shown.ranks)
    if isinstance(shown, Comparison):
        return list(shown.reports or ())
    return list(shown)
