"""IPython magics: ``%load_ext fsdpviz`` registers ``%fsdpviz`` and ``%%fsdpviz``.

``%fsdpviz model --inputs ids --policy transformer:LlamaDecoderLayer --world-size 64``
analyses a model expression with FSDP options written like FSDP keyword
arguments (``%fsdpviz hf:meta-llama/Llama-3.1-8B --seq 8192`` builds a Hugging Face model
from its config; ``--accelerate-config`` / ``--torchtitan-config`` read a trainer's file);
``%%fsdpviz --policy ...`` runs the cell and analyses the outermost
module call the cell makes (the model it builds and runs, with those inputs).
Both return the report, which renders as a rich summary as a cell's last line.

``%fsdpviz tune MODEL ...`` (and ``%%fsdpviz tune ...``) searches for the fastest
configuration that fits (:func:`fsdpviz.tune`), the flags giving the configuration to start
from, plus ``--allow``, ``--pin``, ``--tokens-per-step``, ``--memory-budget`` and
``--world-size 8,16,32``; it returns the :class:`~fsdpviz.tuning.Tuning`.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import shlex
import warnings
from typing import Any

from IPython.core.error import UsageError
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from fsdpviz._options_cli import (
    Source,
    add_fsdp_flags,
    add_source_flags,
    check_applies,
    hf_id,
    job_flag_value,
)
from fsdpviz._options_cli import UsageError as FlagError
from fsdpviz._options_kwargs import analyze_kwargs, load_hf_model
from fsdpviz._options_tune import add_tune_flags
from fsdpviz.api.predict import analyze
from fsdpviz.configs import ConfigNote, from_torchtitan
from fsdpviz.errors import FsdpvizError
from fsdpviz.plan.option_specs import OPTIONS, options_of

_OPTIONS = """\
  MODEL                       a model expression, or hf:ID (line magic only)
  --inputs EXPR               the inputs: a dict (kwargs), a tuple (args) or a tensor
  --accelerate-config YAML    plan what accelerate launch runs with this config
  --torchtitan-config TOML    plan a torchtitan job (its model, batch and recipe; no MODEL)
  --set KEY=VALUE, --batch N, --seq N, --dtype D     hf: models: config override, batch
  --policy SPEC               FSDP1 auto_wrap_policy: transformer:Class[,Class] | size:N | none
  --fully-shard NAMES         FSDP2 instead: fully_shard on classes or FQNs, comma-separated
{fsdp2}
  --mixed-precision DTYPE[,REDUCE]        bf16 | fp16 | fp32 (FSDP1 and FSDP2)
  --cpu-offload               parameters, gradients, optimizer state in host memory
{fsdp1}
{world_size}
  --trace meta|real|fx        how to trace (default meta; fx: FSDP1 only)
  --machine GPU               the GPU to fit and time the plan on (default h100)
  --activation-checkpointing CLASSES      checkpoint these classes (selective:CLASSES)
  --grad-accum N              micro-steps per optimizer step, N-1 without gradient sync
  --compile [CLASSES]         torch.compile: the whole model, or these classes one by one
  --float8 [SPEC]             float8 linears (tensorwise), or rowwise, all-gather, KEY=VALUE
  --float32-matmul-precision highest|high|medium    high, medium: TF32 matmuls
  --show                      open the interactive explorer instead of the summary
%fsdpviz tune MODEL [options]: the fastest configuration that fits, from these options, and
  --world-size N[,N...]       ranks, or counts to compare
  --allow compile,float8,cpu_offload      also try these
  --pin KNOBS                 knobs that stay as given (wrap, precision, micro_batch, ...)
  --tokens-per-step N         tokens per rank per optimizer step (default: the batch's)
  --memory-budget BYTES       a peak per rank to fit instead of the machine's memory
  --api fsdp1|fsdp2           which FSDP to tune
""".format(
    fsdp2="\n".join(spec.summary_line() for spec in options_of("FSDP2")),
    fsdp1="\n".join(spec.summary_line() for spec in options_of("FSDP1")),
    world_size=OPTIONS["world_size"].summary_line(),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit the kernel's process
        raise UsageError(f"%fsdpviz: {message}\n{_OPTIONS}")


def _parser(line_magic: bool, tune: bool = False) -> _Parser:
    p = _Parser(prog="%fsdpviz tune" if tune else "%fsdpviz", add_help=False)
    if line_magic:
        p.add_argument("model", nargs="?")
    p.add_argument("--inputs")
    add_fsdp_flags(p)
    add_source_flags(p)
    p.add_argument("--show", action="store_true")
    if tune:
        add_tune_flags(p)
    return p


def _parse(line: str, line_magic: bool, tune: bool = False) -> argparse.Namespace:
    parser = _parser(line_magic, tune)
    words = shlex.split(line)
    known = {o for a in parser._actions for o in a.option_strings}
    for word in words:
        if word.startswith("--") and word.split("=")[0] not in known:
            hint = difflib.get_close_matches(word.split("=")[0], sorted(known), n=1)
            tip = f"; did you mean {hint[0]}?" if hint else ""
            raise UsageError(f"%fsdpviz: unknown option {word}{tip}\n{_OPTIONS}")
    return parser.parse_args(words)


def _run(
    model: Any, inputs: Any, args: argparse.Namespace, wraps: list[type[nn.Module]] | None = None
) -> Any:
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"%fsdpviz: the model must be a torch.nn.Module, got {type(model).__name__}"
        )
    notes: list[str] = []
    try:
        report = analyze(model, inputs, **analyze_kwargs(args, model, wraps or [], notes))
    except (FsdpvizError, FlagError) as e:
        raise UsageError(f"%fsdpviz: {e}") from None
    for line in notes:
        print(f"note: {line}")
    return report.show() if args.show and hasattr(report, "show") else report


def _tune(model: Any, inputs: Any, args: argparse.Namespace, wraps: list[type[nn.Module]]) -> Any:
    from fsdpviz._tune_command import run_tune  # lazy: the tuner, 0.5 s, for `tune` only

    if not isinstance(model, nn.Module):
        raise UsageError(
            f"%fsdpviz tune: the model must be a torch.nn.Module, got {type(model).__name__}"
        )
    try:
        return run_tune(args, model, inputs, wraps)
    except (FsdpvizError, FlagError) as e:
        raise UsageError(f"%fsdpviz tune: {e}") from None


def _line_model(ip: Any, args: argparse.Namespace) -> tuple[Any, Any, list[type[nn.Module]]]:
    """The model, inputs and default wrap classes a line magic names."""
    try:
        if args.torchtitan_config:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConfigNote)
                job = from_torchtitan(args.torchtitan_config, world_size=args.world_size)
            args.torchtitan_plan = job.config
            return job.model, job.inputs, []
        if args.model is None and not args.torchtitan_config:
            args.model = job_flag_value(args)  # `--compile model`: the word was MODEL
        if args.model is None:
            raise UsageError("%fsdpviz: give MODEL (an expression or hf:ID)\n" + _OPTIONS)
        name = hf_id(args.model) if args.model.startswith("hf:") else None
        if name is not None:
            built = load_hf_model(name, args)
            return built.model, built.inputs, built.wrap_classes
    except (FsdpvizError, FlagError) as e:
        raise UsageError(f"%fsdpviz: {e}") from None
    if args.inputs is None:
        raise UsageError("%fsdpviz: pass --inputs EXPR (the model's inputs)\n" + _OPTIONS)
    return ip.ev(args.model), ip.ev(args.inputs), []


def _outermost_call(run_cell: Any) -> tuple[nn.Module, Any]:
    """Run the cell; return the outermost module call it made and that call's inputs."""
    depth = 0
    captured: list[tuple[nn.Module, Any]] = []

    def pre(module: nn.Module, args: Any) -> None:
        nonlocal depth
        depth += 1

    def post(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        nonlocal depth
        depth -= 1
        if depth == 0 and not captured:
            captured.append((module, _bind(module, args, kwargs)))

    handles = [
        register_module_forward_pre_hook(pre),
        register_module_forward_hook(post, with_kwargs=True),
    ]
    try:
        run_cell()
    finally:
        for h in handles:
            h.remove()
    if not captured:
        raise UsageError("%%fsdpviz: the cell ran no torch module; build and call the model in it")
    return captured[0]


def _bind(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not kwargs:
        return tuple(args)
    if not args:
        return dict(kwargs)
    return dict(inspect.signature(module.forward).bind(*args, **kwargs).arguments)


def load_ipython_extension(ip: Any) -> None:
    """Called by ``%load_ext fsdpviz``: registers ``%fsdpviz`` and ``%%fsdpviz``."""

    def applies(args: argparse.Namespace, line_magic: bool) -> None:
        model = getattr(args, "model", None) if line_magic else None
        source: Source
        if args.torchtitan_config:
            source, what = "torchtitan", "--torchtitan-config"
        elif model is not None and model.startswith("hf:"):
            source, what = "hf", model
        else:
            source, what = "factory", model or "the cell"
        try:
            check_applies(args, source, what)
        except FlagError as e:
            raise UsageError(f"%fsdpviz: {e}") from None

    def fsdpviz(line: str, cell: str | None = None) -> Any:
        words = line.split(None, 1)
        tune = bool(words) and words[0] == "tune"
        if tune:
            line = words[1] if len(words) > 1 else ""
        if cell is None:
            args = _parse(line, line_magic=True, tune=tune)
            applies(args, True)
            sizes = args.world_size if tune else None
            if tune:
                args.world_size = sizes[0] if sizes else None
            model, inputs, wraps = _line_model(ip, args)
            if args.inputs is not None and (args.torchtitan_config or args.model.startswith("hf:")):
                inputs = ip.ev(args.inputs)
            if tune:
                args.world_size = sizes
                return _tune(model, inputs, args, wraps)
            return _run(model, inputs, args, wraps)
        args = _parse(line, line_magic=False, tune=tune)
        applies(args, False)
        # silent: the cell runs as it is, but its last value is not shown (the answer is
        # the report)
        model, inputs = _outermost_call(lambda: ip.run_cell(cell, store_history=False, silent=True))
        if args.inputs is not None:
            inputs = ip.ev(args.inputs)
        return _tune(model, inputs, args, []) if tune else _run(model, inputs, args)

    fsdpviz.__doc__ = (
        "Analyse what FSDP does with a model.\n\n"
        "Line:  %fsdpviz MODEL --inputs EXPR [options]\n"
        "       %fsdpviz hf:ID [--seq N] [options]   |   %fsdpviz --torchtitan-config TOML\n"
        "Cell:  %%fsdpviz [options]   (runs the cell, analyses the outermost module call)\n"
        "Tune:  %fsdpviz tune MODEL [options]   |   %%fsdpviz tune [options]\n\n"
        "Options:\n" + _OPTIONS
    )
    ip.register_magic_function(fsdpviz, magic_kind="line_cell", magic_name="fsdpviz")
