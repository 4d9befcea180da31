"""A tuning in words: the best configuration, what each alternative changes, what would fit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsdpviz.schema.memory import size_text
from fsdpviz.schema.timeline import duration_text

if TYPE_CHECKING:
    from fsdpviz.tune.result import Candidate, Tuning

from fsdpviz.tune.result import KNOB_NAMES


def _anchor(tuning: Tuning) -> Candidate:
    best = tuning.best
    if best is not None:
        return best
    return min(tuning.candidates, key=lambda c: c.memory_bytes)


def alternatives(tuning: Tuning) -> list[dict[str, Any]]:
    """Per knob, the best configuration that differs from the anchor (the best, else the
    lightest) in that knob, as few other knobs changed as possible (fitting ones first,
    then the most tokens/s)."""
    anchor = _anchor(tuning)
    out: list[dict[str, Any]] = []
    for knob in anchor.knobs:
        others = [c for c in tuning.candidates if c.knobs.get(knob) != anchor.knobs[knob]]
        if not others:
            continue

        fewest = min(_distance(c, anchor, knob) for c in others)
        near = [c for c in others if _distance(c, anchor, knob) == fewest]
        pick = max(near, key=lambda c: (c.fits, round(c.tokens_per_s, 6), -c.memory_bytes))
        out.append({"knob": knob, "candidate": pick, "text": _change(anchor, pick, knob)})
    return out


def why_slow(tuning: Tuning, c: Candidate) -> list[dict[str, Any]]:
    """See :meth:`fsdpviz.tune.Tuning.why_slow`."""
    from fsdpviz.cost.slowdowns import slowdowns

    out = []
    checkpointed = c.knobs.get("activation_checkpointing", "none") != "none"
    for row in slowdowns(c.report, checkpointing=checkpointed):
        knob = row["knob"]
        others = [
            o for o in tuning.candidates if knob in o.knobs and o.knobs[knob] != c.knobs.get(knob)
        ]
        pick: Candidate | None = None
        if others:
            fewest = min(_distance(o, c, knob) for o in others)
            near = [o for o in others if _distance(o, c, knob) == fewest]
            pick = max(near, key=lambda o: (o.fits, round(o.tokens_per_s, 6)))
        if pick is not None:
            predicted = f"tune: {_change(c, pick, knob)}"
        elif knob in ("compile", "float8", "cpu_offload"):
            predicted = f"tune tries {knob} with allow=({knob!r},)"
        else:
            predicted = ""
        out.append(row | {"prediction": pick, "predicted": predicted})
    return out


def _distance(c: Candidate, anchor: Candidate, knob: str) -> int:
    """How many knobs other than ``knob`` differ between ``c`` and ``anchor``."""
    return sum(1 for k, v in c.knobs.items() if k != knob and anchor.knobs.get(k) != v)


def _change(anchor: Candidate, other: Candidate, knob: str) -> str:
    name = KNOB_NAMES.get(knob, knob)
    head = f"{name} {other.knobs[knob]} instead of {anchor.knobs[knob]}"
    also = [
        f"{KNOB_NAMES.get(k, k)} {v}"
        for k, v in other.knobs.items()
        if k != knob and anchor.knobs.get(k) != v
    ]
    if also:
        head += f" (with {', '.join(also)})"
    return f"{head}: {_speed(anchor, other)}, {other.verdict()}" + (
        "" if other.fits else ", does not fit"
    )


def _speed(anchor: Candidate, other: Candidate) -> str:
    if anchor.tokens_per_s <= 0:
        return f"{other.tokens_per_s:,.0f} tokens/s"
    ratio = other.tokens_per_s / anchor.tokens_per_s
    change = ratio - 1
    if abs(change) < 0.0005:
        return "same tokens/s"
    if ratio >= 2:
        return f"{ratio:.1f}x the tokens/s"
    return f"{change:+.0%} tokens/s" if abs(change) >= 0.01 else f"{change:+.1%} tokens/s"


def _config_lines(c: Candidate) -> list[str]:
    return [f"  {KNOB_NAMES.get(k, k)}: {v}" for k, v in c.knobs.items()]


def summary(tuning: Tuning) -> str:
    """The tuning in words (``str(tuning)``)."""
    best = tuning.best
    user = tuning.user
    n = len(tuning.candidates)
    fits = len(tuning.fitting)
    room = (
        f"a budget of {size_text(tuning.budget)} per rank"
        if tuning.budget is not None
        else f"{tuning.machine}'s usable memory"
    )
    sizes = [str(w) for w in tuning.world_sizes]
    ranks = sizes[0] if len(sizes) == 1 else f"{', '.join(sizes[:-1])} or {sizes[-1]}"
    lines = [
        f"fsdpviz tune · {tuning.api} on {ranks} x {tuning.machine}: {n} configurations "
        f"({tuning.traces} traced, the rest replayed) in {tuning.seconds:.1f} s; {fits} fit "
        f"{room}."
    ]
    if best is not None:
        lines.append(
            f"Best: {best.tokens_per_s:,.0f} tokens/s per GPU "
            f"({best.total_tokens_per_s:,.0f} on {best.world_size} GPUs), MFU {best.mfu:.1%}, "
            f"step {duration_text(best.step_s)}, {best.verdict()}:"
        )
        lines += _config_lines(best)
        if best is user:
            lines.append("That is the configuration as given.")
        else:
            speed = (
                f"{best.tokens_per_s / user.tokens_per_s:.2f}x the tokens/s"
                if user.tokens_per_s > 0
                else "faster"
            )
            mine = "fits" if user.fits else "does not fit"
            lines.append(
                f"The configuration as given: {user.tokens_per_s:,.0f} tokens/s per GPU, "
                f"{user.verdict()} ({mine}); the best has {speed}."
            )
        if len(tuning.world_sizes) > 1:
            for ws in tuning.world_sizes:
                b = tuning.best_for(ws)
                if b is None:
                    lines.append(f"  on {ws} ranks nothing fits")
                else:
                    lines.append(
                        f"  on {ws} ranks: {b.tokens_per_s:,.0f} tokens/s per GPU, "
                        f"{b.total_tokens_per_s:,.0f} in total"
                    )
    else:
        low = _anchor(tuning)
        lines.append(
            f"Nothing fits. The lightest configuration needs {low.verdict()} (its peak "
            f"{size_text(low.peak_bytes)}, dominated by {low.dominant}), with:"
        )
        lines += _config_lines(low)
        needs = tuning.needs or {}
        if needs.get("world_size"):
            lines.append(
                f"It fits from {needs['world_size']} ranks (peak "
                f"{size_text(needs['peak_bytes'])}): the sharded state shrinks with the ranks."
            )
        elif needs.get("reason"):
            lines.append(f"{needs['reason'][0].upper()}{needs['reason'][1:]}.")
        pinned = [n for n in tuning.notes if n.endswith("(pinned)")]
        if pinned:
            lines.append(
                "Pinned, so not turned: " + "; ".join(p[: -len(" (pinned)")] for p in pinned) + "."
            )
    slow = [r for r in why_slow(tuning, user) if r["seconds"] > 0][:4]
    if slow:
        lines.append(
            f"Why the configuration as given is slow (its step: {duration_text(user.step_s)}):"
        )
        for r in slow:
            lines.append(f"  {r['share']:.0%} {r['text']}")
            if r["predicted"]:
                lines.append(f"      {r['predicted']}")
    alts = alternatives(tuning)
    if alts:
        lines.append("Per knob, the best alternative:")
        lines += [f"  {a['text']}" for a in alts]
    rest = [n for n in tuning.notes if not n.endswith("(pinned)")]
    if rest:
        lines.append("Notes:")
        lines += [f"  {n}" for n in rest]
    return "\n".join(lines)


__all__ = ["alternatives", "summary"]
