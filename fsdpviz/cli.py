"""The ``fsdpviz`` command line.

Usage::

    fsdpviz demo [-o fsdpviz-demo.html] [--world-size 8]
    fsdpviz report mypkg.models:build_model --inputs mypkg.models:make_batch \\
        --policy transformer:DecoderLayer --world-size 64 -o report.html
    fsdpviz report mypkg.models:build_model --inputs mypkg.models:make_batch \\
        --fully-shard DecoderLayer --mixed-precision bf16,fp32 -o report.html   # FSDP2

The output's suffix picks the format (:func:`fsdpviz.export.save`): ``.html``
(interactive page), ``.json`` (Chrome trace that ``fsdpviz.load`` reads back),
``.png`` / ``.svg`` / ``.pdf`` / ``.jpeg`` / ``.webp`` (the wrap-unit explorer),
``.graphml`` / ``.nodelink.json`` (the unit graph).

Exit status: 0 on success, 2 for usage errors (bad arguments, a factory or
class name that cannot be found), 1 when the analysis itself fails with an
:class:`fsdpviz.FsdpvizError`.
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
from typing import Any

from torch import nn

from fsdpviz._options_cli import UsageError, add_fsdp_flags, analyze_kwargs, positive_int
from fsdpviz.errors import FsdpvizError

_PROG = "fsdpviz"


def main(argv: list[str] | None = None) -> int:
    """Run ``fsdpviz`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse reports its own errors and --help this way
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    command: Callable[[argparse.Namespace], int] = args.func
    try:
        return command(args)
    except UsageError as exc:
        sub: argparse.ArgumentParser = args.parser
        sub.print_usage(sys.stderr)
        print(f"{sub.prog}: error: {exc}", file=sys.stderr)
        return 2
    except FsdpvizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _build_parser() -> argparse.ArgumentParser:
    from fsdpviz._version import __version__

    parser = argparse.ArgumentParser(
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
    _add_output(demo, "fsdpviz-demo.html")
    _add_world_size(demo)
    demo.set_defaults(func=_cmd_demo, parser=demo)

    report = subs.add_parser(
        "report",
        help="analyse your own model",
        description="Analyse the model returned by MODULE:FACTORY (a callable returning a "
        "model, or a (model, inputs) tuple) with FSDP1 (--policy ...) or FSDP2 "
        "(--fully-shard ...) options and write the report.",
    )
    report.add_argument("factory", metavar="MODULE:FACTORY", help="e.g. mypkg.models:build")
    report.add_argument(
        "--inputs",
        metavar="MODULE:FACTORY",
        help="callable returning the model inputs (a dict of keyword arguments, a tuple "
        "of positional arguments or one tensor); required unless FACTORY returns them",
    )
    add_fsdp_flags(report)
    _add_output(report, "fsdpviz-report.json")
    report.set_defaults(func=_cmd_report, parser=report)
    return parser


def _add_output(parser: argparse.ArgumentParser, default: str) -> None:
    from fsdpviz.export import SUFFIXES

    parser.add_argument(
        "-o",
        "--output",
        default=default,
        metavar="PATH",
        help=f"file to write; its suffix picks the format: {', '.join(SUFFIXES)} "
        f"(default: {default})",
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


def _cmd_report(args: argparse.Namespace) -> int:
    from fsdpviz.schedule.predict import analyze

    path = _output_path(args.output)
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
    kwargs = analyze_kwargs(args, model)
    start = time.perf_counter()
    report = analyze(model, inputs, **kwargs)
    return _write(report, path, time.perf_counter() - start)


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
    return path


def _write(report: Any, path: Path, seconds: float) -> int:
    from fsdpviz.export import save

    save(report, path)
    print(report.summary())
    print(f"wrote {path} ({seconds:.1f}s)")
    return 0


def _import_object(spec: str, what: str) -> Any:
    """Resolve ``module:attr[.attr]``, raising :class:`UsageError` when it is not there."""
    module_name, sep, attr_path = spec.rpartition(":")
    if not sep or not module_name or not attr_path:
        raise UsageError(f"{what} must be MODULE:NAME (e.g. mypkg.models:build), got {spec!r}")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        raise UsageError(
            f"{what}: {module_name!r} looks like a file; give the importable module name "
            f"(e.g. {Path(module_name).stem!r}) and run from its directory"
        )
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
    factory = _import_object(spec, "MODULE:FACTORY")
    if isinstance(factory, nn.Module):
        return factory, None
    if not callable(factory):
        raise UsageError(f"{spec} is a {type(factory).__name__}, not a callable")
    result = factory()
    if isinstance(result, nn.Module):
        return result, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module):
        return result[0], result[1]
    raise UsageError(
        f"{spec} returned {type(result).__name__}; expected an nn.Module or (model, inputs)"
    )
