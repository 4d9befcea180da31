"""FSDP2 (``fully_shard``) traces for :func:`fsdpviz.load_profile`.

FSDP2 labels name their group: ``FSDP::pre_forward (layers.0)``,
``FSDP::all_gather (layers.1)``, ``FSDP::forward_prefetch for layers.2``,
``FSDP::pre_backward (layers.3)``, ``FSDP::post_backward_reshard (...)``,
``FSDP::post_backward_reduce (...)``, ``FSDP::root_pre_forward`` and
``FSDP::root_post_backward_callback`` (the root group's labels carry no name).
So all-gathers and reduce-scatters come with their unit, phase, prefetch flag
and the hook that issued them, as :class:`~fsdpviz.recording.FSDP2Recorder` sees
them; frees have no label of their own and are not rebuilt.
"""

from __future__ import annotations

import re
from typing import Any

from fsdpviz.schema.events import Hook

_LABEL = re.compile(r"^FSDP::(?P<what>[a-z_]+)(?: \((?P<fqn>.*)\))?$")
_PREFETCH = re.compile(r"^FSDP::(?P<pass>forward|backward)_prefetch for (?P<fqn>.*)$")
_HOOKS: dict[str, Hook] = {
    "pre_forward": "pre_forward",
    "post_forward": "post_forward",
    "pre_backward": "pre_backward",
    "post_backward_reshard": "post_backward",
    "post_backward_reduce": "post_backward",
}
KINDS = ("all_gather", "reduce_scatter")


def is_fsdp2_trace(events: list[dict[str, Any]]) -> bool:
    return any(str(e.get("name", "")).startswith("FSDP::") for e in events)


def fsdp2_found(
    spans: list[dict[str, Any]], collective_ops: set[str]
) -> tuple[list[dict[str, Any]], list[float]]:
    """The collectives of one thread, as dicts of ``_Found`` fields, and root-forward starts."""
    found: list[dict[str, Any]] = []
    roots: list[float] = []
    stack: list[tuple[str, float, dict[str, Any] | None]] = []  # label, end, event it opened
    sticky: tuple[Hook, str] | None = None
    first_pre_backward: str | None = None
    for e in spans:
        ts, end, name = float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e["name"])
        while stack and stack[-1][1] <= ts:
            stack.pop()
        ext = e.get("args", {}).get("External id")
        if name in collective_ops and ext is not None:
            for _, _, opened in stack:
                if opened is not None:
                    opened["external_ids"].add(int(ext))
        if name == "FSDP::root_pre_forward":
            roots.append(ts)
            first_pre_backward = None
        match = _LABEL.match(name)
        if match is None or _PREFETCH.match(name):
            stack.append((name, end, None))
            continue
        what, fqn = match["what"], match["fqn"] or ""
        in_final = any(label == "FSDP::root_post_backward_callback" for label, _, _ in stack)
        if what in _HOOKS and not in_final:
            sticky = (_HOOKS[what], fqn)
            if what == "pre_backward" and first_pre_backward is None:
                first_pre_backward = fqn
        event: dict[str, Any] | None = None
        if what in ("all_gather", "post_backward_reduce"):
            prefetch = next((_PREFETCH.match(s) for s, _, _ in stack if _PREFETCH.match(s)), None)
            forward = any(s.startswith("FSDP::pre_forward") for s, _, _ in stack)
            if prefetch is not None:
                forward = prefetch["pass"] == "forward"
            hook, hook_unit = sticky or ("pre_forward", fqn)
            if in_final:
                hook, hook_unit = "final_callback", first_pre_backward or ""
            event = {
                "ts": ts,
                "dur": end - ts,
                "kind": "all_gather" if what == "all_gather" else "reduce_scatter",
                "hook": hook,
                "phase": "forward" if forward and what == "all_gather" else "backward",
                "prefetch": prefetch is not None and what == "all_gather",
                "external_ids": set(),
                "unit": fqn,
                "hook_unit": hook_unit,
            }
            found.append(event)
        stack.append((name, end, event))
    return found, roots
