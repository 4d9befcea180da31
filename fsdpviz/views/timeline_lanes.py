"""The timeline's vocabulary: the kinds of events, the hooks, the stream lane of each
collective, the clocks x is read on, and what ``memory=`` accepts.

The columns of :func:`fsdpviz.views.timeline_data` index into these tuples (a step's
``kind`` into :data:`KINDS`, then :data:`PP_KINDS`; its ``hook`` into :data:`HOOKS`),
which the data carries as ``kinds`` and ``hooks``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from fsdpviz.cost.memory import MemoryLane
from fsdpviz.schema.events import TP_KINDS, Event
from fsdpviz.schema.report import Report

__all__ = [
    "ALWAYS_DRAWN",
    "AUTO_ITERATION",
    "AUTO_MACHINE",
    "FLOAT8_SCALES",
    "FREE",
    "HOOKS",
    "KINDS",
    "LANE_ORDER",
    "MODELLED_CLOCK",
    "PP_KINDS",
    "RECORDED_CLOCK",
    "STREAM_LANES",
    "UNTIMED_CLOCK",
    "MemoryOption",
    "MemorySeries",
    "MemorySource",
    "stream_lane",
]

MemorySeries = Sequence[float]
"""Bytes in use after each event of the first group, one float per event."""
MemorySource = MemorySeries | Callable[[Report], MemorySeries] | None
"""A series, or a memory model called with the report (re-run after each re-plan)."""
MemoryOption = Literal["auto"] | MemoryLane | MemorySeries | Callable[[Report], Any] | None
"""``"auto"`` (:func:`fsdpviz.cost.memory_lane`, AdamW, as ``report.memory``), a
:class:`~fsdpviz.cost.MemoryLane`, bytes after each event, a callable ``report ->`` either,
or ``None`` (no memory lane)."""

KINDS = (
    "all_gather", "free", "reduce_scatter", "all_reduce", "h2d", "d2h",
    "tp_all_gather", "tp_reduce_scatter", "tp_all_reduce", "tp_all_to_all",
    "cp_all_gather", "cp_all_to_all", "cast",
)  # fmt: skip
PP_KINDS = ("pp_send", "pp_recv")
"""Pipeline parallelism's sends and receives: after :data:`KINDS` where they occur."""
FREE = KINDS.index("free")
HOOKS = ("pre_forward", "post_forward", "pre_backward", "post_backward", "final_callback")
STREAM_LANES: dict[tuple[str, str | None], str] = {
    ("all_gather", None): "all-gather",
    ("reduce_scatter", None): "reduce-scatter",
    ("all_reduce", None): "reduce-scatter",
    ("all_reduce", "replicate"): "replicate all-reduce",
    # a float8 weight's amax, before its all-gather: torchao's fsdp_pre_all_gather runs in
    # FSDP2's foreach_all_gather, on its copy-in stream (the all-gather's)
    ("all_reduce", "shard"): "all-gather",
    ("h2d", None): "host-device copies",
    ("d2h", None): "host-device copies",
    ("cast", None): "parameter casts",
    ("tp_all_gather", "tp"): "tensor parallel",
    ("tp_reduce_scatter", "tp"): "tensor parallel",
    ("tp_all_reduce", "tp"): "tensor parallel",
    ("tp_all_to_all", "tp"): "tensor parallel",
    ("pp_send", "pp"): "pipeline sends",
    ("pp_recv", "pp"): "pipeline receives",
    ("cp_all_gather", "cp"): "context parallel",
    ("cp_all_to_all", "cp"): "context parallel",
}
"""The stream lane of a collective, by ``(kind, group)`` (but for :data:`FLOAT8_SCALES`'s).
``all-gather`` and ``reduce-scatter`` are always drawn; other lanes only where their events
occur."""
FLOAT8_SCALES = "float8 scales all-reduce"
"""The lane of ``precompute_float8_dynamic_scale_for_fsdp``'s all-reduce of every float8
weight's amax (an ``all_reduce`` over the shard group of no one ``module``): no all-gather's
(DTensor issues it after the optimizer step, on the compute stream, for the stacked amaxes'
``torch.clamp``) and no gradient's."""
LANE_ORDER = (*dict.fromkeys([*STREAM_LANES.values()]), FLOAT8_SCALES)
"""The stream lanes, top to bottom."""
ALWAYS_DRAWN = ("all-gather", "reduce-scatter")
"""The stream lanes every group draws, whether or not their events occur."""
UNTIMED_CLOCK = "event index: the order of the events, not their durations"
RECORDED_CLOCK = "recorded"
MODELLED_CLOCK = "modelled on {machine} by fsdpviz.cost.timeline"
AUTO_ITERATION = "auto"
"""``iteration="auto"``: a recording's first divergent iteration, else the last
(:func:`~fsdpviz.views.timeline_view.opening_iteration`)."""
AUTO_MACHINE = "auto"
"""``machine="auto"``: each report on the machine it was planned for (``analyze(...,
machine=...)``, else the H100 preset), as ``report.memory`` and ``report.timeline``."""


def stream_lane(e: Event) -> str:
    """The stream lane ``e`` runs on (:data:`STREAM_LANES`); a clear error for a kind
    without one."""
    if e.kind == "all_reduce" and e.group == "shard" and e.module is None:
        return FLOAT8_SCALES
    group = e.group
    if group is None and e.kind in TP_KINDS:
        # the tp all-reduce of precompute_float8_dynamic_scale_for_fsdp in a report saved
        # before the plan stated its group
        group = "tp"
    lane = STREAM_LANES.get((e.kind, group))
    if lane is None:
        raise ValueError(
            f"no lane for {e.describe()}; add ({e.kind!r}, {e.group!r}) to STREAM_LANES"
        )
    return lane
