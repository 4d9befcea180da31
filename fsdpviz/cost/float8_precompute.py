"""torchao's ``precompute_float8_dynamic_scale_for_fsdp`` in the time model: the float8
scales FSDP2's float8 all-gathers use, computed once a step after the optimizer step.

Which of a tape's events are its all-reduces (:func:`is_precompute_all_reduce`), which
:class:`~fsdpviz.cost.time_sim.MicroStepSim` sets aside as it walks its micro-step; the
compute around them (:func:`float8_precompute_costs`: the ``torch._foreach_norm`` of the
float8 weights' shards before, the scales' arithmetic after); and the step's work after the
optimizer (:func:`after_optimizer`) with what it adds to the step's sums
(:func:`after_step_totals`), which :func:`~fsdpviz.cost.time.timeline` places after the
step's last micro-step.
"""

from __future__ import annotations

import math

from fsdpviz.cost.hardware import Machine, ring_bytes
from fsdpviz.cost.kernels import StretchCost, stretch_cost
from fsdpviz.cost.sizes import itemsize
from fsdpviz.cost.time_state import EventTiming, Ranks
from fsdpviz.plan.job import Float8, float8_weights
from fsdpviz.schema.events import TP_KINDS, Event
from fsdpviz.schema.report import Report, param_shapes
from fsdpviz.schema.rows import StepWork, Wait

# torch's multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh) for a depth-1 foreach
# op such as _foreach_norm: a launch holds at most 110 tensors and 320 blocks of 65536
# elements each (CUDA 12 builds; CUDA 13 builds 770 and 2240, a 32 KB kernel argument);
# ForeachReduceOp.cu's norm then launches one cleanup kernel (the per-block maxima into one
# per tensor)
_FOREACH_TENSORS, _FOREACH_BLOCKS, _FOREACH_CHUNK = 110, 320, 65536


def is_precompute_all_reduce(events: list[Event], index: int) -> bool:
    """Whether event ``index`` is torchao's ``precompute_float8_dynamic_scale_for_fsdp``'s:
    the all-reduce of every float8 weight's amax over the shard group (no module: not one
    weight's, before its all-gather), or the tensor-parallel all-reduce DTensor issues right
    after it (:meth:`FSDP2Runtime.optimizer_step`)."""
    e = events[index]
    if e.kind == "all_reduce":
        return e.group == "shard" and e.module is None
    return (
        e.kind == "tp_all_reduce" and e.module is None and index > 0
        and is_precompute_all_reduce(events, index - 1)
    )  # fmt: skip


def float8_precompute_costs(
    report: Report, m: Machine
) -> tuple[tuple[StretchCost, float], tuple[StretchCost, float], int]:
    """The compute of torchao's ``precompute_float8_dynamic_scale_for_fsdp`` around its
    all-reduce, on ``m``: before it, ``torch._foreach_norm(weights, ord=inf)`` over every
    float8 weight's local (padded) shard, memory-bound, reading each shard once (its
    multi-tensor launches and the cleanup kernel), and ``torch.stack`` of the norms; after
    it, on the vector of one amax per weight, ``torch.clamp``, ``.to(torch.float64)``, the
    division of the float8 maximum by it (a float16 weight's scale clamped once more) and
    ``.to(torch.float32)``. Each kernel launched by the CPU as a forward one (eager Python,
    outside autograd). Returns the cost and bytes before and after the all-reduce, and the
    number of weights."""
    spec = report.config.float8
    weights = float8_weights(report.modules, Float8.from_dict(spec)) if spec else set()
    shapes = param_shapes(report.modules)
    numels: list[int] = []
    shard_bytes = 0
    size = 4
    dtypes: set[str | None] = set()
    for u in report.units:
        ranks = u.shard_ranks or 1
        for fqn in u.params:
            if fqn not in weights:
                continue
            shape = u.shard_shapes.get(fqn)
            if shape is None:
                whole = shapes.get(fqn) or [0]
                shape = [-(-whole[0] // ranks), *whole[1:]]
            dtypes.add(u.param_dtype(fqn))
            size = itemsize(u.param_dtype(fqn))
            numels.append(math.prod(shape))
            shard_bytes += numels[-1] * size
    n = len(numels)
    if not n:
        return (stretch_cost((), m), 0.0), (stretch_cost((), m), 0.0), 0
    blocks = sum(-(-k // _FOREACH_CHUNK) for k in numels)
    launches = max(-(-n // _FOREACH_TENSORS), -(-blocks // _FOREACH_BLOCKS)) + 1
    read = float(shard_bytes + 4 * n + 2 * n * size)  # the shards; the norms; the stack
    norms = (("mem", False, launches, shard_bytes + 4.0 * n), ("mem", False, 1, 2.0 * n * size))
    # clamp, to float64, the division, (a float16 weight's: clamp to its maximum), to float32
    after = 5 if "float16" in dtypes else 4
    moved = float(n * (2 * size + 8 + 16 + 12))  # each kernel's input and output
    tail = (("mem", False, after, moved),)
    return (stretch_cost(norms, m), read), (stretch_cost(tail, m), moved), n


def after_optimizer(
    after_step: list[EventTiming],
    start: float,
    report: Report,
    m: Machine,
    ranks: Ranks,
    waits: list[Wait],
) -> tuple[float, list[StepWork]]:
    """Place the precomputation's all-reduces (``after_step``: a micro-step's
    :attr:`~fsdpviz.cost.time_sim.MicroStepSim.after_step`, over its ``ranks``, its waits
    appended to ``waits``) after the optimizer step on ``m``, which ends at ``start`` (in
    that micro-step's time): torchtitan calls ``precompute_float8_dynamic_scale_for_fsdp``
    after ``optimizer.step()``, so its ``torch._foreach_norm`` of the float8 weights' shards
    follows the optimizer's last kernel on the compute stream
    (:func:`float8_precompute_costs`), and the stacked amaxes' all-reduce (DTensor's
    ``redistribute`` to ``Replicate``, ``funcol.all_reduce``) follows the norms; the
    ``torch.clamp`` and reciprocal after it wait for it on the compute stream, and the next
    step's first all-gather (whose copy-in waits for the compute stream) and forward after
    that. Nothing hides it: each is exposed whole, and the step ends when the last one does.
    Returns that end (``start`` where there is none) and the precomputation's compute,
    before and after the all-reduces."""
    if not after_step:
        return start, []
    (before, read), (after, moved), n = float8_precompute_costs(report, m)
    work = [
        StepWork(
            "float8_amax",
            start,
            start + before.seconds,
            read,
            before.kernels,
            f"torch._foreach_norm of the {n} float8 weights' local shards (their amaxes)",
        )
    ]
    t = start + before.seconds
    for rec in after_step:
        e = rec.event
        size = float(e.nbytes or 0)
        tp = e.kind in TP_KINDS
        group = ranks.tp if tp else ranks.shard
        span = ranks.spans.get("tp" if tp else "shard")
        dur = m.collective_seconds("all_reduce", size, group, span) if group > 1 else 0.0
        rec.issued = rec.compute_t = rec.start = t
        rec.end = t + dur
        rec.bytes = ring_bytes("all_reduce", size, group)
        rec.exposed = dur
        rec.held, rec.held_by = "optimizer", -1
        waits.append(Wait(t, rec.end, rec.index, e.phase, True))
        t = rec.end
    work.append(
        StepWork(
            "float8_scales",
            t,
            t + after.seconds,
            moved,
            after.kernels,
            f"torch.clamp and reciprocal of the {n} amaxes: the float8 scales",
        )
    )
    return t + after.seconds, work


def after_step_totals(after_step: list[EventTiming]) -> dict[str, float]:
    """What :func:`after_optimizer`'s all-reduces (``after_step``) add to the step's sums
    (once a step, however many micro-steps share this one)."""
    spent = sum(r.end - r.start for r in after_step)
    return {
        "comm_s": spent,
        "exposed_comm_s": spent,
        "exposed_backward_s": spent,
        "reduce_scatter_bytes": sum(r.bytes for r in after_step if r.stream == "comm"),
        "tp_bytes": sum(r.bytes for r in after_step if r.stream == "tp"),
    }
