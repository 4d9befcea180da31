"""The dashboard as it runs in a kernel: callbacks on an asyncio loop, answers kept short.

A control change redraws all three views in one answer; a trace for the memory curve
waits until the controls rest; stored traces are made while the kernel is idle; no
garbage-collector pause lands inside an answer. (Outside a loop everything runs at once:
see test_widgets.py.)
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from views_models import Tiny, analyze_tiny, needs_front_end, tiny_inputs

import fsdpviz._deferred_gc as deferred_gc
import fsdpviz.widgets.dashboard as dashboard_module
import fsdpviz.widgets.explorer as explorer_module
from fsdpviz import Report
from fsdpviz.cost import memory_lane
from fsdpviz.replan import Replanner
from fsdpviz.views import unit_details
from fsdpviz.widgets import Dashboard, Explorer

pytestmark = needs_front_end


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short idle delays, so the tests wait milliseconds, not seconds."""
    monkeypatch.setattr(dashboard_module, "PROFILE_AFTER_S", 1.0)
    monkeypatch.setattr(explorer_module, "WARM_AFTER_S", 0.01)
    monkeypatch.setattr(deferred_gc, "IDLE_GC_S", 0.01)


def in_kernel(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def count_calls(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[Any]:
    calls: list[Any] = []
    original = getattr(cls, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, wrapper)
    return calls


def test_a_control_change_redraws_every_view_in_one_answer(report: Report, quick: None) -> None:
    async def test() -> None:
        view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
        view.explorer.controls.set(world_size=16, as_browser=True)  # a click in the page
        new = view.explorer.report
        assert new.config["world_size"] == 16
        assert "world size 16" in view.explorer.view.data["title"]
        assert view.timeline.data["memory"][0]["total"] == memory_lane(new).total
        assert "world size 16" in view.timeline.data["groups"][0]["summary"]
        view.explorer.controls.set(world_size=32, sharding_strategy="SHARD_GRAD_OP")
        new = view.explorer.report
        assert view.timeline.data["memory"][0]["total"] == memory_lane(new).total
        assert "world size 32" in view.explorer.view.data["title"]
        assert not (view.explorer.busy or view.timeline.busy or view.prefetch.busy)
        assert view.errors.last_error is None and view.explorer.errors.last_error is None

    in_kernel(test)


def test_the_answer_carries_the_selected_units_details_the_others_follow(
    report: Report, quick: None
) -> None:
    async def test() -> None:
        view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
        assert all(view.explorer.view.details)  # every unit's, from the start
        view.selected_unit = "blocks.1"
        view.explorer.controls.set(world_size=16, as_browser=True)
        details = view.explorer.view.details
        assert [d is not None for d in details] == [False, False, True, False]
        assert details[2]["facts"].endswith("352 B full, 24 B per rank")  # 16 ranks: the new plan
        await until(lambda: all(view.explorer.view.details))
        assert view.explorer.view.details == unit_details(view.explorer.report)

    in_kernel(test)


def test_activations_are_traced_once_the_controls_rest(
    report: Report, quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    traced = count_calls(monkeypatch, Replanner, "profiled")

    async def test() -> None:
        view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
        ex = view.explorer
        ex.controls.set(forward_prefetch=True, as_browser=True)  # a new graph: stored trace
        await until(lambda: "once the controls rest" in view.memory_note.value)
        assert traced == []
        ex.controls.set(sharding_strategy="SHARD_GRAD_OP", as_browser=True)  # before they rest
        assert ex.report.profile is None and ex.replanner is not None
        await until(lambda: "activations included" in view.memory_note.value)
        assert len(traced) == 1 and traced[0][0] == ex.options  # only the last plan
        profiled = ex.replanner.cached(ex.options)
        assert profiled is not None and profiled.profile is not None
        assert view.timeline.data["memory"][0]["total"] == memory_lane(profiled).total

    in_kernel(test)


def test_the_stored_trace_is_made_while_the_kernel_is_idle(report: Report, quick: None) -> None:
    async def test() -> None:
        ex = Explorer(report, model=Tiny(), inputs=tiny_inputs())
        planner = ex.replanner
        assert planner is not None and not planner.has_stored_trace(ex.options)  # shown at once
        await until(lambda: planner.has_stored_trace(ex.options))
        assert "units" in ex.status.value  # the status line is back
        ex.controls.set(layer_classes=[])
        assert planner.last_path == "stored trace" and planner.last_seconds is not None
        assert not planner.has_stored_trace(ex.options.replace(recipe="FSDP2"))  # on demand
        ex.controls.set(recipe="FSDP2")
        assert planner.last_path == "stored trace"

    in_kernel(test)


def test_no_garbage_collector_pause_inside_an_answer(
    report: Report, quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    enabled_while_planning: list[bool] = []
    original = Replanner.plan

    def plan(self: Replanner, *args: Any, **kwargs: Any) -> Report:
        enabled_while_planning.append(gc.isenabled())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Replanner, "plan", plan)
    collections: list[int] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collections.append(info["generation"])

    async def test() -> None:
        view = Dashboard(report, model=Tiny(), inputs=tiny_inputs())
        collections.clear()
        view.explorer.controls.set(world_size=32)
        assert enabled_while_planning == [False] and gc.isenabled()
        assert 2 not in collections
        await until(lambda: 2 in collections)  # one full collection once idle

    gc.callbacks.append(on_gc)
    try:
        in_kernel(test)
    finally:
        gc.callbacks.remove(on_gc)
