"""What a notebook shows for a :class:`~fsdpviz.Report` or :class:`~fsdpviz.RecordedRun`.

A compact card: the configuration in one line, the wrap units, bytes and peak
memory per rank, warnings and a small static SVG figure. Static HTML only (no
JavaScript, no network), styled with JupyterLab's CSS variables so it reads in
the light and dark themes, with fallbacks elsewhere. ``report.show()`` opens the
interactive views.

Example::

    report                              # last line of a cell: the card
    bundle = report_bundle(report)      # {"text/plain": ..., "text/html": ...}
    html = report_html(report)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from html import escape
from typing import TYPE_CHECKING, Any, TypeVar

from fsdpviz.api.comparison import COSTS, cost_label, cost_text
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.memory import MemoryReport
from fsdpviz.schema.report import Report
from fsdpviz.schema.timeline import duration_text
from fsdpviz.views._svg import event_strips_svg, memory_curve_svg, unit_bytes_svg
from fsdpviz.views.detail import dtype_text
from fsdpviz.views.style import format_bytes, three_digits, unit_colors

if TYPE_CHECKING:
    from fsdpviz.api.comparison import Comparison
    from fsdpviz.recording import RecordedRun

__all__ = [
    "comparison_html",
    "plural",
    "report_bundle",
    "report_html",
    "run_bundle",
    "run_html",
    "warnings_html",
]

_Shown = TypeVar("_Shown", Report, "RecordedRun")  # what a card shows

MAX_UNIT_ROWS = 10
MAX_WARNINGS = 8

_FG = "var(--jp-ui-font-color1, inherit)"
_MUTED = "color:var(--jp-ui-font-color2, inherit);opacity:0.9"
_BORDER = "var(--jp-border-color2, rgba(128, 128, 128, 0.35))"
_MONO = "font-family:var(--jp-code-font-family, ui-monospace, SFMono-Regular, Menlo, monospace)"
_CARD = (
    f"font-family:var(--jp-ui-font-family, system-ui, sans-serif);font-size:13px;color:{_FG};"
    f"background:var(--jp-layout-color0, transparent);border:1px solid {_BORDER};"
    "border-radius:4px;padding:8px 12px;max-width:760px;line-height:1.4"
)
_CELL = f"padding:1px 8px 1px 0;border-bottom:1px solid {_BORDER};text-align:"
_WARN = "color:var(--jp-warn-color0, #b35c00)"
_ERROR = "color:var(--jp-error-color1, #c62828)"
_OK = "color:var(--jp-success-color0, #2e7d32)"


def report_bundle(report: Report) -> dict[str, str]:
    """``{"text/plain", "text/html"}`` for ``report`` (what ``_repr_mimebundle_`` returns)."""
    return {"text/plain": report.summary(), "text/html": _guarded(report_html, report)}


def run_bundle(run: RecordedRun) -> dict[str, str]:
    """``{"text/plain", "text/html"}`` for a recorded run."""
    return {"text/plain": run.summary(), "text/html": _guarded(run_html, run)}


def report_html(report: Report) -> str:
    """The card of a prediction or one rank's recording, as an HTML fragment."""
    api = report.config.api
    per_rank = sum(u.sharded_bytes for u in report.units)
    full = sum(u.bytes for u in report.units)
    numel = sum(u.numel for u in report.units)
    title = (
        f"<b>fsdpviz</b> {escape(report.source)} · {escape(str(api))} · "
        f"{plural(len(report.units), 'wrap unit')} · world size "
        f"{escape(str(report.config.world_size))}{escape(_mesh(report.config))}"
        f"{escape(_torch(report.config))}"
    )
    trainable = sum(u.trainable[0] for u in report.units)
    counted = f"{_count(numel)} parameters"
    if trainable < numel:  # frozen weights (a fine-tune with adapters)
        counted = f"<b>{_count(trainable)} trainable</b> of {counted}"
    totals = f"{counted} · {format_bytes(full)} full · <b>{format_bytes(per_rank)} per rank</b>"
    memory, figures = _memory_parts(report)
    parts = [
        _line(title),
        _line(escape(" · ".join(config_items(report))), _MUTED),
        _line(totals),
        memory,
        _time_part(report),
        _figures([unit_bytes_svg(report), *figures]),
        units_table(report),
        warnings_html(report),
        _line(_hint("report.show()") + " opens the explorer", _MUTED),
    ]
    return _card(parts)


def run_html(run: RecordedRun) -> str:
    """The card of a run recorded on every rank: ranks, iterations, units, divergence."""
    first = run.ranks[0]
    api = first.config.api
    backend = first.config.backend
    counts = sorted({len(r.iterations) for r in run.ranks})
    title = (
        f"<b>fsdpviz</b> recording · {escape(str(api))} · {len(run.ranks)} of "
        f"{run.world_size} ranks"
        + (f" · {escape(str(backend))}" if backend else "")
        + escape(_torch(first.config))
    )
    summary = (
        f"{'/'.join(map(str, counts))} iterations per rank · "
        f"{plural(len(first.units), 'wrap unit')} · "
        f"<b>{format_bytes(sum(u.sharded_bytes for u in first.units))} per rank</b>"
    )
    if run.path is not None:
        summary += f' · <span style="{_MONO}">{escape(str(run.path))}</span>'
    div = run.divergence()
    iteration = div.iteration if div is not None else max(min(counts) - 1, 0)
    strips = (
        event_strips_svg(run.ranks, iteration, div.index if div is not None else None)
        if any(r.iterations for r in run.ranks)
        else ""
    )
    parts = [
        _line(title),
        _line(summary),
        _divergence(run),
        _figures([strips]),
        _ranks_table(run),
        units_table(first),
        *(_line("note: " + escape(n), _WARN) for n in run.notes),
        _line(
            _hint("run.ranks[r].show()")
            + " opens the explorer for one rank; "
            + _hint("fsdpviz.diff(run, prediction)")
            + " compares with a prediction",
            _MUTED,
        ),
    ]
    return _card(parts)


def _mesh(c: ReportConfig) -> str:
    """`` (mesh dp_shard 32 × tp 8)``: a mesh of more than one dimension, else nothing."""
    if not c.mesh or len(c.mesh) < 2:
        return ""
    return " (mesh " + " × ".join(f"{name} {size}" for name, size in c.mesh.items()) + ")"


def _torch(config: ReportConfig) -> str:
    """`` · torch 2.8.0``: whose FSDP the card shows (nothing where the report does not say)."""
    return f" · torch {config.torch_version}" if config.torch_version else ""


def config_items(report: Report) -> list[str]:
    """The configuration as short phrases: strategy, policy or recipe, prefetch settings."""
    c = report.config
    items: list[str] = []
    if c.shard_world_size is not None and c.shard_world_size != c.world_size:
        items.append(f"shard groups of {c.shard_world_size}")
    if report.source == "recording":
        if c.rank is not None:
            items.append(f"rank {c.rank}")
        strategies = sorted({u.sharding_strategy for u in report.units})
        if c.api != "FSDP2" and len(strategies) == 1:
            items.append(strategies[0])
        return items
    if c.pp_world_size:
        rank = f" · pp rank {c.pp_rank}" if c.pp_rank is not None else ""
        items.append(
            f"pipeline {c.pipeline_schedule} over {c.pp_world_size} ranks, "
            f"{c.microbatches} microbatches{rank}"
        )
    if c.api == "FSDP2":
        items.extend(_fsdp2_items(c))
        if c.tp_world_size:
            plan = c.parallelize_plan or {}
            items.append(
                f"tensor parallel over {c.tp_world_size} ranks "
                f"({plural(len(plan), 'module')} parallelised)"
            )
    else:
        items.extend(_fsdp1_items(c))
    items.extend(job_items(c))
    if c.trace not in (None, "meta"):
        items.append(f"trace={c.trace}")
    return items


def job_items(c: ReportConfig, *, detailed: bool = False) -> list[str]:
    """Gradient accumulation, torch.compile, float8 and TF32, where the plan states them;
    ``detailed`` (the CLI's ``job:`` line) adds what each changes (fused kernels, the
    float8 recipe, the matmul precision)."""
    items: list[str] = []
    if c.grad_accum > 1 and c.pipeline_schedule is not None:  # REDUCE_GRAD in every step()
        items.append(f"grad_accum {c.grad_accum} (each step() reduces)")
    elif c.grad_accum > 1:
        quiet = "no_sync()" if c.api == "FSDP1" else "no gradient sync"
        items.append(f"grad_accum {c.grad_accum} ({quiet} on {c.grad_accum - 1})")
    if c.compile:
        on = f" on {', '.join(c.compile)}" if isinstance(c.compile, tuple) else ""
        items.append(f"torch.compile{on}" + (" (fused kernels)" if detailed else ""))
    if c.float8:
        gather = " + float8 all-gather" if c.float8.get("enable_fsdp_float8_all_gather") else ""
        recipe = f" ({c.float8.get('recipe_name', 'tensorwise')})" if detailed else ""
        items.append(f"float8 linears{recipe}{gather}")
    if c.float32_matmul_precision in ("high", "medium"):
        precision = f" (float32_matmul_precision {c.float32_matmul_precision})"
        items.append("TF32 matmuls" + (precision if detailed else ""))
    return items


def _fsdp1_items(c: ReportConfig) -> list[str]:
    items = [c.sharding_strategy]
    if c.auto_wrap_policy is not None:
        items.append(f"auto_wrap_policy {c.auto_wrap_policy}")
    items.append(f"backward_prefetch {c.backward_prefetch}")
    items.append(f"forward_prefetch {'on' if c.forward_prefetch else 'off'}")
    if c.use_orig_params:
        items.append("use_orig_params")
    if c.mixed_precision is not None:
        items.append(_dtypes("mixed precision", c.mixed_precision))
    return items


def _fsdp2_items(c: ReportConfig) -> list[str]:
    items = [f"fully_shard on {plural(len(c.fully_shard), 'module')}"]
    reshard = {u: v for u in c.fully_shard if (v := c.resharding(u)) is not None}
    if reshard:
        root = reshard.get("")
        others = sorted({str(v) for k, v in reshard.items() if k != ""})
        text = f"{RESHARD.name} " + ("/".join(others) if others else str(root))
        if others and root is not None and [str(root)] != others:
            text += f" (root {root})"
        items.append(text)
    mp = c.mp_policy
    if mp is not None and (mp.get("param_dtype") or mp.get("reduce_dtype")):
        items.append(_dtypes("mp_policy", mp))
    fwd, bwd = c.explicit_forward_prefetch or {}, c.explicit_backward_prefetch or {}
    items.append(
        f"forward prefetch set on {plural(len(fwd), 'module')}" if fwd else "no forward prefetch"
    )
    items.append(
        f"backward prefetch set on {plural(len(bwd), 'module')}"
        if bwd
        else "backward prefetch of the previous unit"
    )
    return items


def _dtypes(label: str, mp: Mapping[str, object]) -> str:
    kinds = ("param_dtype", "reduce_dtype")
    return label + " " + ", ".join(f"{k.split('_')[0]} {mp[k]}" for k in kinds if mp.get(k))


def units_table(report: Report, limit: int = MAX_UNIT_ROWS) -> str:
    """The first ``limit`` units: colour, name, class, parameters, bytes (full, per rank), dtype."""
    if not report.units:
        return _line("no wrap units", _MUTED)
    colors = unit_colors(report)
    head = ["", "unit", "class", "params", "full", "per rank", "dtype"]
    numeric = {3, 4, 5}
    rows = [
        "<tr>"
        + "".join(
            f'<th style="{_CELL}{"right" if i in numeric else "left"};font-weight:600">'
            f"{escape(h)}</th>"
            for i, h in enumerate(head)
        )
        + "</tr>"
    ]
    for u in report.units[:limit]:
        cells = [
            f'<span style="display:inline-block;width:10px;height:10px;border-radius:2px;'
            f'background:{colors[u.module]}"></span>',
            f'<span style="{_MONO}">{escape(u.module or "(root)")}</span>',
            escape(u.module_class),
            _count(u.numel),
            format_bytes(u.bytes),
            format_bytes(u.sharded_bytes),
            escape(dtype_text(u)),
        ]
        rows.append(
            "<tr>"
            + "".join(
                f'<td style="{_CELL}{"right" if i in numeric else "left"}">{v}</td>'
                for i, v in enumerate(cells)
            )
            + "</tr>"
        )
    if len(report.units) > limit:
        rows.append(
            f'<tr><td></td><td colspan="6" style="padding:2px 0;{_MUTED}">'
            f"… and {len(report.units) - limit} more</td></tr>"
        )
    return (
        '<table style="border-collapse:collapse;margin:6px 0;font-size:12px;color:inherit;'
        f'background:transparent">{"".join(rows)}</table>'
    )


def _memory_parts(report: Report) -> tuple[str, list[str]]:
    """The peak-memory line and the memory curve, or a short note when there is none."""
    if not report.iterations or not report.units:
        return "", []
    if not _measured(report):
        return _line(
            "peak memory: not estimated, this report has no trace profile "
            "(activations unknown); fsdpviz.cost.memory_model(report) gives parameters, "
            "gradients and optimizer state",
            _MUTED,
        ), []
    try:
        memory: MemoryReport = report.memory
        peak = memory.peak
        line = _line(
            f"<b>peak {format_bytes(peak['bytes'])} per rank</b> "
            f"{escape(str(peak['where']))}; dominated by {escape(str(peak['dominant']))} "
            f'<span style="{_MUTED}">(AdamW, steady state; report.memory)</span>'
        )
        return line + _fit_line(memory), [memory_curve_svg(memory)]
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        return _line(
            f"peak memory: the memory model failed ({escape(type(e).__name__)}: {escape(first)})",
            _MUTED,
        ), []


def _fit_line(memory: MemoryReport) -> str:
    """Whether the step fits in the machine's memory, in words: ``✗ does not fit in ...``."""
    if memory.capacity <= 0:
        return ""
    text = escape(memory.fit_text())
    if memory.fits:
        return _line(f"✓ {text}", _OK)
    return _line(f"<b>✗ {text}</b>", _ERROR)


def _time_part(report: Report) -> str:
    """Step time and throughput on the default machine, for a report with a trace profile."""
    if not _measured(report) or not report.iterations or not report.units:
        return ""
    try:
        tl = report.timeline
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        return _line(
            f"step time: the time model failed ({escape(type(e).__name__)}: {escape(first)})",
            _MUTED,
        )
    t = tl.totals
    text = f"<b>step {duration_text(t['step_s'])}</b> on {escape(str(tl.machine['name']))}"
    if t["tokens_per_s"] > 0:
        text += (
            f" · <b>{t['tokens_per_s']:,.0f} tokens/s per GPU</b> · MFU {t['mfu']:.1%}"
            f" · HFU {t['hfu']:.1%}"
        )
    text += f" · {t['overlap']:.0%} of communication hidden"
    if report.config.pp_world_size and t.get("bubble_s", 0.0) > 0:
        pipe = report.pipeline
        ranks = len(pipe.ranks) if pipe is not None and pipe.ranks else 1
        share = t["bubble_s"] / (t["step_s"] * ranks) if t["step_s"] > 0 else 0.0
        text += f" · <b>pipeline bubbles {share:.0%}</b> of the GPU time"
    line = _line(text + f' <span style="{_MUTED}">(modelled; report.timeline)</span>')
    return line + _topology_line(tl.machine)


def _measured(report: Report) -> bool:
    """Whether the cost model has a trace profile to go on (a pipeline's: its ranks')."""
    return report.profiled


def _topology_line(machine: Mapping[str, Any]) -> str:
    """Which mesh dimension's groups stay inside a node and which cross nodes (where the
    network, shared by the groups crossing a node, times their collectives)."""
    spans = [s for s in machine.get("topology", []) if s.get("ranks", 1) > 1]
    if not spans:
        return ""
    per_node = machine.get("gpus_per_node", 8)
    parts = []
    for s in spans:
        if s["nodes"] <= 1:
            parts.append(f"{escape(str(s['dim']))} {s['ranks']} inside a node")
            continue
        text = f"<b>{escape(str(s['dim']))} {s['ranks']} across {s['nodes']} nodes</b>"
        text += f" ({s['per_node']} of {per_node} GPUs in each"
        if s["sharing"] > 1:
            text += f", {s['sharing']} groups share a node's network"
        parts.append(text + ")")
    return _line(f"nodes of {per_node} GPUs: " + " · ".join(parts), _MUTED)


def warnings_html(report: Report) -> str:
    """The report's warnings as the card lists them (``2 warnings``, each code and first
    line; ``""`` for none): the dashboard shows the same list."""
    if not report.warnings:
        return ""
    items = [
        f'<li><code style="{_MONO}">{escape(w.code)}</code> '
        f"{escape(w.message.splitlines()[0] if w.message else '')}</li>"
        for w in report.warnings[:MAX_WARNINGS]
    ]
    if len(report.warnings) > MAX_WARNINGS:
        items.append(f"<li>… and {len(report.warnings) - MAX_WARNINGS} more</li>")
    return (
        f'<div style="margin:4px 0;{_WARN}">{plural(len(report.warnings), "warning")}'
        f'<ul style="margin:2px 0;padding-left:18px">{"".join(items)}</ul></div>'
    )


def comparison_html(cmp: Comparison) -> str:
    """The differences of two plans, as ``print(cmp)`` says them: the verdict, each cost of
    both plans with the change (peak, reserved, step, exposed communication, tokens/s),
    whether each fits its machine, and the units that differ. Static HTML, as the card."""
    a, b = cmp.name_a, cmp.name_b
    parts = [
        _line(
            f"<b>fsdpviz</b> comparison · {escape(a)} <b>vs</b> {escape(b)}: "
            f"<b>{escape(cmp.verdict)}</b>"
        )
    ]
    head = ["", escape(a), escape(b), "change"]
    rows = []
    for key in COSTS:
        if key not in cmp.costs:
            continue
        va, vb = cmp.costs[key]
        change = cmp.change_text(key)
        style = "" if change == "same" else _WARN if cmp.worse(key) else _OK
        rows.append(
            f'<tr data-fv-cost="{key}"><td style="{_CELL}left">{escape(cost_label(key))}</td>'
            f'<td style="{_CELL}right">{escape(cost_text(key, va))}</td>'
            f'<td style="{_CELL}right">{escape(cost_text(key, vb))}</td>'
            f'<td style="{_CELL}right;{style}">{escape(change)}</td></tr>'
        )
    if rows:
        th = "".join(
            f'<th style="{_CELL}{"left" if i == 0 else "right"};font-weight:600">{h}</th>'
            for i, h in enumerate(head)
        )
        parts.append(
            '<table class="fsdpviz-costs" style="border-collapse:collapse;margin:4px 0">'
            f"<tr>{th}</tr>{''.join(rows)}</table>"
        )
    else:
        parts.append(_line("costs: not modelled (a plan has no trace profile)", _MUTED))
    for name, report in zip((a, b), cmp.reports or (), strict=False):
        memory = report.memory if report.profile is not None and report.units else None
        if memory is not None and memory.capacity > 0:
            parts.append(_fit_line(memory).replace(">✓ ", f">✓ {escape(name)}: ", 1)
                         .replace(">✗ ", f">✗ {escape(name)}: ", 1))  # fmt: skip
    differ = [p for p in cmp.pairs if p.differs]
    if differ or cmp.moved_params:
        said = f"{plural(len(differ), 'unit')} differ" if differ else ""
        moved = plural(len(cmp.moved_params), "parameter") + " moved" if cmp.moved_params else ""
        parts.append(_line(" · ".join(x for x in (said, moved) if x) + " (print(cmp) lists them)",
                           _MUTED))  # fmt: skip
    return _card(parts)


def _divergence(run: RecordedRun) -> str:
    div = run.divergence()
    if not any(r.iterations for r in run.ranks):
        return _line("no iteration was recorded, so there is nothing to compare", _MUTED)
    if len(run.ranks) < 2:
        return _line("one rank was recorded: nothing to compare it with", _MUTED)
    if div is None:
        return _line("✓ all ranks issued the same events in every iteration", _OK)
    lines = str(div).splitlines()
    per_rank = "".join(f'<li style="{_MONO}">{escape(x.strip())}</li>' for x in lines[1:-1])
    return (
        f'<div style="margin:4px 0"><b style="{_ERROR}">{escape(lines[0])}</b>'
        f'<ul style="margin:2px 0;padding-left:18px">{per_rank}</ul>'
        f'<div style="{_MUTED};font-size:12px">{escape(lines[-1])}</div></div>'
    )


def _ranks_table(run: RecordedRun) -> str:
    head = "".join(
        f'<th style="{_CELL}{a};font-weight:600">{h}</th>'
        for h, a in (("rank", "right"), ("iterations", "right"), ("events per iteration", "left"))
    )
    rows = [f"<tr>{head}</tr>"]
    for r in run.ranks:
        done = r.config.complete_iterations
        done = len(r.iterations) if done is None else done
        its = f"{done}" if done == len(r.iterations) else f"{done} (+{len(r.iterations) - done})"
        cells = (
            (escape(str(r.config.rank)), "right"),
            (its, "right"),
            (escape(" / ".join(str(len(it)) for it in r.iterations[:8])), "left"),
        )
        rows.append(
            "<tr>" + "".join(f'<td style="{_CELL}{a}">{v}</td>' for v, a in cells) + "</tr>"
        )
    return (
        '<table style="border-collapse:collapse;margin:6px 0;font-size:12px;color:inherit;'
        f'background:transparent">{"".join(rows)}</table>'
    )


def _figures(svgs: list[str]) -> str:
    cells = "".join(f'<div style="flex:0 0 auto">{s}</div>' for s in svgs if s)
    if not cells:
        return ""
    return f'<div style="display:flex;flex-wrap:wrap;gap:8px 24px;margin:8px 0 4px 0">{cells}</div>'


def _card(parts: list[str]) -> str:
    body = "".join(p for p in parts if p)
    return f'<div class="fsdpviz-card" style="{_CARD}">{body}</div>'


def _line(content: str, style: str = "") -> str:
    return f'<div style="margin:2px 0;{style}">{content}</div>' if content else ""


def _hint(code: str) -> str:
    return f'<code style="{_MONO}">{escape(code)}</code>'


def plural(n: int, word: str) -> str:
    """``1 warning``, ``2 warnings``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def _count(n: int) -> str:
    """``1234567`` -> ``'1.23 M'``; small counts stay exact."""
    if n < 10_000:
        return f"{n:,}"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{three_digits(n / div)} {suffix}"
    raise AssertionError("unreachable")


def _guarded(render: Callable[[_Shown], str], obj: _Shown) -> str:
    """``render(obj)``; a bug in the card must not hide the object, so fall back to text."""
    try:
        return render(obj)
    except Exception as e:
        text = escape(obj.summary())
        return _card(
            [
                f'<pre style="margin:0;{_MONO}">{text}</pre>',
                _line(
                    f"(the card could not be drawn: {escape(type(e).__name__)}: "
                    f"{escape(str(e).splitlines()[0] if str(e) else '')})",
                    _MUTED,
                ),
            ]
        )
