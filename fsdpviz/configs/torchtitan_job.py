"""A torchtitan job file read and checked: its TOML, its sections and keys as torchtitan
has them now (older files' keys moved, with a note each), the mesh's degrees, and the
job's float8 and compile settings.

:func:`~fsdpviz.configs.torchtitan.from_torchtitan` makes the model and batch of what it
reads, :mod:`fsdpviz.configs.torchtitan_plan` the plan.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsdpviz.configs.common import note
from fsdpviz.configs.torchtitan_model import TransformerBlock
from fsdpviz.configs.torchtitan_plan import RESHARD_KEY
from fsdpviz.errors import ConfigError, did_you_mean
from fsdpviz.schema.mesh import ParallelDims

# torchtitan's collective for the ring's keys and values, and the one fsdpviz plans (torch's
# default: every rank's gathered once per attention, schedule/cp_emulation.py)
CP_ROTATE_KEY = "context_parallel_rotate_method"
CP_ROTATE_METHOD = "allgather"

# Keys of the sections that decide the plan (torchtitan/config/job_config.py); the other
# sections (job, metrics, optimizer, checkpoint, ...) do not change what FSDP does.
_SECTIONS: dict[str, set[str]] = {
    "model": {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters",
              "print_after_conversion"},
    "training": {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len",
                 "max_norm", "steps", "enable_cpu_offload", "dtype", "mixed_precision_param",
                 "mixed_precision_reduce", "gc_freq", "gc_debug", "dataloader"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    RESHARD_KEY, "tensor_parallel_degree",
                    "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_microbatches", "pipeline_parallel_split_points",
                    "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree",
                    "context_parallel_load_balancer", CP_ROTATE_KEY,
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


def load_job(job: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(job, Mapping):
        return dict(job), "torchtitan job"
    path = Path(job)
    if not path.is_file():
        raise ConfigError(f"torchtitan job file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text()), path.name
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None


def upgrade_keys(data: dict[str, Any], where: str) -> list[str]:
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
            # the blocks, as in 2024 (from April to August 2025 torchtitan compiled the loss
            # too under this key; a file cannot say which, so components= says it)
            data["compile"].setdefault("components", ["model"])
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


def check_sections(data: dict[str, Any], where: str) -> list[str]:
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
                tip = did_you_mean(key, sorted(_SECTIONS[section]))
                problems.append(f"{where}: unknown key {section}.{key}{tip}")
    if problems:
        raise ConfigError("\n".join(problems))
    return []


def mesh_degrees(
    parallel: dict[str, Any], world_size: int | None, where: str, notes: list[str]
) -> ParallelDims:
    """The degrees of torchtitan's ``ParallelDims``: ``data_parallel_shard_degree = -1``
    takes the ranks the other degrees leave."""
    degrees = {
        key: int(parallel.get(key, 1))
        for key in ("data_parallel_replicate_degree", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "context_parallel_degree")
    }  # fmt: skip
    for key, value in degrees.items():
        if value < 1:
            raise ConfigError(f"{where}: parallelism.{key} must be 1 or more, got {value}")
    replicate, tp, pp, cp = degrees.values()
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
        try:
            return ParallelDims.filled(ranks, dp_replicate=replicate, cp=cp, tp=tp, pp=pp)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}; give a world size that does") from None
    if shard < 1:
        raise ConfigError(
            f"{where}: parallelism.data_parallel_shard_degree must be -1 or 1 or more, got {shard}"
        )
    dims = ParallelDims.product(dp_replicate=replicate, dp_shard=shard, cp=cp, tp=tp, pp=pp,
                                hsdp=replicate > 1)  # fmt: skip
    if world_size is not None and world_size != dims.world_size:
        note(
            notes,
            f"{where}: data_parallel_shard_degree = {shard} x the other degrees ({others}) "
            f"is planned, not the {world_size} ranks given",
        )
    return dims


def float8_option(data: dict[str, Any], where: str, notes: list[str]) -> dict[str, object] | None:
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


def compile_option(section: dict[str, Any], where: str, notes: list[str]) -> bool | list[type]:
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


__all__ = [
    "CP_ROTATE_KEY",
    "CP_ROTATE_METHOD",
    "check_sections",
    "compile_option",
    "float8_option",
    "load_job",
    "mesh_degrees",
    "upgrade_keys",
]
