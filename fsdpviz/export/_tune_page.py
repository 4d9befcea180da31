"""The page of a tuning (``tuning.save("tune.html")``), and its images.

One self-contained page, drawn by the front end the notebook uses: the tuning in words,
the tune view (every configuration as a point, the capacity line, the frontier, the best
and the configuration as given marked, the knob table beside it), and under it the
timeline, the explorer and the prefetch graph of the configuration selected. A click on a
point swaps them for that configuration's plan, if the page holds it: every configuration's
plan would make a page of hundreds of MB, so it holds the plans :func:`kept_plans` picks
(the one shown first, the configuration as given, each knob's best alternative, the
frontier; at most ``max_plans``, and no more than ``max_bytes`` of them packed), each
packed in a script of its own that the page unpacks when it is first shown. A point whose
plan the page does not hold says so, and how to get it.

Example::

    tuning.save("tune.html")                  # the best's plan shown first
    tuning.save("tune.html", selected=0)      # the configuration as given first
    tuning.save("tune.png", theme="dark")     # the scatter and the knob table (kaleido)
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Unpack

from fsdpviz.cost.hardware import Machine
from fsdpviz.errors import ConfigError
from fsdpviz.export._html import (
    PageTheme,
    check_theme,
    notes_list,
    pack,
    page_config,
    page_header,
    summary_items,
    write_page,
)
from fsdpviz.export._image import IMAGE_FORMATS, write_image
from fsdpviz.export._save import check_options
from fsdpviz.schema.keywords import TuneSaveKwargs
from fsdpviz.schema.memory import size_text
from fsdpviz.views.tune_view import TuneData, anchor_of, tune_data, tune_figure

if TYPE_CHECKING:
    from fsdpviz.tuning.result import Candidate, Tuning

__all__ = ["MAX_PLANS", "MAX_PLAN_BYTES", "kept_plans", "save_tuning", "tune_page"]

MAX_PLANS = 24
"""The most plans a tuning's page holds."""
MAX_PLAN_BYTES = 6 * 2**20
"""The most bytes of packed plans a tuning's page holds (the first plan always)."""

_OPTIONS = {
    "html": ("theme", "title", "selected", "max_plans", "max_bytes", "iteration", "machine"),
    "image": ("theme", "width", "height", "scale"),
}


def kept_plans(tuning: Tuning, first: Candidate, max_plans: int = MAX_PLANS) -> list[Candidate]:
    """The configurations whose plans a tuning's page holds, in the order they are kept:
    ``first`` (the one shown when the page opens), the best, the configuration as given,
    each knob's best alternative (:meth:`~fsdpviz.tuning.Tuning.alternatives`), then the
    frontier by memory; at most ``max_plans``."""
    order = [first]
    if tuning.best is not None:
        order.append(tuning.best)
    order.append(tuning.user)
    order += [a["candidate"] for a in tuning.alternatives()]
    data = tune_data(tuning)
    order += [tuning.candidates[k] for k in data["frontier"]]
    out: list[Candidate] = []
    for c in order:
        if all(c is not o for o in out):
            out.append(c)
    return out[: max(max_plans, 1)]


def _plan_title(tuning: Tuning, c: Candidate) -> str:
    tags = []
    if tuning.best is not None and c is tuning.best:
        tags.append("best")
    if c.user:
        tags.append("as given")
    for a in tuning.alternatives():
        if a["candidate"] is c:
            tags.append(f"the best other {a['knob'].replace('_', ' ')}")
    tag = f" ({', '.join(tags)})" if tags else ""
    if tuning.budget is not None:
        fit = "fits the budget" if c.fits else "over the budget"
        memory = f"peak {size_text(c.peak_bytes)} of {size_text(tuning.budget)}"
    else:
        fit = "fits" if c.fits else "does not fit"
        memory = c.verdict()
    return (
        f"Configuration #{c.index}{tag}: {c.tokens_per_s:,.0f} tokens/s per GPU, "
        f"{memory} per rank, {fit}"
    )


def _plan_entry(
    tuning: Tuning, c: Candidate, iteration: Any, machine: Any
) -> tuple[dict[str, str], str]:
    """What the page's config says of ``c``'s plan, and the plan's views packed."""
    config = page_config(c.report, iteration=iteration, machine=machine)
    title = _plan_title(tuning, c)
    heading, header = page_header(c.report, iteration=iteration, title=title)
    head = f"<header><h1>{html.escape(heading)}</h1>"
    if not (header.startswith(head) and header.endswith("</header>")):
        raise AssertionError(f"a page header of an unexpected form: {header[:80]!r}")
    body = header[len(head) : -len("</header>")]
    entry = {
        "script": f"fv-plan-{c.index}",
        "title": title,
        "label": c.label,
        "header": body,
    }
    return entry, pack(json.dumps(config, separators=(",", ":"), allow_nan=False))


def tune_page(
    tuning: Tuning,
    *,
    theme: PageTheme = "auto",
    title: str | None = None,
    selected: int | None = None,
    max_plans: int = MAX_PLANS,
    max_bytes: int = MAX_PLAN_BYTES,
    iteration: int | Literal["auto"] | None = "auto",
    machine: Machine | str | None = "auto",
) -> str:
    """The page of ``tuning`` as a string (see the module docstring).

    ``selected``: the candidate (its ``index``) whose plan is shown when the page opens
    (default: the best; when nothing fits, the lightest); ``max_plans``, ``max_bytes``:
    how many plans the page holds at most, and how many bytes of them packed;
    ``iteration``, ``machine``: as for a report's page.
    """
    check_theme(theme)
    by_index = {c.index: c for c in tuning.candidates}
    if selected is not None and selected not in by_index:
        raise ConfigError(
            f"selected={selected} is not the index of one of the tuning's "
            f"{len(by_index)} candidates (Candidate.index)"
        )
    first = anchor_of(tuning) if selected is None else by_index[selected]
    plans: dict[str, dict[str, str]] = {}
    scripts: list[str] = []
    used = 0
    for c in kept_plans(tuning, first, max_plans):
        entry, packed = _plan_entry(tuning, c, iteration, machine)
        if plans and used + len(packed) > max_bytes:
            continue
        used += len(packed)
        plans[str(c.index)] = entry
        scripts.append(f'<script type="application/gzip" id="{entry["script"]}">{packed}</script>')
    data = tune_data(tuning)
    kept = [int(k) for k in plans]
    config = {
        "views": {"timeline": None, "explorer": None, "prefetch": None},
        "divs": {"timeline": "fv-timeline", "explorer": "fv-explorer", "prefetch": "fv-prefetch"},
        "tune": {
            "state": {"data": data, "selected": first.index, "saved": kept},
            "div": "fv-tune",
            "plans": plans,
            "kept": _kept_text(tuning, len(plans)),
        },
    }
    ranks = ", ".join(str(w) for w in tuning.world_sizes)
    heading = title or f"fsdpviz tune: {tuning.api} on {ranks} x {tuning.machine}"
    header = _header(tuning, heading, data)
    return write_page(heading, theme, header, _SECTIONS, config, "\n".join(scripts) + "\n")


def _kept_text(tuning: Tuning, kept: int) -> str:
    n = len(tuning.candidates)
    if kept >= n:
        return f"This page holds the plans of all {n} configurations."
    return (
        f"This page holds the plans of {kept} of the {n} configurations: the best, the one "
        "as given, each knob's best alternative and the frontier, as many as fit. In Python, "
        "tuning.candidates[i].report.save('plan.html') writes another's page, and "
        "tuning.show() opens any in a notebook."
    )


def _header(tuning: Tuning, heading: str, data: TuneData) -> str:
    """The page's heading and what the tune view below does not say: the configuration
    as given, the best per world size, the search's notes."""
    rows = []
    user = tuning.user
    k = data["user"]
    memory = data["points"]["hover"][k][3].removeprefix("memory per rank: ")
    rows.append(
        (
            "as given",
            f"#{user.index}: {user.tokens_per_s:,.0f} tokens/s per GPU; {memory} per rank, "
            f"{'fits' if user.fits else 'does not fit'}",
        )
    )
    if len(tuning.world_sizes) > 1:
        for ws in tuning.world_sizes:
            b = tuning.best_for(ws)
            rows.append(
                (
                    f"best on {ws} ranks",
                    "nothing fits"
                    if b is None
                    else f"#{b.index}: {b.tokens_per_s:,.0f} tokens/s per GPU, "
                    f"{b.total_tokens_per_s:,.0f} in total",
                )
            )
    items = summary_items(rows)
    warn = notes_list([n for n in tuning.notes if n], "notes")
    return (
        f'<header><h1>{html.escape(heading)}</h1><dl class="fv-summary">{items}</dl>{warn}</header>'
    )


_SECTIONS = """<section id="fv-tune-section">
<h2>Configurations</h2>
<p class="fv-hint">Every configuration evaluated: tokens/s per GPU against the memory it needs per
rank. Click a point (or a knob's alternative) to show its plan below.</p>
<div id="fv-tune"></div>
</section>
<section id="fv-plan-section">
<h2 id="fv-plan-title">Plan</h2>
<div id="fv-plan-header"></div>
<p id="fv-plan-missing" class="fv-plan-missing" hidden></p>
<div id="fv-plan-views">
<h3>Timeline</h3>
<div id="fv-timeline"></div>
<section class="fv-figures">
<div><h3>Wrap units</h3><div id="fv-explorer" class="fv-plot"></div></div>
<div><h3>Prefetch graph</h3><div id="fv-prefetch" class="fv-plot"></div></div>
</section>
</div>
</section>"""


def save_tuning(tuning: Tuning, path: str | Path, **kwargs: Unpack[TuneSaveKwargs]) -> Path:
    """Write ``tuning`` to ``path``: ``.html``, its page (options: ``theme``, ``title``,
    ``selected``, ``max_plans``, ``max_bytes``, ``iteration``, ``machine``; see
    :func:`tune_page`); ``.png`` / ``.svg`` / ``.pdf`` / ``.jpeg`` / ``.webp``, the scatter
    and the knob table as one figure through kaleido (options: ``theme``, ``width``,
    ``height``, ``scale``). ``tuning.save`` writes ``.json`` itself."""
    options: dict[str, Any] = dict(kwargs)  # each format takes some, checked below
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".html":
        _check("html", suffix, options)
        p.write_text(tune_page(tuning, **options), encoding="utf-8")
        return p
    if suffix in IMAGE_FORMATS:
        _check("image", suffix, options)
        fig = tune_figure(tuning, theme=options.pop("theme", "light"))
        return write_image(fig, p, **options)
    raise ConfigError(
        f"cannot save a tuning to {str(p)!r}: unknown suffix {suffix or '(none)'!r}; use .html "
        f"(its page), .json (the search as JSON) or an image ({', '.join(IMAGE_FORMATS)})"
    )


def _check(kind: str, suffix: str, options: Mapping[str, object]) -> None:
    check_options(options, _OPTIONS[kind], f"a tuning's {suffix} file")
