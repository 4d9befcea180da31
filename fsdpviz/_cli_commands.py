"""The commands of the ``fsdpviz`` command line (:mod:`fsdpviz.cli` parses their flags and
:mod:`fsdpviz._cli_checks` checks them): ``demo``, ``report``, ``tune`` and ``doctor``, each
run once its command line is checked (the model imported or built, the analysis), and how a
report is written and summed up (``-o``, ``--check``, the advice of its warnings as flags).

:mod:`fsdpviz.cli` imports this module only after the check, as it loads torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from fsdpviz import load
from fsdpviz._cli_checks import DOES_NOT_FIT, factory_spec
from fsdpviz._options_cli import Source, UsageError, flags_for, hf_id
from fsdpviz._options_kwargs import analyze_kwargs, load_hf_model
from fsdpviz.api.predict import analyze
from fsdpviz.configs import ConfigNote, from_torchtitan
from fsdpviz.errors import did_you_mean
from fsdpviz.examples import example_analysis
from fsdpviz.export import save
from fsdpviz.flight import FlightRecorderRun, load_run
from fsdpviz.recording import diff
from fsdpviz.schema.report import Report, option_text
from fsdpviz.views.card import job_items

__all__ = ["cmd_demo", "cmd_doctor", "cmd_report", "cmd_tune"]


def cmd_demo(args: argparse.Namespace, path: Path) -> int:
    start = time.perf_counter()
    report = example_analysis(world_size=args.world_size)
    return _write(report, path, time.perf_counter() - start)


def cmd_report(args: argparse.Namespace, source: Source, path: Path, explicit: bool) -> int:
    if source == "saved":
        return _report_saved(args, path, explicit)
    model, inputs, wraps = _model(args, source)
    notes: list[str] = []
    kwargs = analyze_kwargs(args, model, wraps, notes)
    for line in notes:
        print(f"note: {line}")
    start = time.perf_counter()
    report = analyze(model, inputs, **kwargs)
    root_only = (args.policy or "").strip().lower() == "none"
    if args.check:
        return _check(report, path if explicit else None, time.perf_counter() - start, source)
    return _write(report, path, time.perf_counter() - start, root_only, source)


def cmd_tune(args: argparse.Namespace, path: Path, source: Source) -> int:
    from fsdpviz._tune_command import frontier_table, run_tune  # lazy: the tuner, 0.5 s

    sizes: list[int] | None = args.world_size
    args.world_size = sizes[0] if sizes else None
    model, inputs, wraps = _model(args, source)
    args.world_size = sizes
    start = time.perf_counter()
    tuning = run_tune(args, model, inputs, wraps, print)
    print(tuning)
    print(frontier_table(tuning))
    best = tuning.best
    if best is not None:
        style = args.code or (
            "torchtitan" if args.torchtitan_config else "accelerate" if args.accelerate_config
            else "python"
        )  # fmt: skip
        print(f"\nThe best configuration ({style}):")
        print(best.code(style))
    tuning.save(str(path))
    print(f"wrote {path} ({time.perf_counter() - start:.1f}s)")
    return 0 if best is not None else DOES_NOT_FIT


def cmd_doctor(args: argparse.Namespace, path: Path, source: Source | None) -> int:
    try:
        run = load_run(args.dumps)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    prediction = None
    if source is not None:
        if args.world_size is None:  # the job's, as the dumps tell it
            args.world_size = run.world_size
        model, inputs, wraps = _model(args, source)
        notes: list[str] = []
        kwargs = analyze_kwargs(args, model, wraps, notes)
        for line in notes:
            print(f"note: {line}")
        prediction = analyze(model, inputs, **kwargs)
    if isinstance(run, FlightRecorderRun):
        diagnosis = run.diagnose(prediction)
        print(diagnosis)
        diagnosis.save(path)
    else:  # a run fsdpviz.record wrote: where its ranks diverge, and what differs from the plan
        print(run.summary())
        divergence = run.divergence()
        if divergence is not None:
            print(divergence)
        if prediction is not None:
            print(diff(run, prediction))
        run.save(path)
    print(f"wrote {path}")
    return 0


def _report_saved(args: argparse.Namespace, path: Path, explicit: bool) -> int:
    """``fsdpviz report PATH``: write what :func:`fsdpviz.load` reads from PATH."""
    start = time.perf_counter()
    try:
        loaded = load(args.factory)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if isinstance(loaded, Report):
        if args.check:
            return _check(loaded, path if explicit else None, time.perf_counter() - start)
        return _write(loaded, path, time.perf_counter() - start)
    if args.check:
        raise UsageError(
            f"--check checks that a plan fits in memory; {args.factory!r} is a recorded run"
        )
    loaded.save(path)
    print(loaded.summary())
    if isinstance(loaded, FlightRecorderRun):
        print(f"(fsdpviz doctor {args.factory} MODEL [flags] reads it in FSDP's terms)")
    print(f"wrote {path} ({time.perf_counter() - start:.1f}s)")
    return 0


def _model(
    args: argparse.Namespace, source: Source
) -> tuple[nn.Module, Any, list[type[nn.Module]]]:
    """The model, inputs and default wrap classes that ``report``, ``tune`` and ``doctor``
    plan, from ``source`` (checked by :mod:`fsdpviz._cli_checks`)."""
    wraps: list[type[nn.Module]] = []
    if source == "torchtitan":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigNote)
            job = from_torchtitan(args.torchtitan_config, world_size=args.world_size)
        model, inputs, args.torchtitan_plan = job.model, job.inputs, job.config
    elif source == "hf":
        built = load_hf_model(str(hf_id(args.factory)), args)
        model, inputs, wraps = built.model, built.inputs, built.wrap_classes
    else:
        if os.getcwd() not in sys.path:  # let `fsdpviz report mymodule:f` find ./mymodule.py
            sys.path.insert(0, os.getcwd())
        model, inputs = _load_model(args.factory)
    if args.inputs is not None:
        obj = _import_object(args.inputs, "--inputs")
        inputs = obj() if callable(obj) else obj
    if inputs is None:
        raise UsageError(
            f"{args.factory} returned only a model; pass --inputs MODULE:FACTORY, "
            "or make the factory return (model, inputs)"
        )
    return model, inputs, wraps


def _write(
    report: Any, path: Path, seconds: float, root_only: bool = False, source: Source = "saved"
) -> int:
    save(report, path)
    print(_as_flags(report.summary(), report, source))
    job = _job_line(report)
    if job:
        print(job)
    if len(report.units) == 1 and root_only:
        print("root only, as --policy none asks: the whole model is one unit")
    elif len(report.units) == 1:
        print(
            "root only: 1 unit (no wrap policy: pass --policy transformer:CLASS, "
            "--fully-shard CLASS or a config file to shard the model's blocks)"
        )
    if report.profiled:
        print(report.memory.summary())  # the peak, and whether it fits
        print(report.timeline.summary().splitlines()[0])
    print(f"wrote {path} ({seconds:.1f}s)")
    return 0


def _job_line(report: Any) -> str:
    """The job around FSDP the plan assumes (``--grad-accum``, ``--compile``, ``--float8``,
    ``--float32-matmul-precision``), where it states one; else ``""``."""
    items = job_items(report.config, detailed=True)
    return f"  job: {', '.join(items)}" if items else ""


def _as_flags(text: str, report: Any, source: Source) -> str:
    """``text`` (a report's summary or warning) with the options its warnings advise
    (``FsdpWarning.fix``, as analyze takes them) written as this command line's flags; a
    saved report's as they were written."""
    if source == "saved":
        return text
    api = report.config.api
    for warning in report.warnings:
        if warning.fix:
            text = text.replace(option_text(warning.fix, api), flags_for(warning.fix, source, api))
    return text


def _check(report: Any, path: Path | None, seconds: float, source: Source = "saved") -> int:
    """``--check``: whether the plan fits in its machine's memory, as the exit status."""
    if path is not None:
        _write(report, path, seconds, source=source)
    else:
        print(_as_flags(report.summary(), report, source))
        print(report.memory.summary().splitlines()[0])
    memory = report.memory
    if memory.fits:
        print(f"check passed: {memory.fit_text()}")
        return 0
    warning = next(w for w in report.warnings if w.code == "out_of_memory")
    print(f"check failed: {_as_flags(warning.message, report, source)}", file=sys.stderr)
    return DOES_NOT_FIT


def _import_object(spec: str, what: str) -> Any:
    """Resolve ``module:attr[.attr]``, raising :class:`UsageError` when it is not there."""
    module_name, attr_path = factory_spec(spec, what)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name != missing and not module_name.startswith(missing + "."):
            raise  # the module exists but one of its own imports is missing
        raise UsageError(f"{what}: cannot import module {module_name!r} ({exc})") from None
    owner = module_name
    for attr in attr_path.split("."):
        if not hasattr(obj, attr):
            tip = did_you_mean(attr, [n for n in dir(obj) if not n.startswith("_")])
            raise UsageError(f"{what}: {owner!r} has no attribute {attr!r}{tip}")
        obj = getattr(obj, attr)
        owner += ("." if ":" in owner else ":") + attr
    return obj


def _load_model(spec: str) -> tuple[nn.Module, Any]:
    factory = _import_object(spec, "MODULE:FACTORY")
    if isinstance(factory, nn.Module):
        return factory, None
    if not callable(factory):
        raise UsageError(f"{spec} is a {type(factory).__name__}, not a callable")
    try:
        result = factory()
    except TypeError as exc:
        hint = ""
        if getattr(factory, "__module__", "").startswith("transformers"):
            hint = "; for a Hugging Face model pass hf:ID (e.g. hf:Qwen/Qwen2-0.5B) or hf:./dir"
        raise UsageError(f"{spec} cannot be called without arguments ({exc}){hint}") from None
    if isinstance(result, nn.Module):
        return result, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module):
        return result[0], result[1]
    raise UsageError(
        f"{spec} returned {type(result).__name__}; expected an nn.Module or (model, inputs)"
    )
