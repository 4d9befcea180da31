"""Every ``n``-th block checkpointed, for :func:`fsdpviz.tune`, derived from two traces of
the same key: without checkpointing and with each block checkpointed
(:mod:`fsdpviz.replan.checkpoint_replay`), traced where that is not exact.

A configuration that checkpoints every ``n``-th block (``CheckpointEvery``) has two
siblings: itself with the checkpointing choice ``none``, and with ``each`` block. Where
both siblings' traces are there, made with the same replayed knobs, its trace is derived
from them; where one is there, made with the configuration's replayed knobs, and the other
is not, the other is traced in its place (one trace either way, and the search that later
asks for that sibling finds it traced), unless the configuration's micro-batch family
derives its trace (:mod:`fsdpviz.tuning.batch_families`) or a pair of this search was
refused already (the model's blocks do not derive: each trace then made as asked; the
sibling traced for the refused pair is the one trace a search may spend in vain). The
derived trace is made with the siblings' replayed knobs, which
tune replays to each configuration's own as it replays any trace of a key. Traces made side
by side in forked workers leave such a key to the search, and trace the sibling it would
trace first in its place, or none where the search takes that sibling without tracing it
(an earlier search's trace, :meth:`fsdpviz.Tuning.retune`, or one its micro-batch family
derives) (:meth:`CheckpointPairs.left_to_derive`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from fsdpviz.replan.checkpoint_replay import checkpoint_capture
from fsdpviz.schema.checkpointing import CheckpointEvery
from fsdpviz.schema.report import Report
from fsdpviz.tuning.retune import StoredTrace, same_changes
from fsdpviz.tuning.space import Choice

__all__ = ["CheckpointPairs", "Sibling"]

_KNOB: Final = "activation_checkpointing"

Sibling = tuple[tuple[Any, ...], dict[str, Choice]]
"""A sibling's trace key and configuration."""


class CheckpointPairs:
    """The pairs of one search (see the module's docstring): whether one was refused."""

    def __init__(self) -> None:
        self.refused = False  # a pair did not derive: no sibling traced ahead any more

    @staticmethod
    def siblings(
        key: tuple[Any, ...],
        config: dict[str, Choice],
        choices: list[Choice],
        key_of: Callable[[dict[str, Choice]], tuple[Any, ...]],
    ) -> tuple[Sibling, Sibling, int] | None:
        """The trace keys and configurations of ``config``'s siblings (``key``: its trace key,
        ``key_of`` a configuration's, what ``key`` adds to it kept), and its ``n``, where it
        checkpoints every ``n``-th block of one class and ``choices`` offer ``none`` and
        ``each`` block of that class; else None."""
        c = config.get(_KNOB)
        spec = None if c is None else c.kwargs.get(_KNOB)
        if not isinstance(spec, CheckpointEvery) or spec.every < 2:
            return None
        blocks = list(spec.modules) if isinstance(spec.modules, (list, tuple)) else None
        none = next((x for x in choices if _KNOB in x.kwargs and x.kwargs[_KNOB] is None), None)
        each = next((x for x in choices if x.kwargs.get(_KNOB) == blocks), None)
        own = key_of(config)
        if blocks is None or none is None or each is None or key[: len(own)] != own:
            return None
        out = []
        for choice in (none, each):
            sibling = {**config, _KNOB: choice}
            out.append(((*key_of(sibling), *key[len(own) :]), sibling))
        return out[0], out[1], spec.every

    def derive(
        self,
        asked: tuple[tuple[Any, ...], dict[str, Choice], Callable[[dict[str, Choice]], Any]],
        choices: list[Choice],
        made: tuple[
            dict[str, Any],
            Mapping[tuple[Any, ...], Report | None],
            Callable[[tuple[Any, ...]], StoredTrace | None],
        ],
        trace: Callable[[tuple[Any, ...], dict[str, Choice]], Any],
        ahead: Callable[[], bool],
    ) -> tuple[Report, dict[str, Any]] | None:
        """The trace of ``asked`` (its trace key, configuration, and how a configuration's key
        is made) and the replayed knobs' keywords it is made with, derived from its siblings'
        traces (``made``: the configuration's own replayed knobs' keywords, the search's
        traces by key, and a key's stored trace with those it was made with); where one
        sibling is traced, made with the configuration's own, and ``ahead()``, the other is
        traced first (``trace``). None: trace it."""
        changes, traces, kept = made

        def stored(k: tuple[Any, ...]) -> tuple[Report | None, dict[str, Any] | None] | None:
            found = kept(k)
            return (
                (traces[k], None if found is None else dict(found.changes)) if k in traces else None
            )

        sibs = self.siblings(*asked[:2], choices, asked[2])
        if sibs is None:
            return None
        (k0, c0), (k1, c1), n = sibs
        there = [stored(k0), stored(k1)]
        if there.count(None) == 1 and not self.refused:
            mine = there[1] if there[0] is None else there[0]
            assert mine is not None
            if mine[1] is not None and same_changes(mine[1], changes) and ahead():
                trace(*((k0, c0) if there[0] is None else (k1, c1)))
                there = [stored(k0), stored(k1)]
        one, two = there
        if one is None or two is None:
            return None
        (t0, ch0), (t1, ch1) = one, two
        if t0 is None or t1 is None or ch0 is None or ch1 is None or not same_changes(ch0, ch1):
            return None
        plan = self.derived((t0, t1), n)
        return None if plan is None else (plan, ch0)

    def left_to_derive(
        self,
        todo: dict[tuple[Any, ...], tuple[dict[str, Choice], bool]],
        choices: list[Choice],
        key_of: Callable[[dict[str, Choice]], tuple[Any, ...]],
        made: tuple[
            Callable[[dict[str, Choice]], dict[str, Any]],
            Mapping[tuple[Any, ...], Report | None],
            Callable[[tuple[Any, ...]], StoredTrace | None],
        ],
        ahead: Callable[[tuple[Any, ...], dict[str, Choice]], bool],
        wanted: Callable[[tuple[Any, ...], dict[str, Choice]], bool],
        untraced: Callable[[tuple[Any, ...], dict[str, Choice]], dict[str, Any] | None],
    ) -> dict[tuple[Any, ...], tuple[dict[str, Choice], bool]]:
        """``todo`` (the trace keys forked workers are to trace, each with its configuration
        and whether it is the one as given) without the keys :meth:`derive` will derive once
        they are traced: where both siblings are traced or in ``todo``, made with the same
        replayed knobs; or where one is, made with the key's own, and ``ahead(key, config)``
        (the search would trace the other first, :meth:`derive`'s ``ahead``) and the other is
        ``wanted`` by the workers: that other in the key's place, or none where the search
        takes the other without tracing it (``untraced``: the keywords of the trace it takes,
        an earlier search's or derived from its micro-batch family; None: it traces it)
        (``made``: a configuration's replayed knobs' keywords, the search's traces by key, a
        key's stored trace, as :meth:`derive` takes them). Unchanged once a pair was
        refused."""
        changes_of, traces, kept = made
        out = dict(todo)

        def state(k: tuple[Any, ...]) -> dict[str, Any] | bool:
            """The keywords ``k``'s trace is (or is to be) made with; False: none there,
            True: one that derives nothing (failed, or its keywords not kept)."""
            if k in out:
                return changes_of(out[k][0])
            found = kept(k)
            if k not in traces:
                return False
            return True if traces[k] is None or found is None else dict(found.changes)

        for key, (config, mine) in todo.items():
            sibs = None if self.refused else self.siblings(key, config, choices, key_of)
            if sibs is None:
                continue
            (k0, c0), (k1, c1), _ = sibs
            there = [state(k0), state(k1)]
            if there.count(False) == 1:
                k, c = (k0, c0) if there[0] is False else (k1, c1)
                have = there[1] if there[0] is False else there[0]
                own = changes_of(config)
                if isinstance(have, dict) and same_changes(have, own) and ahead(key, config):
                    taken = untraced(k, c)
                    if taken is not None:  # (derive's trace of it takes it so)
                        there = [taken if x is False else x for x in there]
                    elif wanted(k, c):
                        out[k] = (c, mine)
                        there = [have, have]
            one, two = there
            if isinstance(one, dict) and isinstance(two, dict) and same_changes(one, two):
                del out[key]
        return out

    def derived(self, traces: tuple[Report, Report], n: int) -> Report | None:
        """The plan that checkpoints every ``n``-th block from the siblings' traces (without
        checkpointing, with each block); None where not exact (noted: no sibling is traced
        ahead any more)."""
        capture = checkpoint_capture(*traces)  # (not kept: each key is derived once)
        if capture is None:
            self.refused = True
            return None
        plan = capture.every(n)
        for step in plan.profile.iterations if plan.profile is not None else []:
            step.moments = []  # (no micro-batch family takes a derived trace: let them go)
        return plan
