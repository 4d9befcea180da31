"""What fsdpviz's notebook outputs and report files hold for JupyterLab's fsdpviz renderer:
the views' data (``application/vnd.fsdpviz.report+json``, the page's config packed), a
static SVG of the timeline and the plan, ``text/plain``; ``.fsdpviz.json`` read back."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from export_models import recorded_run, report_49_units
from views_models import analyze_tiny, needs_front_end

import fsdpviz
from fsdpviz import Report
from fsdpviz.export import MIME, PAGE_KEY, object_bundle
from fsdpviz.export._html import page_config
from fsdpviz.views import explorer_data, prefetch_data, timeline_data
from fsdpviz.views.tree import with_module_tree

SVG = "image/svg+xml"
WIDGET = "application/vnd.jupyter.widget-view+json"
LIMIT = 2_000_000  # bytes of one output of a 10,000-module report


def unpacked(data: dict[str, str]) -> dict[str, Any]:
    """The config a MIME output packs (as js/src/page.ts `unpackText` reads it)."""
    config: dict[str, Any] = json.loads(gzip.decompress(base64.b64decode(data["config"])))
    return config


def check_svg(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


def test_card_carries_the_views_and_a_static_image(report: Report) -> None:
    bundle = report._repr_mimebundle_()
    assert bundle["text/html"].startswith('<div class="fsdpviz-card"')
    assert bundle["text/plain"] == report.summary()
    data = bundle[MIME]
    assert data["version"] == fsdpviz.__version__ and data["header"] == ""
    assert data["title"].startswith("fsdpviz prediction: FSDP1, 4 units")
    views = unpacked(data)["views"]
    # the page's views, as report.save("x.html") draws them
    assert views == json.loads(json.dumps(page_config(report)["views"]))
    assert views["explorer"]["data"] == json.loads(
        json.dumps(explorer_data(with_module_tree(report)))
    )
    assert views["prefetch"]["data"] == json.loads(json.dumps(prefetch_data(report)))
    svg = check_svg(bundle[SVG])
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "Timeline" in texts and "Wrap units" in texts
    # one mark per event at most, in the units' colours
    rects = [r.get("fill") for r in svg.iter("{http://www.w3.org/2000/svg}rect")]
    colors = set(timeline_data(report)["colors"])
    assert colors & set(rects)


def test_a_run_and_its_diagnosis_carry_every_rank() -> None:
    run = recorded_run()
    bundle = run._repr_mimebundle_()
    timeline = unpacked(bundle[MIME])["views"]["timeline"]["data"]
    assert [g["name"] for g in timeline["groups"]] == ["rank 0", "rank 1"]
    check_svg(bundle[SVG])
    assert "rank 1" in bundle[SVG]


def test_bundle_of_a_report_whose_views_fail_is_the_card(
    report: Report, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsdpviz.export._notebook as notebook

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("no data")

    monkeypatch.setattr(notebook, "page_config", broken)
    fresh = dataclasses.replace(report)  # (a report shown before keeps the card it was given)
    bundle = fresh._repr_mimebundle_()
    assert MIME not in bundle and bundle["text/html"].startswith('<div class="fsdpviz-card"')
    assert "(no saved views: ValueError: no data)" in bundle["text/plain"]


def test_report_file_round_trips_and_holds_the_page(report: Report, tmp_path: Path) -> None:
    path = report.save(tmp_path / "plan.fsdpviz.json")
    data = json.loads(path.read_text())
    page = data[PAGE_KEY]
    assert page["title"].startswith("fsdpviz prediction: FSDP1, 4 units")
    assert page["header"].startswith("<header><h1>") and "wrap units" in page["header"]
    assert unpacked(page)["views"] == json.loads(json.dumps(page_config(report)["views"]))
    back = fsdpviz.load(path)
    assert isinstance(back, Report) and back.to_dict() == report.to_dict()
    run = recorded_run()
    run_path = run.save(tmp_path / "run.fsdpviz.json")
    back_run = fsdpviz.load(run_path)
    assert [r.to_dict() for r in back_run.ranks] == [r.to_dict() for r in run.ranks]  # type: ignore[union-attr]
    with pytest.raises(fsdpviz.ConfigError, match=r"unknown option 'figure' for \.fsdpviz\.json"):
        report.save(tmp_path / "x.fsdpviz.json", figure="timeline")


def test_chrome_trace_holds_the_page_too(report: Report, tmp_path: Path) -> None:
    path = report.save(tmp_path / "trace.json")
    data = json.loads(path.read_text())
    assert data["traceEvents"] and data["otherData"]["generator"].startswith("fsdpviz")
    assert set(unpacked(data[PAGE_KEY])["views"]) == {"timeline", "explorer", "prefetch"}
    assert fsdpviz.load(path).to_dict() == report.to_dict()  # type: ignore[union-attr]


@needs_front_end
def test_widgets_put_their_views_beside_the_live_widget(report: Report) -> None:
    from fsdpviz.widgets import ComparisonView, Dashboard, TimelineWidget

    view = Dashboard(report)
    view.timeline.step = 3
    view.selected_unit = "blocks.1"
    bundle = view._repr_mimebundle_()
    assert bundle[WIDGET]["model_id"] == view.model_id
    views = unpacked(bundle[MIME])["views"]
    assert views["timeline"]["step"] == 3 and views["timeline"]["selected_unit"] == "blocks.1"
    assert views["explorer"]["selected_unit"] == "blocks.1"
    assert bundle["text/plain"] == report.summary()
    check_svg(bundle[SVG])
    cmp = fsdpviz.compare(report, analyze_tiny(world_size=8))
    shown = cmp.show()
    assert isinstance(shown, ComparisonView) and isinstance(shown.timeline, TimelineWidget)
    one = shown._repr_mimebundle_()
    assert one is not None
    views = unpacked(one[MIME])["views"]
    assert views["explorer"] is None and views["prefetch"] is None
    assert len(views["timeline"]["data"]["groups"]) == 2
    check_svg(one[SVG])


@pytest.mark.slow
def test_a_ten_thousand_module_report_outputs_under_2_mb() -> None:
    from fsdpviz.examples import ExampleConfig, example_analysis

    small = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2}
    big = example_analysis(config=ExampleConfig(num_layers=833, **small), progress=False)
    assert len(big.modules) >= 10_000
    start = time.perf_counter()
    bundle = object_bundle(big)
    seconds = time.perf_counter() - start
    size = len(json.dumps(bundle))
    print(f"10,000-module output: {size / 1e6:.2f} MB ({len(bundle[SVG]) / 1e3:.0f} kB SVG), "
          f"{seconds:.1f} s")  # fmt: skip
    assert size < LIMIT
    assert unpacked(bundle[MIME])["views"]["timeline"]["data"]["n_steps"] > 4_000  # one iteration
    check_svg(bundle[SVG])


def test_the_49_unit_svg_stays_small() -> None:
    bundle = object_bundle(report_49_units())
    assert len(bundle[SVG]) < 150_000
    check_svg(bundle[SVG])
