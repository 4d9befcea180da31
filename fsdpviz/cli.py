"""The ``fsdpviz`` command line.

Usage::

    fsdpviz demo [-o fsdpviz-demo.html] [--world-size 8]
    fsdpviz report hf:meta-llama/Llama-3.1-8B --batch 2 --seq 8192 --world-size 64
    fsdpviz report hf:./my-config-dir --set num_hidden_layers=4 --accelerate-config fsdp.yaml
    fsdpviz report --torchtitan-config llama3_8b.toml --world-size 8
    fsdpviz report mypkg.models:build_model --inputs mypkg.models:make_batch \\
        --policy transformer:DecoderLayer --world-size 64 -o report.html
    fsdpviz report mypkg.models:build_model --inputs mypkg.models:make_batch \\
        --fully-shard DecoderLayer --mixed-precision bf16,fp32 -o report.html   # FSDP2
    fsdpviz report hf:meta-llama/Llama-3.1-8B --seq 8192 --machine h100 --check   # CI gate
    fsdpviz report hf:Qwen/Qwen2-0.5B --fully-shard Qwen2DecoderLayer --grad-accum 4 \
        --compile Qwen2DecoderLayer --float32-matmul-precision high   # the job around FSDP
    fsdpviz report fsdpviz-run -o run.html           # a saved report, a recording, or dumps
    fsdpviz doctor /tmp/fr-dumps                     # torch flight recorder dumps of a hang
    fsdpviz doctor /tmp/fr-dumps mypkg.models:build_model --inputs mypkg.models:make_batch \\
        --policy transformer:DecoderLayer            # ... read in FSDP's terms

The report is written to ``report.html`` unless ``-o`` says otherwise; the output's
suffix picks the format (:func:`fsdpviz.export.save`): ``.html``
(interactive page), ``.json`` (Chrome trace that ``fsdpviz.load`` reads back),
``.png`` / ``.svg`` / ``.pdf`` / ``.jpeg`` / ``.webp`` (the wrap-unit explorer),
``.graphml`` / ``.nodelink.json`` (the unit graph).

Exit status: 0 on success; 2 for what the command line got wrong (bad or misspelled
arguments, a flag that does not apply to the model given, a factory, class, config field or
file that cannot be found, a configuration fsdpviz refuses: :class:`fsdpviz.ConfigError`);
1 when the analysis itself fails (the model cannot be traced, FSDP would refuse it, a file
cannot be written: the other :class:`fsdpviz.FsdpvizError`); and with ``--check`` 3 when the
plan does not fit in the machine's memory (``report.memory.fits``; ``--check`` writes a file
only when ``-o`` names one).

The flags are parsed and checked before torch is loaded, so a mistake is answered at once, in
one line (``--help`` shows the usage); the advice a report prints (``out_of_memory``'s "First
try") is written as the flags that try it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpviz._options_cli import (
    Source,
    UsageError,
    add_fsdp_flags,
    add_source_flags,
    check_applies,
    check_flags,
    flags_for,
    hf_id,
    job_flag_value,
    positive_int,
)
from fsdpviz._options_kwargs import analyze_kwargs, load_hf_model
from fsdpviz._options_tune import add_tune_flags, frontier_table, run_tune
from fsdpviz.errors import ConfigError, FsdpvizError

if TYPE_CHECKING:
    from torch import nn

_PROG = "fsdpviz"
DOES_NOT_FIT = 3
"""Exit status of ``fsdpviz report --check`` for a plan that does not fit."""


class _Parser(argparse.ArgumentParser):
    """argparse, answering a mistake in one line (with where ``--help`` is) instead of the
    usage block, which ``--help`` and a bare ``fsdpviz`` show."""

    def error(self, message: str) -> Any:
        _usage_error(self.prog, message, hint=True)
        raise SystemExit(2)


def _usage_error(prog: str, message: str, hint: bool = False) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)
    if hint:
        print(f"({prog} --help lists the options)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run ``fsdpviz`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    words = sys.argv[1:] if argv is None else argv
    parser = _build_parser(full_help=any(w in ("-h", "--help") for w in words))
    if not words:
        parser.print_help(sys.stderr)
        return 2
    first = words[0].split("=")[0]
    if first.startswith("-") and not any(
        o.startswith(first) for o in parser._option_string_actions
    ):  # a misspelled option before the command
        _usage_error(_PROG, _unrecognized(words[:1], parser), hint=True)
        return 2
    try:
        args, unknown = parser.parse_known_args(words)
    except SystemExit as exc:  # argparse reports its own errors and --help this way
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if unknown:
        given: argparse.ArgumentParser = getattr(args, "parser", parser)
        _usage_error(given.prog, _unrecognized(unknown, given), hint=True)
        return 2
    command: Callable[[argparse.Namespace], int] = args.func
    try:
        return command(args)
    except (UsageError, ConfigError) as exc:  # what the command line got wrong
        sub: argparse.ArgumentParser = args.parser
        _usage_error(sub.prog, str(exc))
        return 2
    except FsdpvizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the user's own code (a factory), or a file that cannot be written
        if os.environ.get("FSDPVIZ_TRACEBACK"):
            raise
        print(f"error: {type(exc).__name__}: {exc}{_raised_at(exc)}", file=sys.stderr)
        print("(set FSDPVIZ_TRACEBACK=1 to see the whole traceback)", file=sys.stderr)
        return 1


def _raised_at(exc: BaseException) -> str:
    """`` (raised in models.py, line 12, in build)``: the innermost frame outside torch,
    fsdpviz and the standard library, where the fix most likely is."""
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    found = ""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        file = code.co_filename
        library = file.startswith(stdlib) and "site-packages" not in file
        if not library and not any(p in file for p in ("/torch/", "/fsdpviz/", "<frozen")):
            found = f" (raised in {Path(file).name}, line {tb.tb_lineno}, in {code.co_name})"
        tb = tb.tb_next
    return found


def _unrecognized(words: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's message for arguments it does not know, with the option each misspells
    (``--wrold-size`` -> ``--world-size``), as ``%fsdpviz`` says it."""
    known = sorted(o for o in parser._option_string_actions if o.startswith("--"))
    tips = []
    for word in words:
        if word.startswith("-"):
            close = difflib.get_close_matches(word.split("=")[0], known, n=1)
            if close:
                tips.append(f"{word.split('=')[0]}: did you mean {close[0]}?")
    text = f"unrecognized arguments: {' '.join(words)}"
    return text + ("; " + "; ".join(tips) if tips else "")


def _build_parser(full_help: bool = False) -> argparse.ArgumentParser:
    """The parser; ``full_help``: with the output formats listed (``--help``), which reading
    costs an import the parse of a command line does without."""
    from fsdpviz._version import __version__

    parser = _Parser(
        prog=_PROG,
        description="See what PyTorch FSDP will do with your model: wrap units, "
        "all-gather/free/reduce-scatter schedule and prefetch.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = subs.add_parser(
        "demo",
        help="analyse the bundled example transformer",
        description="Analyse the bundled Llama-style example model (one FSDP unit per "
        "DecoderLayer, BACKWARD_PRE prefetch) and write the report.",
    )
    _add_output(demo, "fsdpviz-demo.html", full_help=full_help)
    _add_world_size(demo)
    demo.set_defaults(func=_cmd_demo, parser=demo)

    report = subs.add_parser(
        "report",
        help="analyse your own model",
        description="Analyse a model with FSDP1 (--policy ...), FSDP2 (--fully-shard ...) or a "
        "trainer's config file (--accelerate-config, --torchtitan-config) and write the report. "
        "MODEL is hf:ID (a Hugging Face model id or config directory, built on the meta device "
        "from its config alone) or MODULE:FACTORY (a callable returning a model, or a (model, "
        "inputs) tuple); a torchtitan config brings its own model. MODEL may also be what "
        "fsdpviz.load reads (a saved report's .json, a folder fsdpviz.record wrote, torch "
        "flight recorder dumps): it is written as it was saved.",
    )
    report.add_argument(
        "factory",
        metavar="MODEL",
        nargs="?",
        help="hf:meta-llama/Llama-3.1-8B, hf:./config-dir or mypkg.models:build; or a saved "
        "report, recording or dumps folder",
    )
    report.add_argument(
        "--inputs",
        metavar="MODULE:FACTORY",
        help="callable returning the model inputs (a dict of keyword arguments, a tuple "
        "of positional arguments or one tensor); required unless FACTORY returns them",
    )
    add_fsdp_flags(report)
    add_source_flags(report)
    _add_output(report, "report.html", given=True, full_help=full_help)
    report.add_argument(
        "--check",
        action="store_true",
        help=f"check that the plan fits in the machine's memory (--machine): exit status "
        f"{DOES_NOT_FIT} when it does not, 0 when it does (a CI gate); writes a file only "
        "with -o",
    )
    report.set_defaults(func=_cmd_report, parser=report)
    _add_tune(subs, full_help)
    _add_doctor(subs, full_help)
    return parser


def _add_tune(subs: Any, full_help: bool) -> None:
    tune = subs.add_parser(
        "tune",
        help="find the fastest configuration that fits",
        description="Search FSDP's knobs (units, resharding, activation checkpointing, "
        "precision, micro-batch and accumulation, HSDP, tensor parallelism where needed) for "
        "the configuration with the most tokens/s per GPU that fits the machine's memory, "
        "each one planned exactly. MODEL and the FSDP flags as `fsdpviz report` takes them "
        "give your own configuration, which is evaluated too and marked. Prints the best, "
        "the frontier of tokens/s against memory and what each knob's best alternative "
        "changes; writes the page (-o). Exit status 0 when something fits, "
        f"{DOES_NOT_FIT} when nothing does.",
    )
    tune.add_argument(
        "factory",
        metavar="MODEL",
        nargs="?",
        help="hf:meta-llama/Llama-3.1-8B, hf:./config-dir or mypkg.models:build",
    )
    tune.add_argument(
        "--inputs", metavar="MODULE:FACTORY", help="callable returning the model inputs"
    )
    add_fsdp_flags(tune)
    add_source_flags(tune)
    add_tune_flags(tune)
    _add_output(tune, "tune.html", full_help=full_help)
    tune.set_defaults(func=_cmd_tune, parser=tune)


def _add_doctor(subs: Any, full_help: bool) -> None:
    doctor = subs.add_parser(
        "doctor",
        help="read the flight recorder dumps of a hung job",
        description="Read torch's flight recorder dumps of a hung or desynced job (a folder "
        "with one file per rank, as torch writes them) and print where each rank stopped and "
        "where the ranks first disagree; given the job's model (MODEL and the flags of "
        "`fsdpviz report`), in FSDP's terms: unit, phase, hook and iteration. Writes the page "
        "(a lane group per rank, the stuck and the first divergent collectives marked). "
        "DIR may also be a run fsdpviz.record wrote: where its ranks diverge and, given "
        "MODEL, how it differs from the prediction (fsdpviz.diff).",
    )
    doctor.add_argument(
        "dumps",
        metavar="DIR",
        help="the folder of dumps (nccl_trace_rank_0, ...) or of a recording (rank0.json, ...)",
    )
    doctor.add_argument(
        "factory",
        metavar="MODEL",
        nargs="?",
        help="the job's model, as fsdpviz report takes it: hf:ID or MODULE:FACTORY",
    )
    doctor.add_argument(
        "--inputs", metavar="MODULE:FACTORY", help="callable returning the model inputs"
    )
    add_fsdp_flags(doctor)
    add_source_flags(doctor)
    _add_output(doctor, "doctor.html", full_help=full_help)
    doctor.set_defaults(func=_cmd_doctor, parser=doctor)


def _add_output(
    parser: argparse.ArgumentParser, default: str, *, given: bool = False, full_help: bool = False
) -> None:
    """``-o``; ``given``: parse to None when it is left out (the command applies ``default``)."""
    if full_help:
        from fsdpviz.export import SUFFIXES

        formats = f": {', '.join(SUFFIXES)}"
    else:
        formats = " (see --help)"
    parser.add_argument(
        "-o",
        "--output",
        default=None if given else default,
        metavar="PATH",
        help=f"file to write; its suffix picks the format{formats} (default: {default})",
    )


def _add_world_size(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--world-size", type=positive_int, default=8, metavar="N", help="ranks (default: 8)"
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    from fsdpviz.examples import example_analysis

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


def _cmd_report(args: argparse.Namespace) -> int:
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
    # The command line can run: torch is loaded from here on.
    import warnings

    from fsdpviz.configs import ConfigNote, from_torchtitan
    from fsdpviz.schedule.predict import analyze

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


def _cmd_tune(args: argparse.Namespace) -> int:
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


def _cmd_doctor(args: argparse.Namespace) -> int:
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
    from fsdpviz.flight import FlightRecorderRun, load_run
    from fsdpviz.recording import diff

    try:
        run = load_run(args.dumps)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    prediction = None
    if source is not None:
        from fsdpviz.schedule.predict import analyze

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
    from fsdpviz import load
    from fsdpviz.flight import FlightRecorderRun
    from fsdpviz.schema.report import Report

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
    import warnings

    from fsdpviz.configs import ConfigNote, from_torchtitan

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
    from fsdpviz.export import SUFFIXES, suffix_of

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
    from fsdpviz.export import save

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
    from fsdpviz.views.card import job_items

    items = job_items(report.config, detailed=True)
    return f"  job: {', '.join(items)}" if items else ""


def _as_flags(text: str, report: Any, source: Source) -> str:
    """``text`` (a report's summary or warning) with the options its warnings advise
    (``FsdpWarning.fix``, as analyze takes them) written as this command line's flags; a
    saved report's as they were written."""
    from fsdpviz.schema.report import option_text

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
    from torch import nn

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
