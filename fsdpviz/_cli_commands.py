"""The commands of the ``fsdpviz`` command line (:mod:`fsdpviz.cli` parses their flags):
``demo``, ``report``, ``tune`` and ``doctor``, where each one's model comes from (MODEL
checked as written, then imported or built), and how a report is written and summed up
(``-o``, ``--check``, the advice of its warnings as flags).

Importing this module imports no torch: each command checks its flags first and loads torch
(the model, the analysis) only then.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpviz import load
from fsdpviz._options_cli import (
    Source,
    UsageError,
    check_applies,
    check_flags,
    flags_for,
    hf_id,
    job_flag_value,
)
from fsdpviz._options_tune import frontier_table, run_tune
from fsdpviz.schema.report import Report, option_text

if TYPE_CHECKING:
    from torch import nn

__all__ = ["DOES_NOT_FIT", "cmd_demo", "cmd_doctor", "cmd_report", "cmd_tune"]

DOES_NOT_FIT = 3
"""Exit status of ``fsdpviz report --check`` for a plan that does not fit."""


def cmd_demo(args: argparse.Namespace) -> int:
    from fsdpviz.examples import example_analysis  # lazy: loads torch

    path = _output_path(args.output)
    start = time.perf_counter()
    report = example_analysis(world_size=args.world_size)
    return _write(report, path, time.perf_counter() - start)


def _source(args: argparse.Namespace) -> Source:
    """Where the command's model comes from (``args.factory``: MODEL, or None), checked
    before anything is imported: a MODEL that is neither an id, a factory nor a file there
    is answered "not found"."""
    if args.factory is None and not args.torchtitan_config:
        args.factory = job_flag_value(args)  # `--compile MODEL`: the word was MODEL
    if args.torchtitan_config:
        if args.factory is not None:
            raise UsageError(
                f"--torchtitan-config builds its own model (its model.flavor); leave out "
                f"{args.factory!r}"
            )
        return "torchtitan"
    if args.factory is None:
        raise UsageError("give the model: hf:ID, MODULE:FACTORY, or --torchtitan-config TOML")
    spec: str = args.factory
    if _is_saved(spec):
        return "saved"
    if spec.startswith("hf:") or Path(spec).joinpath("config.json").is_file():
        return "hf"
    if _looks_like_a_path(spec):
        raise UsageError(
            f"{spec!r} not found: MODEL is a saved report's .json, a recording's folder or "
            "flight recorder dumps (a path that exists), hf:ID, or MODULE:FACTORY"
        )
    if hf_id(spec) is not None:  # org/name
        return "hf"
    _factory_spec(spec, "MODULE:FACTORY")
    return "factory"


def _looks_like_a_path(spec: str) -> bool:
    """A MODEL written as a file or folder (``./runs/r1``, ``report.json``), not as an id or
    a factory."""
    if spec.startswith(("./", "../", "/", "~")):
        return True
    return ":" not in spec and Path(spec).suffix.lower() in (".json", ".html", ".jsonl")


def cmd_report(args: argparse.Namespace) -> int:
    source = _source(args)
    what = args.factory or "--torchtitan-config"
    check_applies(args, source, what)
    explicit = args.output is not None
    path = _output_path(args.output if explicit else "report.html")
    if source == "saved":
        return _report_saved(args, path, explicit)
    if args.check and args.trace == "fx":
        raise UsageError(
            "--check needs the activations the trace measures, and --trace fx measures "
            "none; use --trace meta (the default) or real"
        )
    check_flags(args)
    if args.inputs is not None:
        _factory_spec(args.inputs, "--inputs")
    # The command line can run: torch is loaded from here on (hence these lazy imports).
    from fsdpviz._options_kwargs import analyze_kwargs, load_hf_model
    from fsdpviz.api.predict import analyze
    from fsdpviz.configs import ConfigNote, from_torchtitan

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


def cmd_tune(args: argparse.Namespace) -> int:
    path = Path(args.output)
    if path.suffix not in (".html", ".json"):
        raise UsageError(
            f"cannot write {args.output!r}: fsdpviz tune writes the page (.html) or the "
            "search as JSON (.json)"
        )
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {args.output!r}: its directory does not exist")
    source = _source(args)  # (nothing loaded yet: the flags are checked first)
    if source == "saved":
        raise UsageError(
            f"fsdpviz tune searches a model's configurations; {args.factory!r} is a saved "
            "report or recording: give MODEL as hf:ID or MODULE:FACTORY"
        )
    check_applies(args, source, args.factory or "--torchtitan-config")
    check_flags(args)
    sizes: list[int] | None = args.world_size
    args.world_size = sizes[0] if sizes else None
    model, inputs, wraps = _doctor_model(args)
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


def cmd_doctor(args: argparse.Namespace) -> int:
    path = _output_path(args.output)
    planned = args.factory is not None or args.torchtitan_config or job_flag_value(args)
    source: Source | None = None
    if planned:
        source = _source(args)
        if source == "saved":
            raise UsageError(
                f"MODEL is the job's model (hf:ID or MODULE:FACTORY); {args.factory!r} is a "
                "saved report or recording"
            )
        check_applies(args, source, args.factory or "--torchtitan-config")
        check_flags(args)
    else:
        check_applies(args, "saved", args.dumps)
    from fsdpviz.flight import FlightRecorderRun, load_run  # lazy: loads torch
    from fsdpviz.recording import diff  # lazy: loads torch

    try:
        run = load_run(args.dumps)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    prediction = None
    if source is not None:
        from fsdpviz._options_kwargs import analyze_kwargs  # lazy: loads torch
        from fsdpviz.api.predict import analyze  # lazy: loads torch

        if args.world_size is None:  # the job's, as the dumps tell it
            args.world_size = run.world_size
        model, inputs, wraps = _doctor_model(args)
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


def _is_saved(spec: str) -> bool:
    """Whether MODEL names what :func:`fsdpviz.load` reads (a saved report, a recording, flight
    recorder dumps) rather than a model: a path that exists, and no Hugging Face config."""
    p = Path(spec)
    return ":" not in spec and p.exists() and not p.joinpath("config.json").is_file()


def _report_saved(args: argparse.Namespace, path: Path, explicit: bool) -> int:
    """``fsdpviz report PATH``: write what :func:`fsdpviz.load` reads from PATH."""
    from fsdpviz.flight import FlightRecorderRun  # lazy: loads torch

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


def _doctor_model(args: argparse.Namespace) -> tuple[nn.Module, Any, list[type[nn.Module]]]:
    """The model, inputs and default wrap classes ``fsdpviz doctor`` predicts the job with
    (the sources of ``fsdpviz report``)."""
    from fsdpviz._options_kwargs import load_hf_model  # lazy: loads torch
    from fsdpviz.configs import ConfigNote, from_torchtitan  # lazy: loads torch

    wraps: list[type[nn.Module]] = []
    if args.torchtitan_config:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigNote)
            job = from_torchtitan(args.torchtitan_config, world_size=args.world_size)
        model, inputs, args.torchtitan_plan = job.model, job.inputs, job.config
    elif (name := hf_id(args.factory)) is not None:
        built = load_hf_model(name, args)
        model, inputs, wraps = built.model, built.inputs, built.wrap_classes
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        model, inputs = _load_model(args.factory)
    if args.inputs is not None:
        obj = _import_object(args.inputs, "--inputs")
        inputs = obj() if callable(obj) else obj
    if inputs is None:
        raise UsageError(f"{args.factory} returned only a model; pass --inputs MODULE:FACTORY")
    return model, inputs, wraps


def _output_path(text: str) -> Path:
    from fsdpviz.export import SUFFIXES, suffix_of  # lazy: plotly, which mistakes do without

    path = Path(text)
    if suffix_of(path) not in SUFFIXES:
        raise UsageError(
            f"cannot write {text!r}: unknown suffix {path.suffix or '(none)'!r}; "
            f"use a path ending in one of {', '.join(SUFFIXES)}"
        )
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {text!r}: directory {str(path.parent)!r} does not exist")
    if path.is_dir():
        raise UsageError(f"cannot write {text!r}: it is a directory; give a file name")
    return path


def _write(
    report: Any, path: Path, seconds: float, root_only: bool = False, source: Source = "saved"
) -> int:
    from fsdpviz.export import save  # lazy: plotly, which mistakes do without

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
    from fsdpviz.views.card import job_items  # lazy: plotly, which mistakes do without

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


def _factory_spec(spec: str, what: str) -> tuple[str, str]:
    """``module:attr[.attr]``'s module and attributes, checked as written (nothing imported)."""
    module_name, sep, attr_path = spec.rpartition(":")
    if not sep or not module_name or not attr_path:
        raise UsageError(f"{what} must be MODULE:NAME (e.g. mypkg.models:build), got {spec!r}")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        raise UsageError(
            f"{what}: {module_name!r} looks like a file; give the importable module name "
            f"(e.g. {Path(module_name).stem!r}) and run from its directory"
        )
    return module_name, attr_path


def _import_object(spec: str, what: str) -> Any:
    """Resolve ``module:attr[.attr]``, raising :class:`UsageError` when it is not there."""
    module_name, attr_path = _factory_spec(spec, what)
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
            hint = difflib.get_close_matches(attr, [n for n in dir(obj) if not n.startswith("_")])
            tip = f"; did you mean {hint[0]!r}?" if hint else ""
            raise UsageError(f"{what}: {owner!r} has no attribute {attr!r}{tip}")
        obj = getattr(obj, attr)
        owner += ("." if ":" in owner else ":") + attr
    return obj


def _load_model(spec: str) -> tuple[nn.Module, Any]:
    from torch import nn  # lazy: the flags are checked before torch is loaded

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
