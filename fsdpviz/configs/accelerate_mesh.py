"""An accelerate config's ``parallelism_config`` section as the mesh accelerate builds.

``accelerate launch`` exports the section's keys (``PARALLELISM_CONFIG_*``) and
``Accelerator`` builds a ``ParallelismConfig`` from them (accelerate 1.x,
``parallelism_config.py``): each size at least 1 (default 1), its product the number of
processes, dimensions of more than one rank only, in the order ``dp_replicate``,
``dp_shard``, ``cp``, ``tp``; FSDP2 shards over ``dp_shard x cp`` and, where
``dp_replicate`` is more than one, all-reduces across it (HSDP). That is fsdpviz's mesh
(:class:`~fsdpviz.schema.mesh.ParallelDims`) in the same names and order.

Example::

    dims = accelerate_mesh({"parallelism_config_dp_replicate_size": 2,
                            "parallelism_config_dp_shard_size": 4}, 8, 2, "fsdp.yaml", [])
    dims.mesh_arg  # ("dp_replicate", 2, "dp_shard", 4)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from fsdpviz.configs.common import check_keys, note
from fsdpviz.configs.torchtitan_job import CP_ROTATE_METHOD
from fsdpviz.errors import ConfigError
from fsdpviz.schema.mesh import ParallelDims

__all__ = ["PREFIX", "accelerate_mesh"]

PREFIX = "parallelism_config_"
_SIZES = ("dp_replicate", "dp_shard", "tp", "cp", "sp")
_KEYS = {
    *(f"{PREFIX}{d}_size" for d in _SIZES),
    f"{PREFIX}cp_backend",
    f"{PREFIX}cp_comm_strategy",
    f"{PREFIX}sp_backend",
    f"{PREFIX}sp_seq_length",
    f"{PREFIX}sp_seq_length_is_variable",
    f"{PREFIX}sp_attn_implementation",
}


def _size(section: Mapping[str, object], dim: str, where: str) -> int:
    key = f"{PREFIX}{dim}_size"
    value = section.get(key, 1)
    try:
        size = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        size = 0
    if isinstance(value, bool) or size < 1:
        raise ConfigError(
            f"{where}: parallelism_config {key} must be a whole number of ranks, 1 or more "
            f"(accelerate's ParallelismConfig refuses less), got {value!r}; write 1 to leave "
            "the dimension out"
        )
    return size


def accelerate_mesh(
    section: object, world_size: int, version: int, where: str, notes: list[str]
) -> ParallelDims | None:
    """The mesh ``ParallelismConfig`` builds from ``section`` for ``world_size`` processes
    under FSDP ``version``; None where it builds none (an empty section, one process).

    Raises:
        ConfigError: a key accelerate does not read, a size below 1, sizes whose product is
            not ``world_size``, a combination ``accelerate launch`` or ``ParallelismConfig``
            refuses, or tensor parallelism (the model's own ``tp_plan``, which fsdpviz does
            not read: pass ``mesh=`` and ``parallelize_plan=`` to ``analyze``).
    """
    if section is None or section == {}:
        return None
    at = f"{where} parallelism_config"
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"{at} must be a mapping of keys (parallelism_config_dp_shard_size: 8, ...), "
            f"got {section!r}"
        )
    notes += check_keys(section, _KEYS, at, ignored={})
    if version != 2:
        raise ConfigError(
            f"{at}: accelerate launch refuses a parallelism_config without fsdp_version: 2 "
            "(FSDP1 builds no device mesh); set fsdp_config.fsdp_version: 2, or remove the "
            "section (fsdp_sharding_strategy: HYBRID_SHARD is FSDP1's HSDP)"
        )
    sizes = {dim: _size(section, dim, at) for dim in _SIZES}
    replicate, shard, tp, cp, sp = sizes.values()
    if sp > 1:
        raise ConfigError(
            f"{at}: {PREFIX}sp_size={sp} is DeepSpeed's sequence parallelism (Ulysses), not "
            f"FSDP's, and is not modelled; write {PREFIX}sp_size: 1"
        )
    backend = str(section.get(f"{PREFIX}cp_backend", "torch"))
    if backend != "torch":
        raise ConfigError(f"{at}: {PREFIX}cp_backend must be torch, got {backend!r}")
    strategy = str(section.get(f"{PREFIX}cp_comm_strategy", CP_ROTATE_METHOD))
    if strategy not in ("allgather", "alltoall"):
        raise ConfigError(
            f"{at}: {PREFIX}cp_comm_strategy must be allgather or alltoall, got {strategy!r}"
        )
    if cp > 1 and strategy != CP_ROTATE_METHOD:
        note(notes, f"{at}: {PREFIX}cp_comm_strategy={strategy!r} is not modelled; ring "
                    f"attention is planned with {CP_ROTATE_METHOD!r} (keys and values gathered "
                    "once per attention)")  # fmt: skip
    total = math.prod(sizes.values())
    if total == 1:
        if world_size == 1:
            return None
        raise ConfigError(
            f"{at}: every size is 1, so accelerate replicates over all {world_size} processes "
            "(dp_replicate_size = num_processes) and FSDP2 has no dimension to shard across; "
            f"write {PREFIX}dp_shard_size: {world_size}, or remove the section"
        )
    if total != world_size:
        given = " x ".join(f"{PREFIX}{d}_size {s}" for d, s in sizes.items() if s > 1)
        try:  # the dp_shard_size the others leave, where they divide the processes
            filled = ParallelDims.filled(world_size, dp_replicate=replicate, cp=cp, tp=tp)
            fix = f" ({PREFIX}dp_shard_size: {filled.dp_shard})"
        except ConfigError:
            fix = ""
        raise ConfigError(
            f"{at}: {given} is {total} ranks, not num_processes {world_size} (accelerate's "
            f"ParallelismConfig refuses it); make their product {world_size}{fix}, or "
            "num_processes theirs"
        )
    if replicate > 1 and shard == 1 and tp * cp > 1:
        raise ConfigError(
            f"{at}: {PREFIX}dp_replicate_size > 1 with {PREFIX}dp_shard_size 1 beside tp or cp "
            "is refused by accelerate's ParallelismConfig; give the ranks to "
            f"{PREFIX}dp_shard_size instead"
        )
    if shard == 1 and cp == 1:
        raise ConfigError(
            f"{at}: {PREFIX}dp_shard_size and {PREFIX}cp_size are both 1, so FSDP2 has no "
            "dimension to shard across (accelerate refuses it); give ranks to "
            f"{PREFIX}dp_shard_size"
        )
    dims = ParallelDims(world_size=world_size, dp_replicate=replicate, dp_shard=shard, cp=cp,
                        tp=tp, hsdp=replicate > 1)  # fmt: skip
    if tp > 1:
        raise ConfigError(
            f"{at}: {PREFIX}tp_size={tp}: accelerate applies the model's own tensor-parallel "
            "plan (transformers' from_pretrained(tp_plan='auto'), its base_model_tp_plan), "
            "which fsdpviz does not read from an accelerate config; plan it with "
            f"analyze(..., mesh={dims.mesh_arg!r}, parallelize_plan={{module name: "
            "ParallelStyle, ...}) as that plan shards each layer, or write "
            f"{PREFIX}tp_size: 1"
        )
    return dims
