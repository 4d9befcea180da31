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
import os
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsdpviz._cli_checks import DOES_NOT_FIT, check_demo, check_doctor, check_report, check_tune
from fsdpviz._options_cli import UsageError, add_fsdp_flags, add_source_flags, positive_int
from fsdpviz._options_tune import add_tune_flags
from fsdpviz._version import __version__
from fsdpviz.errors import ConfigError, FsdpvizError

_PROG = "fsdpviz"


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
    check: Callable[[argparse.Namespace], tuple[Any, ...]] = args.func
    try:
        checked = check(args)  # the command line alone: nothing is loaded yet
        from fsdpviz import _cli_commands  # lazy: loads torch, which a mistake does without

        command: Callable[..., int] = getattr(_cli_commands, f"cmd_{args.command}")
        return command(args, *checked)
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
    demo.set_defaults(func=check_demo, parser=demo)

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
    _add_model(
        report,
        "hf:meta-llama/Llama-3.1-8B, hf:./config-dir or mypkg.models:build; or a saved "
        "report, recording or dumps folder",
        inputs_help="callable returning the model inputs (a dict of keyword arguments, a "
        "tuple of positional arguments or one tensor); required unless FACTORY returns them",
    )
    _add_output(report, "report.html", given=True, full_help=full_help)
    report.add_argument(
        "--check",
        action="store_true",
        help=f"check that the plan fits in the machine's memory (--machine): exit status "
        f"{DOES_NOT_FIT} when it does not, 0 when it does (a CI gate); writes a file only "
        "with -o",
    )
    report.set_defaults(func=check_report, parser=report)
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
    _add_model(tune, "hf:meta-llama/Llama-3.1-8B, hf:./config-dir or mypkg.models:build")
    add_tune_flags(tune)
    _add_output(tune, "tune.html", full_help=full_help)
    tune.set_defaults(func=check_tune, parser=tune)


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
    _add_model(doctor, "the job's model, as fsdpviz report takes it: hf:ID or MODULE:FACTORY")
    _add_output(doctor, "doctor.html", full_help=full_help)
    doctor.set_defaults(func=check_doctor, parser=doctor)


def _add_model(
    parser: argparse.ArgumentParser,
    model_help: str,
    inputs_help: str = "callable returning the model inputs",
) -> None:
    """MODEL (``args.factory``, optional: a config file may bring the model), ``--inputs``
    and the flags that plan the model (FSDP's, and its source's), as ``report``, ``tune``
    and ``doctor`` take them."""
    parser.add_argument("factory", metavar="MODEL", nargs="?", help=model_help)
    parser.add_argument("--inputs", metavar="MODULE:FACTORY", help=inputs_help)
    add_fsdp_flags(parser)
    add_source_flags(parser)


def _add_output(
    parser: argparse.ArgumentParser, default: str, *, given: bool = False, full_help: bool = False
) -> None:
    """``-o``; ``given``: parse to None when it is left out (the command applies ``default``)."""
    if full_help:
        from fsdpviz.export import SUFFIXES  # lazy: plotly; only --help lists them

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
