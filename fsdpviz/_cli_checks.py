"""The checks of the ``fsdpviz`` command line, made before anything is loaded: where each
command's model comes from (MODEL checked as written), the file it writes, and its flags.

:mod:`fsdpviz.cli` runs a command's check (``check_demo``, ``check_report``, ``check_tune``,
``check_doctor``) and only then imports the commands (:mod:`fsdpviz._cli_commands`), which
load torch: a mistake is answered without it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fsdpviz._options_cli import (
    Source,
    UsageError,
    check_applies,
    check_flags,
    hf_id,
    job_flag_value,
)

__all__ = [
    "DOES_NOT_FIT",
    "check_demo",
    "check_doctor",
    "check_report",
    "check_tune",
    "factory_spec",
]

DOES_NOT_FIT = 3
"""Exit status of ``fsdpviz report --check`` for a plan that does not fit."""


def check_demo(args: argparse.Namespace) -> tuple[Path]:
    """``fsdpviz demo``'s file to write."""
    return (_output_path(args.output),)


def check_report(args: argparse.Namespace) -> tuple[Source, Path, bool]:
    """``fsdpviz report``'s model source, its file to write and whether ``-o`` named it."""
    source = _source(args)
    what = args.factory or "--torchtitan-config"
    check_applies(args, source, what)
    explicit = args.output is not None
    path = _output_path(args.output if explicit else "report.html")
    if source == "saved":
        return source, path, explicit
    if args.check and args.trace == "fx":
        raise UsageError(
            "--check needs the activations the trace measures, and --trace fx measures "
            "none; use --trace meta (the default) or real"
        )
    check_flags(args)
    if args.inputs is not None:
        factory_spec(args.inputs, "--inputs")
    return source, path, explicit


def check_tune(args: argparse.Namespace) -> tuple[Path, Source]:
    """``fsdpviz tune``'s file to write (the page or the search as JSON) and its model's
    source."""
    path = Path(args.output)
    if path.suffix not in (".html", ".json"):
        raise UsageError(
            f"cannot write {args.output!r}: fsdpviz tune writes the page (.html) or the "
            "search as JSON (.json)"
        )
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {args.output!r}: its directory does not exist")
    source = _planned_source(  # (nothing loaded yet: the flags are checked first)
        args,
        f"fsdpviz tune searches a model's configurations; {args.factory!r} is a saved "
        "report or recording: give MODEL as hf:ID or MODULE:FACTORY",
    )
    return path, source


def check_doctor(args: argparse.Namespace) -> tuple[Path, Source | None]:
    """``fsdpviz doctor``'s file to write and its model's source (None: the dumps alone)."""
    path = _output_path(args.output)
    planned = args.factory is not None or args.torchtitan_config or job_flag_value(args)
    source: Source | None = None
    if planned:
        source = _planned_source(
            args,
            f"MODEL is the job's model (hf:ID or MODULE:FACTORY); {args.factory!r} is a saved "
            "report or recording",
        )
    else:
        check_applies(args, "saved", args.dumps)
    return path, source


def _planned_source(args: argparse.Namespace, refusal: str) -> Source:
    """The source of MODEL for a command that plans it (tune, doctor), its flags checked: a
    saved report or recording is refused, saying ``refusal``."""
    source = _source(args)
    if source == "saved":
        raise UsageError(refusal)
    check_applies(args, source, args.factory or "--torchtitan-config")
    check_flags(args)
    return source


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
    factory_spec(spec, "MODULE:FACTORY")
    return "factory"


def _looks_like_a_path(spec: str) -> bool:
    """A MODEL written as a file or folder (``./runs/r1``, ``report.json``), not as an id or
    a factory."""
    if spec.startswith(("./", "../", "/", "~")):
        return True
    return ":" not in spec and Path(spec).suffix.lower() in (".json", ".html", ".jsonl")


def _is_saved(spec: str) -> bool:
    """Whether MODEL names what :func:`fsdpviz.load` reads (a saved report, a recording, flight
    recorder dumps) rather than a model: a path that exists, and no Hugging Face config."""
    p = Path(spec)
    return ":" not in spec and p.exists() and not p.joinpath("config.json").is_file()


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


def factory_spec(spec: str, what: str) -> tuple[str, str]:
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
