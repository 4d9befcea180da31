"""Where a report's process groups sit on a machine's nodes.

torch's ``DeviceMesh`` numbers the ranks of a mesh row-major: the last dimension is the
innermost (its ranks are consecutive), and a launcher puts ranks ``n * G`` to
``(n + 1) * G - 1`` on node ``n`` (``G = gpus_per_node``). A process group is the set of
ranks that differ only along one mesh dimension, so the dimensions decide which groups
stay inside a node and which cross nodes:

- FSDP2: ``report.config.mesh`` in the order torchtitan and ``init_device_mesh`` give it
  (``dp_replicate``, ``dp_shard``, ``cp``, ``tp``): HSDP shards inside a node and replicates
  across nodes; FSDP x TP keeps tensor parallelism inside the node, so each data-parallel
  group has one rank per node. With context parallelism FSDP shards over ``dp_shard`` and
  ``cp`` together (torchtitan's flattened ``dp_shard_cp``), and ring attention runs over
  ``cp`` alone. Without a mesh, one dimension of every rank.
- FSDP1: hybrid sharding's shard groups are consecutive ranks (``shard_group_size``,
  default a node's 8), its replicate groups take one rank of each; otherwise one group
  of every rank (``NO_SHARD``'s all-reduce too).

A :class:`Span` says how one group of a dimension sits: its ranks, the nodes it spans,
its ranks per node, and how many groups of that dimension have ranks in one node (they
run their collectives at the same time and share the node's network cards).

Example::

    spans(report.config, 8)["replicate"]  # Span(dim='dp_replicate', ranks=4, nodes=4, ...)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fsdpviz.schema.config import ReportConfig, costed_within_node
from fsdpviz.schema.mesh import HYBRID_STRATEGIES, ParallelDims
from fsdpviz.schema.serial import record_dict


@dataclass(frozen=True)
class Span:
    """One process group of mesh dimension ``dim`` on nodes of ``gpus_per_node`` GPUs.

    ``ranks`` in ``nodes`` nodes, at most ``per_node`` in one; ``sharing``: the groups of
    this dimension with ranks in one node, whose rings cross the node's network cards
    together (each gets ``1 / sharing`` of them).
    """

    dim: str
    ranks: int
    nodes: int
    per_node: int
    sharing: int

    @property
    def across_nodes(self) -> bool:
        return self.nodes > 1

    def to_dict(self) -> dict[str, object]:
        return record_dict(self)


def consecutive(ranks: int, gpus_per_node: int, dim: str = "") -> Span:
    """A group of ``ranks`` consecutive ranks (one dimension of a mesh, or its innermost)."""
    return span_of([(dim, ranks)], 0, gpus_per_node)


def span_of(dims: Sequence[tuple[str, int]], index: int, gpus_per_node: int) -> Span:
    """How the group along ``dims[index]`` of the mesh ``dims`` (outermost first) that holds
    rank 0 sits on nodes of ``gpus_per_node`` GPUs."""
    g = max(1, gpus_per_node)
    sizes = [max(1, int(n)) for _, n in dims]
    world = math.prod(sizes)
    stride = math.prod(sizes[index + 1 :])
    size = sizes[index]
    members = [j * stride for j in range(size)]
    per_node: dict[int, int] = {}
    for r in members:
        per_node[r // g] = per_node.get(r // g, 0) + 1
    # the groups of this dimension with a rank in node 0: ranks that differ in another coordinate
    groups = {(r // (stride * size), r % stride) for r in range(min(g, world))}
    return Span(dims[index][0], size, len(per_node), max(per_node.values()), len(groups))


def mesh_dims(config: ReportConfig, cp: bool = False) -> list[tuple[str, str, int]]:
    """The mesh of a report as ``(role, name, size)``, outermost first; roles are ``pp``,
    ``replicate``, ``shard`` and ``tp`` (FSDP1 without hybrid sharding, or a plan without
    a mesh: one ``shard`` dimension of every rank). FSDP's ``shard`` dimension takes in
    context parallelism's (``dp_shard_cp``), unless ``cp``: then ``cp`` is a role of its own."""
    if config.api == "FSDP2" and config.mesh:
        items = [(str(k), int(v)) for k, v in config.mesh.items()]
        # pipeline parallelism: the pp dimension, outermost (torchtitan's ParallelDims)
        pp = [("pp", *items.pop(0))] if config.pp_world_size and items[0][0] == "pp" else []
        tp = 1 if config.tp_world_size else 0
        # a dimension named cp is context parallelism's (the option parser's
        # ``context_parallel_mesh``), of one rank too: ``init_device_mesh`` keeps a size-1
        # dimension, and FSDP still shards over ``dp_shard`` beside it
        has_cp = any(n == "cp" for n, _ in items)
        data = len(items) - tp - has_cp
        roles = ["replicate", "shard"][-data:] + ["cp"] * has_cp + ["tp"] * tp
        dims = [(role, name, size) for role, (name, size) in zip(roles, items, strict=True)]
        if has_cp and not cp:  # FSDP's group: dp_shard and cp flattened
            at = roles.index("cp")
            _, name, size = dims[at - 1]
            dims[at - 1 : at + 1] = [("shard", f"{name}_cp", size * dims[at][2])]
        return pp + dims
    hybrid = config.sharding_strategy in HYBRID_STRATEGIES
    if config.api == "FSDP1" and (hybrid or config.process_group_size):
        # hybrid sharding's shard groups, also where FSDP switched it to NO_SHARD
        group = config.process_group_size or config.parallel_dims.dp_shard
        split = ParallelDims.fsdp1(config.ranks, group, "HYBRID_SHARD")
        return [("replicate", "replicate", split.dp_replicate), ("shard", "shard", split.dp_shard)]
    return [("shard", "world" if config.api == "FSDP1" else "dp_shard", config.ranks)]


def spans(config: ReportConfig, gpus_per_node: int) -> dict[str, Span]:
    """The :class:`Span` of each role of the report's mesh (``shard``, and ``replicate`` /
    ``tp`` where the mesh has them), and ``process_group`` (FSDP1's process group: the
    shard group, or every rank)."""
    dims = mesh_dims(config)
    named = [(name, size) for _, name, size in dims]
    out = {role: span_of(named, i, gpus_per_node) for i, (role, _, _) in enumerate(dims)}
    out["process_group"] = out["shard"]
    if config.parallel_dims.cp > 1:  # ring attention's groups: the cp dimension alone
        full = mesh_dims(config, cp=True)
        at = next((i for i, d in enumerate(full) if d[0] == "cp"), None)
        if at is not None:
            out["cp"] = span_of([(n, k) for _, n, k in full], at, gpus_per_node)
    return out


def post_forward_span(config: ReportConfig, ranks: int, gpus_per_node: int) -> Span:
    """FSDP2 resharded after forward to ``ranks`` (``ReportConfig.post_forward_ranks``): the
    backward all-gather over consecutive ``ranks`` of the shard dimension
    (``_init_post_forward_mesh_info``: :meth:`ParallelDims.post_forward`)."""
    groups, inner = config.parallel_dims.post_forward(ranks)
    named: list[tuple[str, int]] = []
    for role, name, size in mesh_dims(config):
        if role == "shard":
            named += [(name, groups), (f"{name} (post-forward)", inner)]
        else:
            named.append((name, size))
    index = next(i for i, (n, _) in enumerate(named) if n.endswith("(post-forward)"))
    return span_of(named, index, gpus_per_node)


def tp_strategies_moved(config: ReportConfig, gpus_per_node: int) -> str | None:
    """What is wrong with costing a report of ``config`` on nodes of ``gpus_per_node`` GPUs
    where DTensor's ``mm`` strategies were picked for other nodes: torch costs the tp group
    within a node on one side of ``tp <= gpus_per_node`` and across nodes on the other
    (``MeshTopoInfo.build_from_mesh``), and the report's multiplies depend on it
    (``config.tp_strategy_gpus_per_node``). None where the strategies hold there."""
    planned, tp = config.tp_strategy_gpus_per_node, config.parallel_dims.tp
    if planned is None:
        return None
    if costed_within_node(tp, planned) == costed_within_node(tp, gpus_per_node):
        return None
    where = "within one node" if costed_within_node(tp, planned) else "across nodes"
    there = "across nodes" if where == "within one node" else "within one node"
    return (
        f"tensor parallelism: the report's multiplies were planned with DTensor's mm "
        f"strategies for a tp group of {tp} costed {where}, on nodes of {planned} GPUs; on "
        f"nodes of {gpus_per_node} torch costs it {there} and picks other strategies, with "
        "other collectives, which this costing does not have: plan again with "
        f"analyze(..., machine=...) giving gpus_per_node={gpus_per_node}"
    )
