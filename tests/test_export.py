"""``fsdpviz.export.save``: Chrome traces that load back, graphs, the HTML page's contents, errors.

The browser side of the HTML page is in ``test_export_html.py``, images in
``test_export_images.py``. Golden file ``tests/golden/export_trace_small.json``
(rewrite with ``FSDPVIZ_UPDATE_GOLDEN=1`` and review the diff).
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
from export_models import recorded_run
from views_models import analyze_tiny, check_golden

import fsdpviz
from fsdpviz import ConfigError, RecordedRun, Report
from fsdpviz.cost import memory_model, timeline
from fsdpviz.export import SUFFIXES, chrome_trace, html_page, page_script, save
from fsdpviz.views import timeline_data
from fsdpviz.views.explorer import explorer_data
from fsdpviz.views.prefetch import prefetch_data


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


@pytest.fixture(scope="module")
def run() -> RecordedRun:
    return recorded_run()


# ------------------------------------------------------------ Chrome trace


def _check_trace(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Trace Event Format: the fields each phase needs; slices never overlap on a lane."""
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    for e in events:
        assert e["ph"] in ("M", "X", "i", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str), e
        if e["ph"] == "M":
            assert e["name"] in (
                "process_name", "process_sort_index", "thread_name", "thread_sort_index",
            )  # fmt: skip
            assert isinstance(e["tid"], int) and isinstance(e["args"], dict)
        elif e["ph"] == "X":
            assert isinstance(e["tid"], int) and isinstance(e["cat"], str)
            assert isinstance(e["ts"], float | int) and e["ts"] >= 0
            assert isinstance(e["dur"], float | int) and e["dur"] >= 0
        elif e["ph"] == "i":
            assert e["s"] in ("t", "p") and isinstance(e["ts"], float | int)
        else:
            assert e["args"] and all(isinstance(v, int | float) for v in e["args"].values())
    lanes: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X":
            lanes.setdefault((e["pid"], e["tid"]), []).append(e)
    for lane in lanes.values():
        lane.sort(key=lambda e: e["ts"])
        for a, b in itertools.pairwise(lane):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)
    return list(events)


def _names(events: list[dict[str, Any]], kind: str) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e.get("tid", 0)): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == kind
    }


def _collectives(events: list[dict[str, Any]], pid: int = 0) -> list[dict[str, Any]]:
    """Events of ``report.iterations`` (slices and free instants), in (iteration, index) order."""
    out = [e for e in events if e["pid"] == pid and "kind" in e.get("args", {})]
    return sorted(out, key=lambda e: (e["args"]["iteration"], e["args"]["index"]))


def test_prediction_trace_holds_every_event_on_its_lane(report: Report, tmp_path: Path) -> None:
    path = save(report, tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    events = _check_trace(trace)
    assert _names(events, "process_name") == {(0, 0): "rank 0"}
    assert _names(events, "thread_name") == {
        (0, 1): "compute", (0, 2): "all-gather stream", (0, 3): "reduce-scatter stream",
    }  # fmt: skip
    got = _collectives(events)
    want = [(i, k, e) for i, it in enumerate(report.iterations) for k, e in enumerate(it)]
    assert [(g["args"]["iteration"], g["args"]["index"]) for g in got] == [
        (i, k) for i, k, _ in want
    ]
    lane = {"all_gather": 2, "free": 2, "reduce_scatter": 3, "all_reduce": 3}
    for g, (_, _, e) in zip(got, want, strict=True):
        args = g["args"]
        assert (args["unit"], args["kind"], args["phase"]) == (e.unit, e.kind, e.phase)
        assert (args["prefetch"], args["hook"], args["hook_unit"]) == (
            e.prefetch, e.hook, e.hook_unit,
        )  # fmt: skip
        assert g["tid"] == lane[e.kind]
        assert g["ph"] == ("i" if e.kind == "free" else "X")
        assert g["name"] == f"{e.kind} {e.unit or '(root)'}"
    assert any(e["cat"] == "all_gather,prefetch" for e in got if e["ph"] == "X")
    assert trace["otherData"]["machine"] == "h100"


def test_prediction_trace_times_come_from_the_time_model(report: Report) -> None:
    trace = chrome_trace(report, iteration=-1)
    events = _collectives(trace["traceEvents"])
    tl = timeline(report, iteration=-1)
    comm = sum(e["dur"] for e in events if e["ph"] == "X")
    assert comm == pytest.approx(tl.totals["comm_s"] * 1e6, abs=0.01)
    for e, r in zip(events, tl.events, strict=True):
        assert e["ts"] == pytest.approx(r["start"] * 1e6, abs=1e-3)
    compute = [e for e in trace["traceEvents"] if e.get("cat") == "compute"]
    assert sum(e["args"].get("flops", 0) for e in compute) == pytest.approx(
        sum(c["flops"] for c in tl.compute)
    )
    assert [e["name"] for e in compute][-1] == "optimizer step"


def test_iterations_follow_each_other(report: Report) -> None:
    events = chrome_trace(report)["traceEvents"]
    marks = [e for e in events if e.get("cat") == "iteration"]
    assert [m["name"] for m in marks] == ["iteration 0", "iteration 1"]
    first = timeline(report, iteration=0).totals["step_s"] * 1e6
    assert marks[1]["ts"] == pytest.approx(first, abs=1e-3)
    second = [e for e in _collectives(events) if e["args"]["iteration"] == 1]
    assert min(e["ts"] for e in second) >= marks[1]["ts"]


def test_memory_is_a_counter_per_event(report: Report) -> None:
    trace = chrome_trace(report, iteration=-1)
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    records = memory_model(report, iteration=-1).records()
    assert len(counters) == len(records) == len(report.iterations[-1])
    assert {c["name"] for c in counters} == {"memory"}
    totals = sorted(sum(c["args"].values()) for c in counters)
    assert totals == sorted(r["total"] for r in records)
    ts = [c["ts"] for c in counters]
    assert ts == sorted(ts)


def test_report_round_trips_through_the_trace(report: Report, tmp_path: Path) -> None:
    path = report.save(tmp_path / "report.json")
    back = fsdpviz.load(path)
    assert back == report
    assert back.to_dict() == report.to_dict()
    assert Report.from_json(path) == report
    assert json.loads(report.to_json()) == {
        k: v for k, v in json.loads(path.read_text()).items()
        if k not in ("traceEvents", "displayTimeUnit", "otherData", "fsdpviz_page")
    }  # fmt: skip
    assert "config" in json.loads(path.read_text())["fsdpviz_page"]  # JupyterLab's page


def test_no_shard_casts_are_on_the_copy_stream(tmp_path: Path) -> None:
    """``NO_SHARD`` with bf16 parameters: each ``cast`` on the copy stream's lane (the lane
    drawn where copies occur), and the report reads back whole, casts included."""
    import torch
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

    r = analyze_tiny(
        sharding_strategy=ShardingStrategy.NO_SHARD,
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16),
    )
    trace = chrome_trace(r)
    casts = [e for e in trace["traceEvents"] if e.get("cat", "").startswith("cast")]
    assert casts and {e["tid"] for e in casts} == {4}
    threads = [e for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert {e["args"]["name"] for e in threads if e["tid"] == 4} == {"copy stream"}
    back = fsdpviz.load(r.save(tmp_path / "report.json"))
    assert back == r and any(e.kind == "cast" for e in back.iterations[-1])


def test_recorded_run_is_one_trace_with_a_process_per_rank(
    run: RecordedRun, tmp_path: Path
) -> None:
    path = run.save(tmp_path / "run.json")
    trace = json.loads(path.read_text())
    events = _check_trace(trace)
    assert _names(events, "process_name") == {(0, 0): "rank 0", (1, 0): "rank 1"}
    assert "machine" not in trace["otherData"]
    for pid, rank in enumerate(run.ranks):
        got = _collectives(events, pid)
        flat = [e for it in rank.iterations for e in it]
        assert len(got) == len(flat)
        offset = (rank.config["started_unix"] - 1000.0) * 1e6
        for g, e in zip(got, flat, strict=True):
            assert g["ts"] == pytest.approx(offset + e.t * 1e6, abs=1e-3)
            if e.duration is not None:
                assert g["dur"] == pytest.approx(e.duration * 1e6, abs=1e-3)
                assert g["args"]["duration_s"] == e.duration
        hooks = [e for e in events if e["pid"] == pid and e.get("cat") == "hooks"]
        assert hooks and all(e["tid"] == 1 for e in hooks)
    back = fsdpviz.load(path)
    assert isinstance(back, RecordedRun)
    assert back.ranks == run.ranks
    assert back.notes == run.notes
    with pytest.raises(ValueError, match=r"recorded run of 2 ranks.*fsdpviz\.load"):
        Report.from_json(path)


def test_trace_golden(report: Report) -> None:
    trace = chrome_trace(report)
    check_golden(
        "export_trace_small.json",
        {"traceEvents": trace["traceEvents"], "displayTimeUnit": trace["displayTimeUnit"]},
    )


# ------------------------------------------------------------------ graphs


def test_graphml_unit_and_module_graph(report: Report, tmp_path: Path) -> None:
    units = nx.read_graphml(save(report, tmp_path / "units.graphml"))
    assert set(units.nodes) == {u.module for u in report.units}
    kinds = Counter(d["kind"] for _, _, d in units.edges(data=True))
    assert kinds["forward_order"] == len(report.units) - 1
    assert kinds["backward_prefetch"] > 0
    modules = nx.read_graphml(save(report, tmp_path / "modules.GRAPHML", graph="module"))
    assert set(modules.nodes) == {m.fqn for m in report.modules}


def test_node_link_json_is_not_a_trace(report: Report, tmp_path: Path) -> None:
    data = json.loads(save(report, tmp_path / "units.nodelink.json").read_text())
    assert "traceEvents" not in data
    g = nx.node_link_graph(data, edges="edges")
    assert set(g.nodes) == {u.module for u in report.units}


def test_graph_of_a_recording_uses_its_units(run: RecordedRun, tmp_path: Path) -> None:
    g = nx.read_graphml(save(run, tmp_path / "modules.graphml", graph="module"))
    assert set(g.nodes) == {u.module for u in run.ranks[0].units}


# ------------------------------------------------------------ HTML content


def _config(page: str) -> dict[str, Any]:
    """The page's config, with each view's data under its name (what the page draws)."""
    data: dict[str, Any] = json.loads(page_script(page, "fv-config"))
    views = data["views"]
    return {**{name: None if s is None else s["data"] for name, s in views.items()}, **data}


def test_html_is_one_file_with_no_remote_references(report: Report, tmp_path: Path) -> None:
    page = save(report, tmp_path / "report.html").read_text()
    assert page.startswith("<!doctype html>")
    static = Path(fsdpviz.__file__).parent / "static"
    # the very module the notebook's widgets load, and the page's boot script
    assert page_script(page, "fv-widget-esm") == (static / "widget.js").read_text()
    assert (static / "page.js").read_text() in page
    assert "plotly" not in page.lower()  # the page draws its views itself
    assert not re.search(r"<(script|link|img)[^>]*\s(src|href)=", page)
    assert "<title>fsdpviz prediction: FSDP1, 4 units, world size 4</title>" in page
    assert "data-jp-theme-light" not in page.split("</head>")[1][:40]  # the reader's setting
    assert "@media (prefers-color-scheme: dark)" in page
    assert "peak memory per rank" in page and "step time (modelled)" in page
    config = _config(page)
    assert config["divs"] == {
        "timeline": "fv-timeline",
        "explorer": "fv-explorer",
        "prefetch": "fv-prefetch",
    }
    want = timeline_data(report, -1, machine="h100")  # the memory model's lane
    assert config["timeline"] == json.loads(json.dumps(want))
    assert config["timeline"]["memory"][0]["peak"]["bytes"] == report.memory.peak["bytes"]
    assert config["timeline"]["clock"].startswith("modelled on H100")
    assert config["explorer"] == json.loads(json.dumps(explorer_data(report)))
    assert config["prefetch"] == json.loads(json.dumps(prefetch_data(report)))
    assert config["prefetch"]["units"] == ["", "blocks.0", "blocks.1", "blocks.2"]


def test_html_options(report: Report) -> None:
    dark = html_page(report, theme="dark", iteration=None, memory=None, title="my <run>")
    assert '<body data-jp-theme-light="false">' in dark
    assert '<body data-jp-theme-light="true">' in html_page(report, theme="light")
    assert "<title>my &lt;run&gt;</title>" in dark
    config = _config(dark)
    assert config["timeline"]["memory"] == []  # no memory lane
    assert config["timeline"]["n_steps"] == sum(len(it) for it in report.iterations)
    n = len(report.iterations[0])
    first = _config(html_page(report, iteration=0, memory=[float(i) for i in range(n)]))
    (lane,) = first["timeline"]["memory"]
    assert lane["total"] == [float(i) for i in range(n)]
    with pytest.raises(
        ValueError, match="theme='blue' is not valid; use 'auto', 'light' or 'dark'"
    ):
        html_page(report, theme="blue")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory='model' is not valid"):
        html_page(report, memory="model")


def test_html_of_a_recorded_run_has_every_rank(run: RecordedRun, tmp_path: Path) -> None:
    page = run.save(tmp_path / "run.html").read_text()
    config = _config(page)
    assert [g["name"] for g in config["timeline"]["groups"]] == ["rank 0", "rank 1"]
    assert config["timeline"]["timed"] is True
    assert "recording of 2 ranks" in page and "all agree" in page
    modules = config["explorer"]["modules"]  # a recording has no module tree: one per unit
    assert modules["name"] == ["", "blocks.0", "blocks.1", "blocks.2"]
    assert modules["parent"] == [-1, 0, 0, 0]
    assert [u["name"] for u in config["explorer"]["units"]] == modules["name"]


# ------------------------------------------------------------------ errors


def test_unknown_suffix_lists_the_supported_ones(report: Report, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        save(report, tmp_path / "report.xlsx")
    message = str(info.value)
    assert "unknown suffix '.xlsx'" in message
    for suffix in SUFFIXES:
        assert f"  {suffix} " in message
    with pytest.raises(ConfigError, match=r"unknown suffix '\(none\)'"):
        save(report, tmp_path / "report")
    assert not (tmp_path / "report.xlsx").exists()


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("r.html", {"them": "dark"}, "unknown option 'them' for .html files; did you mean 'theme'"),
        ("r.json", {"theme": "dark"}, "unknown option 'theme' for .json files"),
        ("r.png", {"figure": "icicle"}, "figure='icicle' is not one of 'explorer'"),
        ("r.graphml", {"graph": "units"}, "graph='units' is not valid; use 'unit' or 'module'"),
    ],
)
def test_bad_options(
    report: Report, tmp_path: Path, name: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        save(report, tmp_path / name, **options)
    assert not (tmp_path / name).exists()


def test_only_reports_and_runs(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="cannot export a dict"):
        save({"units": []}, tmp_path / "r.html")  # type: ignore[arg-type]


# ------------------------------------------------------- a real recording


@pytest.mark.slow
def test_real_four_rank_recording(tmp_path: Path) -> None:
    """The torchrun job of ``test_record_diverge`` (shared per session): rank 3 diverges."""
    from record_harness import job

    run = fsdpviz.load(job(4, "case:stack-post-fwd,fsdp2:fsdp2-twice-grouped,diverge") / "diverge")
    assert isinstance(run, RecordedRun)
    trace = json.loads(run.save(tmp_path / "run.json").read_text())
    events = _check_trace(trace)
    assert _names(events, "process_name") == {(r, 0): f"rank {r}" for r in range(4)}
    for rank in run.ranks:
        pid = rank.config["rank"]
        assert len(_collectives(events, pid)) == sum(len(it) for it in rank.iterations)
    back = fsdpviz.load(tmp_path / "run.json")
    assert isinstance(back, RecordedRun) and back.ranks == run.ranks
    page = run.save(tmp_path / "run.html").read_text()
    assert "Ranks diverge in iteration 0 at event 3" in page
    groups = _config(page)["timeline"]["groups"]
    assert [g["name"] for g in groups] == [f"rank {r}" for r in range(4)]
