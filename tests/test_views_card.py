"""The card a notebook shows for a report or a recorded run (``_repr_mimebundle_``).

The HTML of a small prediction is compared with ``tests/golden/card_report_small.html``
(``FSDPVIZ_UPDATE_GOLDEN=1`` rewrites it; open it in a browser to review).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import handwritten_models as hm
import pytest
import torch
from IPython.core.formatters import DisplayFormatter
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from views_models import GOLDEN_DIR, Block, Tiny, analyze_tiny, tiny_inputs

import fsdpviz
from fsdpviz import FsdpWarning, RecordedRun, Report
from fsdpviz.views.card import report_bundle, report_html, run_bundle, run_html

GOLDEN = GOLDEN_DIR / "card_report_small.html"


def _warned(report: Report) -> Report:
    """``report`` with a warning whose text needs escaping (two lines: only the first shows)."""
    w = FsdpWarning("unit_unused_in_forward", "Units <never> ran & 'were' skipped\nsecond line")
    return dataclasses.replace(report, warnings=[w])


def _wellformed(html: str) -> ET.Element:
    """The card parses as XML: every tag closed, every attribute quoted, no stray ``<``."""
    return ET.fromstring(html)


def _text(html: str) -> str:
    """What a reader sees: the text of every element, entities decoded."""
    return " ".join(" ".join(_wellformed(html).itertext()).split())


def test_report_card_matches_golden() -> None:
    # one tag per line in the file, so that a change reads as a small diff
    html = report_html(_warned(analyze_tiny())).replace("><", ">\n<") + "\n"
    if os.environ.get("FSDPVIZ_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(html)
    assert GOLDEN.exists(), f"{GOLDEN} is missing: run with FSDPVIZ_UPDATE_GOLDEN=1 and review it"
    assert html == GOLDEN.read_text(), (
        "the card differs from the golden file; if the change is intended, rewrite it with "
        "FSDPVIZ_UPDATE_GOLDEN=1 and review it in a browser"
    )


def test_fsdp1_card_shows_config_units_memory_and_warnings() -> None:
    report = _warned(analyze_tiny())
    bundle = report_bundle(report)
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"] == report.summary()
    html = bundle["text/html"]
    text = _text(html)
    assert "fsdpviz prediction · FSDP1 · 4 wrap units · world size 4" in text
    assert (
        "FULL_SHARD · auto_wrap_policy ModuleWrapPolicy({Block}) · backward_prefetch "
        "BACKWARD_PRE · forward_prefetch off" in text
    )
    per_rank = sum(u.sharded_bytes for u in report.units)
    assert f"322 parameters · 1.26 KiB full · {per_rank} B per rank" in text
    peak = report.memory.peak
    assert f"peak 3.03 KiB per rank {peak['where']}; dominated by {peak['dominant']}" in text
    # the unit table: name, class, parameters, bytes full and per rank, dtype
    assert "(root) Tiny 58 232 B 60 B float32" in text
    assert "blocks.2 Block 88 352 B 88 B float32" in text
    assert "1 warning unit_unused_in_forward Units <never> ran & 'were' skipped" in text
    assert "second line" not in text
    assert "report.show() opens the explorer" in text
    # the figure: inline SVG, one bar per unit in its colour, the memory peak marked
    svgs = re.findall(r"<svg .*?</svg>", html)
    assert len(svgs) == 2
    for color in fsdpviz.views.unit_colors(report).values():
        assert f'fill="{color}"' in svgs[0]
    assert "<title>blocks.0: 88 B per rank</title>" in svgs[0]
    assert "<circle" in svgs[1] and "peak 3.03 KiB" in svgs[1]
    # static: nothing runs, nothing is fetched
    assert "<script" not in html and "http" not in html.replace("http://www.w3.org/2000/svg", "")


def test_card_follows_the_jupyterlab_theme() -> None:
    html = report_html(analyze_tiny())
    assert "color:var(--jp-ui-font-color1, inherit)" in html
    assert "border:1px solid var(--jp-border-color2, rgba(128, 128, 128, 0.35))" in html
    # every var() has a fallback, and SVG text follows the page's text colour
    assert not re.search(r"var\(--jp-[a-z0-9-]+\)", html)
    assert 'fill="currentColor"' in html
    assert not re.search(r'fill="#(000|fff)', html, re.IGNORECASE)


def test_fsdp2_card_names_the_recipe_and_prefetch() -> None:
    torch.manual_seed(0)
    report = fsdpviz.analyze(
        Tiny(),
        tiny_inputs(),
        fully_shard=[Block],
        forward_prefetch={"blocks.0": ["blocks.1"]},
        world_size=4,
        progress=False,
    )
    text = _text(report_html(report))
    assert "fsdpviz prediction · FSDP2 · 4 wrap units · world size 4" in text
    assert (
        "fully_shard on 4 modules · reshard_after_forward True (root False) · "
        "forward prefetch set on 1 module · backward prefetch of the previous unit" in text
    )
    assert "peak " in text and "per rank" in text


def test_long_unit_lists_are_cut_with_a_count() -> None:
    torch.manual_seed(0)
    report = fsdpviz.analyze(
        Tiny(n=14), tiny_inputs(), auto_wrap_policy=ModuleWrapPolicy({Block}), progress=False
    )
    text = _text(report_html(report))
    assert len(report.units) == 15
    assert "blocks.8" in text and "blocks.9 " not in text
    assert "… and 5 more" in text


def test_everything_is_escaped() -> None:
    report = analyze_tiny()
    evil = "<img src=x onerror=alert(1)>"
    units = [dataclasses.replace(report.units[1], module=evil, module_class=evil)]
    report = dataclasses.replace(
        report,
        units=[report.units[0], *units, *report.units[2:]],
        config={**report.config, "auto_wrap_policy": evil},
        warnings=[FsdpWarning(evil, evil)],
    )
    html = report_html(report)
    assert "<img" not in html
    assert html.count("&lt;img src=x onerror=alert(1)&gt;") >= 4
    assert _text(html).count(evil) >= 4


def test_a_failing_memory_model_leaves_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    import fsdpviz.cost.memory

    def broken(report: Report, **kwargs: Any) -> Any:
        raise RuntimeError("no <tape>\nmore detail")

    monkeypatch.setattr(fsdpviz.cost.memory, "memory_model", broken)
    report = analyze_tiny()
    # analyze still gives the plan, and says the fit was not checked
    [warning] = [w for w in report.warnings if w.code == "fit_not_checked"]
    assert "the memory model failed (RuntimeError: no <tape>)" in warning.message
    html = report_html(report)
    text = _text(html)
    assert "peak memory: the memory model failed (RuntimeError: no <tape>)" in text
    assert "more detail" not in text
    assert "blocks.0" in text and html.count("<svg") == 1


def test_the_card_says_whether_it_fits() -> None:
    report = analyze_tiny()
    text = _text(report_html(report))
    assert f"✓ {report.memory.fit_text()}" in text
    assert "fits in H100 SXM 80GB: needs " in text
    small = analyze_tiny(machine=fsdpviz.cost.machine("h100", memory_gib=0.001))
    text = _text(report_html(small))
    assert f"✗ {small.memory.fit_text()}" in text and "does not fit in H100 SXM 80GB" in text
    assert "out_of_memory" in text  # and among the warnings


def test_without_a_profile_the_card_says_why_there_is_no_peak() -> None:
    text = _text(report_html(analyze_tiny(profile=False)))
    assert "peak memory: not estimated, this report has no trace profile" in text
    assert "4 wrap units" in text


def test_a_report_read_back_shows_the_same_card(tmp_path: Path) -> None:
    report = _warned(analyze_tiny())
    report.to_json(tmp_path / "report.json")
    loaded = fsdpviz.load(tmp_path / "report.json")
    assert isinstance(loaded, Report)
    assert report_html(loaded) == report_html(report)


def test_ipython_displays_the_card() -> None:
    report = analyze_tiny()
    data, _ = DisplayFormatter().format(report)
    assert data["text/plain"] == report.summary()
    assert data["text/html"] == report_html(report)


def _record(tmp_path: Path) -> RecordedRun:
    """A real FSDP1 run of three steps on rank 0 of the fake process group, read back."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FSDP(
            hm.Stack(), auto_wrap_policy=ModuleWrapPolicy({hm.Block}), device_id=torch.device("cpu")
        )
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with fsdpviz.record(model, out_dir=tmp_path):
        for _ in range(3):
            model(x).sum().backward()
    run = fsdpviz.load(tmp_path)
    assert isinstance(run, RecordedRun)
    return run


def _rank(report: Report, rank: int, swap: tuple[int, int] | None = None) -> Report:
    its = copy.deepcopy(report.iterations)
    if swap is not None:
        a, b = swap
        its[0][a], its[0][b] = its[0][b], its[0][a]
    return dataclasses.replace(report, config={**report.config, "rank": rank}, iterations=its)


def test_recording_card(fake_pg: int, tmp_path: Path) -> None:
    run = _record(tmp_path)
    bundle = run_bundle(run)
    assert bundle["text/plain"] == run.summary()
    text = _text(bundle["text/html"])
    assert f"fsdpviz recording · FSDP1 · 1 of {fake_pg} ranks · fake" in text
    assert "3 iterations per rank · 5 wrap units" in text
    assert "one rank was recorded: nothing to compare it with" in text
    assert f"note: ranks {list(range(1, fake_pg))} wrote no recording here" in text
    assert "blocks.3 Block 1,104 4.31 KiB 1.08 KiB float32" in text
    assert "run.ranks[r].show() opens the explorer for one rank" in text
    # one rank's recording is a Report: it has a card too, without a memory estimate
    rank_text = _text(report_html(run.ranks[0]))
    assert "fsdpviz recording · FSDP1 · 5 wrap units" in rank_text
    assert "rank 0 · FULL_SHARD" in rank_text
    assert "peak memory: not estimated" in rank_text
    data, _ = DisplayFormatter().format(run)
    assert data["text/html"] == bundle["text/html"]


def test_recording_card_shows_where_ranks_diverge(fake_pg: int, tmp_path: Path) -> None:
    recorded = _record(tmp_path).ranks[0]
    # rank 1 gathers blocks.1 before blocks.0, as a rank-dependent branch would make it
    events = recorded.iterations[0]
    first = next(i for i, e in enumerate(events) if e.unit == "blocks.0")
    second = next(i for i, e in enumerate(events) if e.unit == "blocks.1")
    run = RecordedRun([_rank(recorded, 0), _rank(recorded, 1, (first, second))], tmp_path)
    div = run.divergence()
    assert div is not None
    html = run_html(run)
    text = _text(html)
    assert f"Ranks diverge in iteration 0 at event {div.index} (forward)" in text
    assert "rank 0: all_gather 'blocks.0'" in text and "rank 1: all_gather 'blocks.1'" in text
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in text
    assert f"ranks diverge at event {div.index}" in html  # marked in the per-rank figure
    n = " / ".join(str(len(it)) for it in recorded.iterations)
    assert f"rank iterations events per iteration 0 3 {n} 1 3 {n}" in text  # the ranks table
    strips = re.findall(r"<svg .*?</svg>", html)
    assert len(strips) == 1 and strips[0].count("<rect") == 2 * len(events)


def test_empty_reports_and_runs_still_show_a_card() -> None:
    empty = Report("prediction", {"world_size": 2}, [], [], [])
    text = _text(report_bundle(empty)["text/html"])
    assert "fsdpviz prediction · FSDP1 · 0 wrap units · world size 2" in text
    assert "no wrap units" in text and "could not be drawn" not in text
    crashed = Report("recording", {"world_size": 2, "rank": 0, "api": "FSDP2"}, [], [], [])
    run = RecordedRun([crashed], None, ["rank 1 wrote no recording here"])
    text = _text(run_html(run))
    assert "fsdpviz recording · FSDP2 · 1 of 2 ranks" in text
    assert "no iteration was recorded, so there is nothing to compare" in text
    assert "note: rank 1 wrote no recording here" in text


def test_a_bug_in_the_card_falls_back_to_the_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    import fsdpviz.views.card as card

    def broken(report: Report) -> str:
        raise ValueError("unexpected <unit>")

    monkeypatch.setattr(card, "units_table", broken)
    report = analyze_tiny()
    html = report_bundle(report)["text/html"]
    text = _text(html)
    assert "fsdpviz prediction: 4 units, world size 4" in text
    assert "(the card could not be drawn: ValueError: unexpected <unit>)" in text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (512, "512 B"),
        (1536, "1.5 KiB"),
        (1000 * 1024, "1000 KiB"),  # not '1e+03 KiB'
        (int(1023.7 * 1024), "1024 KiB"),
        (int(999.4 * 2**20), "999 MiB"),
        (3 * 2**30, "3 GiB"),
    ],
)
def test_bytes_read_as_numbers(n: int, text: str) -> None:
    from fsdpviz.views import format_bytes

    assert format_bytes(n) == text


def test_counts_read_as_numbers() -> None:
    from fsdpviz.views.card import _count

    assert [_count(n) for n in (9_999, 999_700, 1_234_567, 70_553_706_496)] == [
        "9,999",
        "1000 K",
        "1.23 M",
        "70.6 B",
    ]


def test_card_says_which_mesh_dimension_crosses_nodes() -> None:
    from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model

    config = ExampleConfig(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4)
    report = fsdpviz.analyze(
        example_model(config), example_inputs(config, batch=2, seq=64),
        fully_shard=[DecoderLayer], mesh=("dp_replicate", 4, "dp_shard", 8), progress=False,
    )  # fmt: skip
    text = _text(report_html(report))
    assert (
        "nodes of 8 GPUs: dp_replicate 4 across 4 nodes (1 of 8 GPUs in each, 8 groups share "
        "a node's network) · dp_shard 8 inside a node"
    ) in text
    job = fsdpviz.analyze(
        example_model(config), example_inputs(config, batch=2, seq=64),
        fully_shard=[DecoderLayer], world_size=8, grad_accum=4, compile=[DecoderLayer],
        float8={"enable_fsdp_float8_all_gather": True}, progress=False,
    )  # fmt: skip
    assert (
        "grad_accum 4 (no gradient sync on 3) · torch.compile on DecoderLayer · float8 linears "
        "+ float8 all-gather"
    ) in _text(report_html(job))


def test_the_card_is_made_once_per_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shown again (a notebook redrawing an output), a report's card is the one made
    before; a report changed since gets a new one. The saved views use the report's own
    time model (report.timeline), not a second run of it."""
    import fsdpviz.cost.time as time_model
    import fsdpviz.export as notebook

    report = analyze_tiny()
    made: list[object] = []
    bundle_of = notebook.object_bundle
    monkeypatch.setattr(notebook, "object_bundle", lambda obj, **kw: made.append(obj) or
                        bundle_of(obj, **kw))  # fmt: skip
    runs: list[object] = []
    model = time_model.timeline
    monkeypatch.setattr(time_model, "timeline", lambda r, *a, **kw: runs.append(r) or
                        model(r, *a, **kw))  # fmt: skip
    first = report._repr_mimebundle_()
    assert report._repr_mimebundle_() == first and len(made) == 1
    assert len(runs) <= 1  # report.timeline, once: the card's and the saved timeline's
    report.warnings.append(FsdpWarning("mine", "a note of my own"))
    again = report._repr_mimebundle_()
    assert len(made) == 2 and "a note of my own" in again["text/html"]
