"""``analyze`` under pipeline parallelism: FSDP2 in every stage of a
``torch.distributed.pipelining`` schedule, each pipeline rank's step as it runs.

Each stage (a copy of the model holding its modules, an FSDP root of its own, as torchtitan
builds it) is traced once, on one microbatch: its forward, then its backward from the
gradient of its output (the last stage: from the loss). FSDP2's hook calls of that trace are
then replayed through a fresh :class:`FSDP2Runtime` per stage, action by action, in each
pipeline rank's order (:mod:`fsdpviz.schedule.pipeline_order`), with what
``PipelineStage`` does around them:

- ``F``: the stage's forward hooks; ``B``: its backward hooks, after
  ``backward_maybe_with_nosync`` turned off gradient sync, resharding after backward and the
  last backward, so each microbatch's gradients accumulate unsharded and the parameters stay
  gathered; ``I`` / ``W`` (zero-bubble schedules): the backward hooks fire in ``I`` (to the
  stage's inputs), ``W`` adds the weight gradients (the first stage, which has no input
  gradient, runs its whole backward in ``W``; another whose inputs need no gradient, behind
  a frozen stage, runs no hook in ``I`` and nothing in ``W``: no gradient);
- ``UNSHARD`` / ``RESHARD``: ``FSDPModule.unshard(async_op=True)`` / ``reshard()`` of every
  FSDP module of the stage (the compute waits for the unshard);
- a group set not to unshard in backward (``unshard_in_backward``, torch's
  ``set_unshard_in_backward(False)``): gathered by a forward or an ``UNSHARD`` (the group
  idle), never by a backward's pre-backward; refused, from the stage's trace, where its
  backward reads the parameters it then lacks (torch fails there);
- ``REDUCE_GRAD``: ``perform_reduce_grad``: each group's post-backward with sync on (free,
  then reduce-scatter), then the root's final callback;
- ``SEND_*`` / ``RECV_*``: a ``pp_send`` / ``pp_recv`` event of the stage's output (forward)
  or its input's gradient (backward), one microbatch's bytes.

The first step starts with ``PipelineStage``'s shape inference: each stage of the rank runs
its forward (in stage order), each stage whose inputs require grad its backward to them
(``autograd.grad``: no parameter gradient; in reverse order), then every FSDP module of each
stage is resharded.
"""

from __future__ import annotations

from typing import Any, Unpack

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from fsdpviz._deferred_gc import answering
from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp2_applied import fsdp2_states
from fsdpviz.plan.fsdp2_options import parse_fsdp2_options
from fsdpviz.plan.pipeline import PIPELINE_KEYS, parse_pipeline_options, split_pipeline_mesh
from fsdpviz.schedule.pipeline_order import parse_action, rank_actions
from fsdpviz.schedule.pipeline_report import all_modules, job_report, rank_report
from fsdpviz.schedule.pipeline_trace import trace_stages
from fsdpviz.schema.keywords import PlanKwargs
from fsdpviz.schema.names import some_names
from fsdpviz.schema.report import FsdpWarning, Report
from fsdpviz.trace.checkpointing import apply_checkpointing
from fsdpviz.trace.copy import inputs_copy, map_objects, model_copy


def analyze_pipeline(
    model: nn.Module, inputs: Any, *, gpus_per_node: int | None = None, **kwargs: Unpack[PlanKwargs]
) -> Report:
    """Plan FSDP2 inside a pipeline-parallel schedule; see :mod:`fsdpviz.plan.pipeline`.
    ``gpus_per_node``: the nodes of the machine ``analyze`` names, which tensor
    parallelism's ``mm`` strategies are picked for (None: none named)."""
    # the stages' traces and replays make many objects and no cycles to speak of: a cyclic
    # collection over the model copy's heap would cost more than the analysis itself
    with answering():
        return _analyze(model, inputs, gpus_per_node, **kwargs)


def _analyze(
    model: nn.Module, inputs: Any, gpus_per_node: int | None, **kwargs: Unpack[PlanKwargs]
) -> Report:
    profile = bool(kwargs.pop("profile", True))
    if fsdp2_states(model):
        raise ConfigError(
            "pipeline parallelism is planned from the model before fully_shard (each stage "
            "is sharded on its own, as torchtitan applies fully_shard to each model part); "
            "pass the unsharded model with fully_shard=[...]"
        )
    if "fully_shard" not in kwargs:
        raise ConfigError(
            "pipeline parallelism is planned with FSDP2, as torchtitan runs it: pass "
            "fully_shard=[...] (applied to each stage, its root last)"
        )
    pp, rest = split_pipeline_mesh(dict(kwargs))
    pipe = {k: rest.pop(k) for k in list(rest) if k in PIPELINE_KEYS}
    opts = parse_fsdp2_options(rest)
    if opts.parallel_dims.cp > 1:
        raise ConfigError(
            f"context parallelism (cp {opts.parallel_dims.cp}) under pipeline parallelism is not "
            "modelled yet (each stage's ring attention on its share of every sequence): plan "
            "the mesh without one of them (PP x FSDP, or FSDP x cp)"
        )
    device = "real" if opts.trace == "real" else "meta"
    copy, mapping = model_copy(model, device)
    apply_checkpointing(copy, opts.activation_checkpointing)
    ignored = set(map_objects(opts.ignored_params, mapping, "ignored_params") or [])
    args, kw = inputs_copy(inputs, device)
    popts, warnings = parse_pipeline_options(copy, _batch(args, kw), pp, pipe)
    if not opts.torch.installed:
        warnings.append(_other_torch(opts.torch.name))
    if ignored:
        warnings.append(_ignored_not_counted(copy, ignored))
    actions = rank_actions(popts)
    args, kw = _first_microbatch(args, kw, popts.microbatches)
    # a zero-bubble schedule's input backward (I) apart from its weight backward (W): by
    # stage, the microbatches whose backward it splits
    split: dict[int, list[int]] = {}
    for acts in actions.values():
        for a in acts:
            for stage, kind, mb, _ in parse_action(a):
                if kind == "I" and mb is not None:
                    split.setdefault(stage, []).append(mb)
    traces = trace_stages(
        copy, popts, opts, ignored, args, kw, device, profile, split, gpus_per_node
    )
    warnings.extend(w for t in traces for w in t.warnings)
    modules = all_modules(copy, traces)
    ranks = [
        rank_report(r, popts, opts, traces, actions[r], warnings, modules)
        for r in range(popts.pp_size)
    ]
    return job_report(popts, opts, traces, actions, ranks, warnings, modules)


def _batch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim()]
    return int(tensors[0].shape[0]) if tensors else None


def _first_microbatch(
    args: tuple[Any, ...], kwargs: dict[str, Any], m: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The first of ``m`` microbatches, as ``PipelineSchedule.step`` splits the inputs (each
    tensor along dim 0, other values as they are)."""

    def first(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim():
            part = x.tensor_split(m, dim=0)[0].detach()
            return part.requires_grad_(x.requires_grad) if x.is_floating_point() else part
        if isinstance(x, (list, tuple)):
            return type(x)(first(v) for v in x)
        if isinstance(x, dict):
            return {k: first(v) for k, v in x.items()}
        return x

    return first(args), first(kwargs)


def _other_torch(name: str) -> FsdpWarning:
    """``torch_version=`` names another release: FSDP2 follows its rules, the pipeline the
    installed torch's (its schedules are what this process can run)."""
    return FsdpWarning(
        "pipeline_installed_torch",
        f"FSDP2 is planned as {name} runs it, the pipeline (each rank's actions, how a "
        f"stage calls FSDP2) as the installed torch {torch.__version__}'s "
        "torch.distributed.pipelining runs it: another release's schedules may differ",
        [],
    )


def _ignored_not_counted(copy: nn.Module, ignored: set[nn.Parameter]) -> FsdpWarning:
    """``ignored_params=`` under pipeline parallelism: FSDP leaves them whole on the rank
    whose stage holds them, which a pipeline rank's memory does not count yet."""
    names = [n for n, p in copy.named_parameters() if p in ignored]
    shown = some_names(names, 3)
    return FsdpWarning(
        "pipeline_ignored_params_not_counted",
        f"ignored_params ({shown}): FSDP leaves them whole on the rank whose stage holds them, "
        "with their unreduced gradients and optimizer states; a pipeline rank's memory does "
        "not count them yet (analyze without pipeline parallelism does), so its peak comes "
        "out low by their bytes",
        [],
    )


__all__ = ["analyze_pipeline"]
