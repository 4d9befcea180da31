"""Will it fit: the memory model's peak against the modelled machine's device memory.

A plan is made for one machine: ``analyze(..., machine="h200")`` states it in
``report.config.machine`` (a preset name, or a :class:`~fsdpviz.cost.Machine`'s constants);
without it, the H100 preset (``"h100"``, 80 GiB), as the time model's default.
``report.memory`` and ``report.timeline`` model that machine, and a plan that does not fit in
it gets an ``out_of_memory`` warning in ``report.warnings`` (set by ``analyze`` and by
:func:`fsdpviz.replan.replay`).

Of the device memory, tensors get what the CUDA context and NCCL leave
(:func:`runtime_overhead`): ``CUDA_CONTEXT_BYTES`` (the context, the kernels PyTorch loads,
cuBLAS workspaces) and ``NCCL_BYTES_PER_GROUP`` for each process group the plan communicates
over (NCCL's channel buffers; FSDP's group, HSDP's replicate group, the tensor-parallel
group). A plan fits when the peak allocated and the allocator's reserved estimate
(``MemoryReport.reserved``) both fit in the rest.

Example::

    report = fsdpviz.analyze(model, ids, fully_shard=[Block], world_size=64, machine="a100-40gb")
    report.memory.fits, report.memory.headroom / 2**30
    [w.message for w in report.warnings if w.code == "out_of_memory"]
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from fsdpviz.cost.hardware import Machine, machine
from fsdpviz.errors import ConfigError
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.schema.memory import MemoryReport, size_text
from fsdpviz.schema.report import FsdpWarning, Report, option_text, unit_label

DEFAULT_MACHINE = "h100"
"""The machine a report is modelled on unless ``analyze(..., machine=...)`` says otherwise."""
CUDA_CONTEXT_BYTES = 512 * 2**20
"""Device memory the CUDA context takes before any tensor (context, loaded kernels, cuBLAS
workspaces): about 0.5 GiB on an H100 with CUDA 12's lazy loading."""
NCCL_BYTES_PER_GROUP = 2**30
"""Device memory NCCL takes per communicator (its channels' buffers, NVLS on NVSwitch
systems): about 1 GiB; NCCL's own tests keep 1 GB free for it."""

FIT_CODES = ("out_of_memory", "fit_not_checked")  # the warnings check_fit sets
USE_CACHE_CODE = "use_cache_checkpointed"  # (the trace's warning: fsdpviz.trace.tracker)
_ACTIVATIONS = ("activations", "forward_temp", "backward_temp", "inputs")
_SHARDED = ("sharded_params", "sharded_grads", "optimizer")
_UNSHARDED = ("unsharded_params", "all_gather")
_GRADIENTS = ("unsharded_grads", "reduce_scatter")


def machine_spec(spec: Any) -> str | dict[str, object]:
    """What ``report.config.machine`` holds for ``spec``: a preset's name (checked), or a
    :class:`~fsdpviz.cost.Machine`'s constants. ``ConfigError`` for anything else."""
    if isinstance(spec, str):
        machine(spec)  # an unknown preset fails here, with the list of presets
        return spec.lower()
    if isinstance(spec, Machine):
        return spec.to_dict()
    raise ConfigError(
        f"machine must be a GPU preset name (e.g. 'h100', 'a100-40gb') or an "
        f"fsdpviz.cost.Machine, got {type(spec).__name__}"
    )


def machine_of(report: Report) -> Machine:
    """The machine ``report`` is modelled on: ``report.config.machine``, else the H100 preset."""
    return machine_named(report.config.machine)


def machine_named(spec: str | Mapping[str, Any] | None) -> Machine:
    """The machine a ``report.config.machine`` (:func:`machine_spec`) names; None: the H100
    preset."""
    if spec is None:
        return machine(DEFAULT_MACHINE)
    if isinstance(spec, str):
        return machine(spec)
    constants: dict[str, Any] = {
        k: dict(v) if isinstance(v, Mapping) else v for k, v in spec.items()
    }
    return Machine(**constants)


def process_groups(report: Report) -> int:
    """The process groups the plan's collectives run over (each one NCCL communicator):
    FSDP's (the shard group, or every rank under ``NO_SHARD``), hybrid sharding's replicate
    group, the tensor-parallel group."""
    dims = report.config.parallel_dims
    groups = 1 if dims.world_size > dims.tp else 0
    if dims.dp_replicate > 1 and dims.dp_shard_cp > 1:
        groups += 1
    if dims.tp > 1:
        groups += 1
    return groups


def runtime_overhead(report: Report) -> int:
    """Bytes of device memory tensors cannot use: the CUDA context and NCCL's buffers."""
    return CUDA_CONTEXT_BYTES + NCCL_BYTES_PER_GROUP * process_groups(report)


def fit_warning(report: Report, memory: MemoryReport) -> FsdpWarning | None:
    """The ``out_of_memory`` warning of a plan that does not fit (None when it fits).

    It names the peak, where it happens, the capacity and the first thing to try, with the
    options that try it (``FsdpWarning.fix``).
    """
    if memory.fits or memory.capacity <= 0:
        return None
    peak = memory.peak
    breakdown: dict[str, int] = peak.get("breakdown", {})
    top = sorted(((b, k) for k, b in breakdown.items() if b), reverse=True)[:3]
    parts = ", ".join(f"{k} {size_text(b)}" for b, k in top)
    reserved = int(memory.reserved.get("bytes", 0))
    advice, fix = fit_advice(report, memory)
    message = (
        f"does not fit in {memory.machine}: peak {size_text(peak['bytes'])} per rank "
        f"{peak['where']} ({parts}); the allocator would reserve about {size_text(reserved)}, "
        f"and {size_text(memory.capacity)} less {size_text(memory.overhead)} for the CUDA "
        f"context and NCCL leaves {size_text(memory.usable)} ({size_text(-memory.headroom)} "
        f"short). First try: {advice}"
    )
    unit = _unit_at_peak(report, memory)
    return FsdpWarning("out_of_memory", message, [] if unit is None else [unit], fix=fix)


def first_fix(report: Report, memory: MemoryReport) -> str:
    """The first thing to try for a plan that does not fit, from what dominates its peak and
    what the plan already does (see :func:`fit_advice`)."""
    return fit_advice(report, memory)[0]


def _tried(lead: str, reason: str, fix: dict[str, object], api: str) -> str:
    """``lead with option=value (reason)``: the advice with the options that try it."""
    with_ = f" with {option_text(fix, api)}" if fix else ""
    return f"{lead}{with_} ({reason})"


def fit_advice(report: Report, memory: MemoryReport) -> tuple[str, dict[str, object]]:
    """The first thing to try for a plan that does not fit, and the :func:`fsdpviz.analyze`
    options that try it (``{}`` where no option does: a smaller batch is the inputs').

    It follows from what dominates the peak and from what the plan already has: checkpointing
    is advised where activations dominate and no module is checkpointed; where they are, a
    KV cache the model keeps (``use_cache``), float32 activations, selective checkpointing
    and the batch, in that order."""
    breakdown: dict[str, int] = memory.peak.get("breakdown", {})
    short = max(-memory.headroom, 0)
    cfg = report.config
    api = cfg.api
    share = {
        "activations": sum(breakdown.get(k, 0) for k in _ACTIVATIONS),
        "sharded": sum(breakdown.get(k, 0) for k in _SHARDED),
        "unsharded": sum(breakdown.get(k, 0) for k in _UNSHARDED),
        "gradients": sum(breakdown.get(k, 0) for k in _GRADIENTS),
    }
    kind = max(share, key=lambda k: share[k])
    held = size_text(share[kind])
    if kind == "activations":
        return _activation_advice(report, held, short)
    if kind == "sharded":
        strategy = cfg.sharding_strategy if api == "FSDP1" else "FULL_SHARD"
        if strategy != "FULL_SHARD" and strategy != "SHARD_GRAD_OP":
            fix: dict[str, object] = {"sharding_strategy": "FULL_SHARD"}
            return _tried(
                f"full sharding over all {cfg.ranks} ranks",
                f"{strategy} keeps more copies of the parameters, gradients and optimizer "
                f"state ({held})",
                fix,
                api,
            ), fix
        if share["sharded"] > short:
            ranks = cfg.ranks * share["sharded"] / (share["sharded"] - short)
            needed = 2 ** math.ceil(math.log2(ranks))
            fix = {"world_size": needed}
            return _tried(
                "more ranks",
                f"parameters, gradients and optimizer state ({held}) are sharded over "
                f"{cfg.parallel_dims.dp_shard_cp} ranks and shrink with more; about {needed} ranks "
                f"instead of {cfg.ranks} would fit",
                fix,
                api,
            ), fix
        if cfg.cpu_offload:
            return (
                f"more ranks or a smaller model: parameters, gradients and optimizer state "
                f"({held}) do not fit sharded over {cfg.ranks} ranks, even with CPU offload"
            ), {}
        fix = {"cpu_offload": True}
        return _tried(
            "CPU offload",
            f"parameters, gradients and optimizer state ({held}) do not fit even sharded "
            f"over {cfg.ranks} ranks",
            fix,
            api,
        ), fix
    if kind == "unsharded":
        kept = cfg.kept_after_forward
        if api == "FSDP2" and kept:
            fix = {RESHARD.name: True}
            return _tried(
                "resharding after forward",
                f"{len(kept)} unit(s) keep their parameters unsharded from forward to "
                f"backward ({held} unsharded at the peak)",
                fix,
                api,
            ), fix
        if api == "FSDP1" and cfg.sharding_strategy == "SHARD_GRAD_OP":
            fix = {"sharding_strategy": "FULL_SHARD"}
            return _tried(
                "full sharding",
                "SHARD_GRAD_OP keeps every unit unsharded from forward to backward "
                f"({held} unsharded at the peak)",
                fix,
                api,
            ), fix
        return _finer(report, held, "unsharded parameters"), {}
    return _finer(report, held, "unsharded gradients, until their reduce-scatter,"), {}


def _activation_advice(report: Report, held: str, short: int) -> tuple[str, dict[str, object]]:
    """Where activations dominate the peak: see :func:`fit_advice`."""
    cfg = report.config
    api = cfg.api
    said = f"activations and temporaries hold {held} at the peak"
    checkpointed = cfg.activation_checkpointing
    if not checkpointed:
        classes = Counter(u.module_class for u in report.units if u.module)
        block = classes.most_common(1)[0][0] if classes else "<block class>"
        fix: dict[str, object] = {"activation_checkpointing": [block]}
        return _tried(f"activation checkpointing of each {block}", said, fix, api), fix
    cache = next((w for w in report.warnings if w.code == USE_CACHE_CODE), None)
    if cache is not None:
        fix = dict(cache.fix)
        frees = f"; without it, {size_text(cache.frees)} less at the peak" if cache.frees else ""
        return _tried(
            "no KV cache",
            "with use_cache=True the model keeps every layer's keys and values under "
            f"activation checkpointing{frees}",
            fix,
            api,
        ), fix
    computed = [u.compute_dtype or u.dtype for u in report.units]
    if computed and all(d == "float32" for d in computed):
        fix = {"mixed_precision": "bfloat16"}
        return _tried(
            "bfloat16 mixed precision",
            f"{said} with {', '.join(checkpointed.get('classes', []))} already "
            "checkpointed; the model computes in float32, and bfloat16 activations take half "
            "the bytes",
            fix,
            api,
        ), fix
    if checkpointed.get("mode") == "selective":
        names = list(checkpointed.get("classes", []))
        fix = {"activation_checkpointing": names}
        return _tried(
            f"full activation checkpointing of each {', '.join(names)} instead of selective",
            f"{said}; selective checkpointing saves the matrix multiplies' outputs",
            fix,
            api,
        ), fix
    return (
        f"a smaller batch per rank with gradient accumulation ({said}, with "
        f"{', '.join(checkpointed.get('classes', []))} already checkpointed; activations "
        "scale with the batch, and grad_accum=N keeps the global batch with 1/N per step)"
    ), {}


def _finer(report: Report, held: str, what: str) -> str:
    largest = max(report.units, key=lambda u: u.padded_numel, default=None)
    if largest is None or len(report.units) == 1:
        return (
            f"wrap the model's blocks as units: one unit holds the whole model ({held} of {what})"
        )
    return (
        f"smaller units: {what} hold {held} at the peak, and the largest unit, "
        f"{unit_label(largest.module)}, gathers {largest.padded_numel:,} parameters at once"
    )


def _unit_at_peak(report: Report, memory: MemoryReport) -> str | None:
    iteration = memory.config.get("iteration", -1)
    events = report.iterations[iteration] if report.iterations else []
    index = int(memory.peak.get("event", -1))
    return events[index].unit if 0 <= index < len(events) else None


def modelled_memory(report: Report) -> MemoryReport | None:
    """``report.memory`` of a prediction, what its fit is judged by; ``None`` for a
    recording, a plan without units or events, or where the memory model cannot be made."""
    if report.source != "prediction" or not report.units or not report.iterations:
        return None
    try:
        return report.memory
    except (ValueError, KeyError, IndexError):
        return None


def check_fit(report: Report) -> None:
    """Set ``report``'s ``out_of_memory`` warning from ``report.memory`` (replacing any it
    had): a prediction that does not fit on its machine gets one, and one whose memory model
    fails a ``fit_not_checked`` warning saying so. Recordings are left as they are (they ran,
    or failed, on their own hardware)."""
    report.warnings[:] = [w for w in report.warnings if w.code not in FIT_CODES]
    if report.source != "prediction" or not report.iterations or not report.units:
        return
    try:
        warning = fit_warning(report, report.memory)
    except Exception as e:  # a plan is still worth showing when its memory model fails
        first = str(e).splitlines()[0] if str(e) else ""
        warning = FsdpWarning(
            "fit_not_checked",
            f"whether the plan fits was not checked: the memory model failed "
            f"({type(e).__name__}: {first})",
        )
    if warning is not None:
        report.warnings.append(warning)


__all__ = [
    "CUDA_CONTEXT_BYTES",
    "DEFAULT_MACHINE",
    "FIT_CODES",
    "NCCL_BYTES_PER_GROUP",
    "check_fit",
    "first_fix",
    "fit_advice",
    "fit_warning",
    "machine_named",
    "machine_of",
    "machine_spec",
    "modelled_memory",
    "process_groups",
    "runtime_overhead",
]
