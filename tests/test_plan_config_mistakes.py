"""Trainer configurations as users write them: accelerate's old key names, broken files,
Lightning's strategies; every mistake gets a message that names the fix."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

import fsdpviz
import fsdpviz.configs.accelerate as accelerate_config
from fsdpviz.cli import main

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> fsdpviz.HFModel:
    """A tiny Llama from a config directory (``llama.name`` is the directory)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=96, max_position_embeddings=64,
    )  # fmt: skip
    cfg.architectures = ["LlamaForCausalLM"]
    path = tmp_path_factory.mktemp("llama")
    cfg.save_pretrained(path)
    return fsdpviz.hf_model(str(path), seq=16)


def _read(path: Path, model: torch.nn.Module) -> fsdpviz.TrainerConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fsdpviz.ConfigNote)
        return fsdpviz.from_accelerate(path, model)


def _accelerate_runs(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """accelerate's own FullyShardedDataParallelPlugin for ``accelerate launch --config_file
    path`` (the launch parser reads the file, prepare_multi_gpu_env exports it)."""
    pytest.importorskip("accelerate")
    import accelerate.utils.dataclasses as accelerate_dataclasses
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    for key, value in prepare_multi_gpu_env(args).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(accelerate_dataclasses, "is_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return FullyShardedDataParallelPlugin(), args


# accelerate's FSDP guide (usage_guides/fsdp.md) writes this, as accelerate 0.2x did
DOCS_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config: {}
distributed_type: FSDP
downcast_bf16: 'no'
dynamo_backend: 'NO'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch_policy: BACKWARD_PRE
  fsdp_forward_prefetch: true
  fsdp_offload_params: false
  fsdp_sharding_strategy: 1
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_use_orig_params: true
machine_rank: 0
main_training_function: main
megatron_lm_config: {}
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def test_old_key_names_are_read_as_the_installed_accelerate_reads_them(
    llama: fsdpviz.HFModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fsdp.yaml"
    path.write_text(DOCS_YAML)
    with pytest.warns(fsdpviz.ConfigNote) as caught:
        ours = fsdpviz.from_accelerate(path, llama.model)
    (renamed,) = [n for n in ours.notes if "fsdp_backward_prefetch_policy" in n]
    assert renamed.startswith(
        "fsdp.yaml fsdp_config: fsdp_backward_prefetch_policy='BACKWARD_PRE' is the old name "
        "of fsdp_backward_prefetch: accelerate stopped reading it in 0.27"
    )
    assert renamed.endswith("rename it to fsdp_backward_prefetch to apply it")
    assert any(renamed == str(w.message) for w in caught)
    plugin, args = _accelerate_runs(path, monkeypatch)
    assert ours["backward_prefetch"] == plugin.backward_prefetch  # None: accelerate drops it
    assert ours["sharding_strategy"] == plugin.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert ours["forward_prefetch"] is plugin.forward_prefetch is True
    assert ours["world_size"] == int(args.num_processes) == 2
    # where the installed accelerate still reads the old name (before 0.27), it applies
    monkeypatch.setattr(accelerate_config, "_accelerate_version", lambda: (0, 26))
    old = _read(path, llama.model)
    assert old["backward_prefetch"] == BackwardPrefetch.BACKWARD_PRE
    assert not [n for n in old.notes if "fsdp_backward_prefetch_policy" in n]
    both = tmp_path / "both.yaml"
    both.write_text(DOCS_YAML.replace("  fsdp_forward", "  fsdp_backward_prefetch: NO_PREFETCH\n"
                                                      "  fsdp_forward"))  # fmt: skip
    assert _read(both, llama.model)["backward_prefetch"] == BackwardPrefetch.BACKWARD_PRE


def test_old_top_level_keys(llama: fsdpviz.HFModel) -> None:
    plan = _read_dict({"distributed_type": "FSDP", "fp16": True, "dynamo_backend": "NO",
                       "command_file": None, "tpu_name": None}, llama)  # fmt: skip
    assert plan["mixed_precision"].param_dtype == torch.float16
    assert "mixed_precision" not in _read_dict({"distributed_type": "FSDP", "fp16": False}, llama)
    unquoted_no = _read_dict({"distributed_type": "FSDP", "mixed_precision": False}, llama)
    assert "mixed_precision" not in unquoted_no  # `mixed_precision: no` reads as false


def _read_dict(data: dict[str, Any], llama: fsdpviz.HFModel) -> fsdpviz.TrainerConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fsdpviz.ConfigNote)
        return fsdpviz.from_accelerate(data, llama.model)


BROKEN = {
    "indent.yaml": (
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n   fsdp_offload_params: x\n",
        "indent.yaml is not valid YAML (line 4, column 23): mapping values are not allowed here",
    ),
    "tab.yaml": (
        "distributed_type: FSDP\nfsdp_config:\n\tfsdp_version: 1\n",
        "found character '\\t' that cannot start any token; an accelerate config is YAML as "
        "`accelerate config` writes it",
    ),
    "list.yaml": ("- FSDP\n", "list.yaml: an accelerate config is a YAML mapping of keys"),
    "empty.yaml": ("", "got an empty file"),
    "processes.yaml": (
        "distributed_type: FSDP\nnum_processes: two\n",
        "num_processes must be an integer, got 'two'; accelerate reads it with int(), so "
        "write the number in digits",
    ),
    "size.yaml": (
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"
        "  fsdp_min_num_params: 1e8\n",
        "fsdp_min_num_params must be an integer, got '1e8'; accelerate reads it with int(), "
        "so write 100000000",
    ),
    "fsdp2.yaml": (
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
        "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n",
        "fsdp_reshard_after_forward='SHARD_GRAD_OP' is FSDP1's sharding strategy; with "
        "fsdp_version: 2 accelerate takes true or false (accelerate to-fsdp2 writes false for "
        "SHARD_GRAD_OP)",
    ),
    "flag.yaml": (
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_use_orig_params: maybe\n",
        "flag.yaml: fsdp_use_orig_params must be true or false, got 'maybe'",
    ),
    "nested.yaml": (
        "distributed_type: FSDP\nfsdp_config:\n  - fsdp_version\n",
        "fsdp_config must be a mapping of keys (fsdp_version: 1, ...), got ['fsdp_version']",
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_files_get_a_message_not_a_traceback(
    name: str, llama: fsdpviz.HFModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, said = BROKEN[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(fsdpviz.ConfigError) as err:
        fsdpviz.from_accelerate(path, llama.model)
    assert said in str(err.value)
    code = main(["report", f"hf:{llama.name}", "--accelerate-config", str(path)])
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err  # the command line's mistake
    assert captured.err.startswith("fsdpviz report: error: ") and said in captured.err


def test_launcher_decided_process_count(llama: fsdpviz.HFModel) -> None:
    with pytest.warns(fsdpviz.ConfigNote, match="num_processes=-1 leaves the number"):
        plan = fsdpviz.from_accelerate({"distributed_type": "FSDP", "num_processes": -1},
                                       llama.model)  # fmt: skip
    assert plan["world_size"] == 8


# ---------------------------------------------------------------- Lightning
def test_lightning_hybrid_shards_within_a_node(llama: fsdpviz.HFModel) -> None:
    """FSDP1's HYBRID_SHARD without a process group shards over the node's devices and
    replicates across nodes (torch's _init_intra_and_inter_node_groups)."""
    pytest.importorskip("lightning")
    layer = llama.wrap_classes[0]
    plan = fsdpviz.from_lightning(devices=4, num_nodes=2, sharding_strategy="HYBRID_SHARD",
                                  auto_wrap_policy={layer})  # fmt: skip
    assert plan["world_size"] == 8 and plan["shard_group_size"] == 4
    report = fsdpviz.analyze(*llama, **plan)
    assert report.config.process_group_size == 4
    assert all(u.padded_numel == 4 * u.sharded_numel for u in report.units)
    steady = report.iterations[1]
    assert {e.group for e in steady if e.kind == "all_reduce"} == {"replicate"}
    mesh = fsdpviz.from_lightning(devices=4, num_nodes=2, sharding_strategy="_HYBRID_SHARD_ZERO2",
                                  device_mesh=(4, 2))  # fmt: skip
    assert mesh["shard_group_size"] == 2 and "device_mesh" not in mesh
    with pytest.raises(fsdpviz.ConfigError, match=r"replicas x shard = devices x num_nodes = 8"):
        fsdpviz.from_lightning(devices=4, num_nodes=2, sharding_strategy="HYBRID_SHARD",
                               device_mesh=(3, 2))  # fmt: skip
    with pytest.raises(fsdpviz.ConfigError, match="requires you to pass at least one of"):
        fsdpviz.from_lightning(devices=4, num_nodes=2, sharding_strategy="HYBRID_SHARD")


def test_lightning_strategy_instance_keeps_its_options(llama: fsdpviz.HFModel) -> None:
    pytest.importorskip("lightning")
    from lightning.pytorch.plugins.precision import FSDPPrecision
    from lightning.pytorch.strategies import FSDPStrategy

    layer = llama.wrap_classes[0]
    given = dict(auto_wrap_policy={layer}, sharding_strategy="SHARD_GRAD_OP",
                 activation_checkpointing_policy={layer}, cpu_offload=True)  # fmt: skip
    built = fsdpviz.from_lightning(strategy=FSDPStrategy(**given), devices=2,
                                   precision="bf16-mixed")  # fmt: skip
    direct = fsdpviz.from_lightning(devices=2, precision="bf16-mixed", **given)
    assert built.keys() == direct.keys()
    assert all(built[k] == direct[k] for k in built if k != "auto_wrap_policy")
    assert built["auto_wrap_policy"]._module_classes == {layer}
    assert built["activation_checkpointing"] == [layer]
    report = fsdpviz.analyze(*llama, **built)  # no "unknown option 'strategy'"
    assert len(report.units) == 3 and report.config.sharding_strategy == "SHARD_GRAD_OP"
    plugin = FSDPStrategy(precision_plugin=FSDPPrecision("bf16-mixed"))
    assert fsdpviz.from_lightning(strategy=plugin)["mixed_precision"].param_dtype == torch.bfloat16
    offload = fsdpviz.from_lightning(strategy="fsdp_cpu_offload", devices=2)
    assert offload["cpu_offload"].offload_params and offload["world_size"] == 2


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"sharding_stratgy": "FULL_SHARD"}, "FSDPStrategy has no argument 'sharding_stratgy'"
         ", and FullyShardedDataParallel, which gets the ones FSDPStrategy does not take, has "
         "none either; did you mean 'sharding_strategy'?"),
        ({"strategy": "fsdp2"}, "strategy='fsdp2' is not an FSDP strategy Lightning registers;"
         " did you mean 'fsdp'? use one of fsdp, fsdp_cpu_offload or FSDPStrategy(...)"),
        ({"strategy": "fsdp", "cpu_offload": True}, "pass strategy=FSDPStrategy(...) or the "
         "strategy's arguments (cpu_offload), not both"),
        ({"devices": "auto"}, "devices='auto': the number of devices per node decides the "
         "world size"),
        ({"precision": "bf16"}, "Lightning rejects these arguments: `precision='bf16')` is not "
         "supported in FSDP"),
        ({"device_mesh": (2, 4)}, "is a 2-D mesh, which FSDP1 takes only with "
         "sharding_strategy='HYBRID_SHARD'"),
        ({"strategy": object()}, "strategy=object is not Lightning's FSDPStrategy"),
    ],
)  # fmt: skip
def test_lightning_mistakes(kwargs: dict[str, Any], said: str) -> None:
    pytest.importorskip("lightning")
    with pytest.raises(fsdpviz.ConfigError) as err:
        fsdpviz.from_lightning(**kwargs)
    assert said in str(err.value)


# ---------------------------------------------------------------- Hugging Face ids
@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("num_hidden_layers=two", "LlamaConfig.num_hidden_layers is an integer (it is 2), got "
         "'two'; set an integer, e.g. num_hidden_layers=2"),
        ("num_hidden_layers=2.5", "num_hidden_layers is an integer (it is 2), got 2.5"),
        ("tie_word_embeddings=3", "LlamaConfig.tie_word_embeddings is true or false (it is "
         "False), got 3; set true or false, e.g. tie_word_embeddings=false"),
        ("rms_norm_eps=small", "LlamaConfig.rms_norm_eps is a number (it is 1e-06), got 'small'"),
    ],
)  # fmt: skip
def test_set_with_a_value_of_the_wrong_type(
    text: str, said: str, llama: fsdpviz.HFModel, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["report", f"hf:{llama.name}", "--set", text])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fsdpviz report: error: ") and said in err, err
    assert "Traceback" not in err
    ok = fsdpviz.hf_model(llama.name, overrides={"num_hidden_layers": 1, "rms_norm_eps": 1})
    assert len(ok.model.model.layers) == 1 and ok.config.rms_norm_eps == 1


def test_unreachable_hub_fails_at_once(tmp_path: Path) -> None:
    """No five retries: one connection to the hub, then the cache, then a message."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cached = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc"
    cached.mkdir(parents=True)
    (cached.parent.parent / "refs").mkdir()
    (cached.parent.parent / "refs" / "main").write_text("abc")
    from transformers import LlamaConfig

    LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, vocab_size=96,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(cached)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HTTP", "ALL_"))}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HUB_CACHE=str(tmp_path / "hub"))
    script = (
        "import fsdpviz, sys; from fsdpviz.cli import main\n"
        "print(len(fsdpviz.hf_model('acme/tiny').model.model.layers))\n"
        "sys.exit(main(['report', 'hf:acme/missing']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.stdout.splitlines()[0] == "1", proc.stderr  # the cached config, offline
    assert proc.returncode == 2, proc.stderr
    assert "Retry" not in proc.stderr and "Traceback" not in proc.stderr
    assert (
        "fsdpviz report: error: the config of 'acme/missing' (its config.json) is not in the "
        "Hugging Face "
        f"cache and the hub is not reachable from here (http://127.0.0.1:{port}: Connection "
        "refused): fetch it once where the hub is reachable (`hf download acme/missing "
        "config.json`"
    ) in proc.stderr
