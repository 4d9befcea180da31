"""What torchtitan applies to the model, as ``analyze`` arguments: ``parallelize_llama``'s
``apply_tp`` (:func:`tp_plan`), ``apply_ac`` (:class:`EveryNthBlock`, per-op
checkpointing) and ``apply_fsdp`` (:func:`parallelize_kwargs`), and ``pipeline_llm``'s
schedule, microbatches and stages (:func:`pipeline_kwargs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from fsdpviz.configs.common import note
from fsdpviz.configs.torchtitan_model import TransformerBlock
from fsdpviz.errors import ConfigError
from fsdpviz.plan.option_specs import RESHARD, RESHARD_KEYWORD
from fsdpviz.plan.pipeline import default_stages, schedule_class
from fsdpviz.schema.checkpointing import SelectiveCheckpoint
from fsdpviz.schema.mesh import ParallelDims
from fsdpviz.schema.report import FsdpWarning

if TYPE_CHECKING:
    from fsdpviz.api.keywords import AnalyzeKwargs

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}

RESHARD_KEY = RESHARD.trainer_keys["torchtitan"]
"""torchtitan's ``[parallelism]`` key for FSDP2's resharding after forward: ``"default"``
(every group but the last, under pipeline parallelism none), ``"always"`` or ``"never"``;
:func:`parallelize_kwargs` reads it, :func:`reshard_policy` writes it."""


def tp_plan(loss_parallel: bool, float8_tensorwise: bool = False) -> dict[str, ParallelStyle]:
    """torchtitan's ``apply_tp`` as one plan over the whole model (``layers.*.`` patterns):
    sequence parallel norms, column/row-wise projections, the output sharded over the
    vocabulary for loss parallel (``disable_loss_parallel = false``) or replicated. With
    tensorwise float8 linears (``float8_tensorwise``: torchtitan's
    ``enable_float8_tensorwise_tp``) the blocks take torchao's ``Float8ColwiseParallel``,
    ``Float8RowwiseParallel`` and ``PrepareFloat8ModuleInput``, as ``apply_tp`` gives them
    (their activations gathered in float8); the embedding, the final norm and the output
    keep torch's."""
    col: Any = ColwiseParallel
    row: Any = RowwiseParallel
    prepare: Any = PrepareModuleInput
    if float8_tensorwise:  # lazy: torchao is needed only here
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )

        col, row, prepare = Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    plan: dict[str, ParallelStyle] = {
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
        "attention": prepare(  # (x, freqs_cis): the rotations stay plain tensors
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        "attention.wq": col(),
        "attention.wk": col(),
        "attention.wv": col(),
        "attention.wo": row(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": prepare(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": col(),
        "feed_forward.w2": row(output_layouts=Shard(1)),
        "feed_forward.w3": col(),
    }
    plan.update({f"layers.*.{k}": v for k, v in block.items()})
    return plan


def parallelize_kwargs(
    model: nn.Module,
    data: dict[str, Any],
    parallel_dims: ParallelDims,
    where: str,
    notes: list[str],
    float8_tensorwise: bool = False,
) -> AnalyzeKwargs:
    """torchtitan's ``apply_tp``, ``apply_ac`` and ``apply_fsdp`` for this job, as analyze
    arguments (``float8_tensorwise``: the job trains tensorwise float8 linears, whose blocks
    ``apply_tp`` gives torchao's float8 styles)."""
    training = data.get("training", {})
    policy = str(data.get("parallelism", {}).get(RESHARD_KEY, "default"))
    if policy not in ("default", "always", "never"):
        raise ConfigError(
            f"{where}: parallelism.{RESHARD_KEY} must be default, always or never, got {policy!r}"
        )
    # "default": True without pipeline parallelism, False under it (torchtitan's
    # apply_fsdp: no all-gather per microbatch)
    reshard = policy == "always" or (policy == "default" and parallel_dims.pp == 1)
    blocks = [f"layers.{name}" for name, _ in model.get_submodule("layers").named_children()]
    raf: dict[str, bool] = {"tok_embeddings": reshard, **dict.fromkeys(blocks, reshard)}
    raf["norm, output"] = policy == "always"
    param = _dtype(training.get("mixed_precision_param", "bfloat16"), "mixed_precision_param")
    reduce = _dtype(training.get("mixed_precision_reduce", "float32"), "mixed_precision_reduce")
    kwargs: AnalyzeKwargs = {
        "fully_shard": ["tok_embeddings", *blocks, ("norm", "output")],
        RESHARD_KEYWORD: raf,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce),
    }
    dims = parallel_dims.device_mesh
    if len(dims) == 1:
        kwargs["world_size"] = parallel_dims.dp_shard
    else:  # PP, HSDP, CP and/or TP: the mesh as torchtitan's ParallelDims builds it
        kwargs["mesh"] = parallel_dims.mesh_arg  # ("dp_shard", 32, "tp", 8)
    if parallel_dims.tp > 1:
        parallel = data.get("parallelism", {})
        loss_parallel = not parallel.get("disable_loss_parallel", False)
        try:
            kwargs["parallelize_plan"] = tp_plan(loss_parallel, float8_tensorwise)
        except ImportError:  # torchao's styles need torchao
            kwargs["parallelize_plan"] = tp_plan(loss_parallel)
            note(
                notes,
                f"{where}: tensor parallelism with tensorwise float8 linears: torchtitan "
                "applies torchao's Float8ColwiseParallel, Float8RowwiseParallel and "
                "PrepareFloat8ModuleInput, but torchao is not installed, so the blocks are "
                "planned with torch's styles (their tp all-gathers in bf16, twice torchtitan's "
                "bytes); pip install torchao to plan torchao's",
            )
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


def reshard_policy(value: Any) -> str | None:
    """torchtitan's :data:`RESHARD_KEY` that makes FSDP2's resharding after forward
    ``value`` (as ``fully_shard`` takes it, or per group) without pipeline parallelism, as
    :func:`parallelize_kwargs` reads it: ``"always"`` (``True`` everywhere), ``"never"``
    (``False`` everywhere), ``"default"`` (torch's default, or ``True`` for every group but
    the last, the norm with the output); ``None`` where no policy does (a number of ranks,
    other groups kept)."""
    if isinstance(value, Mapping):
        values = list(value.values())
        if all(v is False for v in values):
            value = False
        elif all(v is True for v in values):
            value = True
        elif all(v is True for v in values[:-1]) and values[-1] is False:
            return "default"
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "always" if value else "never"
    return None


def pipeline_kwargs(
    model: nn.Module,
    parallel: dict[str, Any],
    pp: int,
    batch: int,
    where: str,
    notes: list[str],
) -> AnalyzeKwargs:
    """torchtitan's ``pipeline_llm`` for this job, as ``analyze`` arguments: the schedule,
    the microbatches (``local_batch_size / pipeline_parallel_microbatch_size``; files of 2024
    give ``pipeline_parallel_microbatches``, default the pp degree) and the stages
    (``module_fqns_per_model_part``, ``pipeline_parallel_layers_per_stage``, 2024's
    ``pipeline_parallel_split_points``, else torchtitan's split with the first and last
    stages ``..._less_layers`` lighter)."""
    # lazy: pipelining is slow to import
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    name, cls = schedule_class(parallel.get("pipeline_parallel_schedule", "1F1B"))
    out: AnalyzeKwargs = {"pipeline_schedule": name}
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


__all__ = ["EveryNthBlock", "parallelize_kwargs", "pipeline_kwargs", "tp_plan"]
