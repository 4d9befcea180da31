"""How FSDP2 shards a group's parameters: the dim each is sharded on (its call's
``shard_placement_fn``, checked as ``fully_shard`` checks it), one rank's padded shard of
it (:func:`shard_shape`, :func:`sharded_numel`), and the group's :class:`Unit` (its sizes,
dtypes and trainable elements, one rank's under tensor parallelism).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import Shard

from fsdpviz.errors import ConfigError, FSDPConfigError
from fsdpviz.plan.fsdp2_group import Group
from fsdpviz.plan.fsdp2_options import FSDP2Options
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.tensor_parallel import layout_name, local_shape
from fsdpviz.schema.report import Unit, dtype_name, unit_label

# [Note: shard_placement_fn]
# fully_shard(module, shard_placement_fn=fn) calls fn on each parameter of the call, the
# user's nn.Parameter before it is sharded (FSDPParam._init_sharded_param; torch 2.13 calls
# it once more per parameter beforehand, to group parameters by mesh). fn returns Shard(dim)
# or None (Shard(0)); a negative dim counts from the end. FSDP2 then chunks the parameter
# along dim over the shard ranks (torch.chunk, the first chunk the largest) and pads every
# rank's shard to the first chunk's size: dim 0 may be uneven (ranks past the end hold
# padding only), another dim must divide evenly (NotImplementedError otherwise). The shard
# is ceil(size[dim] / W) rows of that dim times the other dims; all-gather input, output and
# reduce-scatter sizes follow. A parameter on dim != 0 costs two extra copies per step
# (_fsdp_collectives.py): the copy-out of its all-gather writes into a temporary as large as
# the unsharded parameter and torch.cat's the ranks' chunks along dim into the parameter
# (foreach_all_gather_copy_out), and the reduction rebuilds its gradient as
# torch.cat(torch.chunk(grad, W, dim), dim=0) before the reduce-scatter's chunk_cat
# (foreach_reduce). fsdpviz calls fn once per parameter of each call, on the user's parameter.


def shard_shape(shape: Sequence[int], world_size: int, dim: int = 0) -> list[int]:
    """One rank's padded shard of a parameter of ``shape`` that FSDP2 shards on ``dim``
    over ``world_size`` ranks: ``ceil(shape[dim] / world_size)`` along ``dim``.

    Example::

        shard_shape([6, 8], 4)         # [2, 8]: ranks 0-2 hold rows, rank 3 padding
        shard_shape([6, 8], 4, dim=1)  # [6, 2]
    """
    out = list(shape)
    out[dim] = math.ceil(out[dim] / world_size)
    return out


def sharded_numel(shape: Sequence[int], world_size: int, dim: int = 0) -> int:
    """Elements of a parameter of ``shape`` that each rank holds: FSDP2 shards ``dim``
    (default 0), padded to a multiple of ``world_size``."""
    return math.prod(shard_shape(shape, world_size, dim))


def _dims(dims: Sequence[int] | None, n: int) -> Sequence[int]:
    return dims if dims else [0] * n


def trainable_fields(
    fqns: Sequence[str],
    shapes: Sequence[Sequence[int]],
    trains: Sequence[bool],
    world_size: int,
    dims: Sequence[int] | None = None,
    unused: Collection[str] = (),
) -> dict[str, Any]:
    """``Unit``'s fields for a group that mixes frozen and trainable parameters (``trains``:
    each one's ``requires_grad``), or whose ``unused`` ones no gradient reaches: FSDP2
    reduce-scatters the gradients that exist, one padded shard per parameter with one
    (``dims``: the dim each is sharded on, default 0), and the optimizer keeps state for
    those shards only."""
    ds = _dims(dims, len(shapes))
    steps = [t and f not in unused for f, t in zip(fqns, trains, strict=True)]
    out: dict[str, Any] = {
        "frozen_params": [f for f, t in zip(fqns, trains, strict=True) if not t],
        "trainable_numel": sum(math.prod(s) for s, t in zip(shapes, steps, strict=True) if t),
        "trainable_sharded_numel": sum(
            sharded_numel(s, world_size, d) for s, t, d in zip(shapes, steps, ds, strict=True) if t
        ),
    }
    if unused:
        out["unused_params"] = [f for f, t in zip(fqns, trains, strict=True) if t and f in unused]
    return out


def mark_unused(
    groups: Sequence[Group],
    opts: FSDP2Options,
    reached: Collection[int],
    placements: Mapping[Any, Any],
) -> None:
    """State in each group's unit the parameters that require grad but that no gradient
    reached in the traced step (``reached``: the ids of those that got one):
    ``FSDPParamGroup.post_backward`` reduce-scatters only the parameters whose ``.grad``
    exists, and the optimizer keeps no state for one without (``Unit.unused_params``)."""
    for g in groups:
        if g.schema is None:
            continue
        fqns = g.param_fqns
        unused = {f for f, p in zip(fqns, g.params, strict=True)
                  if p.requires_grad and id(p) not in reached}  # fmt: skip
        if not unused:
            continue
        local = [local_shape(p.shape, placements.get(p), opts.parallel_dims.tp) for p in g.params]
        trains = [p.requires_grad for p in g.params]
        dims = g.shard_dims or None
        fields = trainable_fields(fqns, local, trains, opts.parallel_dims.dp_shard_cp, dims, unused)
        g.schema = replace(g.schema, **fields)


def dtype_fields(
    fqns: Sequence[str],
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[Any],
    world_size: int,
    dims: Sequence[int] | None = None,
) -> dict[str, Any]:
    """``Unit``'s fields for a group of parameters in several dtypes: each dtype's
    parameters, and their elements in all and in one rank's padded shard."""
    names: dict[str, list[str]] = {}
    numels: dict[str, list[int]] = {}
    for fqn, shape, dt, d in zip(fqns, shapes, dtypes, _dims(dims, len(shapes)), strict=True):
        name = dtype_name(dt) or str(dt)
        names.setdefault(name, []).append(fqn)
        counts = numels.setdefault(name, [0, 0])
        counts[0] += math.prod(shape)
        counts[1] += sharded_numel(shape, world_size, d)
    return {"param_dtypes": names, "dtype_numels": numels}


def placement_fn_of(value: Any, name: str, fqns: tuple[str, ...]) -> Any:
    """The ``shard_placement_fn`` of the ``fully_shard`` call ``name`` (modules ``fqns``):
    the option's function, or its mapping's entry for the call (by the call's name or one
    of its modules' FQNs), else None."""
    if isinstance(value, Mapping):
        for key in (name, *fqns):
            if key in value:
                return value[key]
        return None
    return value


def shard_dim(fn: Callable[[Any], Any], param: nn.Parameter, fqn: str, unit: str) -> int:
    """The dim FSDP2 shards ``param`` on: ``fn(param)`` checked as ``fully_shard`` checks it
    (``Shard(dim)`` or None; a negative dim counts from the end)."""
    where = f"shard_placement_fn of {unit_label(unit)}"
    shape = tuple(param.shape)
    try:
        result = fn(param)
    except Exception as e:
        raise ConfigError(
            f"{where} raised {type(e).__name__} for parameter {fqn!r} {list(shape)}: {e}"
        ) from e
    if result is None:
        return 0
    if type(result).__name__ == "ShardPlacementResult":
        raise ConfigError(
            f"{where} returned a ShardPlacementResult for {fqn!r}: a parameter on a mesh of its "
            "own is not modelled; return Shard(dim) (or None for Shard(0)) on the call's mesh"
        )
    if not isinstance(result, Shard):
        raise FSDPConfigError(
            f"{where} returned {result!r} for {fqn!r} {list(shape)}: fully_shard takes Shard(dim) "
            "or None (None shards dim 0) and raises ValueError('Invalid shard_placement_fn "
            "result') for anything else; return torch.distributed.tensor.Shard(dim)"
        )
    ndim = len(shape)
    dim = result.dim + ndim if result.dim < 0 else result.dim
    if not 0 <= dim < ndim:
        raise FSDPConfigError(
            f"{where} returned Shard({result.dim}) for {fqn!r}, a {ndim}-D parameter "
            f"{list(shape)}: FSDP2 fails on it (Shard dim {result.dim} is invalid for a {ndim}D "
            f"tensor); return a dim from {-ndim} to {ndim - 1} (negative dims count from the end)"
        )
    return dim


def check_even_shard(shape: Sequence[int], dim: int, world_size: int, fqn: str, unit: str) -> None:
    """FSDP2 shards a dim other than 0 only evenly (``_init_sharded_param``)."""
    if dim > 0 and shape[dim] % world_size:
        raise FSDPConfigError(
            f"shard_placement_fn of {unit_label(unit)} shards {fqn!r} {list(shape)} on dim {dim}, "
            f"whose size {shape[dim]} the {world_size} shard ranks do not divide: FSDP2 raises "
            f"NotImplementedError (FSDP does not support uneven sharding on dim {dim}). Shard it "
            "on dim 0 (uneven dim-0 shards are padded) or on a dim the shard ranks divide"
        )


def check_placements_reshard(groups: Sequence[Group], world_size: int) -> None:
    """FSDP2 fails in the copy-out of a parameter sharded on a dim other than 0 once it
    resharded to a smaller post-forward mesh (:meth:`Group.post_forward_ranks` of the
    ``world_size`` shard ranks)."""
    for g in groups:
        if any(g.shard_dims) and g.post_forward_ranks(world_size) is not None:
            raise FSDPConfigError(
                f"{g.reshard_text()}, whose shard_placement_fn "
                "shards parameters on a dim other than 0: FSDP2's backward all-gather from the "
                "post-forward mesh fails in its copy-out (IndexError in "
                f"foreach_all_gather_copy_out); use {RESHARD.code(True)} or False for it"
            )


def shard_fields(
    unit: str,
    fqns: Sequence[str],
    shapes: Sequence[Sequence[int]],
    dims: Sequence[int],
    world_size: int,
    *,
    trains: Sequence[bool] | None = None,
    unused: Collection[str] = (),
    dtypes: Sequence[Any] | None = None,
    stated: bool = False,
) -> dict[str, Any]:
    """``Unit``'s fields that follow from sharding the parameters ``fqns`` of ``unit`` (one
    rank's ``shapes``) on ``dims`` over ``world_size`` ranks, each checked as FSDP2 checks it:
    the padded and sharded elements; the trainable ones where ``trains`` is given
    (:func:`trainable_fields`), each dtype's where ``dtypes`` is (:func:`dtype_fields`), each
    shard's shape where ``stated``. A plan and a replay on other ranks both size units so."""
    for shape, d, fqn in zip(shapes, dims, fqns, strict=True):
        check_even_shard(shape, d, world_size, fqn, unit)
    sharded = sum(sharded_numel(s, world_size, d) for s, d in zip(shapes, dims, strict=True))
    out: dict[str, Any] = {"padded_numel": sharded * world_size, "sharded_numel": sharded}
    if trains is not None:
        out |= trainable_fields(fqns, shapes, trains, world_size, dims, unused)
    if dtypes is not None:
        out |= dtype_fields(fqns, shapes, dtypes, world_size, dims)
    if stated:
        out["shard_shapes"] = {
            f: shard_shape(s, world_size, d) for f, s, d in zip(fqns, shapes, dims, strict=True)
        }
    return out


def group_unit(
    group: Group, opts: FSDP2Options, shared: dict[str, str], placements: dict[Any, Any]
) -> Unit:
    """The unit of ``group``. Under tensor parallelism FSDP2 shards each rank's tp-local
    tensor (``FSDPParam._orig_size`` is the local size): sizes are one rank's."""
    ws = opts.parallel_dims.dp_shard_cp
    local = [local_shape(p.shape, placements.get(p), opts.parallel_dims.tp) for p in group.params]
    dims = _dims(group.shard_dims, len(local))
    dtypes = {p.dtype for p in group.params}
    # FSDP2's orig dtype: the trainable parameters' (they share one), frozen ones may differ
    orig = {p.dtype for p in group.params if p.requires_grad} or dtypes
    dtype = next(iter(orig)) if len(orig) == 1 else None
    mp = opts.mp_policy
    compute = mp.param_dtype or (dtype if len(dtypes) == 1 else None)
    reduce = mp.reduce_dtype or mp.param_dtype or dtype
    grads = {p.requires_grad for p in group.params}
    mixed = len(grads) > 1
    trains = [p.requires_grad for p in group.params]
    itemsize = torch.empty((), dtype=dtype or torch.float32, device="meta").element_size()
    sizes = shard_fields(
        group.name, group.param_fqns, local, dims, ws, trains=trains if mixed else None,
        dtypes=[p.dtype for p in group.params] if len(dtypes) > 1 else None,
        stated=opts.tp is not None or any(dims),
    )  # fmt: skip
    numel = sum(math.prod(s) for s in local)
    return Unit(
        module=group.name,
        module_class=", ".join(
            opts.job.class_name(m, f) for m, f in zip(group.modules, group.fqns, strict=True)
        ),
        params=list(group.param_fqns),
        shared_params=shared,
        numel=numel,
        flat_numel=numel,
        dtype=dtype_name(dtype),
        compute_dtype=dtype_name(compute),
        reduce_dtype=dtype_name(reduce),
        requires_grad=None if mixed else (grads.pop() if grads else None),
        sharding_strategy=group.sharding_strategy,
        itemsize=itemsize,
        **sizes,
        tp_placements={
            f: layout_name(placements[p])
            for f, p in zip(group.param_fqns, group.params, strict=True)
            if p in placements
        },
        shard_dims={f: d for f, d in zip(group.param_fqns, dims, strict=True) if d},
    )
