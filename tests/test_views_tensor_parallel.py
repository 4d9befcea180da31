"""FSDP2 + tensor parallelism where reports go: the time model, the timeline view (figure,
data for the front end, exported page), the Chrome trace, the card, the summary and the
explorer's detail panel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import tp_models

import fsdpviz
from fsdpviz.cost.hardware import machine
from fsdpviz.export import chrome_trace, page_script
from fsdpviz.views.card import report_html
from fsdpviz.views.detail import param_rows, unit_details
from fsdpviz.views.timeline_view import timeline_data
from fsdpviz.views.timeline_view_figure import timeline_figure


@pytest.fixture(scope="module")
def report() -> fsdpviz.Report:
    torch.manual_seed(0)
    return fsdpviz.analyze(
        tp_models.Llama(),
        tp_models.tokens(),
        fully_shard=tp_models.LAYERS,
        mesh=("dp_shard", 2, "tp", 2),
        parallelize_plan=tp_models.whole_plan(),
        progress=False,
    )


def test_time_model_puts_tp_collectives_on_nvlink_before_the_compute_that_needs_them(
    report: fsdpviz.Report,
) -> None:
    tl = fsdpviz.cost.timeline(report, "h100")
    h100 = machine("h100")
    records = tl.records()
    tp = [r for r in records if r["kind"].startswith("tp_")]
    assert tp and {r["stream"] for r in tp} == {"tp"}
    events = report.iterations[-1]
    for r in tp:
        e = events[r["index"]]
        kind = e.kind.removeprefix("tp_")
        assert r["end"] - r["start"] == pytest.approx(h100.collective_seconds(kind, e.nbytes, 2))
        # two ranks sit in one node: NVLink, not the network
        assert h100.collective_seconds(kind, e.nbytes, 2) < h100.collective_seconds(
            kind, e.nbytes, 2 * h100.gpus_per_node
        )
    # the compute after a tp collective starts once it is done
    starts = sorted(c["start"] for c in tl.compute)
    for r in tp:
        later = [s for s in starts if s >= r["compute_t"]]
        assert not later or later[0] >= r["end"] - 1e-12
    assert tl.totals["tp_bytes"] == pytest.approx(sum(r["bytes"] for r in tp))
    assert tl.totals["tp_bytes"] > 0


def test_tp_collectives_have_their_own_lane(report: fsdpviz.Report, tmp_path: Path) -> None:
    d = timeline_data(report, machine="h100")
    names = [lane["name"] for lane in d["lanes"]]
    assert "tensor parallel" in names
    s = d["steps"]
    tp = [i for i in range(d["n_steps"]) if d["kinds"][s["kind"][i]].startswith("tp_")]
    assert len(tp) == sum(e.tensor_parallel for e in report.iterations[-1])
    assert {names[s["lane"][i]] for i in tp} == {"tensor parallel"}
    # the front end names the module that issued each (its status line and hover)
    assert {d["modules"][s["module"][i]] for i in tp} == {
        e.module for e in report.iterations[-1] if e.tensor_parallel
    }
    assert all(s["module"][i] == -1 for i in range(d["n_steps"]) if i not in tp)
    figure = timeline_figure(report)
    assert "tensor parallel" in json.dumps(figure.layout.to_plotly_json()["yaxis"])
    page = tmp_path / "tp.html"
    report.save(str(page))
    assert '"tensor parallel"' in page_script(page.read_text(), "fv-config")
    trace = chrome_trace(report)
    lanes = {
        e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"
    }
    assert lanes[5] == "tensor parallel"
    on_tp = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] == 5]
    assert on_tp and all(e["cat"].startswith("tp_") for e in on_tp)


def test_no_tp_lane_without_tensor_parallelism() -> None:
    import handwritten_models as hm

    r = fsdpviz.analyze(hm.Stack(), torch.randn(4, 8), fully_shard=[hm.Block], progress=False)
    assert "tensor parallel" not in [lane["name"] for lane in timeline_data(r)["lanes"]]
    assert not any(u.to_dict().keys() & {"shard_shapes", "tp_placements"} for u in r.units)


def test_card_summary_and_detail_show_the_mesh_and_tp_sharded_parameters(
    report: fsdpviz.Report,
) -> None:
    card = report_html(report)
    assert "world size 4 (mesh dp_shard 2 × tp 2)" in card
    assert "tensor parallel over 2 ranks (25 modules parallelised)" in card
    summary = report.summary()
    assert "world size 4 (dp_shard 2 x tp 2)" in summary
    assert "tensor parallel over 2 ranks: 25 modules parallelised, 16 parameters tp-sharded" in (
        summary
    )
    rows = {r[0]: r for r in param_rows(report, "layers.0")}
    assert rows["layers.0.attention.wq.weight"][1:] == [
        "16×16", "256", "1 KiB", "layers.0.attention.wq", "⊞ tp Shard(0)", "4×16",
    ]  # fmt: skip
    assert rows["layers.0.attention.wo.weight"][-2:] == ["⊞ tp Shard(1)", "8×8"]
    assert rows["layers.0.ffn_norm.weight"][-2:] == ["Replicate()", "8"]
    detail = unit_details(report)[[u.module for u in report.units].index("layers.0")]
    params = next(s for s in detail["sections"] if s["title"] == "Parameters")
    assert params["header"][-2:] == ["tensor parallel", "shard per rank"]
    assert "7 of 9 parameters are sharded by tensor parallelism" in str(detail["sections"])


def test_a_tensor_parallel_report_replays_on_its_own_mesh(report: fsdpviz.Report) -> None:
    from fsdpviz.replan import replay

    kept = replay(report, reshard_after_forward=False)
    assert kept.config.kept_after_forward == ["layers.0", "layers.1"]
    assert kept.config.mesh == report.config.mesh
    with pytest.raises(fsdpviz.ConfigError, match=r"changes the tensor-parallel dimension"):
        replay(report, mesh=("dp_shard", 1, "tp", 4))


def test_llama3_70b_as_fsdp_32_x_tp_8_of_the_readme() -> None:
    """The README's example: 80 decoder layers, the tp plan on each layer's projections (its
    time, under 10 s, is measured by benchmarks/bench_analyze_70b.py --tp)."""
    from torch.distributed.tensor.parallel import ColwiseParallel as Col
    from torch.distributed.tensor.parallel import RowwiseParallel as Row
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    with torch.device("meta"):
        model = LlamaForCausalLM(
            LlamaConfig(hidden_size=8192, intermediate_size=28672, vocab_size=128256,
                        num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8)
        )  # fmt: skip
    at = "model.layers.*."
    plan = {at + "self_attn.[qkv]_proj": Col(), at + "self_attn.o_proj": Row(),
            at + "mlp.[gu]*_proj": Col(), at + "mlp.down_proj": Row()}  # fmt: skip
    report = fsdpviz.analyze(
        model, torch.zeros(1, 8192, dtype=torch.long), parallelize_plan=plan,
        fully_shard=[LlamaDecoderLayer], mesh=("dp_shard", 32, "tp", 8), progress=False,
    )  # fmt: skip
    assert len(report.units) == 81 and report.config.world_size == 256
    layer = report.unit("model.layers.0")
    # q 8192x8192, k and v 1024x8192, o, gate, up, down: one eighth each, then FSDP's 1/32
    per_layer = (8192 * 8192 * 2 + 1024 * 8192 * 2 + 3 * 8192 * 28672) // 8 + 2 * 8192
    assert layer.numel == per_layer and layer.sharded_numel * 32 == per_layer
    assert layer.shard_shapes["model.layers.0.self_attn.k_proj.weight"] == [1024 // 8 // 32, 8192]
    # without sequence parallel: forward all-reduces after o_proj and down_proj, backward ones
    # of the replicated inputs of q, k, v, gate and up
    steady = report.iterations[1]
    tp = [e for e in steady if e.tensor_parallel and e.unit == "model.layers.5"]
    assert [e.phase for e in tp].count("forward") == 2 and len(tp) == 7
    assert {e.kind for e in tp} == {"tp_all_reduce"}


def test_kernels_are_costed_as_one_tp_rank_runs_them(report: fsdpviz.Report) -> None:
    """The trace records each kernel as a rank of the tp group runs it: a column-parallel
    projection's multiply on its share of the output features, a row-parallel one's on its
    share of the input features (both operands shared), the weight gradient of a
    column-parallel projection from the whole gathered input; the time model costs them as
    recorded."""
    prof = report.profile
    assert prof is not None and prof.kernels_tp == 2
    forward = {
        tuple(k[2:5]) for ks in prof.iterations[-1].kernels for k in ks
        if k[0] == "gemm" and k[1] == 0
    }  # fmt: skip
    tokens, dim, vocab = 2 * 8, 16, 64
    assert (tokens, dim // 2, dim) in forward  # wq, wk, wv: output features shared
    assert (tokens, dim, dim // 2) in forward  # wo: the shared dimension reduced
    assert (tokens, vocab // 2, dim) in forward  # the output projection, column-parallel
    assert (tokens, vocab, dim) not in forward
    whole = fsdpviz.analyze(
        tp_models.Llama(), tp_models.tokens(), fully_shard=tp_models.LAYERS, world_size=4,
        progress=False,
    )  # fmt: skip
    t = fsdpviz.cost.timeline(report, "h100").totals
    # a rank computes half of the FLOPs of the whole model
    assert 2 * t["hardware_flops"] == pytest.approx(whole.timeline.totals["hardware_flops"])
