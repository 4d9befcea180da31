"""Per-rank memory at every event of a schedule, and where it peaks.

The model walks one iteration's :mod:`tape <fsdpviz.cost.hook_calls>` and keeps, in
bytes per rank:

``sharded_params``
    every unit's shard (``Unit.sharded_bytes``), plus FSDP2's post-forward shard
    of a unit resharded over fewer ranks (``ReportConfig.post_forward_ranks``), plus
    the parameters FSDP does not manage (``Report.ignored_params``: FSDP2's
    ``ignored_params``, FSDP1's ``ignored_modules`` / ``ignored_states``), whole.
``unsharded_params``
    units whose all-gathered parameters are in use: allocated when the unit's
    own hook waits for its all-gather, released at its ``free``. FSDP1 ``NO_SHARD``: the
    copy of the parameters it computes on, the low-precision one from its ``cast`` to its
    ``free``, CPU offload's from its ``h2d`` (see [Note: NO_SHARD's copies] in
    ``memory_fsdp1.py``).
``all_gather``
    all-gather output in flight. FSDP1 gathers into the unsharded FlatParameter,
    so a prefetched unit counts here from its ``all_gather`` until its own
    pre-forward/pre-backward hook. FSDP2 gathers into a flat buffer: freed
    after the copy-out into the unsharded parameters, except in forward (an explicit
    prefetch's too), where FSDP2 keeps it until the next unit's copy-out (or the
    root's post-forward) to overlap the next all-gather.
``unsharded_grads``
    gradients autograd produces for the unsharded parameters, as measured by
    the trace, until the unit's ``reduce_scatter`` (``all_reduce`` for NO_SHARD). Those
    of the parameters FSDP does not manage, whole, from the operator that makes them to
    the end of the step (FSDP neither reduces nor frees them; under gradient
    accumulation autograd adds each micro-step's into them in place).
``reduce_scatter``
    the reduce-scatter input (padded, reduce dtype): FSDP2 allocates it at the event
    and keeps one in flight, released at the next ``reduce_scatter`` or at the final
    callback. FSDP1 makes it in its post-backward hook only where the gradient is not
    one already (cast to the reduce dtype, padded to a multiple of the shard ranks;
    ``NO_SHARD``: the cast it all-reduces), and frees it, the gradient and the cast of
    the reduced shard to the parameters' dtype when the hook returns (on a GPU the
    gradient's block waits for the reduction before the allocator reuses it, which the
    reserved estimate does not model).
``sharded_grads``
    each unit's reduced shard, from its ``reduce_scatter``; zero at the start of
    an iteration (``optimizer.zero_grad(set_to_none=True)`` before the step).
``activations`` / ``forward_temp`` / ``backward_temp``
    measured by the trace (:mod:`fsdpviz.trace.probe`): tensors saved for
    backward (recomputed ones included); other live tensors the forward created
    (the model output, tensors in use); tensors the backward created (gradients
    of activations). Within a stretch of compute the trace's peak is used.
``optimizer``
    optimizer state of the shards (2 per element for Adam/AdamW, 1 for SGD with
    momentum) and of the parameters FSDP does not manage (whole), in the steady state
    only: the first iteration runs before the first ``optimizer.step()`` creates it.
    After the iteration that steps (the last micro-step of an optimizer step), the step
    itself: the states, and the temporaries of its implementation (``"adamw"``: torch's
    default foreach update makes one state's copy of ``exp_avg_sq.sqrt()`` for every
    shard at once; FSDP2's ignored parameters, plain tensors a foreach kernel does not
    mix with its DTensors, in a param group of their own, whose update comes and goes
    apart; ``"adamw_for_loop"``: a parameter's ``sqrt()`` and its division, with the
    previous parameter's result still bound; ``"adamw_fused"``: none), beside every
    shard and reduced gradient; the activations are gone by then.
``inputs`` / ``buffers``
    the model's inputs, by the memory they use (a tensor passed under two names, or
    views of one tensor, count once), and buffers (FSDP does not shard buffers).

``MemoryReport.reserved`` estimates what the CUDA caching allocator holds at its
peak (``torch.cuda.max_memory_reserved``, what torchtitan reports as "Memory"): the
allocator keeps one pool of blocks per stream, a block belongs to the stream that allocated
it, and a block freed in one pool is not reused by another. FSDP allocates on streams of its
own (see [Note: stream pools] in :mod:`fsdpviz.cost.memory_pools`): FSDP2 its all-gather
outputs and copy-in casts on the all-gather copy-in stream (``all_gather``) and its
reduce-scatter outputs, which the gradient shards are views of until ``zero_grad``, on the
reduce-scatter stream (``reduce_scatter``; their cast under HSDP on the all-reduce stream,
``all_reduce``), its reduce-scatter inputs on the compute stream; FSDP1 the shard's copy or
low-precision cast on the pre-unshard stream (``pre_unshard``), the unsharded FlatParameter,
from its all-gather to its free, on the unshard stream (``all_gather``), and its gradient
reduction, the gradient shard it keeps included, on the post-backward stream
(``reduce_scatter``; the shard's cast under ``HYBRID_SHARD`` on the all-reduce stream).
Everything else (parameters in use under FSDP2, gradients, activations, the optimizer
step) is the compute stream's. The estimate is the sum of each pool's own peak
(``reserved["pools"]``), every pool rounded up to the allocator's 2 MiB blocks: what it
holds with ``expandable_segments:True`` (torchtitan's ``run_train.sh`` sets it), one
segment per stream that grows as needed. On a machine whose allocator does not honour
them (``Machine.expandable_segments``: torch's ROCm builds before ROCm 7.0) each
``cudaMalloc`` is a segment of its own that only its stream's later requests can split,
and the pools besides the compute stream's are replayed block by block through the
allocator's rules (:func:`fixed_segments`); the compute pool, whose tensors the model
counts by category rather than one by one, keeps its peak, so what its own segments leave
unused is not estimated (a note says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TypedDict, cast

from fsdpviz._deferred_gc import deferring_collection
from fsdpviz.cost.fit import machine_of, runtime_overhead
from fsdpviz.cost.grad_sizes import param_grads, placed_grads, upcasts
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.hardware import machine as make_machine
from fsdpviz.cost.hook_calls import iteration_index, tape
from fsdpviz.cost.memory_fsdp1 import low_precision_grads_notes
from fsdpviz.cost.memory_pools import reserved_estimate
from fsdpviz.cost.memory_walker import Walker
from fsdpviz.cost.optimizers import optimizer_spec
from fsdpviz.cost.sizes import UnitBytes, fsdp1_parts, ignored_bytes, unit_bytes
from fsdpviz.cost.topology import tp_strategies_moved
from fsdpviz.errors import ConfigError
from fsdpviz.schema.memory import CATEGORIES, MemoryPeak, MemoryReport
from fsdpviz.schema.names import unwrapped_fqn
from fsdpviz.schema.report import IGNORED, Report
from fsdpviz.schema.serial import record_dict


def _stale_shards(report: Report, sizes: dict[str, UnitBytes], k: int) -> dict[str, int] | None:
    """The post-forward shards iteration ``k`` leaves, by unit (FSDP2's groups resharded
    after forward to fewer ranks, ``config.post_forward_ranks``, that its backward did not
    reach): see [Note: stale post-forward shards] in ``memory_walker.py``."""
    fewer = report.config.post_forward_ranks if report.config.api == "FSDP2" else {}
    gathers = [e for e in report.iterations[k] if e.kind == "all_gather"]
    again = {e.unit for e in gathers if e.phase == "backward"}
    if not any(e.unit in fewer and e.unit not in again for e in gathers):
        return None  # every group resharded after forward is gathered again in backward
    walk = Walker(report, sizes, tape(report, k), steady=False)
    walk.run()
    return dict(walk.post_forward_shard) or None


def _forward_copies(report: Report, sizes: dict[str, UnitBytes], k: int) -> dict[str, int]:
    """FSDP1 ``NO_SHARD`` under CPU offload: the device copies of the host parameters that
    iteration ``k`` leaves to the next, which each unit's views hold: its last forward copy,
    with ``use_orig_params=True`` its last copy (see [Note: NO_SHARD's copies] in
    ``memory_fsdp1.py``)."""
    cfg = report.config
    if k < 0 or cfg.api != "FSDP1":
        return {}
    copies: dict[str, int] = {}
    for e in report.iterations[k]:
        s = sizes.get(e.unit)
        viewed = e.kind == "h2d" and (e.phase == "forward" or cfg.use_orig_params)
        if viewed and s is not None and not s.communicates and not s.copy_in:
            copies[e.unit] = s.h2d
    return copies


@deferring_collection
def memory_model(
    report: Report,
    *,
    optimizer: str | int | None = "adamw",
    iteration: int = -1,
    machine: Machine | str | None = None,
    grad_accum: int | None = None,
) -> MemoryReport:
    """Step through ``report.iterations[iteration]`` and return memory per rank per event.

    ``optimizer``: ``"adamw"`` (default), ``"adam"``, ``"sgd"``, ``"sgd_momentum"``,
    each optionally with its implementation (``"adamw_fused"``, ``"adamw_foreach"``,
    ``"adamw_for_loop"``; default foreach, torch's on a GPU), an int (states per parameter
    element) or None. ``iteration``: 0 for the first
    iteration, -1 (default) for the steady state. ``machine``: whose device memory the
    result's ``capacity``, ``fits`` and ``headroom`` are about (a :class:`Machine` or a
    preset name; default: the report's, see :mod:`fsdpviz.cost.fit`); on nodes where torch
    would pick other tensor-parallel ``mm`` strategies than the report's
    (``report.config.tp_strategy_gpus_per_node``), a note says so, as the timeline's does:
    the walk is of the report's collectives and their buffers.

    ``grad_accum=N`` on a report planned without it: ``N`` micro-steps of the iteration per
    optimizer step, each reducing its gradients (accumulation without ``no_sync`` /
    ``set_requires_gradient_sync(False)``, as ``timeline(report, grad_accum=N)`` times it):
    the memory of the last, which starts with the gradient shards the ones before it left in
    ``.grad`` (each reduction adds its new shard into them) and steps the optimizer after.
    A report planned with ``analyze(..., grad_accum=N)`` holds its micro-steps already.

    Example::

        mem = memory_model(fsdpviz.analyze(model, ids, world_size=8), optimizer="sgd_momentum")
        print(mem.summary())
    """
    pipe = report.pipeline
    repeats = _repeats(report, grad_accum)
    if pipe is not None and pipe.ranks:
        if repeats > 1:
            raise ConfigError(
                "memory_model(grad_accum=N) of a pipeline's report: its microbatches are its "
                "accumulation; plan them with analyze(..., microbatches=N)"
            )
        return _largest_rank(report, optimizer=optimizer, iteration=iteration, machine=machine)
    i = iteration_index(report, iteration)
    return _micro_step_models(report, i, optimizer, machine, repeats, each=False)[-1]


@deferring_collection
def micro_step_memory(
    report: Report,
    *,
    optimizer: str | int | None = "adamw",
    iteration: int = -1,
    machine: Machine | str | None = None,
) -> list[MemoryReport]:
    """``memory_model(report, iteration=k, ...)`` of each micro-step ``k`` of the optimizer
    step that holds ``iteration`` (a report planned with ``grad_accum=N``), up to it, in one
    walk of them (``memory_model`` of each walks the micro-steps before it again).

    Example::

        peak = max(m.peak["bytes"] for m in micro_step_memory(report))
    """
    i = iteration_index(report, iteration)
    if report.pipeline is not None and report.pipeline.ranks:
        first = i - i % (report.config.grad_accum if report.source == "prediction" else 1)
        return [
            memory_model(report, optimizer=optimizer, iteration=k, machine=machine)
            for k in range(first, i + 1)
        ]
    return _micro_step_models(report, i, optimizer, machine, 1, each=True)


def _micro_step_models(
    report: Report,
    i: int,
    optimizer: str | int | None,
    machine: Machine | str | None,
    repeats: int,
    *,
    each: bool,
) -> list[MemoryReport]:
    """The memory of iteration ``i`` (``each``: of every micro-step of its optimizer step up
    to it, each as :func:`memory_model` gives it), the micro-steps before it walked once."""
    sizes = unit_bytes(report, optimizer)
    ignored = ignored_bytes(report, optimizer)
    if ignored is not None:  # whole on every rank, their gradients and states too
        sizes[IGNORED] = ignored
    carry: Walker | None = None
    accum = report.config.grad_accum if report.source == "prediction" else 1
    grads = param_grads(report, last=accum == 1)
    up = upcasts(report, grads) if accum > 1 else {}
    last = {unit: g[-1] for unit, g in grads.items()}
    placed = placed_grads(report)
    steady = i >= accum  # an optimizer step ran before this one (its states exist)
    # FSDP2's set_requires_all_reduce(False): every micro-step reduce-scatters
    reduces = report.config.api == "FSDP2" and not report.config.requires_all_reduce
    # a pipeline's steps each reduce in full: its REDUCE_GRAD (PipelineStage.
    # perform_reduce_grad) turns set_requires_gradient_sync(True) on in every step, so the
    # steps before the last leave gradient shards, in the parameters' dtype
    every_step = report.pipeline is not None
    first = i - i % accum
    # the post-forward shards the optimizer step before left ([Note: stale post-forward
    # shards] in memory_walker.py)
    stale = _stale_shards(report, sizes, first - 1) if first > 0 else None
    copies = _forward_copies(report, sizes, first - 1)
    mems: list[MemoryReport] = []
    for k in range(first, i):  # the micro-steps before it in its optimizer step
        walk = Walker(
            report, sizes, tape(report, k), steady=steady, carry=carry,
            sync=reduces or every_step, all_reduce=every_step, scaled=k > 0,
            upcast=up, last_grads=last, placed=placed, stale=stale, copies=copies,
        )  # fmt: skip
        walk.run()
        if each and every_step:  # k's own walk reduces as the last one does: not the carry
            own = Walker(
                report, sizes, tape(report, k), steady=steady, carry=carry, sync=reduces,
                all_reduce=False, upcast=up, last_grads=last, placed=placed, stale=stale,
                scaled=k > 0, copies=copies,
            )  # fmt: skip
            own.run()
            mems.append(_memory_report(report, own, k, optimizer, machine, ignored))
        elif each:
            mems.append(_memory_report(report, walk, k, optimizer, machine, ignored))
        carry = walk
    if repeats > 1:  # the micro-steps before: one leaves what each leaves, its shards
        carry = Walker(
            report, sizes, tape(report, i), steady=steady, last_grads=last, placed=placed,
            stale=stale, scaled=i > 0, copies=copies,
        )  # fmt: skip
        carry.run()
    sync = i % accum == accum - 1
    step = optimizer_step(report, sizes, optimizer) if sync else None
    walker = Walker(
        report, sizes, tape(report, i), steady=steady, carry=carry, sync=sync or reduces,
        all_reduce=sync,
        upcast=up, last_grads=last, step=step, placed=placed, stale=stale, scaled=i > 0,
        copies=copies,
    )  # fmt: skip
    walker.run()
    return [*mems, _memory_report(report, walker, i, optimizer, machine, ignored)]


def _memory_report(
    report: Report,
    walker: Walker,
    i: int,
    optimizer: str | int | None,
    machine: Machine | str | None,
    ignored: UnitBytes | None,
) -> MemoryReport:
    """The result of ``walker``'s walk of iteration ``i``."""
    notes = [*walker.notes, *low_precision_grads_notes(report, optimizer)]
    if machine is None:
        m = machine_of(report)
    else:
        m = make_machine(machine) if isinstance(machine, str) else machine
    # tensor parallelism's buffers are those of the mm strategies DTensor picked for the
    # nodes the report was planned on: noted, as the time model notes it
    moved = tp_strategies_moved(report.config, m.gpus_per_node)
    if moved is not None:
        notes.append(moved)
    blocks = None
    if not m.expandable_segments:
        blocks = walker.blocks
        notes.append(
            f"{m.name}: the caching allocator does not use expandable segments (torch's ROCm "
            "builds before ROCm 7.0 ignore expandable_segments:True); the reserved estimate "
            "replays the fixed segments of FSDP's own streams, and leaves out what the "
            "compute stream's segments hold unused"
        )
    return MemoryReport(
        config={
            "api": report.config.api,
            "world_size": report.config.world_size,
            "optimizer": optimizer,
            "iteration": i,
            "parameters": sum(u.numel for u in report.units),
            "trainable": sum(u.trainable[0] for u in report.units),
            **({"ignored": {q.fqn: q.bytes for q in report.ignored_params}} if ignored else {}),
        },
        events=walker.records,
        peak=walker.peak_record(),
        unit_peaks=walker.unit_peaks,
        notes=notes,
        moments=walker.moments,
        reserved=reserved_estimate(walker.moments, blocks),
        capacity=int(m.memory_gib * 2**30),
        overhead=runtime_overhead(report),
        machine=m.name,
    )


def _repeats(report: Report, grad_accum: int | None) -> int:
    """The micro-steps ``memory_model(grad_accum=...)`` asks for (1: as planned)."""
    if grad_accum is None:
        return 1
    if not isinstance(grad_accum, int) or isinstance(grad_accum, bool) or grad_accum < 1:
        raise ConfigError(f"grad_accum must be a positive int (micro-batches), got {grad_accum!r}")
    planned = report.config.grad_accum
    if planned > 1 and grad_accum != planned:
        raise ConfigError(
            f"the report was planned with grad_accum={planned} (its iterations are the "
            f"micro-steps as FSDP issues them); memory_model(grad_accum={grad_accum}) cannot "
            "change that: leave grad_accum out, or plan again with "
            f"fsdpviz.analyze(..., grad_accum={grad_accum})"
        )
    return 1 if planned > 1 else grad_accum


def _largest_rank(
    report: Report, *, optimizer: str | int | None, iteration: int, machine: Machine | str | None
) -> MemoryReport:
    """Under pipeline parallelism each pipeline rank holds its own stages: the job's memory
    is that of the rank with the largest peak (torchtitan reports the maximum over ranks),
    its ``peak["pp_rank"]`` says which, and ``config["pp_peaks"]`` gives every rank's."""
    assert report.pipeline is not None
    ranks = report.pipeline.ranks
    default = optimizer == "adamw" and iteration == -1 and machine is None
    mems = [
        r.memory
        if default
        else memory_model(r, optimizer=optimizer, iteration=iteration, machine=machine)
        for r in ranks
    ]
    worst = max(range(len(mems)), key=lambda k: (mems[k].needed, -k))
    mem = mems[worst]
    peaks = [int(m.peak["bytes"]) for m in mems]
    rank = ranks[worst].config.pp_rank
    return replace(
        mem,
        config={**mem.config, "pp_rank": rank, "pp_peaks": peaks},
        peak={
            **mem.peak,
            "pp_rank": rank,
            "where": f"on pipeline rank {rank}, {mem.peak['where']}",
        },
        notes=[
            f"pipeline rank {rank} of {len(ranks)} has the largest peak (each rank holds its "
            "own stages; report.pipeline.ranks[r].memory is rank r's)",
            *mem.notes,
        ],
    )


def optimizer_step(
    report: Report, sizes: dict[str, UnitBytes], optimizer: str | int | None
) -> tuple[int, int] | None:
    """The optimizer step's states and temporaries on the device (bytes per rank; see
    :class:`~fsdpviz.cost.optimizers.OptimizerSpec`), or None without an optimizer."""
    spec = optimizer_spec(optimizer)
    states = sum(s.optimizer for s in sizes.values())
    if spec.states == 0:
        return None
    one = states // spec.states  # one state of every shard
    temporaries = 0
    if spec.adam and spec.implementation == "foreach":
        temporaries = one
        whole = sizes[IGNORED].optimizer // spec.states if IGNORED in sizes else 0
        if whole and report.config.api == "FSDP2":
            # FSDP2's parameters are DTensors, the ignored ones plain tensors, which a
            # foreach kernel refuses to mix ("got mixed torch.Tensor and DTensor"): they
            # are a param group of their own, whose update's temporaries come and go apart
            temporaries = max(one - whole, whole)
    elif spec.adam and spec.implementation == "for_loop" and one:
        temporaries = _largest_shard(report, one, spec.states)
    return states, temporaries


def _largest_shard(report: Report, one: int, states: int) -> int:
    """The for-loop update's most bytes beyond the states: parameter ``i``'s ``sqrt()`` and its
    division alive together, with parameter ``i - 1``'s result still bound to the loop's
    variable (``one``: one state of every shard, to scale shard elements to bytes). The loop
    runs over the parameters with a gradient only (``_init_group`` skips the others): a
    unit's frozen and unused parameters (``Unit.gradless_params``) are not among them. FSDP1
    with ``use_orig_params=True`` (``states`` per element): the most any rank's loop and
    states reach beyond the states counted, the most any rank keeps (:func:`fsdp1_parts`)."""
    if report.config.api == "FSDP1" and report.config.use_orig_params:
        pieces = [[n for _, n in parts] for parts in fsdp1_parts(report, ignored=True)]
        most = max((sum(p) for p in pieces), default=0)
        loops = ((sum(p) - most) * states + _loop_most(p) for p in pieces)
        return max(loops, default=0) * one // max(most, 1)
    # the parameters FSDP does not manage, whole, by the module that holds them
    ignored = {p.fqn: math.prod(p.shape) for p in report.ignored_params if p.requires_grad}
    owned: dict[str, list[int]] = {}
    for q in report.ignored_params:
        if q.fqn in ignored:
            owned.setdefault(q.fqn.rpartition(".")[0], []).append(ignored[q.fqn])
    if report.config.api == "FSDP1":  # the optimizer steps the FlatParameters
        # in model.parameters()' order: a unit's FlatParameter registered on its module
        # after the parameters left there (ignored_states), before its children's
        flats = {u.module: u.sharded_numel for u in report.units if u.requires_grad is not False}
        shards = []
        for m in report.modules:
            shards += owned.get(m.fqn, [])
            shards += [flats[m.fqn]] if m.fqn in flats else []
        total = sum(shards)
    else:
        ranks = report.config.parallel_dims.dp_shard_cp
        trains = {
            p
            for u in report.units
            if u.requires_grad is not False
            for p in u.params
            if p not in u.gradless_params
        }
        total = sum(u.trainable[1] for u in report.units) + sum(ignored.values())
        # model.parameters()' order: each module's own, then its children's (a module's
        # ignored parameters after its managed ones)
        shards = []
        for m in report.modules:
            named = {
                f"{m.fqn}.{name}" if m.fqn else name: shape for name, shape in m.params.items()
            }
            shards += [
                -(-shape[0] // ranks) * math.prod(shape[1:])
                for fqn, shape in named.items()
                if shape and (fqn in trains or unwrapped_fqn(fqn) in trains)
            ]
            shards += owned.get(m.fqn, [])
    return _loop_most(shards) * one // max(total, 1)


def _loop_most(shards: list[int]) -> int:
    """The for-loop update's most elements over parameters of ``shards`` elements, in order."""
    return max((2 * n + (shards[i - 1] if i else 0) for i, n in enumerate(shards)), default=0)


def memory_series(
    report: Report, *, optimizer: str | int | None = "adamw", iteration: int | None = None
) -> list[float]:
    """Total bytes per rank after each event: one iteration, or all of them in order.

    One value per event, so not what the timeline's memory lane draws (:func:`memory_lane`:
    every moment the model looks at, the peaks inside compute too, by category); a series
    of this shape is what ``memory=`` takes for a lane of one category
    (``report.show(memory=fsdpviz.cost.memory_series)``).
    """
    its = range(len(report.iterations)) if iteration is None else [iteration]
    out: list[float] = []
    for i in its:
        out.extend(
            float(v)
            for v in memory_model(report, optimizer=optimizer, iteration=i).arrays()["total"]
        )
    return out


class MemoryLaneDict(TypedDict):
    """:meth:`MemoryLane.to_dict`: its lists by name, its peak and notes."""

    categories: list[str]
    iteration: list[int]
    kind: list[str]
    call: list[int]
    event: list[int]
    before: list[int]
    where: list[str]
    bytes: dict[str, list[int]]
    total: list[int]
    peak: MemoryPeak
    notes: list[str]


@dataclass
class MemoryLane:
    """Bytes in use per category at every moment the memory model looks at them.

    What the timeline's memory lane draws (stacked by category), one or more
    iterations in order. Per moment (parallel lists): ``iteration``, ``kind``
    (``"compute"``: the most reached during the compute before hook call ``call``;
    ``"event"``: at event ``event``; ``"hook"``: at hook call ``call``, e.g. an
    all-gather's copy-out), ``call``, ``event`` (-1 unless ``kind == "event"``),
    ``before`` (the event it precedes or happens in: what a click on it selects),
    ``where`` (in words) and ``bytes[category]``; ``total`` sums the categories.
    ``peak``: the peak of the iteration :func:`memory_model` looks at by default (the
    last one shown), as its ``MemoryReport.peak`` (``bytes``, ``event``, ``where``,
    ``dominant``, ``breakdown``) plus ``iteration`` and ``moment`` (the index of the
    moment here). ``peak["bytes"]`` is the most of ``total``.

    Example::

        lane = fsdpviz.cost.memory_lane(report)       # the steady state
        lane.peak["bytes"] == report.memory.peak["bytes"] == max(lane.total)
    """

    categories: list[str]
    iteration: list[int]
    kind: list[str]
    call: list[int]
    event: list[int]
    before: list[int]
    where: list[str]
    bytes: dict[str, list[int]]
    total: list[int]
    peak: MemoryPeak
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> MemoryLaneDict:
        return cast(MemoryLaneDict, record_dict(self))


def memory_lane(
    report: Report,
    *,
    optimizer: str | int | None = "adamw",
    iteration: int | None = -1,
    memory: MemoryReport | None = None,
) -> MemoryLane:
    """The moments of ``report.iterations[iteration]`` (``None``: every iteration in order).

    ``memory``: the :class:`MemoryReport` of the last iteration shown, when already made
    with these options (``report.memory`` for the defaults), so it is not computed again.
    """
    n = len(report.iterations)
    its = list(range(n)) if iteration is None else [iteration_index(report, iteration)]
    lane = MemoryLane(
        list(CATEGORIES), [], [], [], [], [], [], {k: [] for k in CATEGORIES}, [], MemoryPeak()
    )
    for i in its:
        last = i == its[-1]
        mem = memory if last and memory is not None else None
        mem = mem or memory_model(report, optimizer=optimizer, iteration=i)
        offset = len(lane.total)
        moments = mem.moments
        lane.iteration += [i] * len(moments)
        lane.kind += [m.kind for m in moments]
        lane.call += [m.call for m in moments]
        lane.event += [m.event for m in moments]
        lane.before += [m.before for m in moments]
        lane.where += [m.where for m in moments]
        rows = [m.bytes for m in moments]
        if rows:
            for k, column in zip(CATEGORIES, zip(*rows, strict=True), strict=True):
                lane.bytes[k] += column
        lane.total += map(sum, rows)
        if last:
            lane.peak = {**mem.peak, "iteration": i, "moment": offset + mem.peak["moment"]}
            lane.notes = list(mem.notes)
    return lane


__all__ = [
    "MemoryLane",
    "memory_lane",
    "memory_model",
    "memory_series",
    "micro_step_memory",
]
