"""A configuration as a trainer's keys where those can say it: torchtitan's job TOML and
accelerate's config YAML, with a note for each setting they cannot."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import torch

from fsdpviz.configs.accelerate import RESHARD_KEY as ACCELERATE_RESHARD
from fsdpviz.configs.torchtitan_job import CP_ROTATE_KEY, CP_ROTATE_METHOD
from fsdpviz.configs.torchtitan_plan import RESHARD_KEY as TITAN_RESHARD
from fsdpviz.configs.torchtitan_plan import EveryNthBlock, reshard_policy
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.pipeline import schedule_class
from fsdpviz.schema.checkpointing import CheckpointEvery, SelectiveCheckpoint
from fsdpviz.schema.config import ReportConfig
from fsdpviz.tuning.float8_styles import has_float8_styles
from fsdpviz.tuning.fsdp_code import DTYPES, Candidate
from fsdpviz.tuning.space import reshard_given


# ------------------------------------------------------------------ torchtitan
def torchtitan_toml(c: Candidate) -> str:
    kw = c.kwargs
    cfg = c.report.config
    notes: list[str] = []
    # FSDP1's MixedPrecision has the same two dtypes as FSDP2's MixedPrecisionPolicy
    mp = kw.get("mp_policy", kw.get("mixed_precision"))
    param = getattr(mp, "param_dtype", None) or torch.float32
    reduce = getattr(mp, "reduce_dtype", None) or param
    tt_dtype = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
    raf = reshard_given(kw)
    pipe = c.report.pipeline
    # the value each group was planned with (a mapping names some groups, the others take
    # torch's default), the root aside: torchtitan's policies set the groups below it
    applied = {u: v for u in cfg.fully_shard if u and (v := cfg.resharding(u)) is not None}
    policy = reshard_policy(applied if applied and pipe is None else raf)
    if cfg.api != "FSDP2":
        # FSDP1's strategy as FSDP2's resharding of every unit below the root (FSDP1 keeps
        # the root's parameters after forward, as FSDP2 does)
        policy = _FSDP1_RESHARD.get(cfg.sharding_strategy, "default")
        notes.append(
            f"torchtitan runs FSDP2 (fully_shard); this plan is FSDP1's "
            f"({cfg.sharding_strategy}, its own units and prefetching), not exactly what "
            "torchtitan runs: analyze the FSDP2 configuration (fully_shard=...) for its plan"
        )
    if policy is None:
        policy = "default"
        given = dict(raf) if isinstance(raf, Mapping) else raf
        notes.append(
            f"{RESHARD.code(given)} has no {TITAN_RESHARD} value; "
            "torchtitan's apply_fsdp needs a change for it"
        )
    dims = cfg.parallel_dims.meshed
    if dims.hsdp and dims.dp_replicate == 1 and cfg.api == "FSDP2":
        notes.append(_REPLICATE_OF_ONE.format(trainer="torchtitan's ParallelDims"))
    # torchtitan's batch degree: the data-parallel ranks, each fed its own samples (the cp
    # ranks of one share them, each a part of every sequence)
    global_batch = c.micro_batch * c.grad_accum * dims.dp
    if c.grad_accum > 1 and not c.sync_each:
        notes.append(
            "torchtitan reduces the gradients after every micro-batch; this configuration "
            "reduces them only after the last (set_requires_gradient_sync(False) before the "
            "others), which its train step needs a change for"
        )
    micro = f"{c.grad_accum} micro-batch{'es' if c.grad_accum > 1 else ''} per step"
    out = [
        "[training]",
        f"local_batch_size = {c.micro_batch}",
        f"global_batch_size = {global_batch}  # {micro}",
        f'mixed_precision_param = "{tt_dtype.get(param, "float32")}"',
        f'mixed_precision_reduce = "{tt_dtype.get(reduce, "float32")}"',
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {dims.dp_replicate}",
        f"data_parallel_shard_degree = {dims.dp_shard}",
        f'{TITAN_RESHARD} = "{policy}"',
        f"tensor_parallel_degree = {dims.tp}",
    ]
    if dims.cp > 1:
        out += [
            f"context_parallel_degree = {dims.cp}",
            f'{CP_ROTATE_KEY} = "{CP_ROTATE_METHOD}"',
            "# context parallelism as planned: torchtitan's default load balancing (each rank "
            f"two of {2 * dims.cp} chunks of every sequence), ring attention over SDPA (a model "
            "flavor without flex or varlen attention); training.seq_len must divide by "
            f"{2 * dims.cp * dims.tp} (2 x cp x tp)",
        ]
        notes.append(
            "each ring step of the context-parallel attention is costed as a flash-attention "
            "kernel; torchtitan picks the SDPA kernel itself (no key; since October 2025 it "
            "tries cuDNN attention first)"
        )
    if pipe is not None:
        parts = [st.modules for st in sorted(pipe.stages, key=lambda st: st.index)]
        name, _ = schedule_class(pipe.schedule)
        out += [
            f"pipeline_parallel_degree = {pipe.pp_size}",
            f'pipeline_parallel_schedule = "{name}"',
            f"pipeline_parallel_microbatch_size = {c.micro_batch // pipe.microbatches}",
            f"module_fqns_per_model_part = {json.dumps(parts)}",
        ]
    out += [
        "",
        "[activation_checkpoint]",
    ]
    spec = kw.get("activation_checkpointing")
    if spec is None:
        out.append('mode = "none"')
    elif isinstance(spec, SelectiveCheckpoint):
        out += ['mode = "selective"', 'selective_ac_option = "op"']
    elif (every := _every_nth(spec)) is not None:
        out += ['mode = "selective"', f'selective_ac_option = "{every}"']
    else:
        out.append('mode = "full"')
    if cfg.compile:
        out += ["", "[compile]", "enable = true", 'components = ["model", "loss"]']
    if cfg.float8:
        out += ["", "[model]", 'converters = ["quantize.linear.float8"]']
        f8 = []
        if cfg.float8.get("enable_fsdp_float8_all_gather"):
            f8.append("enable_fsdp_float8_all_gather = true")
        if cfg.float8.get("recipe_name", "tensorwise") != "tensorwise":
            f8.append(f'recipe_name = "{cfg.float8["recipe_name"]}"')
        if cfg.float8.get("filter_fqns"):
            f8.append(f"filter_fqns = {json.dumps(list(cfg.float8['filter_fqns']))}")
        if f8:
            out += ["", "[quantize.linear.float8]", *f8]
        tensorwise = cfg.float8.get("recipe_name", "tensorwise") == "tensorwise"
        if cfg.tp_world_size and tensorwise:
            # torchtitan's enable_float8_tensorwise_tp: implied by tensorwise float8 with TP
            if has_float8_styles(kw.get("parallelize_plan")):
                out.append(
                    "# tensor parallelism with tensorwise float8: torchtitan's apply_tp gives "
                    "the blocks torchao's float8 styles (enable_float8_tensorwise_tp), as planned"
                )
            else:
                notes.append(
                    "planned with torch's tensor-parallel styles, but torchtitan's apply_tp "
                    "gives tensorwise float8 blocks torchao's Float8ColwiseParallel, "
                    "Float8RowwiseParallel and PrepareFloat8ModuleInput (activations gathered "
                    "in float8); the candidate with torchao's float8 TP styles is torchtitan's"
                )
    wrap = c.knobs.get("wrap", "")
    per_block = "each" in wrap and "+" not in wrap and "child" not in wrap
    if not per_block and "as given" not in wrap:
        notes.append(
            f"units {wrap!r}: torchtitan's apply_fsdp shards each block, the embedding and "
            "the norm with the output; other units need a change to apply_fsdp"
        )
    if cfg.cpu_offload:
        out.insert(5, "enable_cpu_offload = true")
    return "\n".join(out + [f"# note: {n}" for n in notes])


# FSDP1's sharding strategies as torchtitan's RESHARD_KEY where they mean the same: FULL_SHARD
# reshards every unit after forward, SHARD_GRAD_OP none; NO_SHARD is torchtitan's DDP (no key)
_FSDP1_RESHARD = {
    "FULL_SHARD": "always",
    "HYBRID_SHARD": "always",
    "SHARD_GRAD_OP": "never",
    "_HYBRID_SHARD_ZERO2": "never",
}

_REPLICATE_OF_ONE = (
    "the plan's mesh has a dp_replicate dimension of 1 rank (HSDP: FSDP2 all-reduces each "
    "gradient over it too, an all-reduce of one rank); {trainer} builds no replicate "
    "dimension of size 1, so the job runs FSDP without it"
)


def _every_nth(spec: object) -> int | None:
    """The ``n`` of activation checkpointing of every ``n``-th block, as torchtitan's
    ``selective_ac_option = "<n>"`` says it: :class:`CheckpointEvery`'s ``every``, or the
    number of the :class:`~fsdpviz.configs.torchtitan_plan.EveryNthBlock` its reader makes
    (``0``: every block); ``None`` for any other checkpointing."""
    return spec.every if isinstance(spec, (CheckpointEvery, EveryNthBlock)) else None


# ------------------------------------------------------------------ accelerate
def accelerate_yaml(c: Candidate) -> str:
    kw = c.kwargs
    cfg = c.report.config
    notes: list[str] = []
    fsdp2 = cfg.api == "FSDP2"
    mp = kw.get("mp_policy", kw.get("mixed_precision"))
    param = getattr(mp, "param_dtype", None)
    reduce = getattr(mp, "reduce_dtype", None)
    mixed = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(param, "no")  # type: ignore[arg-type]
    if mixed != "no" and reduce is not None and reduce != param:
        notes.append(
            f"accelerate's mixed_precision: {mixed} reduces gradients in {mixed}; for "
            f"{DTYPES.get(reduce, reduce)} reduction pass FullyShardedDataParallelPlugin("
            "mixed_precision_policy=...) in code"
        )
    block = _block_name(c, notes)
    out = [
        "distributed_type: FSDP",
        # quoted: YAML reads a bare `no` as false, which accelerate launch cannot lower()
        f"mixed_precision: {json.dumps(mixed) if mixed == 'no' else mixed}",
        f"num_processes: {cfg.ranks}",
        *_accelerate_mesh(cfg, notes),
        "fsdp_config:",
        f"  fsdp_version: {2 if fsdp2 else 1}",
    ]
    if block:
        out += [
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
            f"  fsdp_transformer_layer_cls_to_wrap: {block}",
        ]
    else:
        out.append("  fsdp_auto_wrap_policy: NO_WRAP")
    if fsdp2:
        raf = reshard_given(kw)
        out.append(f"  {ACCELERATE_RESHARD}: {'false' if raf is False else 'true'}")
        if raf not in (None, True, False):
            notes.append(f"{RESHARD.code(raf)} is not an accelerate setting")
    else:
        out.append(f"  fsdp_sharding_strategy: {cfg.sharding_strategy}")
        out.append(f"  fsdp_backward_prefetch: {cfg.backward_prefetch or 'NO_PREFETCH'}")
        out.append(f"  fsdp_forward_prefetch: {str(cfg.forward_prefetch).lower()}")
    spec = kw.get("activation_checkpointing")
    out.append(f"  fsdp_activation_checkpointing: {'true' if spec is not None else 'false'}")
    if isinstance(spec, SelectiveCheckpoint) or (_every_nth(spec) or 0) > 1:
        notes.append(
            "accelerate checkpoints every wrapped block; per-op or every-nth checkpointing "
            "needs apply_activation_checkpointing in code (Candidate.code())"
        )
    out.append(f"  fsdp_offload_params: {'true' if cfg.cpu_offload else 'false'}")
    out.append(
        f"# gradient_accumulation_steps={c.grad_accum} and per_device_train_batch_size="
        f"{c.micro_batch} go to Accelerator(...) / TrainingArguments"
    )
    if c.grad_accum > 1 and c.sync_each:
        out.append(
            "# the gradients reduced after every micro-batch: "
            "GradientAccumulationPlugin(num_steps=..., sync_each_batch=True)"
        )
    return "\n".join(out + [f"# note: {n}" for n in notes])


def _accelerate_mesh(cfg: ReportConfig, notes: list[str]) -> list[str]:
    """The plan's mesh as accelerate's ``parallelism_config`` (FSDP2 only: accelerate's
    ``ParallelismConfig``, dimensions dp_replicate, dp_shard, cp, tp; a pipeline is refused
    before), with a note for what it cannot say; FSDP1's hybrid sharding is its
    ``fsdp_sharding_strategy``."""
    dims = cfg.parallel_dims.meshed
    if cfg.api != "FSDP2":
        if dims.hsdp:
            notes.append(
                f"accelerate's {cfg.sharding_strategy} shards within each node (torch's "
                f"default groups, no device mesh): the plan's shard groups of {dims.dp_shard} "
                f"ranks need {dims.dp_shard} GPUs a node"
            )
        return []
    if dims.hsdp and dims.dp_replicate == 1:
        notes.append(_REPLICATE_OF_ONE.format(trainer="accelerate's ParallelismConfig"))
    if dims.dp_replicate == 1 and dims.cp == 1 and dims.tp == 1:
        return []  # plain FSDP over every rank: num_processes says it
    if dims.tp > 1:
        notes.append(
            "accelerate's tensor parallelism applies the model's own tp_plan (transformers' "
            "from_pretrained(tp_plan=...)), not parallelize_plan: check that they match"
        )
    if dims.dp_replicate > 1 and dims.dp_shard == 1 and dims.cp * dims.tp > 1:
        notes.append(
            "accelerate refuses dp_replicate_size > 1 with dp_shard_size 1 beside tp or cp"
        )
    prefix = "  parallelism_config_"
    out = [
        "parallelism_config:",
        f"{prefix}dp_replicate_size: {dims.dp_replicate}",
        f"{prefix}dp_shard_size: {dims.dp_shard}",
        f"{prefix}tp_size: {dims.tp}",
        f"{prefix}cp_size: {dims.cp}",
    ]
    if dims.cp > 1:
        out.append(f"{prefix}cp_comm_strategy: {CP_ROTATE_METHOD}")
    return out


def _block_name(c: Candidate, notes: list[str]) -> str:
    """The classes accelerate's ``TRANSFORMER_BASED_WRAP`` wraps: the wrap knob's block, or
    each class all of whose modules are units of their own in the plan (it wraps every
    module of a class it names), with a note naming the units it leaves to the root's."""
    wrap = c.knobs.get("wrap", "")
    m = re.match(r"each (\w+)", wrap)
    if m:
        return m.group(1)
    units = [u.module for u in c.report.units if u.module]
    alone = set(units)
    by_class: dict[str, list[str]] = {}
    for info in c.report.modules:
        if info.fqn:
            by_class.setdefault(info.module_class, []).append(info.fqn)
    blocks = [k for k, fqns in by_class.items() if all(f in alone for f in fqns)]
    wrapped = {f for k in blocks for f in by_class[k]}
    others = [u for u in units if u not in wrapped]
    if others:
        each = " and each ".join(blocks)
        notes.append(
            f"fsdp_transformer_layer_cls_to_wrap wraps each {each}; the plan's units "
            f"{', '.join(map(repr, others))} join the root's unit there"
            if blocks
            else f"the plan's units {', '.join(map(repr, others))} are no class's modules; "
            "accelerate wraps none of them"
        )
    return ",".join(blocks)


__all__ = ["accelerate_yaml", "torchtitan_toml"]
