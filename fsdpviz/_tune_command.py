"""What ``fsdpviz tune`` and ``%fsdpviz tune`` run once their flags are checked: the search
the flags ask for (:func:`run_tune`) and its frontier as a table (:func:`frontier_table`).

It loads torch: the command line imports it with its commands (:mod:`fsdpviz._cli_commands`),
after the check; tune's own flags, which the parser takes, are in
:mod:`fsdpviz._options_tune`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from torch.distributed.fsdp import MixedPrecisionPolicy

from fsdpviz._options_cli import UsageError
from fsdpviz._options_kwargs import analyze_kwargs
from fsdpviz.errors import did_you_mean
from fsdpviz.schema.memory import size_text
from fsdpviz.tuning import KNOBS, tune
from fsdpviz.tuning.space import KNOB_NAMES

if TYPE_CHECKING:
    from torch import nn

    from fsdpviz.api.keywords import AnalyzeKwargs
    from fsdpviz.cost.hardware import Machine
    from fsdpviz.schema.keywords import FSDPKwargs

__all__ = ["frontier_table", "run_tune"]


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
    for knob in args.pin:
        if knob not in KNOBS:
            tip = did_you_mean(knob, KNOBS)
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
    world: int | None = kwargs.pop("world_size", 8)
    machine = cast("Machine | str", kwargs.pop("machine", "h100"))  # analyze_kwargs sets no None
    kwargs.pop("progress", None)
    if "mesh" in kwargs:
        world = None
    return tune(
        model,
        inputs,
        world_size=sizes or world,  # None: the mesh's ranks
        machine=machine,
        allow=args.allow,
        knobs=[k for k in KNOBS if k not in args.pin],
        tokens_per_step=args.tokens_per_step,
        memory_budget=args.memory_budget,
        exhaustive=args.exhaustive,
        api=api,
        **cast("FSDPKwargs", kwargs),  # world_size, machine and progress taken out
    )


def _fsdp1_flags(args: argparse.Namespace) -> bool:
    """Whether the flags plan FSDP1 (a wrap policy, its switches, or a config file)."""
    given = [args.policy, args.sharding_strategy, args.backward_prefetch, args.accelerate_config]
    return any(v is not None for v in given) or args.forward_prefetch or args.use_orig_params


def _as_fsdp2(kwargs: AnalyzeKwargs, wraps: Sequence[type[nn.Module]]) -> AnalyzeKwargs:
    """The configuration the flags give, in FSDP2's words (``fsdpviz tune`` without FSDP1
    flags): the default wrap classes as ``fully_shard``, mixed precision as ``mp_policy``."""
    out = cast(
        "AnalyzeKwargs",
        {
            k: v
            for k, v in kwargs.items()
            if k
            not in ("auto_wrap_policy", "forward_prefetch", "use_orig_params", "mixed_precision")
        },
    )
    out["fully_shard"] = list(wraps)
    mp = kwargs.get("mixed_precision")
    if mp is not None:
        out["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=mp.param_dtype, reduce_dtype=mp.reduce_dtype
        )
    return out


def frontier_table(tuning: Any) -> str:
    """The frontier as a table: memory per rank, tokens/s per GPU, and what each
    configuration changes against the best (the lowest peak where nothing fits); the best
    and the user's marked."""
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
