"""The flags of ``fsdpviz tune`` and ``%fsdpviz tune``: tune's own flags
(:func:`add_tune_flags`, after :func:`fsdpviz._options_cli.add_fsdp_flags`'s); the search
they ask for is :mod:`fsdpviz._tune_command`'s.

Importing this module imports no torch (the command line's parser takes its flags).
"""

from __future__ import annotations

import argparse

from fsdpviz._options_cli import positive_int
from fsdpviz.plan.option_specs import RESHARD

__all__ = ["add_tune_flags"]


def add_tune_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``fsdpviz tune``'s own flags to ``parser`` (after :func:`add_fsdp_flags`, whose
    ``--world-size`` takes a list of counts here)."""
    sizes = parser._option_string_actions["--world-size"]
    sizes.type = _world_sizes
    sizes.metavar = "N[,N...]"
    sizes.help = "ranks, or counts to compare (8,16,32; default: the config file's, else 8)"
    parser.add_argument(
        "--allow",
        metavar="WHAT",
        type=_words,
        default=[],
        help="also try compile, float8 and/or cpu_offload (comma-separated): they change "
        "numerics or start-up, so only when asked (CPU offload is tried anyway when "
        "nothing else fits)",
    )
    parser.add_argument(
        "--pin",
        metavar="KNOBS",
        type=_words,
        default=[],
        help="knobs that stay as the flags give them (comma-separated): wrap, "
        f"{RESHARD.name}, backward_prefetch, forward_prefetch, "
        "activation_checkpointing, precision, micro_batch, mesh, cpu_offload, compile, float8",
    )
    parser.add_argument(
        "--tokens-per-step",
        type=positive_int,
        metavar="N",
        help="tokens per rank per optimizer step (default: the batch x --grad-accum)",
    )
    parser.add_argument(
        "--memory-budget",
        metavar="BYTES",
        help="a peak per rank to fit (60GiB) instead of the machine's memory",
    )
    parser.add_argument(
        "--api",
        choices=["fsdp1", "fsdp2"],
        help="which FSDP to tune (default: FSDP1 where its flags are given, else FSDP2)",
    )
    parser.add_argument(
        "--exhaustive",
        action="store_true",
        help="evaluate every combination of the knobs (one trace each) instead of the staged "
        "search",
    )
    parser.add_argument(
        "--code",
        choices=["python", "torchtitan", "accelerate"],
        help="print the code (or trainer keys) that run the best configuration (default: "
        "the trainer's where the configuration came from one, else python)",
    )


def _world_sizes(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",") if part.strip()]


def _words(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
