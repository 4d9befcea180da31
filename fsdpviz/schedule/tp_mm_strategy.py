"""Which of ``aten.mm``'s sharding strategies DTensor picks for a column-wise linear whose
input a style left sequence-sharded (:mod:`fsdpviz.schedule.tp_implicit`), asked of torch's
own sharding propagation: the strategies of ``torch/distributed/tensor/_ops/_matrix_ops.py``
(``mm_strategy``), each costed by ``redistribute_cost``
(``torch/distributed/tensor/_collective_utils.py``), the cheapest taken
(``ShardingPropagator._select_strategy``). It runs on specs alone: a one-dimensional
``DeviceMesh`` made without a process group (``_init_backend=False``, ``_rank=0``), no
tensor moved.

A linear's ``F.linear`` of a 3-D input views it 2-D and multiplies it by the weight's
transpose; its backward multiplies the output's gradient by the weight (the input's
gradient, ``mm_mat1_backward``) and the output's gradient's transpose by the saved input (the
weight's, ``mm_mat2_backward``: the weight's transpose is transposed-contiguous, so it
computes ``(grad.t() @ input).t()``). :func:`mm_choice` answers for one of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from fsdpviz.plan.tensor_parallel import PARTIAL, REPLICATE, Layout


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
def _mesh(size: int) -> object:
    from torch.distributed.device_mesh import DeviceMesh

    # no process group: sharding propagation reads the mesh's shape only, and
    # redistribute_cost its device type's devices on this machine
    # (MeshTopoInfo.build_from_mesh): a CPU mesh, one device a host, so its bandwidths
    # and latencies do not depend on the machine that plans (a tp group over hosts: a
    # GPU mesh within one host weighs an all-to-all against an all-gather with other ones)
    return DeviceMesh("cpu", torch.arange(size), _init_backend=False, _rank=0)


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
) -> MMChoice | None:
    """The strategy of ``aten.mm`` of ``a`` by ``b`` (each a 2-D shape and its layout on a
    tp group of ``tp`` ranks) in ``dtype``, as DTensor's sharding propagation picks it;
    None where this torch cannot be asked so (its ``DeviceMesh`` or sharding propagator
    take other arguments: the caller plans nothing of it and says so).

    >>> mm_choice(((12, 8), ("shard", 0)), ((8, 8), ("shard", 1)), torch.bfloat16, 4).inputs
    (('shard', 0), ('replicate', None))
    """
    try:
        return _propagated(a, b, dtype, tp)
    except (TypeError, AttributeError, ValueError, RuntimeError, AssertionError):
        return None


def _propagated(
    a: tuple[tuple[int, int], Layout],
    b: tuple[tuple[int, int], Layout],
    dtype: torch.dtype,
    tp: int,
) -> MMChoice:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema

    mesh = _mesh(tp)

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
