"""The card a notebook shows of a report or a recorded run (``report.card``, ``run.card``),
with the views' data and a static SVG beside it (``run.bundle``).

:mod:`fsdpviz.schema.extensions` imports this module when a card is first asked for (it
loads plotly, which ``import fsdpviz`` does not); ``fsdpviz/_conveniences.py`` names it there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Unpack

from fsdpviz import export
from fsdpviz.schema.memo import ReportMemo
from fsdpviz.views.card import report_bundle
from fsdpviz.views.card import run_bundle as card

if TYPE_CHECKING:
    from fsdpviz.recording import RecordedRun
    from fsdpviz.schema.keywords import ViewKwargs
    from fsdpviz.schema.report import Report


# The cards of the last reports shown: a notebook redraws an output, and shows a report
# again, without its card (the saved views of every unit) being made again; a report
# changed since gets a new one (see fsdpviz.schema.memo).
_CARDS: ReportMemo[dict[str, object]] = ReportMemo(size=4)


def report_card(report: Report) -> dict[str, object]:
    return dict(_CARDS.get(report, lambda: run_bundle(report, base=report_bundle(report))))


def run_card(run: RecordedRun) -> dict[str, object]:
    return run_bundle(run, base=card(run))


def run_bundle(
    obj: Report | RecordedRun, base: Mapping[str, object], **options: Unpack[ViewKwargs]
) -> dict[str, object]:
    """``base`` (a card, a diagnosis' text) with the views' data for fsdpviz's JupyterLab
    extension and a static SVG of them; ``base`` alone where those cannot be made (a
    card is always shown), its ``text/plain`` saying why."""
    try:
        return export.object_bundle(obj, base=base, **options)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        text = base.get("text/plain", "")
        return {**base, "text/plain": f"{text}\n(no saved views: {type(e).__name__}: {e})"}
