"""The views remember what they made of a plan: going back to a plan draws it again at once,
and a plan changed since (or another plan) is never drawn from what was remembered."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest
from views_models import Tiny, analyze_tiny, needs_front_end, tiny_inputs

from fsdpviz import Report
from fsdpviz.schema.report import FsdpWarning
from fsdpviz.views.explorer import explorer_data
from fsdpviz.views.prefetch import prefetch_data
from fsdpviz.views.timeline_memory import auto_memory
from fsdpviz.views.timeline_view import timeline_data
from fsdpviz.widgets import Dashboard, ExplorerWidget, PrefetchWidget, TimelineWidget, front_end
from fsdpviz.widgets._memo import ReportMemo
from fsdpviz.widgets.front_end import DATA

pytestmark = needs_front_end


@pytest.fixture
def report() -> Report:
    return analyze_tiny()


def sent(widget: Any, name: str = "data") -> bytes:
    """The bytes the widget sends for its trait ``name``."""
    return bytes(DATA["to_json"](getattr(widget, name), widget))


def encoded(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def test_a_memo_makes_again_for_a_changed_or_another_report(report: Report) -> None:
    memo: ReportMemo[list[str]] = ReportMemo()
    made: list[int] = []

    def codes(r: Report) -> list[str]:
        made.append(1)
        return [w.code for w in r.warnings]

    first = memo.get(report, lambda: codes(report))
    assert memo.get(report, lambda: codes(report)) is first and len(made) == 1
    twin = dataclasses.replace(report)  # equal, but another report
    assert memo.get(twin, lambda: codes(twin)) is not first and len(made) == 2
    report.warnings.append(FsdpWarning("test", "changed in place", []))
    assert memo.get(report, lambda: codes(report))[-1] == "test" and len(made) == 3
    report.config = report.config.replace(world_size=64)  # a field replaced
    memo.get(report, lambda: codes(report))
    assert len(made) == 4
    assert memo.get(report, lambda: codes(report), key="other") is not None and len(made) == 5
    assert memo.find(report) is not None and memo.find(twin, key="other") is None


def test_going_back_to_a_plan_sends_what_it_sent_the_first_time(
    report: Report, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
    views = (view.explorer.view, view.prefetch, view.timeline)
    first = [v.data for v in views]
    first_bytes = [sent(v) for v in views]
    view.explorer.controls.set(world_size=16)
    other = [v.data for v in views]
    assert all(a is not b for a, b in zip(first, other, strict=True))
    for v in views:
        sent(v)  # the other plan's data sent
    encodes: list[Any] = []

    def dumps(value: Any, **kwargs: Any) -> str:
        encodes.append(value)
        return json.dumps(value, **kwargs)

    monkeypatch.setattr(front_end, "json", SimpleNamespace(dumps=dumps, loads=json.loads))
    view.explorer.controls.set(world_size=report.config.world_size)  # back, from the cache
    assert view.explorer.report is report
    assert [v.data for v in views] == first
    assert all(a is b for a, b in zip(first, (v.data for v in views), strict=True))
    assert [sent(v) for v in views] == first_bytes
    # the same bytes, not encoded again (only the explorer's details: none shown, no unit
    # selected, each unit's following after the answer)
    assert encodes == [[None] * len(report.units)]
    monkeypatch.undo()
    # what a view that never saw the other plan would send
    assert first_bytes[1] == encoded(prefetch_data(report, -1))
    lane = auto_memory(report, -1)
    assert first_bytes[2] == encoded(timeline_data(report, -1, memory=lane, machine="auto"))
    fresh = explorer_data(report, details=False)
    del fresh["details"]
    assert first_bytes[0] == encoded(fresh)
    assert view.explorer.view.details == explorer_data(report)["details"]


def test_a_plan_changed_in_place_is_drawn_again(report: Report) -> None:
    explorer = ExplorerWidget(report)
    prefetch = PrefetchWidget(report)
    timeline = TimelineWidget(report, memory="auto")
    unit = report.units[1].module
    report.warnings.append(FsdpWarning("changed_in_place", "a warning added", [unit]))
    for widget in (explorer, prefetch):
        widget.set_report(report)
    timeline.set_reports(report, memory="auto")
    warnings = explorer.data["units"][1]["warnings"]
    assert warnings[-1] == "changed_in_place"
    assert "changed_in_place" in explorer.details[1]["warnings"][-1]
    report.config = report.config.replace(machine="a100-40gb")
    del report.memory  # computed again for the new machine, as a new report's would be
    timeline.set_reports(report, memory="auto")
    capacity = timeline.data["memory"][0]["capacity"]
    assert capacity["machine"] == "A100 SXM 40GB"
    assert timeline.data == timeline_data(report, -1, memory="auto", machine="auto")


def test_a_memory_model_given_as_a_callable_runs_for_every_plan(report: Report) -> None:
    calls: list[Report] = []

    def model(r: Report) -> list[float]:
        calls.append(r)
        return [float(len(calls))] * len(r.iterations[-1])

    timeline = TimelineWidget(report, memory=model)
    timeline.set_reports(report, memory=model)
    assert len(calls) == 2 and timeline.data["memory"][0]["total"][0] == 2.0
