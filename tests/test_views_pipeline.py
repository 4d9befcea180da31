"""The views of a pipeline's report: a timeline lane group per pipeline rank (microbatches,
bubbles, each rank's memory), the explorer's stages, the card's schedule. The front end's
test data ``js/test/data/pipeline.json`` (``FSDPVIZ_UPDATE_GOLDEN=1`` rewrites it)."""

from __future__ import annotations

import pipeline_job as pj
import pytest
import torch
from views_models import check_front_end_data

import fsdpviz
from fsdpviz.views import explorer_data, timeline_data
from fsdpviz.views.card import report_html
from fsdpviz.views.detail import unit_details

BLOCKS = [f"layers.{i}" for i in range(pj.MODEL_ARGS["n_layers"])]


@pytest.fixture(scope="module")
def report() -> fsdpviz.Report:
    with torch.device("meta"):
        model = pj.model()
    return fsdpviz.analyze(
        model, torch.zeros(4, pj.SEQ, dtype=torch.long),
        fully_shard=["tok_embeddings", *BLOCKS, ("norm", "output")],
        reshard_after_forward=False, mesh=("pp", 2, "dp_shard", 2),
        pipeline_schedule="1F1B", microbatches=2,
    )  # fmt: skip


def test_the_timeline_has_a_lane_group_per_pipeline_rank(report: fsdpviz.Report) -> None:
    d = timeline_data(report, machine="h100")
    assert [g["name"] for g in d["groups"]] == ["pp rank 0 · stage 0", "pp rank 1 · stage 1"]
    lanes = [(lane["group"], lane["name"]) for lane in d["lanes"]]
    for g in (0, 1):
        assert (g, "pipeline sends") in lanes and (g, "pipeline receives") in lanes
        assert (g, "memory") in lanes
    ranks = report.pipeline.ranks  # type: ignore[union-attr]
    for entry, rank in zip(d["memory"], ranks, strict=True):  # each rank's own memory
        assert entry["peak"]["bytes"] == rank.memory.peak["bytes"]
    c = d["compute"]
    labelled = [(lab, mb) for lab, mb in zip(c["label"], c["microbatch"], strict=True) if lab]
    assert {lab for lab, _ in labelled} >= {"0F0", "0F1", "0B0", "0B1", "1F0", "1B1"}
    assert all(int(lab[2:]) == mb for lab, mb in labelled)
    s = d["steps"]
    kinds = [d["kinds"][k] for k in s["kind"]]
    assert "pp_send" in kinds and "pp_recv" in kinds
    recv = kinds.index("pp_recv")
    assert s["stage"][recv] >= 0 and s["microbatch"][recv] >= 0
    # the compute's waits for another rank are bubbles, ranked with the other waits
    for g, rank in zip(d["groups"], ranks, strict=True):
        bubbles = [b for b in g["bottlenecks"] if b["cause"] == "bubble"]
        assert sum(b["exposed"] for b in bubbles) == pytest.approx(rank.timeline.totals["bubble_s"])
    assert any(b["cause"] == "bubble" for g in d["groups"] for b in g["bottlenecks"])
    # steps walk every rank's events in the time their hooks run
    assert s["issue"] == sorted(s["issue"])
    # each rank's group ends with its optimizer step, the job's timeline's for that rank:
    # the slowest's at the job's step time
    job = report.timeline
    w = d["step_work"]
    for g, rank in enumerate(ranks):
        mine = [w2 for w2 in job.step_work if w2.rank == g]
        at = [k for k, gk in enumerate(w["group"]) if gk == g]
        assert [(w["name"][k], w["x0"][k], w["x1"][k]) for k in at] == [
            (w2.name, w2.start, w2.end) for w2 in mine
        ]
        bars = [x for x, gk in zip(s["x1"], s["group"], strict=True) if gk == g]
        c_x1 = zip(d["compute"]["x1"], d["compute"]["group"], strict=True)
        bars += [x for x, gk in c_x1 if gk == g]
        assert max(bars) < mine[-1].end == rank.timeline.totals["step_s"]
    assert max(w["x1"]) == job.totals["step_s"]
    check_front_end_data("pipeline.json", d)


def test_the_explorer_and_the_card_say_the_stages(report: fsdpviz.Report) -> None:
    e = explorer_data(report)
    assert e["title"].endswith("2 pipeline stages on 2 ranks (1F1B)")
    by_name = {u["name"]: u for u in e["units"]}
    assert by_name["layers.1"]["stage"] == 0 and by_name["norm, output"]["pp_rank"] == 1
    details = unit_details(report)
    assert details[-1]["facts"].startswith("pipeline stage 1 (pp rank 1)")
    card = report_html(report)
    assert "pipeline 1F1B over 2 ranks, 2 microbatches" in card
    assert "pipeline bubbles" in card and "on pipeline rank" in card


def test_a_pipelines_file_and_chrome_trace(report: fsdpviz.Report, tmp_path: object) -> None:
    """The report file reads back with its ranks; the Chrome trace has every rank's events."""
    from pathlib import Path

    from fsdpviz.export import chrome_trace

    out = report.save(Path(str(tmp_path)) / "pp.json")
    again = fsdpviz.load(out)
    assert isinstance(again, fsdpviz.Report) and again.pipeline is not None
    assert [r.to_dict() for r in again.pipeline.ranks] == [
        r.to_dict()
        for r in report.pipeline.ranks  # type: ignore[union-attr]
    ]
    trace = chrome_trace(report)
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("pp_recv" in n for n in names)
