"""The gradients FSDP2 reduces for each unit, per parameter, read from a report: their bytes
on one rank (:func:`param_grads`, tensor parallelism's share: :func:`tp_local_shape`), the
units whose accumulated gradients FSDP2 keeps in the reduce dtype (:func:`upcasts`,
:class:`Upcast`) and the gradients its reduction rebuilds where ``shard_placement_fn``
shards on a dim other than 0 (:func:`placed_grads`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from fsdpviz.cost.sizes import itemsize
from fsdpviz.schema.report import Report, param_shapes

__all__ = ["Upcast", "param_grads", "placed_grads", "tp_chunk_shares", "tp_local_shape", "upcasts"]


@dataclass(frozen=True)
class Upcast:
    """FSDP2's accumulated gradient of one unit in the reduce dtype (gradient accumulation
    with ``set_requires_gradient_sync(False)`` and a ``reduce_dtype`` other than the
    gradients'): ``grads`` holds each parameter's unsharded gradient bytes in the compute
    dtype, in the order FSDP2 casts them (``FSDPParam.to_accumulated_grad_if_needed``), and
    ``ratio`` the reduce dtype's bytes per compute dtype byte."""

    grads: tuple[int, ...]
    ratio: float

    def cast_peak(self) -> int:
        """The most bytes above the unit's compute-dtype gradients while they are cast one
        parameter at a time: the casts made so far and the one being made are alive, the
        compute-dtype gradients not yet cast too."""
        most = made = freed = 0
        for g in self.grads:
            made += round(g * self.ratio)
            most = max(most, made - freed)
            freed += g
        return most


_SHARD = re.compile(r"Shard\((-?\d+)\)")


def tp_local_shape(shape: list[int], placement: str, tp: int) -> list[int]:
    """One rank's piece of a parameter of ``shape`` placed ``placement`` over ``tp`` ranks
    (as ``Unit.tp_placements`` names it, ``"Shard(0)"``, ``"Replicate()"``): the first
    rank's chunk (``torch.chunk``: the largest one)."""
    placed = _SHARD.fullmatch(placement) if tp > 1 else None
    if placed is None or not shape:
        return shape
    out = list(shape)
    d = int(placed.group(1)) % len(out)
    out[d] = -(-out[d] // tp)
    return out


def tp_chunk_shares(report: Report) -> dict[str, Fraction]:
    """FSDP2 x TP: each parameter sharded on its dim 0 over the tp ranks (``Shard(0)``), by
    FQN, with the part of it one rank holds (the first rank's chunk, the largest: a
    gradient redistributed to it holds as many bytes)."""
    tp = report.config.parallel_dims.tp
    if report.config.api != "FSDP2" or tp <= 1:
        return {}
    shapes = param_shapes(report.modules)  # by the names tp_placements keys
    out: dict[str, Fraction] = {}
    for u in report.units:
        for fqn, placement in u.tp_placements.items():
            shape = list(shapes.get(fqn) or [])
            if placement == "Shard(0)" and shape and shape[0]:
                out[fqn] = Fraction(tp_local_shape(shape, placement, tp)[0], shape[0])
    return out


_GRADS: dict[tuple[int, int, bool], tuple[Any, Any, dict[str, tuple[int, ...]]]] = {}


def param_grads(report: Report, last: bool = False) -> dict[str, tuple[int, ...]]:
    """FSDP2: each trainable unit's parameter gradients on one rank (its trainable
    parameters': frozen and unused ones have none), bytes in the compute dtype, in the
    unit's parameter order (FSDP2's ``fsdp_params``): the shape autograd gives them
    (tensor parallelism's local shard, unpadded). ``last``: only each unit's last
    parameter's. Empty for FSDP1. Remembered for the units and modules it was given (a
    report's memory is modelled again for each option and iteration)."""
    if report.config.api != "FSDP2":
        return {}
    key = (id(report.units), id(report.modules), last)
    found = _GRADS.get(key)
    if found is not None and found[0] is report.units and found[1] is report.modules:
        return found[2]
    if len(_GRADS) >= 64:
        _GRADS.clear()
    out = _param_grads(report, last)
    _GRADS[key] = (report.units, report.modules, out)
    return out


def _param_grads(report: Report, last: bool) -> dict[str, tuple[int, ...]]:
    shapes = param_shapes(report.modules)
    tp = report.config.parallel_dims.tp
    out: dict[str, tuple[int, ...]] = {}
    for u in report.units:
        if u.requires_grad is False or not u.params:
            continue
        size = itemsize(u.compute_dtype or u.dtype)
        grads = []
        frozen = u.gradless_params
        params = [p for p in u.params if p not in frozen] if frozen else u.params
        if not params:  # no gradient reaches any of them: nothing reduced
            continue
        for p in params[-1:] if last else params:
            shape = list(shapes.get(p, []))
            shape = tp_local_shape(shape, u.tp_placements.get(p, ""), tp)
            grads.append(math.prod(shape) * size)
        out[u.module] = tuple(grads)
    return out


def upcasts(report: Report, grads: dict[str, tuple[int, ...]]) -> dict[str, Upcast]:
    """The units whose gradients FSDP2 accumulates in the reduce dtype under gradient
    accumulation (``grads``: :func:`param_grads`): a unit with a ``reduce_dtype`` its
    gradients (the compute dtype) are not in. FSDP1's ``no_sync`` keeps them in the compute
    dtype, as autograd accumulates them."""
    out: dict[str, Upcast] = {}
    for u in report.units:
        grad = u.compute_dtype or u.dtype
        if u.module not in grads or not u.reduce_dtype or u.reduce_dtype == grad:
            continue
        out[u.module] = Upcast(grads[u.module], itemsize(u.reduce_dtype) / itemsize(grad))
    return out


def placed_grads(report: Report) -> dict[str, tuple[int, ...]]:
    """FSDP2: for each unit with parameters sharded on a dim other than 0, its trainable
    parameters' gradients (bytes, compute dtype, in :func:`param_grads`' order) where the
    reduction copies them (``torch.cat(torch.chunk(grad, W, dim), dim=0)``), 0 where it
    does not (dim 0)."""
    if not any(u.shard_dims for u in report.units):
        return {}
    grads = param_grads(report)
    out: dict[str, tuple[int, ...]] = {}
    for u in report.units:
        if not u.shard_dims or u.module not in grads:
            continue
        frozen = u.gradless_params
        params = [p for p in u.params if p not in frozen]
        out[u.module] = tuple(
            g if p in u.shard_dims else 0 for p, g in zip(params, grads[u.module], strict=True)
        )
    return out
