"""Bytes per rank of each buffer FSDP keeps for one unit, read from a report's ``Unit``.

FSDP1 (``FlatParameter``): the all-gather writes straight into the padded
unsharded FlatParameter (``padded_numel`` elements in the compute dtype), so
there is no separate all-gather buffer; the reduce-scatter input is the padded
unsharded gradient in the reduce dtype. FSDP2: the all-gather output is one flat
buffer of ``world_size x`` the per-rank shard (``padded_numel``) in the compute
dtype, copied out into per-parameter unsharded tensors of the same padded size;
the reduce-scatter input is a flat buffer of ``padded_numel`` in the reduce dtype.
Sharded gradients are kept in the parameter's original dtype (FSDP1 casts back
unless ``keep_low_precision_grads``; FSDP2 casts to the original dtype). With
mixed precision both first cast the shard to the compute dtype for the
all-gather (FSDP1's ``_mp_shard``, FSDP2's all-gather input): a shard-sized
buffer that lives while the all-gather is issued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fsdpviz.cost.optimizers import OptimizerSpec, optimizer_spec, optimizer_states
from fsdpviz.errors import ConfigError
from fsdpviz.schema.report import DTYPE_SIZES, IGNORED, Report, Unit, param_modules, param_shapes

if TYPE_CHECKING:
    from fsdpviz.plan.fsdp1 import FlatLayout

_ITEMSIZE = DTYPE_SIZES


def itemsize(dtype: str | None, default: int = 4) -> int:
    """Bytes per element of a dtype named like ``Unit.dtype`` (``"bfloat16"``)."""
    if dtype is None:
        return default
    if dtype not in _ITEMSIZE:
        raise ConfigError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(_ITEMSIZE))}")
    return _ITEMSIZE[dtype]


@dataclass(frozen=True)
class UnitBytes:
    """Per-rank bytes of one unit's FSDP buffers."""

    name: str
    sharded: int  # sharded parameters (original dtype)
    unsharded: int  # all-gathered parameters (compute dtype, padded)
    all_gather: int  # FSDP2's flat all-gather output (0 for FSDP1: it is the unsharded param)
    copy_in: int  # the shard cast to the compute dtype for the all-gather (mixed precision)
    grad: int  # unsharded gradient (compute dtype), when the trace did not measure it
    reduce_scatter: int  # reduce-scatter input (reduce dtype, padded)
    sharded_grad: int  # sharded gradient (original dtype)
    optimizer: int  # optimizer state (original dtype)
    communicates: bool  # False under NO_SHARD (no all-gather, all-reduce instead)
    h2d: int = 0  # CPU offload: the shard copied to the device before each all-gather
    # FSDP2 HSDP with set_requires_all_reduce(False): the reduce-scatter output the
    # micro-steps before the last add into (reduce dtype), all-reduced in the last
    partial: int = 0
    # FSDP2, parameters sharded on a dim other than 0 (shard_placement_fn): the temporaries
    # the copy-out gathers them into before torch.cat puts their chunks in place (their
    # unsharded bytes, in the dtype gathered), all alive until the copy-out returns
    copy_out: int = 0
    # FSDP2 reducing in a dtype other than the parameters' (bf16 parameters without a
    # ``reduce_dtype``, or one of its own): the reduce-scatter output in the reduce dtype,
    # alive beside its cast to the parameters' dtype (``foreach_reduce``'s
    # ``_to_dtype_if_needed``) until the name is rebound to the cast
    reduce_cast: int = 0
    # FSDP2: each parameter's all-gathered bytes (padded, in the dtype gathered), in the
    # group's order: what resharding onto fewer ranks (``post_forward_ranks``) clones a slice of
    gathered_params: tuple[int, ...] = ()
    # FSDP1's post-backward (``_post_backward_hook``, ``_reduce_grad``), beside the
    # FlatParameter's unsharded gradient until the hook returns: its copy in the reduce
    # dtype when that is not the compute dtype (``flat_param.grad.to(reduce_dtype)``), and
    # that padded to a multiple of the shard ranks where it is not one (``F.pad``).
    # NO_SHARD all-reduces that copy (or the gradient) in place and casts it to the
    # parameters' dtype (``_cast_grad_to_param_dtype``): ``grad_cast`` is the copy where that
    # cast follows it, ``reduced_shard`` the gradient the unit keeps where a cast made it.
    grad_cast: int = 0
    grad_pad: int = 0
    # FSDP1 sharded: the reduce-scatter output (the padded shard, reduce dtype), beside its
    # cast to the parameters' dtype where they differ (``_cast_grad_to_param_dtype``)
    reduced_shard: int = 0
    # FSDP1 with ``keep_low_precision_grads`` (sharded strategies): the gradient shard once
    # the final callback has cast it to the compute dtype (0: no cast)
    grad_kept: int = 0
    # FSDP2 x TP: the gradients autograd leaves whole on every rank though their parameter
    # is a tp shard (a row-wise embedding's weight, ``Shard(0)``: DTensor's
    # ``embedding_dense_backward`` replicates it), which the post-backward redistributes
    # before it reshards (``FSDPParam._get_grad_inner_tensor``; ``Shard._replicate_to_shard``
    # clones the rank's chunk, the first rank's the largest): per such parameter, in the
    # group's order, (the whole gradient's bytes, the chunk's), in the compute dtype
    replicated_grads: tuple[tuple[int, int], ...] = ()
    # FSDP2 on a shard group of one rank under mixed precision: the casts of the parameters
    # its copy-out makes, the most alive beside the unsharded parameters (:func:`_one_rank_copy`)
    one_rank_copy: int = 0
    # FSDP2 with torchao's float8 all-gather (``_in_float8``): the float32 scales of the
    # unit's float8 weights, one each (``fsdp_pre_all_gather`` makes them anew for every
    # all-gather; the walk follows how long each lives), and those of them a forward saves
    # for the backward with the weights (the linears no activation checkpoint recomputes)
    scales: int = 0
    scales_saved: int = 0
    # FSDP1 under CPU offload: the reduced gradient (``sharded_grad``: ``_saved_grad_shard``,
    # or NO_SHARD's ``.grad``) stays on the device beside its host copy until the final
    # callback (``prepare_gradient_for_optim`` points ``.grad`` at ``_cpu_grad``)
    grad_to_host: bool = False
    # FSDP1 with ``use_orig_params=True`` and ``keep_low_precision_grads``: the most bytes of
    # one trainable parameter's part of the rank's shard, in the parameters' dtype (the most
    # any rank has), made and freed by the post-backward hook's gradient views where the
    # original parameters have no gradient (see [Note: gradient views of the original
    # parameters] in memory_fsdp1.py)
    grad_views: int = 0
    # FSDP1 with ``use_orig_params=True`` and ``keep_low_precision_grads`` after a micro-step
    # under ``no_sync``: the unsharded gradient the original parameters' gradients keep alive
    # as their views' base until ``zero_grad`` (see [Note: gradient bases kept by the
    # original parameters] in memory_fsdp1.py): whether the unit keeps it on the rank where
    # these add up to the most
    grad_base: bool = False
    # FSDP1 with ``use_orig_params=True`` (not offloaded): the most bytes of one parameter's
    # part of the rank's shard (``NO_SHARD``, with bf16 parameters: the largest parameter),
    # in the parameters' dtype, made and freed by the post-backward hook's views of the
    # unsharded gradient under ``no_sync`` where the original parameters have no gradient
    # (see [Note: unsharded gradient views of the original parameters] in memory_fsdp1.py)
    unsharded_grad_views: int = 0


def unit_bytes(report: Report, optimizer: str | int | None) -> dict[str, UnitBytes]:
    """The :class:`UnitBytes` of every unit of ``report``, by unit name."""
    fsdp2 = report.config.api == "FSDP2"
    states = optimizer_states(optimizer)
    offload = report.config.cpu_offload
    out = {u.module: _unit(u, fsdp2, states, offload) for u in report.units}
    keep_low = bool((report.config.mixed_precision or {}).get("keep_low_precision_grads"))
    if not fsdp2:
        spec = optimizer_spec(optimizer)
        out = {
            u.module: _fsdp1_reduction(u, out[u.module], keep_low, spec, offload)
            for u in report.units
        }
    if not fsdp2 and report.config.use_orig_params and states and not offload:
        out = _states_of_the_rank_with_most(report, out, states, keep_low, spec)
    if not fsdp2 and report.config.use_orig_params and keep_low and not offload:
        out = _with_grad_views(report, out)
        if report.config.grad_accum > 1:  # under no_sync
            out = _with_grad_bases(report, out)
    if not fsdp2 and report.config.use_orig_params and not offload:
        out = _with_unsharded_grad_views(report, out)
    shapes = param_shapes(report.modules)
    for u in report.units if fsdp2 else ():
        if u.shard_ranks == 1 and u.compute_dtype:
            out[u.module] = replace(out[u.module], one_rank_copy=_one_rank_copy(u, shapes))
    tp = report.config.parallel_dims.tp
    if fsdp2 and tp > 1:
        styles = dict(report.config.parallelize_plan or {})
        for u in report.units:
            whole = _replicated_grads(u, shapes, styles, tp)
            if whole:
                out[u.module] = replace(out[u.module], replicated_grads=whole)
    gathered = float8_gathered(report) if fsdp2 else {}
    recomputed = _checkpointed(report) if gathered else set()
    owners = param_modules(report.modules) if gathered else {}
    for u in report.units:
        if u.module in gathered and out[u.module].communicates:
            b = _in_float8(u, out[u.module], gathered[u.module], shapes)
            saved = [w for w in gathered[u.module] if owners.get(w) not in recomputed]
            out[u.module] = replace(b, scales_saved=4 * len(saved))
    if fsdp2 and report.config.post_forward_ranks:
        for name in report.config.post_forward_ranks:
            if name in out:
                u = report.unit(name)
                out[name] = replace(out[name], gathered_params=_gathered_params(u, shapes))
    return out


def ignored_bytes(report: Report, optimizer: str | int | None) -> UnitBytes | None:
    """The parameters FSDP does not manage (``report.ignored_params``: FSDP2's
    ``ignored_params``, FSDP1's ``ignored_modules`` / ``ignored_states``) as the memory model
    counts them, under the name :data:`~fsdpviz.schema.report.IGNORED`; None without any.
    FSDP neither shards nor moves them (``_get_managed_states`` leaves them out): each rank
    holds all of each, in its own dtype (``sharded``, counted with the shards). Their
    gradients are autograd's, whole and unreduced (``grad``; the trace measures them), and
    the optimizer keeps its states of those that take one in their dtype (``optimizer``)."""
    params = report.ignored_params
    if not params:
        return None
    trained = sum(p.bytes for p in params if p.requires_grad)
    return UnitBytes(
        name=IGNORED,
        sharded=sum(p.bytes for p in params),
        unsharded=0,
        all_gather=0,
        copy_in=0,
        grad=trained,
        reduce_scatter=0,
        sharded_grad=0,
        optimizer=trained * optimizer_states(optimizer),
        communicates=False,
    )


def float8_gathered(report: Report) -> dict[str, set[str]]:
    """FSDP2 with torchao's float8 all-gather (``float8={"enable_fsdp_float8_all_gather":
    True}``): per unit, the weights of its float8 linears, which it gathers in float8."""
    from fsdpviz.plan.job import Float8, float8_weights  # the plan loads torch

    spec = report.config.float8
    if not spec or not spec.get("enable_fsdp_float8_all_gather"):
        return {}
    weights = float8_weights(report.modules, Float8.from_dict(spec))
    found = {u.module: weights.intersection(u.params) for u in report.units}
    return {unit: ws for unit, ws in found.items() if ws}


def _in_float8(u: Unit, b: UnitBytes, weights: set[str], shapes: dict[str, list[int]]) -> UnitBytes:
    """``b`` with ``weights`` all-gathered in float8. torchao's
    ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts each one's shard to
    float8 (one byte an element) and returns that as its all-gather input with its scale (a
    float32 scalar); FSDP2 all-gathers inputs of several dtypes as bytes into one flat
    ``uint8`` buffer (``foreach_all_gather``), and ``fsdp_post_all_gather`` makes each
    unsharded weight a ``Float8TrainingTensor`` of its gathered bytes and that scale
    (``scales``, apart: a scale outlives the gathered bytes, see ``Walker``). The other
    parameters are gathered in the compute dtype as ever. Each input is the padded shard
    (dim 0 padded to a multiple of the shard ranks)."""
    ranks = u.shard_ranks or 1
    shard = cast = 0
    for fqn in u.params:
        shape = u.shard_shapes.get(fqn)
        if shape is None:
            whole = shapes.get(fqn) or [0]
            shape = [-(-whole[0] // ranks), *whole[1:]] if whole else [1]
        numel = math.prod(shape)
        if fqn in weights:
            shard += numel
            cast += numel
        else:
            size = itemsize(u.compute_dtype or u.param_dtype(fqn))
            shard += numel * size
            cast += numel * size if u.param_dtype(fqn) != (u.compute_dtype or u.dtype) else 0
    return replace(
        b, unsharded=shard * ranks, all_gather=shard * ranks, copy_in=cast, scales=4 * len(weights)
    )


def _checkpointed(report: Report) -> set[str]:
    """The modules an activation checkpoint recomputes in backward: those of a checkpointed
    class (``config.activation_checkpointing``'s ``classes``) and every module inside one."""
    ac = report.config.activation_checkpointing
    classes = set(ac.get("classes", [])) if ac else set()
    if not classes:
        return set()
    parents = {m.fqn: m.parent for m in report.modules}
    kinds = {m.fqn: m.module_class for m in report.modules}
    found: set[str] = set()
    for fqn in parents:
        at: str | None = fqn
        while at is not None:
            if kinds.get(at) in classes:
                found.add(fqn)
                break
            at = parents.get(at)
    return found


def _one_rank_copy(u: Unit, shapes: dict[str, list[int]]) -> int:
    """FSDP2 on a shard group of one rank (torch 2.9 on): ``wait_for_unshard`` copies each
    parameter's ``all_gather_inputs`` into its unsharded storage, one at a time; mixed
    precision makes each input a cast of the shard, which the loop's variable holds until
    the next is made, and the last until the copy-out returns. The most bytes alive beyond
    all the unsharded parameters while it runs."""
    size = itemsize(u.compute_dtype)
    outs = [math.prod(u.shard_shapes.get(f) or shapes.get(f) or [0]) * size for f in u.params]
    cast = [u.param_dtype(f) != u.compute_dtype for f in u.params]
    total, done, prev, most = sum(outs), 0, 0, 0
    for out, casts in zip(outs, cast, strict=True):
        cast_now = out if casts else 0
        # the cast made beside the one before it, then the output beside the cast
        most = max(most, done + prev + cast_now - total, done + out + cast_now - total)
        done, prev = done + out, cast_now
    return max(most, prev)


def _replicated_grads(
    u: Unit, shapes: dict[str, list[int]], styles: dict[str, str], tp: int
) -> tuple[tuple[int, int], ...]:
    """``UnitBytes.replicated_grads`` of ``u``: its trainable embeddings' weights sharded on
    dim 0 over the tp ranks. ``RowwiseParallel`` shards an ``nn.Embedding``'s weight on dim
    0 and an ``nn.Linear``'s on dim 1 (``_partition_embedding_fn``, ``_partition_linear_fn``),
    so a ``Shard(0)`` weight under it is an embedding's (``styles``: the report's
    ``parallelize_plan``, each module's style); a column-wise linear's ``Shard(0)`` weight
    gets a ``Shard(0)`` gradient."""
    size = itemsize(u.compute_dtype or u.dtype)
    out = []
    for fqn in u.params:
        shape = shapes.get(fqn) or []
        owner, _, name = fqn.rpartition(".")
        if fqn in u.gradless_params or u.tp_placements.get(fqn) != "Shard(0)" or not shape:
            continue
        if name == "weight" and styles.get(owner, "").startswith("RowwiseParallel("):
            rest = math.prod(shape[1:]) * size
            out.append((shape[0] * rest, -(-shape[0] // tp) * rest))
    return tuple(out)


def _states_of_the_rank_with_most(
    report: Report, out: dict[str, UnitBytes], states: int, keep_low: bool, spec: OptimizerSpec
) -> dict[str, UnitBytes]:
    """FSDP1 with ``use_orig_params=True``: each unit's optimizer states as the rank that
    keeps the most states in all holds them (:func:`fsdp1_parts`). A unit's part of a rank's
    shard differs by rank where its parameters are padded, and each unit's most
    (``Unit.trainable``) can be on a rank of its own: their sum is more than any rank's.
    The states are in the parameters' dtype, SGD's momentum buffers in the gradients'
    (``keep_low``: ``keep_low_precision_grads``, :func:`fsdp1_grad_dtype`)."""
    ranks = fsdp1_parts(report)
    size = {
        u.module: itemsize(u.dtype if spec.adam else fsdp1_grad_dtype(u, keep_low)) * states
        for u in report.units
    }
    held = [sum(n * size[unit] for unit, n in parts) for parts in ranks]
    if not held:
        return out
    best = ranks[held.index(max(held))]
    kept = dict.fromkeys(out, 0)
    for unit, n in best:
        kept[unit] += n * size[unit]
    return {name: replace(b, optimizer=kept[name]) for name, b in out.items()}


def _with_grad_views(report: Report, out: dict[str, UnitBytes]) -> dict[str, UnitBytes]:
    """FSDP1 with ``use_orig_params=True`` and ``keep_low_precision_grads``: each unit's
    ``grad_views``, the most bytes of one trainable parameter's part of a rank's shard (in
    the parameters' dtype) on any rank (:func:`fsdp1_parts`). Without optimizer states the
    rest of a step is alike on every rank, and the peak is the most any rank reaches; with
    them, of the rank that keeps the most, the views of another rank may add a little
    more than any rank reaches (an upper bound: 4 B on a padded 61-wide model)."""
    most: dict[str, int] = {}
    for parts in fsdp1_parts(report):
        for unit, n in parts:
            most[unit] = max(most.get(unit, 0), n)
    size = {u.module: itemsize(u.dtype) for u in report.units}
    return {
        name: replace(b, grad_views=most[name] * size[name]) if most.get(name) else b
        for name, b in out.items()
    }


def _with_unsharded_grad_views(report: Report, out: dict[str, UnitBytes]) -> dict[str, UnitBytes]:
    """FSDP1 with ``use_orig_params=True``: each unit's ``unsharded_grad_views``, the most
    bytes, in the parameters' dtype, of one parameter's part of a rank's shard (the whole
    parameter under ``NO_SHARD``) whose shape or dtype is not its gradient view's, on any
    rank (an upper bound where the ranks' parts differ, as ``grad_views``). Every
    parameter's, the frozen ones' too: each gets a view of the FlatParameter's gradient.
    A part is a 1-D slice: it has the view's shape where it is a whole 1-D parameter."""
    shapes = param_shapes(report.modules)
    for u in report.units:
        if u.requires_grad is False or not u.sharded_numel:
            continue
        same = (u.compute_dtype or u.dtype) == u.dtype
        numels = [math.prod(shapes.get(p) or [0]) for p in u.params]
        if u.sharding_strategy == "NO_SHARD":
            most = 0 if same else max(numels, default=0)
        else:  # each rank's parts, but a whole 1-D parameter's computed in its own dtype
            one_d = [len(shapes.get(p) or []) == 1 for p in u.params]
            parts = _orig_layout(report, u, numels).shard_parts([True] * len(u.params))
            each = [(i, n) for by_param in parts for i, n in by_param.items()]
            most = max(
                (n for i, n in each if not (same and one_d[i] and n == numels[i])), default=0
            )
        if most:
            out[u.module] = replace(out[u.module], unsharded_grad_views=most * itemsize(u.dtype))
    return out


def _with_grad_bases(report: Report, out: dict[str, UnitBytes]) -> dict[str, UnitBytes]:
    """FSDP1 with ``use_orig_params=True`` and ``keep_low_precision_grads``: the units whose
    unsharded gradient the original parameters keep after the last micro-step of a
    ``no_sync`` accumulation (``UnitBytes.grad_base``), on the rank where that adds up to
    the most (beside the states of the rank that keeps the most states: an upper bound). A
    unit keeps it where it is sharded (every strategy but ``NO_SHARD``), computes in its
    parameters' dtype, and a trainable 1-D parameter lies whole in the rank's shard (see
    [Note: gradient bases kept by the original parameters] in memory_fsdp1.py)."""
    shapes = param_shapes(report.modules)
    by_rank: dict[int, list[str]] = {}
    for u in report.units:
        compute = u.compute_dtype or u.dtype
        sharded = u.sharding_strategy != "NO_SHARD"
        if not sharded or compute != u.dtype or not u.sharded_numel or not u.trainable[0]:
            continue
        numels = [math.prod(shapes.get(p) or [0]) for p in u.params]
        layout = _orig_layout(report, u, numels)
        frozen = set(u.frozen_params)
        for r, parts in enumerate(layout.shard_parts([p not in frozen for p in u.params])):
            whole = (
                n == numels[i] and len(shapes.get(u.params[i]) or []) == 1 for i, n in parts.items()
            )
            if any(whole):
                by_rank.setdefault(r, []).append(u.module)
    if not by_rank:
        return out

    def kept(unit: str) -> int:
        return out[unit].grad_cast or out[unit].grad

    most = max(by_rank.values(), key=lambda units: sum(kept(u) for u in units))
    return {name: replace(b, grad_base=name in most) for name, b in out.items()}


def _orig_layout(report: Report, u: Unit, numels: list[int]) -> FlatLayout:
    """The layout of ``u``'s FlatParameter, of parameters of ``numels`` elements, with
    ``use_orig_params=True``."""
    # here, not at the top: the plan loads torch, and the command line's checks import the
    # cost model (through the exports) before torch is loaded
    from fsdpviz.plan.fsdp1 import flat_param_layout

    return flat_param_layout(
        numels,
        itemsize(u.compute_dtype or u.dtype),
        use_orig_params=True,
        shard_world_size=u.shard_ranks,
        pad_to=report.config.process_group_size or u.shard_ranks,
    )


def fsdp1_parts(report: Report, ignored: bool = False) -> list[list[tuple[str, int]]]:
    """FSDP1 with ``use_orig_params=True``: for each rank, the unit and elements of each
    trainable parameter's part of its unit's shard, in the parameters' order, the parameters
    without one left out (FSDP gives them no gradient: the optimizer skips them).
    ``ignored``: with the trainable parameters FSDP does not manage, whole on every rank
    (:data:`~fsdpviz.schema.report.IGNORED`), after their module's own."""
    shapes = param_shapes(report.modules)
    held: dict[str, dict[int, tuple[str, int]]] = {}  # parameter -> {rank: (unit, part)}
    ranks = 1
    for u in report.units:
        if u.requires_grad is False or not u.sharded_numel:
            continue
        n_ranks = u.shard_ranks
        ranks = max(ranks, n_ranks)
        layout = _orig_layout(report, u, [math.prod(shapes.get(p) or [0]) for p in u.params])
        frozen = set(u.frozen_params)
        parts = layout.shard_parts([p not in frozen for p in u.params])
        for r, by_param in enumerate(parts):
            for i, n in by_param.items():
                held.setdefault(u.params[i], {})[r] = (u.module, n)
    order = list(shapes)
    if ignored:
        whole = {q.fqn: math.prod(q.shape) for q in report.ignored_params if q.requires_grad}
        owned: dict[str, list[str]] = {}
        for fqn in whole:
            owned.setdefault(fqn.rpartition(".")[0], []).append(fqn)
        order = []
        for m in report.modules:
            order += [f"{m.fqn}.{name}" if m.fqn else name for name in m.params]
            order += owned.get(m.fqn, [])
        for fqn, n in whole.items():
            held[fqn] = dict.fromkeys(range(ranks), (IGNORED, n))
    return [[held[p][r] for p in order if r in held.get(p, {})] for r in range(ranks)]


def _gathered_params(u: Unit, shapes: dict[str, list[int]]) -> tuple[int, ...]:
    """Each of ``u``'s parameters all-gathered (FSDP2: padded on dim 0 to a multiple of the
    shard ranks, in the compute dtype, else the parameter's own)."""
    ranks = u.shard_ranks or 1
    out = []
    for fqn in u.params:
        shape = shapes.get(fqn) or [0]
        rows = -(-shape[0] // ranks) * ranks if shape else 1
        dtype = u.compute_dtype or u.param_dtype(fqn)
        out.append(rows * math.prod(shape[1:]) * itemsize(dtype))
    return tuple(out)


def _unit(u: Unit, fsdp2: bool, states: int, offload: bool = False) -> UnitBytes:
    """Device bytes of ``u``; under CPU offload its shard, sharded gradient and optimizer
    state live in host memory, and only the copy of the shard comes to the device."""
    orig = itemsize(u.dtype)
    compute = itemsize(u.compute_dtype or u.dtype)
    reduce = itemsize(u.reduce_dtype or u.compute_dtype or u.dtype)
    sharded = u.sharded_bytes
    communicates = u.sharding_strategy != "NO_SHARD"
    unsharded = gathered_bytes(u) if communicates else 0
    host = sharded if offload else 0
    trainable, trainable_sharded = u.trainable
    grad_numel = trainable if fsdp2 else (u.numel if trainable else 0)
    grad_sharded = reduced_shard_numel(u, fsdp2)
    shard_ranks = u.shard_ranks
    return UnitBytes(
        name=u.module,
        sharded=sharded - host,
        unsharded=unsharded,
        all_gather=unsharded if fsdp2 else 0,
        copy_in=_cast_shard(u, compute, orig),
        grad=grad_numel * compute,
        reduce_scatter=grad_sharded * shard_ranks * reduce if communicates else 0,
        sharded_grad=0 if offload else grad_sharded * orig,
        optimizer=0 if offload else trainable_sharded * orig * states,
        communicates=communicates,
        h2d=host,
        partial=grad_sharded * reduce if communicates else 0,
        copy_out=sum(placed_bytes(u).values()) if fsdp2 and communicates else 0,
        reduce_cast=grad_sharded * reduce if fsdp2 and communicates and _casts_reduced(u) else 0,
    )


def _fsdp1_reduction(
    u: Unit, b: UnitBytes, keep_low: bool, spec: OptimizerSpec | None = None, offload: bool = False
) -> UnitBytes:
    """``b`` with FSDP1's post-backward temporaries (see :class:`UnitBytes`).

    ``keep_low``: ``MixedPrecision(keep_low_precision_grads=True)``. ``NO_SHARD`` then
    leaves the gradient in the reduce dtype (``_reduce_grad_no_shard`` skips the cast);
    the sharded strategies cast the reduced shard to the parameters' dtype as ever, and
    the final callback casts it to the compute dtype (``prepare_gradient_for_optim``,
    ``grad_kept``). SGD's momentum buffer is a copy of the first gradient it steps with
    (``torch.clone(grad)``): in that dtype (``spec``, the optimizer). ``offload``: the
    reduced gradient is on the device until the final callback (``grad_to_host``)."""
    trainable, _ = u.trainable
    if not trainable:
        return b
    if offload:
        b = replace(b, sharded_grad=u.sharded_numel * itemsize(u.dtype), grad_to_host=True)
    compute = u.compute_dtype or u.dtype
    reduce = u.reduce_dtype or compute
    r = itemsize(reduce)
    cast = u.flat_numel * r if reduce != compute else 0
    if not b.communicates:
        if keep_low:  # all-reduced in place, left in the reduce dtype: a copy where cast
            grad = u.sharded_numel * r
            b = replace(b, sharded_grad=grad, reduced_shard=grad if reduce != compute else 0)
            return _momentum_in(b, u, fsdp1_grad_dtype(u, keep_low), spec)
        # NO_SHARD all-reduces in place; the gradient it leaves is new where a cast made it
        new = reduce != compute or reduce != u.dtype
        return replace(
            b, grad_cast=cast if reduce != u.dtype else 0, reduced_shard=b.sharded_grad * new
        )
    pad = u.padded_numel * r if u.padded_numel > u.flat_numel else 0
    b = replace(b, grad_cast=cast, grad_pad=pad, reduced_shard=u.sharded_numel * r)
    if keep_low and compute != u.dtype:
        b = replace(b, grad_kept=u.sharded_numel * itemsize(compute))
        return _momentum_in(b, u, fsdp1_grad_dtype(u, keep_low), spec)
    return b


def fsdp1_grad_dtype(u: Unit, keep_low: bool) -> str | None:
    """The dtype of the gradient FSDP1 leaves ``u``'s parameters for the optimizer: the
    parameters' own, but with ``keep_low_precision_grads`` (``keep_low``) ``NO_SHARD``'s in
    the reduce dtype (``_reduce_grad_no_shard`` skips the cast) and the sharded strategies'
    in the compute dtype (the final callback's cast, ``prepare_gradient_for_optim``)."""
    if not keep_low:
        return u.dtype
    compute = u.compute_dtype or u.dtype
    if u.sharding_strategy == "NO_SHARD":
        return u.reduce_dtype or compute
    return compute


def _momentum_in(b: UnitBytes, u: Unit, dtype: str | None, spec: OptimizerSpec | None) -> UnitBytes:
    """``b`` with SGD's momentum buffers in ``dtype``, the gradients' (not Adam's states: of
    the parameters' dtype)."""
    if spec is None or spec.adam or not spec.states or not b.optimizer:
        return b
    return replace(b, optimizer=u.trainable[1] * itemsize(dtype) * spec.states)


def _casts_reduced(u: Unit) -> bool:
    """Whether FSDP2 casts ``u``'s reduced gradient shard from the reduce dtype (the
    ``reduce_dtype``, else the gradients' dtype, the compute dtype) to the parameters' own."""
    reduce = u.reduce_dtype or u.compute_dtype or u.dtype
    return reduce is not None and u.dtype is not None and reduce != u.dtype


def placed_bytes(u: Unit) -> dict[str, int]:
    """FSDP2: the unsharded bytes, in the dtype all-gathered (the compute dtype, else the
    parameter's own), of each of ``u``'s parameters its ``shard_placement_fn`` shards on a
    dim other than 0: what the copy-out's temporary of each holds and ``torch.cat`` copies
    again. Empty for a unit all on dim 0. (Such a shard is even, so the unsharded parameter
    is its shard times the shard ranks.)"""
    if not u.shard_dims or not u.sharded_numel:
        return {}
    ranks = u.shard_ranks
    out: dict[str, int] = {}
    for fqn in u.shard_dims:
        dtype = u.compute_dtype or u.param_dtype(fqn)
        out[fqn] = math.prod(u.shard_shapes[fqn]) * ranks * itemsize(dtype)
    return out


def gathered_bytes(u: Unit) -> int:
    """Bytes of ``u``'s all-gathered parameters (padded, in the compute dtype; a group of
    several dtypes without mixed precision gathers each in its own)."""
    if u.dtype_numels and u.compute_dtype is None:
        return u.sharded_bytes * (u.padded_numel // max(u.sharded_numel, 1))
    return u.padded_numel * itemsize(u.compute_dtype or u.dtype)


def _cast_shard(u: Unit, compute: int, orig: int) -> int:
    """Mixed precision's copy of the shard in the compute dtype, of the parameters in
    another dtype."""
    if u.dtype_numels:
        if u.compute_dtype is None:
            return 0
        return sum(s for d, (_, s) in u.dtype_numels.items() if d != u.compute_dtype) * compute
    return u.sharded_numel * compute if compute != orig or u.compute_dtype != u.dtype else 0


def reduced_shard_numel(u: Unit, fsdp2: bool) -> int:
    """Elements of ``u``'s gradient one rank holds once reduced: what its reduce-scatter
    outputs (its input is this times the shard ranks), hybrid sharding all-reduces across
    the replicas, and the sharded gradient holds. FSDP1 reduces the whole FlatParameter's
    gradient (a frozen parameter's part is zeros); FSDP2 reduce-scatters the gradients that
    exist, the trainable parameters' padded shards."""
    trainable, trainable_sharded = u.trainable
    if fsdp2:
        return trainable_sharded
    return u.sharded_numel if trainable else 0


_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(value: str | int | float) -> int:
    """``"80GiB"``, ``"80 GB"``, ``"512MiB"`` or a number of bytes, as bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip().lower().replace(" ", "")
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number) :] or "b"
    try:
        return int(float(number) * _UNITS[unit])
    except (KeyError, ValueError):
        raise ConfigError(
            f"cannot read {value!r} as a size; write e.g. '80GiB', '80GB', '512MiB' or bytes"
        ) from None
