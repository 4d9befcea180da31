"""``fsdpviz tune`` and ``%fsdpviz tune`` from their flags: tune's own flags
(:func:`add_tune_flags`, after :func:`fsdpviz._options_cli.add_fsdp_flags`'s), the search
they ask for (:func:`run_tune`) and its frontier as a table (:func:`frontier_table`).

Importing this module imports no torch (the command line's parser takes its flags);
:func:`run_tune` and :func:`frontier_table` do.
"""

from __future__ import annotations

import argparse
import difflib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fsdpviz._options_cli import UsageError, positive_int
from fsdpviz.schema.memory import size_text

if TYPE_CHECKING:
    from torch import nn

__all__ = ["add_tune_flags", "frontier_table", "run_tune"]


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
        "reshard_after_forward, backward_prefetch, forward_prefetch, "
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


def run_tune(
    args: argparse.Namespace,
    model: nn.Module,
    inputs: Any,
    wraps: Sequence[type[nn.Module]],
    say: Any = print,
) -> Any:
    """:func:`fsdpviz.tune` for the parsed flags: the flags give the user's configuration
    (as ``analyze_kwargs`` reads them; FSDP2 unless FSDP1's flags or ``--api fsdp1``),
    ``add_tune_flags``'s the search. ``say`` prints the notes."""
    # lazy: these load torch, and the command line's parser imports this module
    from fsdpviz._options_kwargs import analyze_kwargs
    from fsdpviz.tuning import KNOBS, tune

    for knob in args.pin:
        if knob not in KNOBS:
            close = difflib.get_close_matches(knob, KNOBS, n=1)
            tip = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"--pin: unknown knob {knob!r}{tip}")
    sizes: list[int] | None = args.world_size
    args.world_size = sizes[0] if sizes else None
    notes: list[str] = []
    try:
        kwargs = analyze_kwargs(args, model, wraps, notes)
    finally:
        args.world_size = sizes
    for line in notes:
        say(f"note: {line}")
    api = args.api
    if api is None and not _fsdp1_flags(args):
        api = "fsdp2"
    if api == "fsdp2" and "fully_shard" not in kwargs:
        kwargs = _as_fsdp2(kwargs, wraps)
    world = kwargs.pop("world_size", 8)
    machine = kwargs.pop("machine", "h100")
    kwargs.pop("progress", None)
    if "mesh" in kwargs:
        world = None
    return tune(
        model,
        inputs,
        world_size=sizes or ([world] if world is not None else _mesh_ranks(kwargs)),
        machine=machine,
        allow=args.allow,
        knobs=[k for k in KNOBS if k not in args.pin],
        tokens_per_step=args.tokens_per_step,
        memory_budget=args.memory_budget,
        exhaustive=args.exhaustive,
        api=api,
        **kwargs,
    )


def _fsdp1_flags(args: argparse.Namespace) -> bool:
    """Whether the flags plan FSDP1 (a wrap policy, its switches, or a config file)."""
    given = [args.policy, args.sharding_strategy, args.backward_prefetch, args.accelerate_config]
    return any(v is not None for v in given) or args.forward_prefetch or args.use_orig_params


def _as_fsdp2(kwargs: dict[str, Any], wraps: Sequence[type[nn.Module]]) -> dict[str, Any]:
    """The configuration the flags give, in FSDP2's words (``fsdpviz tune`` without FSDP1
    flags): the default wrap classes as ``fully_shard``, mixed precision as ``mp_policy``."""
    out = {
        k: v
        for k, v in kwargs.items()
        if k not in ("auto_wrap_policy", "forward_prefetch", "use_orig_params", "mixed_precision")
    }
    out["fully_shard"] = list(wraps)
    mp = kwargs.get("mixed_precision")
    if mp is not None:
        from torch.distributed.fsdp import MixedPrecisionPolicy  # lazy: torch, as above

        out["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=mp.param_dtype, reduce_dtype=mp.reduce_dtype
        )
    return out


def _mesh_ranks(kwargs: dict[str, Any]) -> list[int]:
    # lazy: loads torch; the parser imports this module
    from fsdpviz.plan.fsdp2_options import mesh_dims

    sizes, _ = mesh_dims(kwargs["mesh"], 3)
    return [math.prod(sizes or (8,))]


def frontier_table(tuning: Any) -> str:
    """The frontier as a table: memory per rank, tokens/s per GPU, and what each
    configuration changes against the best (the lowest peak where nothing fits); the best
    and the user's marked."""
    from fsdpviz.tuning.space import KNOB_NAMES  # lazy: loads torch

    rows = list(tuning.frontier)
    if tuning.user not in rows:
        rows.append(tuning.user)
    anchor = tuning.best or min(tuning.candidates, key=lambda c: c.memory_bytes)
    rows.sort(key=lambda c: c.memory_bytes)
    lines = [
        "Frontier (no other configuration is both faster and lighter), against "
        f"{'the best' if tuning.best is not None else 'the lowest peak'}:"
    ]
    for c in rows:
        mark = "best" if c is tuning.best else "yours" if c.user else ""
        changed = [
            f"{KNOB_NAMES.get(k, k)} {v}" for k, v in c.knobs.items() if anchor.knobs.get(k) != v
        ]
        what = ", ".join(changed) if changed else "(the same)" if c is not anchor else ""
        fit = "fits" if c.fits else "does not fit"
        lines.append(
            f"  {mark:>5} {size_text(c.memory_bytes):>10} {c.tokens_per_s:>10,.0f} tokens/s  "
            f"{fit:<12} {what}".rstrip()
        )
    return "\n".join(lines)


def _world_sizes(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",") if part.strip()]


def _words(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
