"""Models and FSDP options as users configure them: Hugging Face ids, accelerate YAML,
torchtitan TOML and Lightning's FSDPStrategy, checked against those projects themselves."""

from __future__ import annotations

import functools
import os
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy

import fsdpviz
from fsdpviz.cli import main
from fsdpviz.export import page_script

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config directory as ``config.save_pretrained`` writes it (no weights)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
    )  # fmt: skip
    cfg.architectures = ["LlamaForCausalLM"]
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    cfg.save_pretrained(path)
    return path


def _quiet(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fsdpviz.ConfigNote)
        return fn(*args, **kwargs)


# ---------------------------------------------------------------- Hugging Face
def test_hf_model_from_a_config_directory(llama_dir: Path) -> None:
    llama = fsdpviz.hf_model(str(llama_dir), batch=2, seq=32, overrides={"num_hidden_layers": 2})
    model, inputs = llama
    assert type(model).__name__ == "LlamaForCausalLM" and len(model.model.layers) == 2
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {k: list(v.shape) for k, v in inputs.items()} == {
        "input_ids": [2, 32],
        "labels": [2, 32],
    }
    assert [c.__name__ for c in llama.wrap_classes] == ["LlamaDecoderLayer"]
    assert "LlamaForCausalLM" in repr(llama) and "wrap classes LlamaDecoderLayer" in repr(llama)
    report = fsdpviz.analyze(*llama, fully_shard=llama.wrap_classes, world_size=4)
    assert [u.module for u in report.units] == ["", "model.layers.0", "model.layers.1"]
    bf16 = fsdpviz.hf_model(str(llama_dir), dtype="bf16")
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    assert bf16.inputs["input_ids"].shape[1] == 128  # the model's context


def test_hf_model_errors_name_what_is_missing(llama_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(fsdpviz.ConfigError, match=r"no config.json in .*empty"):
        fsdpviz.hf_model(str(tmp_path / "empty"))
    with pytest.raises(fsdpviz.ConfigError, match="has no field 'num_layer' to set"):
        fsdpviz.hf_model(str(llama_dir), overrides={"num_layer": 2})
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # tests/conftest.py: no network at all
    with pytest.raises(fsdpviz.ConfigError) as err:
        fsdpviz.hf_model("meta-llama/Llama-3.1-8B")
    text = str(err.value)
    assert "the config of 'meta-llama/Llama-3.1-8B' (its config.json) is not in the" in text
    assert "offline (HF_HUB_OFFLINE is set)" in text
    assert "hf download meta-llama/Llama-3.1-8B config.json" in text


# ---------------------------------------------------------------- accelerate
ACCELERATE_FSDP1 = """\
    compute_environment: LOCAL_MACHINE
    debug: false
    distributed_type: FSDP
    downcast_bf16: 'no'
    enable_cpu_affinity: false
    fsdp_config:
      fsdp_activation_checkpointing: {ac}
      fsdp_auto_wrap_policy: {policy}
      fsdp_backward_prefetch: {prefetch}
      fsdp_cpu_ram_efficient_loading: false
      fsdp_forward_prefetch: {forward}
      fsdp_offload_params: false
      fsdp_sharding_strategy: {strategy}
      fsdp_state_dict_type: SHARDED_STATE_DICT
      fsdp_sync_module_states: false
      fsdp_use_orig_params: true
      fsdp_version: 1
    machine_rank: 0
    main_training_function: main
    mixed_precision: {mixed}
    num_machines: 1
    num_processes: 4
    rdzv_backend: static
    same_network: true
    tpu_env: []
    tpu_use_cluster: false
    tpu_use_sudo: false
    use_cpu: false
"""
FSDP1_CASES = {
    "transformer-pre-bf16": dict(
        ac="false", policy="TRANSFORMER_BASED_WRAP", prefetch="BACKWARD_PRE", forward="false",
        strategy="FULL_SHARD", mixed="bf16",
    ),
    "size-post-grad-op": dict(
        ac="false", policy="SIZE_BASED_WRAP", prefetch="BACKWARD_POST", forward="true",
        strategy="SHARD_GRAD_OP", mixed="'no'",
    ),
    "transformer-no-prefetch-ac": dict(
        ac="true", policy="TRANSFORMER_BASED_WRAP", prefetch="NO_PREFETCH", forward="false",
        strategy="FULL_SHARD", mixed="fp16",
    ),
}  # fmt: skip


def _accelerate_plugin(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str, int]:
    """accelerate's own FullyShardedDataParallelPlugin for ``accelerate launch --config_file
    path``: the launch parser fills its arguments from the file, prepare_multi_gpu_env
    exports them, and the plugin reads the environment."""
    pytest.importorskip("accelerate")
    import accelerate.utils.dataclasses as accelerate_dataclasses
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    for key, value in prepare_multi_gpu_env(args).items():
        monkeypatch.setenv(key, value)
    # sync_module_states asks for the current accelerator device, which this machine lacks
    monkeypatch.setattr(accelerate_dataclasses, "is_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    plugin = FullyShardedDataParallelPlugin()
    return plugin, args.mixed_precision, int(args.num_processes)


def _same_policy(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return bool(a.func is b.func and a.keywords == b.keywords)


@pytest.mark.parametrize("case", list(FSDP1_CASES))
def test_accelerate_fsdp1_round_trip(
    case: str, llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kwargs accelerate passes to FullyShardedDataParallel for the same YAML
    (Accelerator.prepare_model) equal fsdpviz's, and so do the plans."""
    path = tmp_path / "fsdp.yaml"
    path.write_text(textwrap.dedent(ACCELERATE_FSDP1).format(**FSDP1_CASES[case]))
    llama = fsdpviz.hf_model(str(llama_dir), seq=16)
    ours = _quiet(fsdpviz.from_accelerate, path, llama.model)
    plugin, mixed, processes = _accelerate_plugin(path, monkeypatch)
    plugin.set_auto_wrap_policy(llama.model)
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    theirs = {
        "sharding_strategy": plugin.sharding_strategy or plugin.reshard_after_forward,
        "auto_wrap_policy": plugin.auto_wrap_policy,
        "mixed_precision": plugin.mixed_precision_policy,
        "backward_prefetch": plugin.backward_prefetch,
        "forward_prefetch": plugin.forward_prefetch,
        "use_orig_params": plugin.use_orig_params,
        "limit_all_gathers": plugin.limit_all_gathers,
    }
    assert ours["world_size"] == processes
    for key in ("sharding_strategy", "backward_prefetch", "forward_prefetch", "use_orig_params",
                "limit_all_gathers", "mixed_precision"):  # fmt: skip
        assert ours.get(key) == theirs[key], key
    assert _same_policy(ours["auto_wrap_policy"], theirs["auto_wrap_policy"])
    if plugin.activation_checkpointing:
        layers = theirs["auto_wrap_policy"].keywords["transformer_layer_cls"]
        assert set(ours["activation_checkpointing"]) == layers
    else:
        assert "activation_checkpointing" not in ours
    plan = fsdpviz.analyze(*llama, **ours)
    accelerate_kwargs = {k: v for k, v in theirs.items() if v is not None or k != "mixed_precision"}
    if "activation_checkpointing" in ours:
        accelerate_kwargs["activation_checkpointing"] = ours["activation_checkpointing"]
    direct = fsdpviz.analyze(*llama, world_size=processes, **accelerate_kwargs)
    assert plan.units == direct.units and plan.iterations == direct.iterations


def test_accelerate_fsdp2_round_trip(
    llama_dir: Path, fake_pg: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """accelerate's own fsdp2_prepare_model shards a meta model on the fake process group;
    fsdpviz reads that plan from FSDP2's state and it equals the plan from the YAML."""
    pytest.importorskip("accelerate")
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    path = tmp_path / "fsdp2.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        distributed_type: FSDP
        mixed_precision: bf16
        num_processes: {fake_pg}
        fsdp_config:
          fsdp_version: 2
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
          fsdp_reshard_after_forward: true
          fsdp_cpu_ram_efficient_loading: false
          fsdp_state_dict_type: SHARDED_STATE_DICT
    """)
    )
    llama = fsdpviz.hf_model(str(llama_dir), seq=16)
    ours = _quiet(fsdpviz.from_accelerate, path, llama.model)
    plugin, mixed, _ = _accelerate_plugin(path, monkeypatch)
    plugin.set_mixed_precision(mixed)

    class Accelerator:  # what fsdp2_prepare_model reads of an Accelerator
        state = type("State", (), {"fsdp_plugin": plugin})()
        mixed_precision = mixed
        is_main_process = True
        device = torch.device("cpu")
        torch_device_mesh = None
        parallelism_config = None

    sharded = fsdp2_prepare_model(Accelerator(), fsdpviz.hf_model(str(llama_dir), seq=16).model)
    theirs = fsdpviz.analyze(sharded, llama.inputs)
    plan = fsdpviz.analyze(*llama, **ours)
    assert [u.module for u in plan.units] == [u.module for u in theirs.units]
    assert [u.params for u in plan.units] == [u.params for u in theirs.units]
    assert plan.config["reshard_after_forward"] == theirs.config["reshard_after_forward"]
    assert plan.config["mp_policy"] == theirs.config["mp_policy"]
    assert plan.iterations == theirs.iterations


ACCELERATE_PEFT = """\
distributed_type: FSDP
mixed_precision: bf16
num_processes: {processes}
fsdp_config:
  fsdp_version: {version}
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_activation_checkpointing: {ac}
  fsdp_cpu_ram_efficient_loading: false
"""


def _peft_llama() -> tuple[nn.Module, dict[str, Any]]:
    from peft_models import llama_lora

    with torch.device("meta"):
        model, inputs, _ = llama_lora()
    return model, inputs


@pytest.mark.parametrize("version", [1, 2])
def test_accelerate_peft_model_as_the_trainer_prepares_it(
    version: int, fake_pg: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A LoRA model under an accelerate config, prepared as transformers' Trainer does it
    (``update_fsdp_plugin_peft``: peft's wrap policy), by accelerate's own code: FSDP1's
    policy plans what fsdpviz plans from the YAML; FSDP2's prepare_model finds no layer
    policy in it and shards the embeddings, the head and the root only, as fsdpviz says."""
    pytest.importorskip("peft")
    pytest.importorskip("accelerate")
    from transformers.distributed.fsdp import update_fsdp_plugin_peft

    path = tmp_path / "fsdp.yaml"
    path.write_text(ACCELERATE_PEFT.format(processes=fake_pg, version=version, ac="false"))
    model, inputs = _peft_llama()
    with pytest.warns(fsdpviz.ConfigNote, match="a peft model, planned as transformers' Trainer"):
        ours = fsdpviz.from_accelerate(path, model)
    plugin, mixed, _ = _accelerate_plugin(path, monkeypatch)
    plugin.set_mixed_precision(mixed)

    class Accelerator:  # what update_fsdp_plugin_peft and fsdp2_prepare_model read
        state = type("State", (), {"fsdp_plugin": plugin})()
        mixed_precision = mixed
        is_main_process = True
        device = torch.device("cpu")
        torch_device_mesh = None
        parallelism_config = None

    update_fsdp_plugin_peft(model, Accelerator())
    plan = fsdpviz.analyze(model, inputs, **ours)
    if version == 1:
        theirs = fsdpviz.analyze(
            model, inputs, auto_wrap_policy=plugin.auto_wrap_policy,
            mixed_precision=plugin.mixed_precision_policy, use_orig_params=plugin.use_orig_params,
            sharding_strategy=plugin.sharding_strategy, backward_prefetch=plugin.backward_prefetch,
            forward_prefetch=plugin.forward_prefetch, world_size=fake_pg,
        )  # fmt: skip
        adapters = [u for u in plan.units if ".lora_" in u.module]
        assert len(adapters) == 2 * 2 * 2 and all(u.requires_grad for u in adapters)
    else:
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        theirs = fsdpviz.analyze(fsdp2_prepare_model(Accelerator(), _peft_llama()[0]), inputs)
        assert not [u for u in plan.units if ".layers." in u.module]
    assert [u.to_dict() for u in plan.units] == [u.to_dict() for u in theirs.units]
    assert plan.iterations == theirs.iterations
    kept = _quiet(fsdpviz.from_accelerate, path, model, trainer=False)  # a script's own loop
    layers = fsdpviz.analyze(model, inputs, **kept)
    assert [u.module for u in layers.units if u.module.endswith(".layers.0")]


def test_accelerate_peft_fsdp2_checkpointing_fails_as_accelerate_does(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    path = tmp_path / "fsdp.yaml"
    path.write_text(ACCELERATE_PEFT.format(processes=8, version=2, ac="true"))
    with pytest.raises(fsdpviz.ConfigError, match="'NoneType' object is not callable"):
        _quiet(fsdpviz.from_accelerate, path, _peft_llama()[0])


def test_accelerate_config_keys_are_never_ignored_silently(llama_dir: Path) -> None:
    model = fsdpviz.hf_model(str(llama_dir)).model
    base = {"distributed_type": "FSDP", "num_processes": 2}
    with pytest.warns(fsdpviz.ConfigNote) as caught:
        plan = fsdpviz.from_accelerate(
            {**base, "fsdp_config": {"fsdp_reshard_after_forward": "SHARD_GRAD_OP",
                                     "fsdp_state_dict_type": "FULL_STATE_DICT"}},
            model,
        )  # fmt: skip
    assert len(plan.notes) == len(caught) == 2
    assert plan.notes[0].endswith("it only picks the checkpoint format")
    assert "fsdp_reshard_after_forward='SHARD_GRAD_OP' is not what accelerate runs" in plan.notes[1]
    assert plan["sharding_strategy"] == ShardingStrategy.FULL_SHARD
    with pytest.raises(fsdpviz.ConfigError, match=r"unknown key 'fsdp_backwards_prefetch'; "
                       r"did you mean 'fsdp_backward_prefetch'\?"):  # fmt: skip
        fsdpviz.from_accelerate({**base, "fsdp_config": {"fsdp_backwards_prefetch": "x"}}, model)
    with pytest.raises(fsdpviz.ConfigError, match="distributed_type is 'MULTI_GPU', not FSDP"):
        fsdpviz.from_accelerate({**base, "distributed_type": "MULTI_GPU"}, model)
    with pytest.raises(fsdpviz.ConfigError, match="no module of class 'LlamaBlock'"):
        fsdpviz.from_accelerate({**base, "fsdp_config": {
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": "LlamaBlock"}}, model)  # fmt: skip


# ---------------------------------------------------------------- torchtitan
TORCHTITAN_8B = """\
# torchtitan/models/llama3/train_configs/llama3_8b.toml, as torchtitan ships it
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[profiling]
enable_profiling = true
save_traces_folder = "profile_trace"
profile_freq = 100

[metrics]
log_freq = 10
enable_tensorboard = true
save_tb_folder = "tb"

[model]
name = "llama3"
flavor = "{flavor}"
hf_assets_path = "./assets/hf/Llama-3.1-8B"

[optimizer]
name = "AdamW"
lr = 3e-4
eps = 1e-8

[lr_scheduler]
warmup_steps = 200

[training]
local_batch_size = 1
seq_len = {seq}
max_norm = 1.0
steps = 1000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1

[checkpoint]
enable = false
folder = "checkpoint"
interval = 500
last_save_model_only = true
export_dtype = "float32"
async_mode = "disabled"

[compile]
enable=false
components = ["model", "loss"]

[activation_checkpoint]
mode = "{mode}"
selective_ac_option = "{option}"
"""


def _job(tmp_path: Path, **fields: Any) -> Path:
    values = {"flavor": "debugmodel", "seq": 64, "mode": "selective", "option": "2", **fields}
    path = tmp_path / "llama3.toml"
    path.write_text(TORCHTITAN_8B.format(**values))
    return path


def test_torchtitan_llama3_8b_is_the_model_torchtitan_builds(tmp_path: Path) -> None:
    job = _quiet(fsdpviz.from_torchtitan, _job(tmp_path, flavor="8B", seq=8192), world_size=8)
    params = dict(job.model.named_parameters())
    assert sum(p.numel() for p in params.values()) == 8_030_261_248  # Llama 3.1 8B
    assert list(params["layers.0.feed_forward.w1.weight"].shape) == [14336, 4096]
    assert list(params["layers.0.attention.wk.weight"].shape) == [1024, 4096]
    assert list(job.inputs.shape) == [1, 8192] and job.config["world_size"] == 8


def test_torchtitan_job_plans_apply_fsdp_and_apply_ac(tmp_path: Path) -> None:
    with pytest.warns(fsdpviz.ConfigNote, match="data_parallel_shard_degree = -1"):
        job = fsdpviz.from_torchtitan(_job(tmp_path))
    model, inputs, config = job
    blocks = [f"layers.{i}" for i in range(6)]
    assert config["fully_shard"] == ["tok_embeddings", *blocks, ("norm", "output")]
    assert config["reshard_after_forward"] == {
        "tok_embeddings": True, **dict.fromkeys(blocks, True), "norm, output": False,
    }  # fmt: skip
    mp = config["mp_policy"]
    assert (mp.param_dtype, mp.reduce_dtype) == (torch.bfloat16, torch.float32)
    # selective_ac_option = "2": every second block (torchtitan counts from 1)
    picked = [n for n, m in model.named_modules() if config["activation_checkpointing"](m)]
    assert picked == ["layers.1", "layers.3", "layers.5"]
    report = fsdpviz.analyze(model, inputs, **config)
    # the root holds no parameter of its own: no unit
    assert [u.module for u in report.units] == ["tok_embeddings", *blocks, "norm, output"]
    assert report.config["world_size"] == 8
    full = _quiet(fsdpviz.from_torchtitan, _job(tmp_path, mode="full"), world_size=8)
    assert full.config["activation_checkpointing"][0].__name__ == "TransformerBlock"
    every = fsdpviz.analyze(full.model, full.inputs, **full.config)
    assert every.iterations == report.iterations  # recomputation issues no all-gather
    assert every.memory.peak["bytes"] < report.memory.peak["bytes"]


def test_torchtitan_job_keys_are_checked(tmp_path: Path) -> None:
    path = _job(tmp_path)
    path.write_text(path.read_text().replace("seq_len", "seq_length"))
    with pytest.raises(fsdpviz.ConfigError, match=r"unknown key training.seq_length; did you "
                       r"mean 'seq_len'\?"):  # fmt: skip
        fsdpviz.from_torchtitan(path)
    with pytest.raises(fsdpviz.ConfigError, match="'3B' is not a llama3 flavor"):
        fsdpviz.from_torchtitan(_job(tmp_path, flavor="3B"))
    with pytest.raises(fsdpviz.ConfigError, match="selective_ac_option must be 'op' or an"):
        fsdpviz.from_torchtitan(_job(tmp_path, option="layer"), world_size=4)


def test_torchtitan_tensor_parallel_hsdp_and_offload(tmp_path: Path) -> None:
    """tensor_parallel_degree, data_parallel_replicate_degree and enable_cpu_offload plan
    torchtitan's mesh (dp_shard = -1 takes the ranks the others leave), apply_tp's plan
    (loss parallel by default) and CPUOffloadPolicy."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.tensor import Replicate, Shard

    path = _job(tmp_path)
    text = path.read_text().replace("tensor_parallel_degree = 1", "tensor_parallel_degree = 2")
    text = text.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2")
    path.write_text(text.replace('dataset = "c4"', 'dataset = "c4"\nenable_cpu_offload = true'))
    with pytest.warns(fsdpviz.ConfigNote, match="cross-entropy's own all-reduces"):
        job = fsdpviz.from_torchtitan(path, world_size=16)
    assert job.config["mesh"] == ("dp_replicate", 2, "dp_shard", 4, "tp", 2)
    assert "world_size" not in job.config
    assert isinstance(job.config["offload_policy"], CPUOffloadPolicy)
    plan = job.config["parallelize_plan"]
    assert plan["output"].output_layouts == (Shard(-1),) and not plan["output"].use_local_output
    assert plan["layers.*.attention.wo"].output_layouts == (Shard(1),)
    report = fsdpviz.analyze(job.model, job.inputs, **job.config)
    assert report.config.world_size == 16 and report.config.cpu_offload
    assert report.config.mesh == {"dp_replicate": 2, "dp_shard": 4, "tp": 2}
    w1 = report.unit("layers.0").shard_shapes["layers.0.feed_forward.w1.weight"]
    assert w1 == [768 // 2 // 4, 256]  # tp's column half, then FSDP's quarter of dim 0
    steady = {e.kind for e in report.iterations[1]}
    assert {"tp_all_gather", "tp_reduce_scatter", "all_reduce", "h2d", "d2h"} <= steady
    # disable_loss_parallel: the logits replicated (an all-gather over the vocabulary)
    path.write_text(path.read_text().replace(
        "tensor_parallel_degree = 2", "tensor_parallel_degree = 2\ndisable_loss_parallel = true"
    ))  # fmt: skip
    replicated = fsdpviz.from_torchtitan(path, world_size=16).config["parallelize_plan"]
    assert replicated["output"].output_layouts == (Replicate(),)
    with pytest.raises(fsdpviz.ConfigError, match="10 ranks do not divide by the other"):
        fsdpviz.from_torchtitan(path, world_size=10)


def test_torchtitan_loss_parallel_cross_entropy(tmp_path: Path) -> None:
    """Under loss parallel each rank's cross-entropy runs on its vocabulary shard of the
    float32 logits as torch's loss_parallel handlers run it: the backward holds the one-hot
    gradient, the result's exponent, their sum and its product beside the saved
    log-softmax (nll_loss_backward and _log_softmax_backward_data hold two), and the loss
    and its gradient are cross-entropy's. Traced without tensor parallelism (a
    configuration tune tries) the same job's loss is torch's cross-entropy."""
    import torch.nn.functional as F

    from fsdpviz.configs.torchtitan import _VocabShardCrossEntropy

    path = _job(tmp_path, mode="full")
    path.write_text(
        path.read_text().replace("tensor_parallel_degree = 1", "tensor_parallel_degree = 2")
    )
    job = _quiet(fsdpviz.from_torchtitan, path, world_size=4)
    plain = {k: v for k, v in job.config.items() if k not in ("mesh", "parallelize_plan")}
    plain["world_size"] = 4
    logits = 64 * 2048 * 4  # one sample's float32 logits: seq 64 x the vocabulary
    for config, share, made in ((job.config, logits // 2, 3), (plain, logits, 2)):
        report = fsdpviz.analyze(job.model, job.inputs, **config)
        step = report.profile.iterations[-1]
        # the compute from the output's forward to its backward: the loss
        k = step.hooks.index(("pre_backward", "norm, output", None))
        in_backward = step.peak[k] - step.peak_activations[k] - step.peak_forward_temp[k]
        assert made * share <= in_backward < (made + 1) * share
    labels = torch.randint(0, 2048, (128,))
    x = torch.randn(128, 2048, requires_grad=True)
    loss = _VocabShardCrossEntropy.apply(x, labels)
    loss.backward()
    ref = x.detach().clone().requires_grad_()
    expected = F.cross_entropy(ref, labels)
    expected.backward()  # type: ignore[no-untyped-call]
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert x.grad is not None and ref.grad is not None
    assert torch.allclose(x.grad, ref.grad, atol=1e-6)


def test_torchtitan_per_operator_checkpointing(tmp_path: Path) -> None:
    """selective_ac_option = "op": torchtitan's save list inside every block, between no
    checkpointing and full checkpointing in memory and in recomputed FLOPs."""
    from fsdpviz.schema.checkpointing import SelectiveCheckpoint

    reports = {}
    for mode, option in (("none", "2"), ("selective", "op"), ("full", "2")):
        job = _quiet(
            fsdpviz.from_torchtitan, _job(tmp_path, mode=mode, option=option), world_size=4
        )
        if option == "op":
            assert isinstance(job.config["activation_checkpointing"], SelectiveCheckpoint)
        reports[mode] = fsdpviz.analyze(job.model, job.inputs, **job.config)
    none, op = reports["none"], reports["selective"]
    assert op.iterations == none.iterations  # recomputation issues no all-gather
    peak = {k: r.memory.peak["bytes"] for k, r in reports.items()}
    assert peak["full"] < peak["selective"] < peak["none"]
    flops = {k: r.timeline.totals["hardware_flops"] for k, r in reports.items()}
    assert flops["none"] < flops["selective"] < flops["full"]
    assert op.timeline.totals["model_flops"] == pytest.approx(none.timeline.totals["model_flops"])


# ---------------------------------------------------------------- Lightning
def test_lightning_strategy_arguments(llama_dir: Path) -> None:
    pytest.importorskip("lightning")
    llama = fsdpviz.hf_model(str(llama_dir), seq=16)
    layer = llama.wrap_classes[0]
    with pytest.warns(fsdpviz.ConfigNote, match=r"state_dict_type=\.\.\.\) is not applied"):
        plan = fsdpviz.from_lightning(
            precision="bf16-mixed", devices=4, num_nodes=2, auto_wrap_policy={layer},
            activation_checkpointing_policy={layer}, sharding_strategy="SHARD_GRAD_OP",
            state_dict_type="sharded", backward_prefetch=BackwardPrefetch.BACKWARD_POST,
        )  # fmt: skip
    assert plan["world_size"] == 8
    assert plan["sharding_strategy"] == ShardingStrategy.SHARD_GRAD_OP
    assert plan["use_orig_params"] is True  # Lightning's default
    assert plan["backward_prefetch"] == BackwardPrefetch.BACKWARD_POST
    assert plan["auto_wrap_policy"]._module_classes == {layer}
    assert plan["activation_checkpointing"] == [layer]
    assert plan["mixed_precision"] == MixedPrecision(
        param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16
    )
    report = fsdpviz.analyze(*llama, **plan)
    assert len(report.units) == 5 and report.config["sharding_strategy"] == "SHARD_GRAD_OP"


# ---------------------------------------------------------------- the CLI
@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def test_cli_report_of_a_hf_config_directory(
    llama_dir: Path, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["report", f"hf:{llama_dir}", "--set", "num_hidden_layers=2", "--seq", "32",
                 "--world-size", "4"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "wrote report.html" in out
    assert "fsdpviz prediction: 3 units, world size 4" in out  # _no_split_modules wrapped
    assert "peak " in out and "step " in out
    config = page_script((in_tmp / "report.html").read_text(), "fv-config")
    assert "LlamaDecoderLayer" in config  # the explorer's data names the wrapped class


def test_cli_with_trainer_configs(
    llama_dir: Path, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    yaml = in_tmp / "fsdp.yaml"
    yaml.write_text(textwrap.dedent(ACCELERATE_FSDP1).format(**FSDP1_CASES["size-post-grad-op"]))
    code = main(["report", f"hf:{llama_dir}", "--accelerate-config", str(yaml), "-o", "a.json"])
    out = capsys.readouterr().out
    assert code == 0
    assert "note: fsdp.yaml fsdp_config: fsdp_state_dict_type='SHARDED_STATE_DICT'" in out
    report = fsdpviz.load("a.json")
    assert report.config["sharding_strategy"] == "SHARD_GRAD_OP"
    assert report.config["backward_prefetch"] == "BACKWARD_POST"
    assert report.config["world_size"] == 4
    code = main(["report", "--torchtitan-config", str(_job(in_tmp)), "--world-size", "2",
                 "-o", "t.json"])  # fmt: skip
    assert code == 0
    assert len(fsdpviz.load("t.json").units) == 8
    # the job flags go on top of a trainer's file, as --world-size does
    code = main(["report", "--torchtitan-config", str(_job(in_tmp)), "--world-size", "2",
                 "--grad-accum", "2", "--compile", "TransformerBlock", "--float8",
                 "all-gather", "-o", "t.json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    config = fsdpviz.load("t.json").config
    assert config["grad_accum"] == 2 and config["compile"] == ["TransformerBlock"]
    assert config["float8"]["enable_fsdp_float8_all_gather"] is True
    assert "micro-step 2/2 (synced)" in out
    code = main(["report", f"hf:{llama_dir}", "--accelerate-config", str(yaml), "--float8",
                 "all-gather"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--float8: enable_fsdp_float8_all_gather needs FSDP2" in err
    dynamo = in_tmp / "dynamo.yaml"
    dynamo.write_text(yaml.read_text() + "dynamo_config:\n  dynamo_backend: INDUCTOR\n")
    code = main(["report", f"hf:{llama_dir}", "--accelerate-config", str(dynamo), "--compile",
                 "LlamaDecoderLayer", "-o", "d.json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "note: --compile LlamaDecoderLayer overrides --accelerate-config's compile=True" in out
    assert fsdpviz.load("d.json").config["compile"] == ["LlamaDecoderLayer"]
    code = main(["report", f"hf:{llama_dir}", "--accelerate-config", str(yaml), "--policy",
                 "none"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--policy cannot be combined with --accelerate-config" in err


def test_cli_points_class_names_without_config_to_hf(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["report", "transformers:LlamaForCausalLM"])
    err = capsys.readouterr().err
    assert code == 2
    assert "missing 1 required positional argument: 'config'" in err
    assert "pass hf:ID" in err


def test_activation_checkpointing_option_recomputes_in_backward(llama_dir: Path) -> None:
    llama = fsdpviz.hf_model(str(llama_dir), seq=64)
    layer = llama.wrap_classes[0]
    plain = fsdpviz.analyze(*llama, fully_shard=[layer])
    checkpointed = fsdpviz.analyze(*llama, fully_shard=[layer], activation_checkpointing=[layer])
    assert plain.iterations == checkpointed.iterations  # recomputation issues no all-gather
    assert checkpointed.memory.peak["bytes"] < plain.memory.peak["bytes"]
    with pytest.raises(fsdpviz.ConfigError, match="activation_checkpointing must be a list"):
        fsdpviz.analyze(*llama, activation_checkpointing="LlamaDecoderLayer")
    assert isinstance(llama.model.model.layers[0].forward, functools.partial) is False
    assert all(isinstance(m, nn.Module) for m in llama.model.modules())
