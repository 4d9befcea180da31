"""Which of ``aten.mm``'s sharding strategies DTensor picks for a column-wise linear whose
input a style left sequence-sharded (:mod:`fsdpviz.schedule.tp_implicit`), asked of torch's
own sharding propagation: the strategies of ``torch/distributed/tensor/_ops/_matrix_ops.py``
(``mm_strategy``), each costed by ``redistribute_cost``
(``torch/distributed/tensor/_collective_utils.py``), the cheapest taken
(``ShardingPropagator._select_strategy``). It runs on specs alone: a one-dimensional
``DeviceMesh`` made without a process group (``_init_backend=False``, ``_rank=0``), no
tensor moved.

Topology: ``redistribute_cost`` weighs a collective by ``MeshTopoInfo.build_from_mesh``,
which takes a mesh dimension as intra-host (87.7 GB/s, 0.6 us a hop) while the devices of
it and the dimensions inside it number at most ``num_devices_per_host`` of the mesh's
device type (``torch.cuda.device_count()`` on a GPU job), inter-host (a fifth of the
bandwidth, 2.7 us a hop) beyond. A GPU job's tp mesh is one-dimensional, so torch costs
its tp group intra-host exactly when ``tp <= device_count()``, wherever its ranks sit.
fsdpviz plans as torchtitan's jobs run, all of a node's GPUs visible to each rank, tp the
innermost dimension: on the nodes of the machine ``analyze(..., machine=...)`` names
(``Machine.gpus_per_node``), else on nodes of :data:`GPUS_PER_NODE` (every GPU preset of
``fsdpviz/cost/hardware.py``). Where a choice would differ on the other side of
``tp <= gpus_per_node`` (:func:`topology_dependent`,
:func:`~fsdpviz.schema.config.costed_within_node`), the caller says so, and the report
states the node size it was planned for (``ReportConfig.tp_strategy_gpus_per_node``), which
a re-costing on other nodes checks.

torch caches ``build_from_mesh`` by mesh (``lru_cache``; a mesh equals another of the same
ranks, device type, dimension names and thread). fsdpviz's meshes carry a dimension name
of their own (:data:`MESH_DIM`), so no cached topology of theirs is a user's mesh's, nor
the other way round, and the devices per host they are costed with are set for the
calling thread alone while torch propagates (:func:`_devices_per_host`).

A linear's ``F.linear`` of a 3-D input views it 2-D and multiplies it by the weight's
transpose; its backward multiplies the output's gradient by the weight (the input's
gradient, ``mm_mat1_backward``) and the output's gradient's transpose by the saved input (the
weight's, ``mm_mat2_backward``: the weight's transpose is transposed-contiguous, so it
computes ``(grad.t() @ input).t()``). :func:`mm_choice` answers for one of them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import _disable_current_modes

from fsdpviz.plan.tensor_parallel import PARTIAL, REPLICATE, Layout
from fsdpviz.schema.config import costed_within_node

GPUS_PER_NODE = 8
"""GPUs a node of a planned job holds where ``analyze`` names no machine, each visible to
every rank on it (torch's ``num_devices_per_host``): every GPU preset's
``Machine.gpus_per_node``."""

MESH_DIM = "fsdpviz_tp"
"""The dimension name prefix of fsdpviz's own meshes (never a user's)."""

_local = threading.local()
_patching = threading.Lock()


@dataclass(frozen=True)
class MMChoice:
    """The strategy DTensor runs ``aten.mm`` by.

    Attributes:
        inputs: the layout each operand is redistributed to first (as it came where it
            does not move).
        output: the layout of the product.
    """

    inputs: tuple[Layout, Layout]
    output: Layout


@functools.lru_cache(maxsize=16)
def _mesh(size: int, devices_per_host: int) -> object:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils._python_dispatch import _disable_current_modes

    # no process group: sharding propagation reads the mesh's shape only, and
    # redistribute_cost the devices per host of its device type (MeshTopoInfo), set by
    # _devices_per_host; the name keeps torch's cached topology of it apart from any
    # other mesh's (one per devices per host). Made where no dispatch mode sees it: asked
    # inside a trace, the cost probe would count its tensors (kept by this cache) as the
    # model's, a forward temporary held to the step's end by the first trace alone
    name = (f"{MESH_DIM}_{devices_per_host}",)
    with _disable_current_modes():
        ranks = torch.arange(size, device="cpu")
        return DeviceMesh("cpu", ranks, mesh_dim_names=name, _init_backend=False, _rank=0)


@contextlib.contextmanager
def _devices_per_host(n: int) -> Iterator[None]:
    """torch's ``_mesh_resources.num_devices_per_host`` answering ``n`` on this thread
    while it runs, as before on any other (a user's DTensor code is not affected)."""
    from torch.distributed.device_mesh import _mesh_resources

    with _patching:
        own = "num_devices_per_host" in vars(_mesh_resources)
        before = _mesh_resources.num_devices_per_host

        def answer(device_type: str) -> int:  # (_local.n is set on this thread alone)
            if getattr(_local, "n", None) is not None:
                return int(_local.n)
            return int(before(device_type))

        _local.n = n
        _mesh_resources.num_devices_per_host = answer  # type: ignore[method-assign]
        try:
            yield
        finally:
            _local.n = None
            if own:
                _mesh_resources.num_devices_per_host = before  # type: ignore[method-assign]
            else:
                del _mesh_resources.num_devices_per_host


def _placement(layout: Layout) -> object:
    from torch.distributed.tensor import Partial, Replicate, Shard

    if layout == REPLICATE:
        return Replicate()
    if layout == PARTIAL:
        return Partial()
    return Shard(layout[1] or 0)


def _layout(placement: object) -> Layout:
    from torch.distributed.tensor import Shard

    if isinstance(placement, Shard):
        return ("shard", placement.dim)
    return PARTIAL if getattr(placement, "is_partial", lambda: False)() else REPLICATE


@functools.lru_cache(maxsize=1024)
def mm_choice(
    a: tuple[tuple[int, int], Layout],
    b: tuple[tuple[int, int], Layout],
    dtype: torch.dtype,
    tp: int,
    devices_per_host: int = GPUS_PER_NODE,
) -> MMChoice | None:
    """The strategy of ``aten.mm`` of ``a`` by ``b`` (each a 2-D shape and its layout on a
    tp group of ``tp`` ranks) in ``dtype``, as DTensor's sharding propagation picks it on
    hosts of ``devices_per_host`` devices (a GPU job's nodes by default); None where this
    torch cannot be asked so (its ``DeviceMesh`` or sharding propagator take other
    arguments: the caller plans nothing of it and says so).

    >>> mm_choice(((12, 8), ("shard", 0)), ((8, 8), ("shard", 1)), torch.bfloat16, 4).inputs
    (('shard', 0), ('replicate', None))
    """
    try:
        # asked outside every dispatch mode: the specs' meta tensors and what the
        # propagator runs on them are no tensors of the traced step (a probe counting them
        # would hold them at the first multiply that asks)
        with _devices_per_host(devices_per_host), _disable_current_modes():
            return _propagated(a, b, dtype, tp, devices_per_host)
    except (TypeError, AttributeError, ValueError, RuntimeError, AssertionError):
        return None


def _propagated(
    a: tuple[tuple[int, int], Layout],
    b: tuple[tuple[int, int], Layout],
    dtype: torch.dtype,
    tp: int,
    devices_per_host: int,
) -> MMChoice:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema

    mesh = _mesh(tp, devices_per_host)

    def spec(shape: tuple[int, int], layout: Layout) -> DTensorSpec:
        meta = torch.empty(shape, dtype=dtype, device="meta")
        tensor_meta = TensorMeta(torch.Size(shape), meta.stride(), dtype)
        return DTensorSpec(mesh, (_placement(layout),), tensor_meta)  # type: ignore[arg-type]

    specs = (spec(*a), spec(*b))
    schema = OpSchema(torch.ops.aten.mm.default, specs, {})
    propagator = DTensor._op_dispatcher.sharding_propagator
    sharding = propagator.propagate_op_sharding_non_cached(schema)
    moved = sharding.redistribute_schema
    chosen = moved.args_spec if moved is not None else specs
    out = sharding.output_spec
    assert not isinstance(out, (list, tuple)) and out is not None
    first, second = (_layout(s.placements[0]) for s in chosen)
    return MMChoice((first, second), _layout(out.placements[0]))


def topology_dependent(
    a: tuple[tuple[int, int], Layout],
    b: tuple[tuple[int, int], Layout],
    dtype: torch.dtype,
    tp: int,
    devices_per_host: int = GPUS_PER_NODE,
) -> bool:
    """Whether DTensor would pick another strategy for ``aten.mm`` of ``a`` by ``b`` on the
    other side of ``tp <= devices_per_host``: its tp group costed across hosts where it fits
    in one of ``devices_per_host`` (nodes of fewer GPUs, or ranks seeing one GPU each), or
    within one where it does not (nodes of ``tp`` GPUs or more)."""
    other = 1 if costed_within_node(tp, devices_per_host) else tp
    return mm_choice(a, b, dtype, tp, devices_per_host) != mm_choice(a, b, dtype, tp, other)
