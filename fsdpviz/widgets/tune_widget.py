"""``TuneWidget``: a tuning's configurations as a scatter, a view of fsdpviz's front end (``js/``).

Every configuration :func:`fsdpviz.tune` evaluated: tokens/s per GPU against the memory it
needs per rank, the capacity line, the frontier joined, the best and the configuration as
given marked, and the knob table beside it (:func:`fsdpviz.views.tune_data`, as the page
``tuning.save("tune.html")`` draws it). Synced traitlets: ``selected`` (a candidate's
index: set by a click on a point, Enter, or an alternative in the knob table) and ``saved``
(the candidates whose plans can be opened; ``None``: all).

Example::

    view = TuneWidget(tuning)
    view.selected = tuning.best.index
"""

from __future__ import annotations

from typing import ClassVar, TypedDict, Unpack

import traitlets

from fsdpviz.schema.report import Report
from fsdpviz.tuning.result import Candidate, Tuning
from fsdpviz.views.tune_view import anchor_of, tune_data
from fsdpviz.widgets.front_end import DATA, FrontEnd, TraitProposal

__all__ = ["TuneWidget"]


class TuneTraits(TypedDict, total=False):
    """The tune view's state a constructor may set (its traits)."""

    selected: int | None
    saved: list[int] | None


class TuneWidget(FrontEnd):
    """The configurations of one tuning; ``selected`` is a candidate's index or ``None``."""

    view = traitlets.Unicode("tune").tag(sync=True)
    data = traitlets.Dict().tag(**DATA)
    selected = traitlets.Int(None, allow_none=True).tag(sync=True)
    saved = traitlets.List(traitlets.Int(), default_value=None, allow_none=True).tag(sync=True)

    PAGE_TRAITS: ClassVar[tuple[str, ...]] = ("data", "selected", "saved")

    def __init__(self, tuning: Tuning, **kwargs: Unpack[TuneTraits]) -> None:
        self.tuning = tuning
        self._by_index = {c.index: c for c in tuning.candidates}
        super().__init__(data=tune_data(tuning), **kwargs)

    @traitlets.validate("selected")
    def _valid(self, proposal: TraitProposal) -> int | None:
        index = proposal["value"]
        if index is not None and index not in self._by_index:
            raise traitlets.TraitError(
                f"selected={index} is not the index of one of the tuning's "
                f"{len(self._by_index)} candidates (Candidate.index)"
            )
        return index  # type: ignore[no-any-return]

    def shown_report(self) -> Report | None:
        """The selected configuration's plan (for the static image), else the best's."""
        c = self.candidate
        if c is None:
            c = anchor_of(self.tuning)
        return c.report

    @property
    def candidate(self) -> Candidate | None:
        """The selected :class:`~fsdpviz.tuning.Candidate`, or ``None``."""
        return None if self.selected is None else self._by_index[self.selected]
