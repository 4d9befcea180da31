"""The parsed flags of :data:`fsdpviz._options_cli.FLAGS` as :func:`fsdpviz.analyze` keyword
arguments for a model: the wrap policy or ``fully_shard`` targets among the model's classes,
FSDP's option objects, a trainer's configuration with ``--world-size`` and ``--trace`` on top,
and the job around FSDP (:mod:`fsdpviz.plan.job`), checked as ``analyze`` checks them and
refused in the flags' words (:class:`~fsdpviz._options_cli.UsageError`).

Importing this module imports torch: the command line and the tune flags import it only once
their flags are checked and a model is to be built.
"""

from __future__ import annotations

import argparse
import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    MixedPrecisionPolicy,
)
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

from fsdpviz._options_cli import (
    FLAGS,
    UsageError,
    check_flags,
    checkpointing_spec,
    float8_spec,
    mixed_precision_names,
    policy_spec,
    set_item,
)
from fsdpviz.api.keywords import AnalyzeKwargs
from fsdpviz.configs import ConfigNote, from_accelerate, hf_model
from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp1 import closest_class, model_classes
from fsdpviz.plan.fsdp1_options import enum_value
from fsdpviz.plan.fsdp2_applied import fsdp2_states
from fsdpviz.plan.job import parse_job_options
from fsdpviz.plan.option_specs import options_of
from fsdpviz.schema.checkpointing import SelectiveCheckpoint
from fsdpviz.schema.keywords import FSDPKwargs

__all__ = ["analyze_kwargs", "job_kwargs", "load_hf_model", "module_classes", "policy"]


def analyze_kwargs(
    args: argparse.Namespace,
    model: nn.Module,
    default_wrap: Sequence[type[nn.Module]] = (),
    notes: list[str] | None = None,
) -> AnalyzeKwargs:
    """:func:`fsdpviz.analyze` keyword arguments for the parsed flags and ``model``.

    ``default_wrap`` are the classes wrapped when neither ``--policy`` nor ``--fully-shard``
    is given (a Hugging Face model's ``_no_split_modules``). What a config file sets but
    fsdpviz does not apply is appended to ``notes``. ``--machine`` goes with every plan.
    """
    check_flags(args)
    kwargs = _plan_kwargs(args, model, default_wrap, notes)
    if getattr(args, "machine", None) is not None:
        kwargs["machine"] = args.machine
    job = job_kwargs(args, model)
    if notes is not None and (args.accelerate_config or args.torchtitan_config):
        source = "--accelerate-config" if args.accelerate_config else "--torchtitan-config"
        stated: Mapping[str, object] = kwargs
        notes.extend(
            f"{_flag_text(k, v)} overrides {source}'s {k}={stated[k]!r}"
            for k, v in job.items()
            if k in stated and stated[k] != v
        )
    kwargs.update(cast(AnalyzeKwargs, job))  # the job's keywords: a part of analyze's
    api = "FSDP2" if "fully_shard" in kwargs or fsdp2_states(model) else "FSDP1"
    try:
        parse_job_options(kwargs, api)
    except ConfigError as exc:  # what analyze would raise, in the flags' words
        text = str(exc)
        for key, flag in _JOB_FLAGS.items():
            if text.startswith(key) and key not in job:
                raise  # the config file's, not the flags'
            if text.startswith(key):
                text = flag + text[len(key) :]
        raise UsageError(text.replace("fully_shard=[...]", "--fully-shard NAMES")) from None
    return kwargs


_JOB_FLAGS = {f.option: f.name for f in FLAGS if f.group == "job" and f.option is not None}


def job_kwargs(args: argparse.Namespace, model: nn.Module) -> FSDPKwargs:
    """The :mod:`fsdpviz.plan.job` keyword arguments of the flags that were given (and
    ``activation_checkpointing``, which a config file's plan may hold too)."""
    kwargs: FSDPKwargs = {}
    checkpointed = getattr(args, "activation_checkpointing", None)
    if checkpointed is not None:
        kwargs["activation_checkpointing"] = _checkpointing(checkpointed, model)
    if getattr(args, "grad_accum", None) is not None:
        kwargs["grad_accum"] = args.grad_accum
    compiled = getattr(args, "compile", None)
    if compiled is True:
        kwargs["compile"] = True
    elif isinstance(compiled, str):
        names = [n for n in compiled.split(",") if n.strip()]
        kwargs["compile"] = sorted(module_classes(names, model, "--compile"), key=str)
    if getattr(args, "float8", None) is not None:
        kwargs["float8"] = float8_spec(args.float8)
    if getattr(args, "float32_matmul_precision", None) is not None:
        kwargs["float32_matmul_precision"] = args.float32_matmul_precision
    return kwargs


def _checkpointing(spec: str, model: nn.Module) -> Any:
    """``--activation-checkpointing CLASSES`` or ``selective:CLASSES``."""
    selective, names = checkpointing_spec(spec)
    classes = sorted(module_classes(names, model, "--activation-checkpointing"), key=str)
    if selective:
        return SelectiveCheckpoint(classes)
    return classes


def _flag_text(key: str, value: Any) -> str:
    """The flag that gives ``key=value``: ``--compile Block``."""
    if value is True:
        return _JOB_FLAGS[key]
    if isinstance(value, list):
        text = ",".join(getattr(v, "__name__", str(v)) for v in value)
    elif isinstance(value, dict):
        text = ",".join(f"{k}={v}" for k, v in value.items())
    else:
        text = str(value)
    return f"{_JOB_FLAGS[key]} {text}"


def _plan_kwargs(
    args: argparse.Namespace,
    model: nn.Module,
    default_wrap: Sequence[type[nn.Module]],
    notes: list[str] | None,
) -> AnalyzeKwargs:
    if args.accelerate_config or getattr(args, "torchtitan_plan", None) is not None:
        return _config_kwargs(args, model, notes if notes is not None else [])
    kwargs: dict[str, object] = {"world_size": args.world_size or 8, "trace": args.trace}
    param, reduce = _mixed_precision(args.mixed_precision)
    if args.fully_shard:
        kwargs["fully_shard"] = _fully_shard(args.fully_shard, model)
        for spec in options_of("FSDP2"):
            if getattr(args, spec.dest) is not None:
                kwargs[spec.name] = getattr(args, spec.dest)
        if param is not None:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)
        if args.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy()
        return cast(AnalyzeKwargs, kwargs)  # FSDP2's options, by the flags' names
    if args.policy is None and default_wrap:
        layers = set(default_wrap)
        kwargs["auto_wrap_policy"] = functools.partial(
            transformer_auto_wrap_policy, transformer_layer_cls=layers
        )
    else:
        kwargs["auto_wrap_policy"] = policy(args.policy or "none", model)
    for spec in options_of("FSDP1"):  # a switch always; an enum's word when given
        value = getattr(args, spec.dest)
        if spec.kind == "bool":
            kwargs[spec.name] = value
        elif value is not None:
            kwargs[spec.name] = enum_value(spec, spec.stored(value))
    if args.cpu_offload:
        kwargs["cpu_offload"] = CPUOffload(offload_params=True)
    if param is not None:
        kwargs["mixed_precision"] = MixedPrecision(
            param_dtype=param, reduce_dtype=reduce or param, buffer_dtype=param
        )
    return cast(AnalyzeKwargs, kwargs)  # FSDP1's options, by the flags' names


def _config_kwargs(args: argparse.Namespace, model: nn.Module, notes: list[str]) -> AnalyzeKwargs:
    """The kwargs of ``--accelerate-config`` (or of the torchtitan plan already read), with
    ``--world-size`` and ``--trace`` on top; FSDP flags would contradict the file."""
    if args.accelerate_config:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigNote)
            plan = from_accelerate(args.accelerate_config, model)
    else:
        plan = args.torchtitan_plan
    notes.extend(plan.notes)
    kwargs = cast(AnalyzeKwargs, dict(plan))
    if args.world_size is not None:
        kwargs["world_size"] = args.world_size
    kwargs["trace"] = args.trace
    return kwargs


def _mixed_precision(spec: str | None) -> tuple[torch.dtype | None, torch.dtype | None]:
    dtypes = mixed_precision_names(spec)
    if not dtypes:
        return None, None
    param, *reduce = (getattr(torch, d) for d in dtypes)
    return param, reduce[0] if reduce else None


def _fully_shard(spec: str, model: nn.Module) -> list[Any]:
    """Module FQNs stay names; other names are module classes of the model."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UsageError("--fully-shard needs at least one module class or FQN")
    modules = dict(model.named_modules())
    targets: list[Any] = [n for n in names if n in modules]
    classes = [n for n in names if n not in modules]
    if classes:
        targets += sorted(module_classes(classes, model, "--fully-shard"), key=str)
    return targets


def policy(spec: str, model: nn.Module) -> Any:
    """The FSDP1 auto-wrap policy for ``--policy SPEC``."""
    kind, arg = policy_spec(spec)
    if kind == "none":
        return None
    if kind == "transformer":
        return ModuleWrapPolicy(module_classes(arg.split(","), model, "--policy"))
    return functools.partial(size_based_auto_wrap_policy, min_num_params=int(arg))


def module_classes(names: Sequence[str], model: nn.Module, flag: str) -> set[type[nn.Module]]:
    """The model's module classes with these names (all classes of a name)."""
    classes: dict[str, set[type[nn.Module]]] = {}
    for m in model.modules():
        classes.setdefault(type(m).__name__, set()).add(type(m))
    found: set[type[nn.Module]] = set()
    for name in filter(None, (n.strip() for n in names)):
        if name not in classes:
            hint = closest_class(model, name)
            tip = f"; did you mean {hint!r}?" if hint else ""
            what = "module of class or FQN" if flag == "--fully-shard" else "module of class"
            raise UsageError(
                f"{flag}: the model has no {what} {name!r}{tip} (its classes with parameters, "
                f"blocks first: {model_classes(model)})"
            )
        found |= classes[name]
    if not found:
        what = "--policy transformer:" if flag == "--policy" else flag
        raise UsageError(f"{what} needs at least one class name")
    return found


def load_hf_model(spec: str, args: argparse.Namespace) -> Any:
    """:func:`fsdpviz.hf_model` for ``hf:ID`` and the ``--set/--batch/--seq/--dtype`` flags."""
    overrides = dict(set_item(item) for item in args.set)
    return hf_model(
        spec, batch=args.batch or 1, seq=args.seq, dtype=args.dtype, overrides=overrides
    )
