"""``ParallelDims``: the ranks of a job by mesh dimension, and every count derived from them.

One object owns the rank arithmetic, as torchtitan's ``ParallelDims`` does: the degrees of
pipeline, data (replicate and shard), context and tensor parallelism, the job's world size,
and what the rest of fsdpviz asks of them (the ranks FSDP shards a unit over, the replicas
whose gradients are all-reduced, whether a plan is HSDP, the data-parallel ranks, the mesh
as ``init_device_mesh`` takes it). A report's is :attr:`ReportConfig.parallel_dims
<fsdpviz.schema.config.ReportConfig.parallel_dims>`, derived from the config's counts, never
stored.

Example::

    dims = ParallelDims(world_size=64, dp_replicate=2, dp_shard=4, tp=8, hsdp=True)
    dims.dp, dims.dp_shard_cp, dims.hsdp    # 8, 4, True
    dims.device_mesh                        # {'dp_replicate': 2, 'dp_shard': 4, 'tp': 8}
    ParallelDims.filled(64, tp=8).dp_shard  # 8: the ranks the other degrees leave
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from fsdpviz.errors import ConfigError

__all__ = ["HYBRID_STRATEGIES", "ParallelDims"]

HYBRID_STRATEGIES = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """The ranks of a job by mesh dimension (see the module docstring).

    Attributes:
        world_size: every rank of the job (1 where a recording could not tell).
        dp_replicate: the copies of each shard whose gradients are all-reduced across them
            after their reduction: HSDP's replicate dimension, FSDP1's shard groups under
            hybrid sharding (1 without).
        dp_shard: the ranks FSDP shards a parameter over, context parallelism's aside
            (FSDP1: its shard group, 1 under ``NO_SHARD``).
        cp: the ranks of the context-parallel dimension (1 without).
        tp: the ranks of the tensor-parallel dimension (1 without).
        pp: the ranks of the pipeline-parallel dimension (1 without).
        hsdp: whether gradients are all-reduced across the replicas after their reduction:
            FSDP2 on a data-parallel mesh with a replicate dimension, of one rank too
            (``HSDPMeshInfo``: ``foreach_reduce`` all-reduces over it whatever its size),
            FSDP1's hybrid sharding over more than one shard group.

    FSDP1's ``NO_SHARD`` all-reduces each gradient over its whole process group, which is
    neither shard nor replicas: there ``dp_shard`` and ``dp_replicate`` are both 1 and the
    degrees' product falls short of ``world_size``.
    """

    world_size: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    hsdp: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "hsdp" and (type(value) is not int or value < 1):
                raise ConfigError(f"ParallelDims.{f.name} must be 1 or more, got {value!r}")

    @classmethod
    def filled(
        cls,
        world_size: int,
        *,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        cp: int = 1,
        tp: int = 1,
        pp: int = 1,
    ) -> ParallelDims:
        """The degrees on ``world_size`` ranks, the one given as -1 (``dp_shard`` by
        default, or ``dp_replicate``) the ranks the others leave, as torchtitan's
        ``data_parallel_shard_degree = -1``; HSDP where ``dp_replicate`` is more than one.

        Raises:
            ConfigError: the other degrees' product does not divide ``world_size``.
        """
        others = math.prod(d for d in (dp_replicate, dp_shard, cp, tp, pp) if d != -1)
        if world_size % others or (-1 not in (dp_replicate, dp_shard) and world_size != others):
            raise ConfigError(
                f"{world_size} ranks do not divide by the other degrees' product {others} "
                "(replicate x tp x pp x cp)"
            )
        rest = world_size // others
        replicate = rest if dp_replicate == -1 else dp_replicate
        shard = rest if dp_shard == -1 else dp_shard
        return cls(world_size=world_size, dp_replicate=replicate, dp_shard=shard,
                   cp=cp, tp=tp, pp=pp, hsdp=replicate > 1)  # fmt: skip

    @classmethod
    def product(
        cls,
        *,
        dp_replicate: int = 1,
        dp_shard: int = 1,
        cp: int = 1,
        tp: int = 1,
        pp: int = 1,
        hsdp: bool = False,
    ) -> ParallelDims:
        """The degrees given, on the ranks their product makes (:meth:`filled`'s converse:
        the world size from the degrees, as a mesh of these dimensions has it).

        Example::

            ParallelDims.product(dp_replicate=2, dp_shard=4, hsdp=True).world_size  # 8
        """
        world = math.prod((dp_replicate, dp_shard, cp, tp, pp))
        return cls(world_size=world, dp_replicate=dp_replicate, dp_shard=dp_shard,
                   cp=cp, tp=tp, pp=pp, hsdp=hsdp)  # fmt: skip

    @classmethod
    def stated(
        cls,
        world_size: int,
        shard_group: int,
        *,
        dp_replicate: int | None = None,
        cp: int = 1,
        tp: int = 1,
        pp: int = 1,
        hsdp: bool | None = None,
    ) -> ParallelDims:
        """The degrees from the counts a report states: FSDP's shard group of
        ``shard_group`` ranks (``dp_shard x cp``) on ``world_size`` ranks, ``dp_replicate``
        (where not given) the ranks the shard group and the tp and pp dimensions leave, HSDP
        (where not given) where more than one replica. Counts that do not divide, as a
        report may state them, are rounded down, each at least 1.

        Example::

            ParallelDims.stated(64, 8, tp=4).dp_replicate  # 2: 64 ranks over 8 x 4
        """
        if dp_replicate is None:
            dp_replicate = max(1, world_size // (shard_group * tp * pp))
        return cls(world_size=world_size, dp_replicate=dp_replicate,
                   dp_shard=max(1, shard_group // cp), cp=cp, tp=tp, pp=pp,
                   hsdp=dp_replicate > 1 if hsdp is None else hsdp)  # fmt: skip

    @classmethod
    def fsdp1(cls, world_size: int, group_size: int, strategy: str) -> ParallelDims:
        """FSDP1's ``strategy`` (a ``ShardingStrategy`` name) on a process group of
        ``group_size`` of ``world_size`` ranks: ``dp_shard`` the ranks one FlatParameter is
        sharded over, ``dp_replicate`` the copies of each shard that hybrid sharding
        all-reduces across (1 when it does not).

        Example::

            ParallelDims.fsdp1(8, 4, "HYBRID_SHARD")  # dp_shard 4, dp_replicate 2
            ParallelDims.fsdp1(8, 8, "NO_SHARD")      # 1, 1: all-reduced in its group
        """
        if strategy == "NO_SHARD":
            return cls(world_size=world_size)
        replicas = max(1, world_size // group_size) if strategy in HYBRID_STRATEGIES else 1
        return cls(world_size=world_size, dp_shard=group_size, dp_replicate=replicas,
                   hsdp=replicas > 1)  # fmt: skip

    @property
    def dp(self) -> int:
        """The data-parallel ranks, each fed its own batch: ``dp_replicate x dp_shard``."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_shard_cp(self) -> int:
        """The ranks one unit's parameters are sharded over, FSDP's shard group:
        ``dp_shard x cp`` (torchtitan's ``dp_shard_cp``; FSDP shards over both)."""
        return self.dp_shard * self.cp

    @property
    def dp_cp(self) -> int:
        """The ranks outside the tensor- and pipeline-parallel dimensions, ``dp_replicate x
        dp_shard x cp`` (torchtitan's ``dp_cp``, the loss's all-reduce), taken from
        ``world_size`` (FSDP1's ``NO_SHARD`` all-reduces over these ranks)."""
        return self.world_size // (self.tp * self.pp)

    @property
    def meshed(self) -> ParallelDims:
        """These degrees as a mesh of them has them, their product ``world_size``: where
        they fall short (FSDP1's ``NO_SHARD``, which all-reduces each gradient over its
        whole group), every data-parallel rank a replica and ``dp_shard`` 1, as
        torchtitan's DDP.

        Example::

            ParallelDims.fsdp1(8, 8, "NO_SHARD").meshed.dp_replicate  # 8
        """
        if self.dp * self.cp * self.tp * self.pp == self.world_size:
            return self
        return replace(self, dp_replicate=self.dp_cp // self.cp, dp_shard=1)

    def post_forward(self, ranks: int) -> tuple[int, int]:
        """FSDP2's shard group as resharding to ``ranks`` after forward splits it for the
        backward all-gather (torch's ``_init_post_forward_mesh_info``): ``(groups, ranks)``,
        outermost first, ``groups`` of ``ranks`` consecutive ranks each.

        Example::

            ParallelDims.filled(16).post_forward(8)  # (2, 8): a node's 8 ranks, twice
        """
        return max(1, self.dp_shard_cp // ranks), ranks

    @property
    def device_mesh(self) -> dict[str, int]:
        """The mesh as ``init_device_mesh`` takes it, ``{name: size}`` outermost first, in
        torchtitan's order and names: ``pp``, ``dp_replicate`` (where :attr:`hsdp`),
        ``dp_shard`` (always), ``cp`` and ``tp`` (where more than one rank)."""
        dims = {"pp": self.pp if self.pp > 1 else 0}
        dims["dp_replicate"] = self.dp_replicate if self.hsdp else 0
        dims["dp_shard"] = self.dp_shard
        dims.update(cp=self.cp if self.cp > 1 else 0, tp=self.tp if self.tp > 1 else 0)
        return {name: size for name, size in dims.items() if size}

    @property
    def mesh_arg(self) -> tuple[str | int, ...]:
        """:attr:`device_mesh` as ``analyze(mesh=...)`` takes it: ``("dp_shard", 32, "tp", 8)``."""
        return tuple(x for dim in self.device_mesh.items() for x in dim)
