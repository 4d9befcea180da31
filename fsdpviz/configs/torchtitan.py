"""A torchtitan job (its TOML ``--job.config_file``) as the model and FSDP2 plan torchtitan
builds for it.

The job files are those of torchtitan's TOML configuration (``train_configs/*.toml``, up
to its move to Python config registries in 2026). The Llama 3 flavors (``debugmodel``,
``8B``, ``70B``, ``405B``) are built here as torchtitan builds them (``Transformer`` of
``torchtitan/models/llama3/model``: the same module names and parameter shapes) on the meta
device, and sharded as its ``apply_fsdp`` does: ``tok_embeddings``, each block, ``norm``
with ``output`` (resharded after forward only with ``fsdp_reshard_after_forward =
"always"``), then the root, with ``MixedPrecisionPolicy(param_dtype=mixed_precision_param,
reduce_dtype=mixed_precision_reduce)``, on torchtitan's mesh: ``dp_replicate`` (HSDP) when
``data_parallel_replicate_degree > 1``, ``dp_shard``, and ``tp`` with ``apply_tp``'s plan
(sequence parallel, loss parallel unless ``disable_loss_parallel``) when
``tensor_parallel_degree > 1``; ``enable_cpu_offload`` gives ``CPUOffloadPolicy()``.
``activation_checkpoint.mode = "full"``
checkpoints every block, ``"selective"`` with an integer option every n-th block, with
``"op"`` per operator inside every block
(:class:`~fsdpviz.trace.checkpointing.SelectiveCheckpoint`).

The job around FSDP: ``[compile] enable`` compiles each block (``analyze(...,
compile=[TransformerBlock])``; with ``components`` including ``"loss"``, as torchtitan's
default, the whole model: the blocks and the loss, with the embedding and final norm
costed fused too); float8 linears (``model.converters = ["quantize.linear.float8"]`` with
``[quantize.linear.float8]``, or ``["float8"]`` with ``[float8]``) become ``float8=``
(torchtitan's keys: ``enable_fsdp_float8_all_gather``, ``recipe_name``, ``filter_fqns``).

Older job files read as torchtitan read them then, with a note where a key was renamed:
``training.batch_size`` (``training.local_batch_size`` since June 2025),
``training.compile`` (``[compile] enable`` since August 2025, compiling the blocks only),
``training.data_parallel_*_degree``, ``training.tensor_parallel_degree``,
``training.disable_loss_parallel`` and ``experimental.{pipeline,context}_parallel_degree``
(``[parallelism]`` since March 2025), ``[float8] enable_float8_linear`` (``model.converters``
since early 2025, ``[quantize.linear.float8]`` since September 2025).
"""

from __future__ import annotations

import copy
import difflib
import math
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fsdpviz.configs.common import TrainerConfig, note
from fsdpviz.errors import ConfigError
from fsdpviz.trace.checkpointing import SelectiveCheckpoint

# torchtitan's llama3_args (torchtitan/models/llama3/__init__.py)
FLAVORS: dict[str, dict[str, Any]] = {
    "debugmodel": {"dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": 2048},
    "8B": {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
           "ffn_dim_multiplier": 1.3, "multiple_of": 1024},
    "70B": {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8,
            "ffn_dim_multiplier": 1.3, "multiple_of": 4096},
    "405B": {"dim": 16384, "n_layers": 126, "n_heads": 128, "n_kv_heads": 8,
             "ffn_dim_multiplier": 1.2, "multiple_of": 4096},
}  # fmt: skip
# Keys of the sections that decide the plan (torchtitan/config/job_config.py); the other
# sections (job, metrics, optimizer, checkpoint, ...) do not change what FSDP does.
_SECTIONS: dict[str, set[str]] = {
    "model": {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters",
              "print_after_conversion"},
    "training": {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len",
                 "max_norm", "steps", "enable_cpu_offload", "dtype", "mixed_precision_param",
                 "mixed_precision_reduce", "gc_freq", "gc_debug", "dataloader"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_microbatches", "pipeline_parallel_split_points",
                    "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree",
                    "context_parallel_load_balancer", "context_parallel_rotate_method",
                    "expert_parallel_degree", "expert_tensor_parallel_degree",
                    "expert_parallel_comm_backend"},
    "activation_checkpoint": {"mode", "selective_ac_option",
                              "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop",
                              "memory_budget", "visualize_memory_budget_pareto",
                              "preserve_rng_state", "determinism_check", "debug"},
    "compile": {"enable", "components", "backend"},
    # torchtitan's Float8 / Float8Linear keys, in [float8] (2024 to September 2025) and
    # [quantize.linear.float8] (since)
    "float8": {"enable_float8_linear", "enable_fsdp_float8_all_gather",
               "precompute_float8_dynamic_scale_for_fsdp", "force_recompute_fp8_weight_in_bwd",
               "recipe_name", "filter_fqns", "emulate", "scaling_type_input",
               "scaling_type_weight", "scaling_type_grad_output"},
}  # fmt: skip
_OTHER_SECTIONS = {
    "job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "quantize",
    "comm", "memory_estimation", "fault_tolerance", "experimental", "validation", "debug",
    "mx",
}  # fmt: skip
# Keys torchtitan moved, as (old section, old key) -> (section, key, since): read where they
# were, with a note
_RENAMED = {
    ("training", "batch_size"): ("training", "local_batch_size", "June 2025"),
    ("training", "compile"): ("compile", "enable", "August 2025"),
    **{
        ("training", key): ("parallelism", key, "March 2025")
        for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "tensor_parallel_degree", "disable_loss_parallel")
    },
    **{
        ("experimental", key): ("parallelism", key, "March 2025")
        for key in ("pipeline_parallel_degree", "context_parallel_degree",
                    "enable_async_tensor_parallel", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatches", "pipeline_parallel_split_points",
                    "pipeline_parallel_schedule_csv")
    },
}  # fmt: skip
# Keys of older job files that no longer exist and do not change the plan
_OLD_KEYS = {
    "training": {"warmup_steps", "seed", "deterministic", "enable_compiled_autograd"},
    "model": {"norm_type"},
}
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class TorchtitanJob:
    """The model, batch and FSDP2 plan of a torchtitan job.

    ``fsdpviz.analyze(job.model, job.inputs, **job.config)``; ``model, inputs, config =
    job`` unpacks them.
    """

    model: nn.Module
    inputs: torch.Tensor
    config: TrainerConfig

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.inputs, self.config))


def from_torchtitan(
    job: str | Path | Mapping[str, Any], *, world_size: int | None = None
) -> TorchtitanJob:
    """Read a torchtitan job TOML: the Llama 3 model it trains, one batch, and its FSDP2 plan.

    ``world_size`` is the number of ranks the job runs on; it is needed only when
    ``data_parallel_shard_degree = -1`` (torchtitan's default: every rank; default 8).

    Example::

        job = fsdpviz.from_torchtitan("llama3_8b.toml", world_size=8)
        report = fsdpviz.analyze(job.model, job.inputs, **job.config)
    """
    data, where = _load(job)
    data = copy.deepcopy(data)  # the older keys move: never in the caller's dict
    notes = _upgrade(data, where)
    notes += _check(data, where)
    model_cfg = data.get("model", {})
    name = model_cfg.get("name", "llama3")
    if name != "llama3":
        raise ConfigError(f"{where}: model.name {name!r} is not modelled; fsdpviz builds llama3")
    flavor = str(model_cfg.get("flavor", "debugmodel"))
    if flavor not in FLAVORS:
        close = difflib.get_close_matches(flavor, list(FLAVORS), n=1)
        tip = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"{where}: model.flavor {flavor!r} is not a llama3 flavor ({', '.join(FLAVORS)}){tip}"
        )
    float8 = _float8(data, where, notes)
    for converter in model_cfg.get("converters", []) or []:
        if converter not in ("float8", "quantize.linear.float8"):
            note(
                notes,
                f"{where}: model.converters {converter!r} (quantized training) is not modelled",
            )
    training = data.get("training", {})
    parallel = data.get("parallelism", {})
    seq = int(training.get("seq_len", 2048))
    batch = int(training.get("local_batch_size", 8))
    rotate = parallel.get("context_parallel_rotate_method", "allgather")
    if int(parallel.get("context_parallel_degree", 1)) > 1 and rotate != "allgather":
        note(
            notes,
            f"{where}: context_parallel_rotate_method = {rotate!r} is not modelled; ring "
            "attention is planned with torch's default 'allgather' (keys and values gathered "
            "once per attention)",
        )
    mesh = _mesh(parallel, world_size, where, notes)
    shard = mesh["dp_shard"]
    if int(training.get("global_batch_size", -1)) > batch * shard * mesh["dp_replicate"]:
        steps = int(training["global_batch_size"]) // (batch * shard * mesh["dp_replicate"])
        note(
            notes,
            f"{where}: global_batch_size = {training['global_batch_size']} means "
            f"{steps} micro-batches per step, each reducing its gradients (torchtitan does not "
            f"skip gradient sync); one is planned (time the step with "
            f"fsdpviz.cost.timeline(report, grad_accum={steps}))",
        )
    model = build_llama3(flavor, seq)
    tokens = torch.zeros(batch, seq, dtype=torch.long)
    kwargs = _plan(model, data, mesh, where, notes)
    if mesh["pp"] > 1:
        kwargs.update(_pipeline(model, parallel, mesh["pp"], batch, where, notes))
    # the loss of one microbatch under pipeline parallelism (the last stage's), else the batch;
    # one rank's labels: context parallelism cuts them as it cuts the tokens
    rows = batch // int(kwargs.get("microbatches", 1))
    labels = torch.zeros(rows, seq // mesh["cp"], dtype=torch.long, device="meta")
    kwargs["loss"] = _CrossEntropy(labels)
    compiled = _compile(data.get("compile", {}), where, notes)
    if compiled:
        kwargs["compile"] = compiled
    if float8 is not None:
        kwargs["float8"] = float8
    config = TrainerConfig(f"torchtitan job {where} (llama3 {flavor})", kwargs, notes)
    return TorchtitanJob(model, tokens, config)


def _load(job: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(job, Mapping):
        return dict(job), "torchtitan job"
    path = Path(job)
    if not path.is_file():
        raise ConfigError(f"torchtitan job file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text()), path.name
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None


def _upgrade(data: dict[str, Any], where: str) -> list[str]:
    """Move the keys of older job files to where torchtitan has them now (see the module
    docstring), with a note for each; a key given in both places keeps the new one."""
    notes: list[str] = []
    for (old_section, old_key), (section, key, since) in _RENAMED.items():
        values = data.get(old_section)
        if not isinstance(values, dict) or old_key not in values:
            continue
        value = values.pop(old_key)
        target = data.setdefault(section, {})
        if key in target:
            note(
                notes,
                f"{where}: {old_section}.{old_key} and {section}.{key} are both given; "
                f"{section}.{key} is read (torchtitan renamed the first in {since})",
            )
            continue
        target[key] = value
        note(
            notes,
            f"{where}: {old_section}.{old_key} is read as {section}.{key} "
            f"(torchtitan's name since {since})",
        )
        if (old_section, old_key) == ("training", "compile"):
            data["compile"].setdefault("components", ["model"])  # the blocks, as then
    for section, keys in _OLD_KEYS.items():
        values = data.get(section)
        if isinstance(values, dict):
            for key in keys & set(values):
                values.pop(key)
    quantize = data.get("quantize")
    if isinstance(quantize, dict):
        linear = quantize.get("linear")
        if isinstance(linear, dict) and isinstance(linear.get("float8"), dict):
            data.setdefault("float8", {}).update(linear["float8"])
    return notes


def _float8(data: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any] | None:
    """torchtitan's float8 linears: ``model.converters`` naming them (``"float8"``, since
    September 2025 ``"quantize.linear.float8"``) or, before converters, ``[float8]
    enable_float8_linear``; their options from ``[float8]`` / ``[quantize.linear.float8]``."""
    section = dict(data.get("float8", {}))
    converters = data.get("model", {}).get("converters", []) or []
    enabled = section.pop("enable_float8_linear", None)
    if enabled is not None:
        note(
            notes,
            f"{where}: float8.enable_float8_linear is read as model.converters = "
            '["quantize.linear.float8"] (torchtitan\'s name since early 2025)',
        )
    if not enabled and not {"float8", "quantize.linear.float8"} & set(converters):
        return None
    filters = list(section.get("filter_fqns") or [])
    if "auto_filter_small_kn" in filters:
        filters.remove("auto_filter_small_kn")
        note(
            notes,
            f"{where}: float8 filter_fqns 'auto_filter_small_kn' (torchao's choice of linears "
            "too small to gain) is not modelled; every linear whose dimensions divide by 16 "
            "runs in float8",
        )
    section["filter_fqns"] = filters
    return section


def _compile(section: dict[str, Any], where: str, notes: list[str]) -> bool | list[type]:
    """torchtitan's ``apply_compile``: each block (``"model"``), and the loss (``"loss"``)."""
    if not section.get("enable"):
        return False
    components = list(section.get("components", ["model", "loss"]))
    if "model" not in components:
        note(notes, f"{where}: compile of the loss alone is not modelled; costed eager")
        return False
    if "loss" in components:
        return True  # the blocks and the loss; the embedding and final norm fuse too
    return [TransformerBlock]


def _check(data: dict[str, Any], where: str) -> list[str]:
    """Unknown sections and keys raise; the plan's sections are checked key by key."""
    known = set(_SECTIONS) | _OTHER_SECTIONS
    problems = []
    for section, values in data.items():
        if section not in known:
            close = difflib.get_close_matches(section, sorted(known), n=1)
            tip = f"; did you mean [{close[0]}]?" if close else ""
            problems.append(f"{where}: unknown section [{section}]{tip}")
            continue
        for key in values if section in _SECTIONS and isinstance(values, dict) else []:
            if key not in _SECTIONS[section]:
                close = difflib.get_close_matches(key, sorted(_SECTIONS[section]), n=1)
                tip = f"; did you mean {close[0]!r}?" if close else ""
                problems.append(f"{where}: unknown key {section}.{key}{tip}")
    if problems:
        raise ConfigError("\n".join(problems))
    return []


def _mesh(
    parallel: dict[str, Any], world_size: int | None, where: str, notes: list[str]
) -> dict[str, int]:
    """The sizes of torchtitan's ``ParallelDims`` for FSDP's and TP's mesh dimensions:
    ``data_parallel_shard_degree = -1`` takes the ranks the other degrees leave."""
    degrees = {
        key: int(parallel.get(key, 1))
        for key in ("data_parallel_replicate_degree", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "context_parallel_degree")
    }  # fmt: skip
    for key, value in degrees.items():
        if value < 1:
            raise ConfigError(f"{where}: parallelism.{key} must be 1 or more, got {value}")
    others = math.prod(degrees.values())
    shard = int(parallel.get("data_parallel_shard_degree", -1))
    if shard == -1:
        ranks = world_size or 8
        if world_size is None:
            note(
                notes,
                f"{where}: data_parallel_shard_degree = -1 uses every rank; planned "
                "on 8 (pass world_size / --world-size for another count)",
            )
        if ranks % others:
            raise ConfigError(
                f"{where}: {ranks} ranks do not divide by the other degrees' product {others} "
                "(replicate x tp x pp x cp); give a world size that does"
            )
        shard = ranks // others
    elif shard < 1:
        raise ConfigError(
            f"{where}: parallelism.data_parallel_shard_degree must be -1 or 1 or more, got {shard}"
        )
    elif world_size is not None and world_size != shard * others:
        note(
            notes,
            f"{where}: data_parallel_shard_degree = {shard} x the other degrees ({others}) "
            f"is planned, not the {world_size} ranks given",
        )
    return {
        "pp": degrees["pipeline_parallel_degree"],
        "dp_replicate": degrees["data_parallel_replicate_degree"],
        "dp_shard": shard,
        "cp": degrees["context_parallel_degree"],
        "tp": degrees["tensor_parallel_degree"],
    }


def tp_plan(loss_parallel: bool) -> dict[str, Any]:
    """torchtitan's ``apply_tp`` as one plan over the whole model (``layers.*.`` patterns):
    sequence parallel norms, column/row-wise projections, the output sharded over the
    vocabulary for loss parallel (``disable_loss_parallel = false``) or replicated."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }
    block = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(  # (x, freqs_cis): the rotations stay plain tensors
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    plan.update({f"layers.*.{k}": v for k, v in block.items()})
    return plan


def _plan(
    model: nn.Module, data: dict[str, Any], mesh: dict[str, int], where: str, notes: list[str]
) -> dict[str, Any]:
    """torchtitan's ``apply_tp``, ``apply_ac`` and ``apply_fsdp`` for this job, as analyze
    arguments."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    training = data.get("training", {})
    policy = str(data.get("parallelism", {}).get("fsdp_reshard_after_forward", "default"))
    if policy not in ("default", "always", "never"):
        raise ConfigError(
            f"{where}: parallelism.fsdp_reshard_after_forward must be default, always or "
            f"never, got {policy!r}"
        )
    # "default": True without pipeline parallelism, False under it (torchtitan's
    # get_fsdp_reshard_after_forward_policy: no all-gather per microbatch)
    reshard = policy == "always" or (policy == "default" and mesh["pp"] == 1)
    blocks = [f"layers.{name}" for name, _ in model.get_submodule("layers").named_children()]
    raf: dict[str, bool] = {"tok_embeddings": reshard, **dict.fromkeys(blocks, reshard)}
    raf["norm, output"] = policy == "always"
    param = _dtype(training.get("mixed_precision_param", "bfloat16"), "mixed_precision_param")
    reduce = _dtype(training.get("mixed_precision_reduce", "float32"), "mixed_precision_reduce")
    kwargs: dict[str, Any] = {
        "fully_shard": ["tok_embeddings", *blocks, ("norm", "output")],
        "reshard_after_forward": raf,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce),
    }
    if mesh["dp_replicate"] == 1 and mesh["tp"] == 1 and mesh["pp"] == 1 and mesh["cp"] == 1:
        kwargs["world_size"] = mesh["dp_shard"]
    else:  # PP, HSDP, CP and/or TP: the mesh as torchtitan's ParallelDims builds it
        dims = [(k, n) for k, n in mesh.items() if n > 1 or k == "dp_shard"]
        kwargs["mesh"] = tuple(x for dim in dims for x in dim)  # ("dp_shard", 32, "tp", 8)
    if mesh["tp"] > 1:
        parallel = data.get("parallelism", {})
        loss_parallel = not parallel.get("disable_loss_parallel", False)
        kwargs["parallelize_plan"] = tp_plan(loss_parallel)
        if loss_parallel:
            note(
                notes,
                f"{where}: loss parallel keeps the logits sharded over the vocabulary; the "
                "cross-entropy's own all-reduces (a few values per token) are not shown",
            )
        if parallel.get("enable_async_tensor_parallel"):
            note(
                notes,
                f"{where}: enable_async_tensor_parallel overlaps tp collectives with the "
                "matmuls (not modelled; planned as synchronous tensor parallelism)",
            )
    if training.get("enable_cpu_offload"):
        kwargs["offload_policy"] = CPUOffloadPolicy()
    ac = data.get("activation_checkpoint", {})
    mode = str(ac.get("mode", "selective"))
    option = str(ac.get("selective_ac_option", "2"))
    if mode == "full":
        kwargs["activation_checkpointing"] = [TransformerBlock]
    elif mode == "selective" and option.isdigit():
        kwargs["activation_checkpointing"] = EveryNthBlock(int(option))
    elif mode == "selective" and option == "op":
        kwargs["activation_checkpointing"] = SelectiveCheckpoint([TransformerBlock])
    elif mode == "selective":
        raise ConfigError(
            f"{where}: activation_checkpoint.selective_ac_option must be 'op' or an "
            f"integer, got {option!r}"
        )
    elif mode == "memory_budget":
        note(
            notes,
            f"{where}: activation_checkpoint mode = 'memory_budget' is not modelled; "
            "planned without activation checkpointing",
        )
    elif mode != "none":
        raise ConfigError(f"{where}: activation_checkpoint.mode {mode!r} is not valid")
    return kwargs


def _pipeline(
    model: nn.Module,
    parallel: dict[str, Any],
    pp: int,
    batch: int,
    where: str,
    notes: list[str],
) -> dict[str, Any]:
    """torchtitan's ``pipeline_llm`` for this job, as ``analyze`` arguments: the schedule,
    the microbatches (``local_batch_size / pipeline_parallel_microbatch_size``; files of 2024
    give ``pipeline_parallel_microbatches``, default the pp degree) and the stages
    (``module_fqns_per_model_part``, ``pipeline_parallel_layers_per_stage``, 2024's
    ``pipeline_parallel_split_points``, else torchtitan's split with the first and last
    stages ``..._less_layers`` lighter)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from fsdpviz.plan.pipeline import default_stages, schedule_class
    from fsdpviz.schema.report import FsdpWarning

    name, cls = schedule_class(parallel.get("pipeline_parallel_schedule", "1F1B"))
    out: dict[str, Any] = {"pipeline_schedule": name}
    if parallel.get("pipeline_parallel_schedule_csv"):
        note(
            notes,
            f"{where}: pipeline_parallel_schedule_csv is not read; planned with "
            f"pipeline_parallel_schedule = {name!r}",
        )
    if "pipeline_parallel_microbatches" in parallel:  # torchtitan of 2024
        out["microbatches"] = int(parallel["pipeline_parallel_microbatches"])
    elif "pipeline_parallel_microbatch_size" in parallel:
        size = int(parallel["pipeline_parallel_microbatch_size"])
        if size < 1 or batch % size:
            raise ConfigError(
                f"{where}: local_batch_size {batch} does not divide into microbatches of "
                f"pipeline_parallel_microbatch_size = {size}"
            )
        out["microbatches"] = batch // size
    elif "pipeline_parallel_split_points" in parallel:  # 2024's default: the pp degree
        out["microbatches"] = pp
    else:
        out["microbatches"] = batch  # microbatches of one sample (microbatch size 1)
    per_rank = 1 if issubclass(cls, PipelineScheduleSingle) else 2
    if parallel.get("module_fqns_per_model_part"):
        out["pipeline_stages"] = [list(s) for s in parallel["module_fqns_per_model_part"]]
    elif parallel.get("pipeline_parallel_split_points"):
        out["pipeline_stages"] = _split_points(model, parallel["pipeline_parallel_split_points"])
    elif parallel.get("pipeline_parallel_layers_per_stage"):
        out["pipeline_stages"] = int(parallel["pipeline_parallel_layers_per_stage"])
    else:
        first = int(parallel.get("pipeline_parallel_first_stage_less_layers", 1))
        last = int(parallel.get("pipeline_parallel_last_stage_less_layers", 1))
        unused: list[FsdpWarning] = []  # analyze warns of an uneven split itself
        out["pipeline_stages"] = default_stages(model, pp * per_rank, unused, first, last)
    return out


def _split_points(model: nn.Module, points: Any) -> list[list[str]]:
    """torchtitan's 2024 ``pipeline_parallel_split_points`` (``["layers.8", "layers.16"]``):
    each point starts a stage; the first also holds the embedding, the last the final norm
    and the output."""
    blocks = [f"layers.{k}" for k, _ in model.get_submodule("layers").named_children()]
    starts = [str(p) for p in (points.split(",") if isinstance(points, str) else points)]
    stages: list[list[str]] = [["tok_embeddings"]]
    for block in blocks:
        if block in starts:
            stages.append([])
        stages[-1].append(block)
    stages[-1] += ["norm", "output"]
    return stages


@dataclass(frozen=True)
class EveryNthBlock:
    """torchtitan's ``selective_ac_option = "<n>"``: every ``n``-th block is checkpointed,
    counting from 1 (``0``: every block). Picks by the block's ``layer_id``, so it picks the
    same blocks of fsdpviz's traced copy as of the model."""

    every: int

    def __call__(self, module: nn.Module) -> bool:
        layer = getattr(module, "layer_id", None)
        if not isinstance(module, TransformerBlock) or layer is None:
            return False
        return not self.every or (int(layer) + 1) % self.every == 0


def _dtype(name: Any, key: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ConfigError(f"training.{key} must be bfloat16 or float32, got {name!r}")
    return _DTYPES[name]


class _CrossEntropy:
    """torchtitan's loss: cross-entropy of the float32 logits against the labels (the first
    samples', for a micro-batch of fewer)."""

    def __init__(self, labels: torch.Tensor) -> None:
        self.labels = labels

    def __call__(self, pred: torch.Tensor) -> torch.Tensor:
        labels = self.labels[: pred.shape[0]]
        loss: torch.Tensor = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        return loss


# ------------------------------------------------------------------ the model
class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = _rotate(self.wq(x).view(b, s, self.n_heads, self.head_dim), rope)
        k = _rotate(self.wk(x).view(b, s, self.n_kv_heads, self.head_dim), rope)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        rep = self.n_heads // self.n_kv_heads  # torchtitan's repeat_kv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, s, -1))
        return result


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return result


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: dict[str, Any]) -> None:
        super().__init__()
        self.layer_id = layer_id
        dim = args["dim"]
        self.attention = Attention(dim, args["n_heads"], args.get("n_kv_heads") or args["n_heads"])
        self.feed_forward = FeedForward(dim, _ffn_hidden(args))
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = x + self.attention(self.attention_norm(x), rope)
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


class Transformer(nn.Module):
    """torchtitan's Llama 3 ``Transformer``: module names and shapes as torchtitan has them."""

    def __init__(self, args: dict[str, Any], seq_len: int) -> None:
        super().__init__()
        dim, vocab = args["dim"], args.get("vocab_size", 128256)
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args) for i in range(args["n_layers"])}
        )
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocab, bias=False)
        half = dim // args["n_heads"] // 2
        angles = torch.outer(
            torch.arange(seq_len).float(), 1.0 / 500000 ** (torch.arange(half) / half)
        )
        # torchtitan's precompute_freqs_cis: complex rotations, one per position and pair
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles), False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # a pipeline stage holds some of the modules, the others set to None (torchtitan's
        # pipeline_module_split): it takes the previous stage's hidden states as tokens
        h: torch.Tensor = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        rope = self.get_buffer("freqs_cis")[: tokens.shape[1]]
        for layer in self.layers.values():
            h = layer(h, rope)
        h = self.norm(h) if self.norm else h
        return self.output(h) if self.output else h


def _rotate(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (batch, seq, heads, head_dim) as torchtitan's apply_rotary_emb:
    interleaved pairs as complex numbers, multiplied by the rotations, in float32."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(pairs * freqs_cis[None, :, None, :]).flatten(3)
    return out.type_as(x)


def _ffn_hidden(args: dict[str, Any]) -> int:
    """torchtitan's FeedForward hidden size: 2/3 of 4*dim, scaled, rounded up to multiple_of."""
    hidden = int(2 * (4 * args["dim"]) / 3)
    if args.get("ffn_dim_multiplier") is not None:
        hidden = int(args["ffn_dim_multiplier"] * hidden)
    multiple = args.get("multiple_of", 256)
    return int(multiple * math.ceil(hidden / multiple))


def build_llama3(flavor: str, seq_len: int) -> nn.Module:
    """torchtitan's Llama 3 ``flavor`` on the meta device, float32 as torchtitan builds it."""
    with torch.device("meta"):
        return Transformer(FLAVORS[flavor], seq_len).train()
