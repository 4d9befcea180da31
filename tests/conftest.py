"""Shared fixtures: a fake process group so real FSDP runs in this process; one Chromium and
one JupyterLab (server, page, kernel) for every browser suite of the session."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch.distributed as dist
from browser_harness import (  # noqa: F401 (session fixtures)
    chromium,
    jupyterlab,
    lab_server,
    load_note,
)

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FAKE_WORLD_SIZE = 4


@pytest.fixture(scope="session")
def bench_published() -> ModuleType:
    """``benchmarks/bench_published.py`` as a module: the published runs as it rebuilds them
    (their plans and machines), for tests that check a rebuild against torch or a source."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_published.py"
    spec = importlib.util.spec_from_file_location("bench_published", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.setdefault("bench_published", importlib.util.module_from_spec(spec))
    if not hasattr(module, "ROWS"):
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fake_pg() -> Iterator[int]:
    """Real FSDP on the CPU in one process: a fake process group of 4 ranks."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=FAKE_WORLD_SIZE)
    yield FAKE_WORLD_SIZE


@pytest.fixture
def as_rank(fake_pg: int) -> Iterator[object]:
    """Run as another rank of the fake process group, then as rank 0 again."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def become(rank: int, world_size: int = fake_pg) -> None:
        dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        # DTensor's sharding propagation caches decisions by mesh; a mesh made now equals
        # one made before, whose groups are gone
        _clear_sharding_prop_cache()

    yield become
    become(0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    """A failed test that drove a browser says so when the machine was busy meanwhile."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    browser = {"chromium", "jupyterlab", "lab_server"}
    if report.failed and browser & set(getattr(item, "fixturenames", ())):
        note = load_note()
        if note:
            report.sections.append(("machine load", note))


@pytest.fixture(autouse=True)
def _garbage_collector_left_on() -> Iterator[None]:
    """Every test starts and ends with Python's garbage collector on: code that leaves it
    off (a user's kernel would then never collect cycles) fails the test that did it."""
    import gc

    if not gc.isenabled():
        gc.enable()
        pytest.fail("the garbage collector was off when this test started")
    yield
    if not gc.isenabled():
        gc.enable()
        pytest.fail("this test left the garbage collector off")


@pytest.fixture(autouse=True)
def _no_browser_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Playwright's sync API (the session's Chromium) leaves its asyncio loop marked as
    running in this thread once started; a test that drives no browser runs as a script
    does, with no running loop (else fsdpviz would defer work to a loop nobody runs)."""
    import asyncio

    if "chromium" in request.fixturenames:
        yield
        return
    loop = asyncio._get_running_loop()
    asyncio._set_running_loop(None)
    try:
        yield
    finally:
        asyncio._set_running_loop(loop)
