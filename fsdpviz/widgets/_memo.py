"""What a view made of a report, remembered (:mod:`fsdpviz.schema.memo`, which the card's
cache shares): the widgets' name for it."""

from __future__ import annotations

from fsdpviz.schema.memo import SIZE, ReportMemo, report_state

__all__ = ["SIZE", "ReportMemo", "report_state"]
