"""The job around FSDP from trainer configs: torchtitan jobs as torchtitan runs them (selective
per-layer checkpointing on the traced copy, torch.compile, float8 linears, the keys of older
job files) and accelerate's dynamo settings."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import fsdpviz
from fsdpviz.configs.torchtitan_model import TransformerBlock
from fsdpviz.configs.torchtitan_plan import EveryNthBlock

# torchtitan's llama3_8b.toml of December 2024 (commit 9dec370, the one of its published H100
# benchmarks), with the debug model, float8 linears and compile turned on
DECEMBER_2024 = """\
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[model]
name = "llama3"
flavor = "debugmodel"
norm_type = "rmsnorm"
tokenizer_path = "./torchtitan/datasets/tokenizer/original/tokenizer.model"

[optimizer]
name = "AdamW"
lr = 3e-4

[training]
batch_size = 2
seq_len = 64
warmup_steps = 200
max_norm = 1.0
steps = 1000
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
compile = true
dataset = "c4"

[experimental]
context_parallel_degree = 1
pipeline_parallel_degree = 1

[activation_checkpoint]
mode = 'selective'
selective_ac_option = 'op'

[float8]
enable_float8_linear = true
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = true
"""

# the same job in torchtitan's layout of late 2025
LATE_2025 = """\
[model]
name = "llama3"
flavor = "debugmodel"
converters = ["quantize.linear.float8"]

[training]
local_batch_size = 2
seq_len = 64

[parallelism]
data_parallel_shard_degree = -1

[compile]
enable = true
components = ["model", "loss"]

[activation_checkpoint]
mode = "{mode}"
selective_ac_option = "{option}"

[quantize.linear.float8]
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = true
filter_fqns = ["output"]
"""


def _read(tmp_path: Path, text: str, **fields: Any) -> tuple[fsdpviz.TorchtitanJob, list[str]]:
    path = tmp_path / "job.toml"
    path.write_text(text.format(**fields) if fields else text)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        job = fsdpviz.from_torchtitan(path, world_size=8)
    return job, [str(w.message) for w in seen]


def test_selective_layer_checkpointing_reaches_the_traced_copy(tmp_path: Path) -> None:
    """selective_ac_option = "2" checkpoints blocks 1, 3, 5 of fsdpviz's own copy: their
    recomputation is in the traced backward (it was silently dropped when the blocks were
    picked by object identity)."""
    flops, peaks = {}, {}
    for mode, option in (("none", "2"), ("selective", "2"), ("full", "2")):
        job, _ = _read(tmp_path, LATE_2025, mode=mode, option=option)
        config = {k: v for k, v in job.config.items() if k not in ("compile", "float8")}
        report = fsdpviz.analyze(job.model, job.inputs, **config, progress=False)
        flops[mode] = report.timeline.totals["hardware_flops"]
        peaks[mode] = report.memory.peak["bytes"]
    assert flops["none"] < flops["selective"] < flops["full"]
    assert peaks["full"] < peaks["selective"] < peaks["none"]
    # half of the blocks recompute their forward: half of what full checkpointing adds
    added = (flops["selective"] - flops["none"]) / (flops["full"] - flops["none"])
    assert added == pytest.approx(0.5, abs=0.01)
    job, _ = _read(tmp_path, LATE_2025, mode="selective", option="2")
    picks = job.config["activation_checkpointing"]
    assert picks == EveryNthBlock(2)
    assert [n for n, m in job.model.named_modules() if picks(m)] == [
        "layers.1", "layers.3", "layers.5",
    ]  # fmt: skip


def test_compile_and_float8_as_torchtitan_applies_them(tmp_path: Path) -> None:
    job, notes = _read(tmp_path, LATE_2025, mode="selective", option="op")
    assert job.config["compile"] is True  # the blocks and the loss
    # the loss as torchtitan builds it, torch.compile(loss_fn): its memory as compiled
    assert getattr(job.config["loss"], "_torchdynamo_orig_callable", None) is not None
    float8 = job.config["float8"]
    assert float8["enable_fsdp_float8_all_gather"] and float8["filter_fqns"] == ["output"]
    assert not [n for n in notes if "not modelled" in n]
    report = fsdpviz.analyze(job.model, job.inputs, **job.config, progress=False)
    assert report.config["compile"] is True
    assert report.config["float8"]["enable_fsdp_float8_all_gather"] is True
    eager = fsdpviz.analyze(
        job.model,
        job.inputs,
        **{k: v for k, v in job.config.items() if k not in ("compile", "float8")},
        progress=False,
    )
    assert [[e.to_dict() for e in it if e.group != "shard"] for it in report.iterations] == [
        [e.to_dict() for e in it] for it in eager.iterations
    ]  # neither changes what FSDP issues, but for the float8 weights' amax all-reduces
    assert any(e.group == "shard" for e in report.iterations[0])
    fast, slow = report.timeline.totals, eager.timeline.totals
    assert fast["memory_bound_s"] < slow["memory_bound_s"] / 1.5  # fused
    assert fast["all_gather_bytes"] < slow["all_gather_bytes"]  # float8 weights
    blocks_only = [TransformerBlock]
    old, notes = _read(tmp_path, DECEMBER_2024)
    assert old.config["compile"] == blocks_only  # training.compile compiled the blocks
    assert not hasattr(old.config["loss"], "_torchdynamo_orig_callable")  # an eager loss
    assert old.config["float8"]["enable_fsdp_float8_all_gather"] is True
    assert list(old.inputs.shape) == [2, 64]
    text = "\n".join(notes)
    for renamed in (
        "training.batch_size is read as training.local_batch_size",
        "training.compile is read as compile.enable",
        "training.data_parallel_shard_degree is read as parallelism.data_parallel_shard_degree",
        "experimental.context_parallel_degree is read as parallelism.context_parallel_degree",
        "float8.enable_float8_linear is read as model.converters",
    ):
        assert renamed in text
    assert fsdpviz.analyze(old.model, old.inputs, **old.config, progress=False).config[
        "compile"
    ] == ["TransformerBlock"]


def test_accelerate_dynamo_config_compiles_the_model() -> None:
    from fsdpviz.examples import DecoderLayer, ExampleConfig, example_model

    model = example_model(ExampleConfig(num_layers=2))
    base = {
        "distributed_type": "FSDP", "num_processes": 8, "mixed_precision": "bf16",
        "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                        "fsdp_transformer_layer_cls_to_wrap": "DecoderLayer"},
    }  # fmt: skip

    def plan(dynamo: dict[str, Any]) -> tuple[Any, list[str]]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            config = fsdpviz.from_accelerate({**base, "dynamo_config": dynamo}, model)
        return config.get("compile"), [str(w.message) for w in seen]

    assert plan({"dynamo_backend": "INDUCTOR"}) == (True, [])
    regional, _ = plan({"dynamo_backend": "INDUCTOR", "dynamo_use_regional_compilation": True})
    assert regional == [DecoderLayer]
    assert plan({"dynamo_backend": "NO"})[0] is None
    eager, notes = plan({"dynamo_backend": "AOT_EAGER"})
    assert eager is None and "does not fuse kernels" in notes[0]
    _, notes = plan({"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune"})
    assert "costed as the default mode" in notes[0]
    with pytest.raises(fsdpviz.ConfigError, match="unknown key 'dynamo_backed'"):
        plan({"dynamo_backed": "INDUCTOR"})


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_tensor_parallelism_plans_torchaos_styles_where_torchtitan_does(
    tmp_path: Path, recipe: str
) -> None:
    """torchtitan's ``apply_tp`` with tensorwise float8 linears (``enable_float8_tensorwise_tp``)
    gives the blocks torchao's ``Float8ColwiseParallel``, ``Float8RowwiseParallel`` and
    ``PrepareFloat8ModuleInput`` (the embedding, final norm and output keep torch's); a
    rowwise recipe, torch's. Before, torch's styles were planned for both, with a note that
    the tp all-gathers were counted in bf16."""
    text = LATE_2025.replace(
        "data_parallel_shard_degree = -1", "data_parallel_shard_degree = -1\n"
        "tensor_parallel_degree = 2",
    ).replace("filter_fqns", f'recipe_name = "{recipe}"\nfilter_fqns')  # fmt: skip
    text = text.replace("enable_fsdp_float8_all_gather = true\n", "")
    text = text.replace("precompute_float8_dynamic_scale_for_fsdp = true\n", "")
    job, notes = _read(tmp_path, text, mode="full", option="op")
    assert job.config["float8"]["recipe_name"] == recipe
    styles = {k: type(v).__name__ for k, v in job.config["parallelize_plan"].items()}
    f8 = recipe == "tensorwise"
    assert styles["layers.*.attention"] == (
        "PrepareFloat8ModuleInput" if f8 else "PrepareModuleInput"
    )
    assert styles["layers.*.feed_forward.w1"] == (
        "Float8ColwiseParallel" if f8 else "ColwiseParallel"
    )
    assert styles["layers.*.attention.wo"] == ("Float8RowwiseParallel" if f8 else "RowwiseParallel")
    assert styles["output"] == "ColwiseParallel" and styles["tok_embeddings"] == "RowwiseParallel"
    assert not [n for n in notes if "Float8ColwiseParallel" in n]
