"""The ``analyze`` entry point."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Unpack, cast

from torch import nn

from fsdpviz._deferred_gc import collection_deferred
from fsdpviz.api.keywords import AnalyzeKwargs
from fsdpviz.cost.fit import check_fit, machine_named, machine_spec
from fsdpviz.plan.fsdp2_applied import fsdp2_states
from fsdpviz.plan.pipeline import wants_pipeline
from fsdpviz.schedule.fsdp1 import analyze_fsdp1
from fsdpviz.schedule.fsdp2 import analyze_fsdp2
from fsdpviz.schedule.pipeline import analyze_pipeline
from fsdpviz.schema.keywords import PlanKwargs
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.report import Report
from fsdpviz.trace.checkpointing import describe_checkpointing
from fsdpviz.trace.copy import check_model
from fsdpviz.trace.tracker import USE_CACHE_CODE


def analyze(model: nn.Module, inputs: Any, **fsdp_kwargs: Unpack[AnalyzeKwargs]) -> Report:
    """Predict what FSDP1 does with ``model`` for one training step on ``inputs``.

    ``fsdp_kwargs`` are the keyword arguments of ``FullyShardedDataParallel``
    (``auto_wrap_policy``, ``sharding_strategy``, ``backward_prefetch``,
    ``forward_prefetch``, ``use_orig_params``, ``mixed_precision``,
    ``ignored_modules``, ``ignored_states``, ...) with FSDP's own enums and
    policy objects, plus:

    - ``world_size`` (default 8),
    - ``loss``: callable from the model output to a scalar (default
      ``output.loss``, else ``output.logits.sum()``, else the sum of the
      floating-point tensors of the output),
    - ``trace``: ``"meta"`` (default; nothing of the model is allocated) or
      ``"real"`` (runs a copy on the model's own device, for models that cannot
      run on meta),
    - ``shard_group_size`` for hybrid sharding (ranks per shard group),
    - ``progress``: show a progress bar (default: only when tracing is slow),
    - ``machine``: the GPU the plan is for, a preset name (``"h100"``, the default,
      ``"h200"``, ``"a100-40gb"``, ...) or an :class:`fsdpviz.cost.Machine`: what
      ``report.timeline`` models and ``report.memory.fits`` checks. A plan whose peak
      does not fit in its memory gets an ``out_of_memory`` warning. Tensor parallelism's
      multiplies DTensor's cost model picks a strategy for are planned on its nodes
      (``gpus_per_node``; without a machine, nodes of 8, with a ``tp_topology_assumed``
      warning where a choice depends on it).
    - ``torch_version``: whose FSDP to plan, a torch release from 2.6 to 2.14 (``"2.8"``);
      default the installed torch's. ``report.config.torch_version`` says which.

    FSDP2: pass ``fully_shard=[...]`` (module classes, FQNs, tuples of FQNs
    for one grouped call, or a callable ``(name, module) -> bool``) with
    ``reshard_after_forward``, ``mp_policy`` and explicit ``forward_prefetch`` /
    ``backward_prefetch`` maps ``{fqn: [fqn, ...]}``; or pass a model on which
    ``fully_shard`` was already called (e.g. on the meta device with the fake
    process group) and its plan is read from FSDP2's state.

    ``inputs`` is a dict (keyword arguments), a tuple (positional arguments)
    or one tensor. The model and inputs are not modified.

    Example::

        report = fsdpviz.analyze(
            model, {"input_ids": ids},
            auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
            backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
            world_size=64,
        )
        report.to_dict()["forward_order"]
    """
    check_model(model)
    asked = dict(fsdp_kwargs)
    given = fsdp_kwargs.pop("machine", None)
    machine = None if given is None else machine_spec(given)
    plan_kwargs = cast("PlanKwargs", fsdp_kwargs)  # machine taken out above
    # tensor parallelism's mm strategies are picked for the machine's nodes (torch's cost
    # model reads the host's devices): fsdpviz/schedule/tp_mm_strategy.py
    node = None if given is None else machine_named(machine).gpus_per_node
    with collection_deferred():
        if wants_pipeline(fsdp_kwargs):
            report = analyze_pipeline(model, inputs, gpus_per_node=node, **plan_kwargs)
        elif "fully_shard" in fsdp_kwargs or fsdp2_states(model):
            report = analyze_fsdp2(model, inputs, gpus_per_node=node, **plan_kwargs)
        else:
            report = analyze_fsdp1(model, inputs, **plan_kwargs)
        if machine is not None:
            report.config = report.config.replace(machine=machine)
        _state_checkpointing(report, model, fsdp_kwargs.get("activation_checkpointing"))
        _measure_cache(report, model, inputs, asked)
        check_fit(report)
    return report


def _state_checkpointing(report: Report, model: nn.Module, spec: Any) -> None:
    """``report.config.activation_checkpointing``: what runs under checkpointing."""
    if report.source != "prediction":
        return
    said = describe_checkpointing(model, spec)
    if said is not None:
        report.config = report.config.replace(activation_checkpointing=said)


def _measure_cache(report: Report, model: nn.Module, inputs: Any, asked: dict[str, Any]) -> None:
    """The KV cache a model keeps under checkpointing (the tracker's warning): plan the same
    step with ``use_cache=False`` and state the bytes that takes off the peak."""
    at = next((i for i, w in enumerate(report.warnings) if w.code == USE_CACHE_CODE), None)
    if at is None or report.profile is None:
        return
    if isinstance(inputs, dict):
        without = {**inputs, "use_cache": False}
    else:
        args = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
        try:
            without = dict(inspect.signature(model.forward).bind_partial(*args).arguments)
        except TypeError:
            return  # the warning says what to do, without the bytes
        without["use_cache"] = False
    other = analyze(model, without, **{**asked, "progress": False})
    freed = report.memory.peak["bytes"] - other.memory.peak["bytes"]
    if freed <= 0:
        return
    warning = report.warnings[at]
    report.warnings[at] = dataclasses.replace(
        warning,
        message=f"{warning.message} takes {size_text(freed)} per rank off the peak "
        f"({size_text(report.memory.peak['bytes'])} to "
        f"{size_text(other.memory.peak['bytes'])})",
        frees=freed,
    )
