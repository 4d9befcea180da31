"""Every ``n``-th block checkpointed, for :func:`fsdpviz.tune`, derived from two traces of
the same key: without checkpointing and with each block checkpointed
(:mod:`fsdpviz.replan.checkpoint_replay`), traced where that is not exact.

A configuration that checkpoints every ``n``-th block (``CheckpointEvery``) has two
siblings: itself with the checkpointing choice ``none``, and with ``each`` block. Where
both siblings' traces are there, made with the same replayed knobs, its trace is derived
from them; where one is there, made with the configuration's replayed knobs, and the other
is not, the other is traced in its place (one trace either way, and the search that later
asks for that sibling finds it traced), unless the configuration's micro-batch family
derives its trace (:mod:`fsdpviz.tuning.batch_families`) or a pair of the same family (the
trace key but the micro-batch's samples: the same units, precision, mesh, ...) was refused
already: it gave no capture (the blocks do not derive there: each trace of the family then
made as asked), or its capture did not derive the configuration's ``n``
(:meth:`~fsdpviz.replan.checkpoint_replay.CheckpointCapture.derives`: that ``n`` then
traced as asked, the other ``n`` still derived). The sibling traced for a refused pair is
the one trace a family may spend in vain (for ``n``). Each pair's capture is made once, for
every ``n`` it is asked for. The derived trace is made with the siblings' replayed knobs, which
tune replays to each configuration's own as it replays any trace of a key. Traces made side
by side in forked workers leave such a key to the search, and trace the sibling it would
trace first in its place, or none where the search takes that sibling without tracing it
(an earlier search's trace, :meth:`fsdpviz.Tuning.retune`, or one its micro-batch family
derives) (:meth:`CheckpointPairs.left_to_derive`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

from fsdpviz.replan.checkpoint_replay import CheckpointCapture, checkpoint_capture
from fsdpviz.schema.checkpointing import CheckpointEvery
from fsdpviz.schema.report import Report
from fsdpviz.tuning.retune import StoredTrace, same_changes
from fsdpviz.tuning.space import Choice, TuneKwargs

__all__ = ["CheckpointPairs", "PairSearch", "Sibling"]

_KNOB: Final = "activation_checkpointing"

Key = tuple[Any, ...]
Config = dict[str, Choice]
Sibling = tuple[Key, Config]
"""A sibling's trace key and configuration."""
Batch = dict[Key, tuple[Config, bool]]
"""The trace keys forked workers are to trace, each with its configuration and whether it is
the one as given."""


def _with(
    key: Key, own: int, config: Config, choice: Choice, key_of: Callable[[Config], Key]
) -> Sibling:
    """``config`` with ``choice`` for checkpointing, and its trace key: ``key_of``'s, with
    what ``key`` (``config``'s trace key) adds after its first ``own`` entries."""
    sibling = {**config, _KNOB: choice}
    return (*key_of(sibling), *key[own:]), sibling


class PairSearch(Protocol):
    """What the pairs ask of their search (:class:`~fsdpviz.tuning.evaluation.Evaluations`)."""

    def trace_key(self, config: Config, any_batch: bool = False) -> Key:
        """``config``'s trace key (``any_batch``: with ``None`` for its micro-batch's
        samples)."""
        ...

    def traced_changes(self, config: Config) -> TuneKwargs:
        """The replayed knobs' keywords of ``config`` (those its trace key leaves out)."""
        ...

    def trace_of(self, key: Key) -> StoredTrace | None:
        """The search's trace of ``key`` and the keywords it is made with (None: none)."""
        ...

    def ahead(self, key: Key, config: Config) -> bool:
        """Whether a pair's sibling is traced ahead for ``key`` (not where its micro-batch
        family derives ``key``)."""
        ...

    def untraced(self, key: Key, config: Config) -> TuneKwargs | None:
        """The keywords of the trace the search takes for ``key`` without tracing it (an
        earlier search's, or derived from its micro-batch family); None: it traces it."""
        ...

    def wanted(self, key: Key, config: Config) -> bool:
        """Whether forked workers trace ``key``."""
        ...


class CheckpointPairs:
    """The pairs of one search (see the module's docstring): their captures, the families
    refused. ``choices``: the checkpointing choices the search offers."""

    def __init__(self, search: PairSearch, choices: list[Choice]) -> None:
        self.search = search
        self.choices = choices
        # (family, n) a pair did not derive (n None: no capture): no sibling traced ahead
        self.refused: set[tuple[Key, int | None]] = set()
        # each pair's capture (None: not exact) and the n it is still to be asked for, by
        # its siblings' trace keys (let go once asked for each)
        self._captures: dict[tuple[Key, Key], tuple[CheckpointCapture | None, set[int]]] = {}

    @staticmethod
    def siblings(
        key: Key,
        config: Config,
        choices: list[Choice],
        key_of: Callable[[Config], Key],
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
        without, with_each = (_with(key, len(own), config, c, key_of) for c in (none, each))
        return without, with_each, spec.every

    def derive(
        self, key: Key, config: Config, trace: Callable[[Key, Config], Any]
    ) -> tuple[Report, TuneKwargs] | None:
        """The trace of ``key`` (of ``config``) and the replayed knobs' keywords it is made
        with, derived from its siblings' traces (:meth:`_pair`: the sibling missing traced
        first, ``trace``). None: trace it."""

        def first(k: Key, c: Config) -> TuneKwargs | None:
            trace(k, c)
            return self._made_with(k)

        pair = self._pair(key, config, first)
        if pair is None:
            return None
        (k0, _), (k1, _), n, family = pair
        one = self.search.trace_of(k0)
        assert one is not None
        plan = self.derived((k0, k1), n, family, lambda: self._to_ask(key, config))
        return None if plan is None else (plan, one.changes.copy())

    def left_to_derive(self, todo: Batch) -> Batch:
        """``todo`` (the forked workers' batch) without the keys :meth:`derive` will derive
        once they are traced (:meth:`_pair`, asked ahead: a sibling in ``todo`` as made with
        its configuration's own keywords; the sibling missing taken as the search takes it
        without tracing it, else put in the batch where the workers trace it; not for a
        family and ``n`` refused)."""
        out = dict(todo)
        for key, (config, mine) in todo.items():

            def first(k: Key, c: Config, mine: bool = mine) -> TuneKwargs | None:
                taken = self.search.untraced(k, c)  # (derive's trace of it takes it so)
                if taken is None and self.search.wanted(k, c):
                    out[k] = (c, mine)
                    return self._made_with(k, out)
                return taken

            if self._pair(key, config, first, out) is not None:
                del out[key]
        return out

    def _made_with(self, key: Key, batch: Batch | None = None) -> TuneKwargs | None:
        """What the search has, or will have, for ``key``: the keywords its trace is made
        with, where it is traced or in the workers' ``batch`` (its configuration's own);
        None: neither."""
        if batch is not None and key in batch:
            return self.search.traced_changes(batch[key][0])
        found = self.search.trace_of(key)
        return None if found is None else found.changes.copy()

    def _pair(
        self,
        key: Key,
        config: Config,
        first: Callable[[Key, Config], TuneKwargs | None],
        batch: Batch | None = None,
    ) -> tuple[Sibling, Sibling, int, Key] | None:
        """``config``'s siblings, ``n`` and family (``key``: its trace key) where both
        siblings' traces are there (:meth:`_made_with`), made with the same keywords; where
        one is, made with ``config``'s own, and the search traces ahead for ``key``, the
        other is made ``first`` (what the search will have for it; None: nothing yet),
        unless its family was refused (for ``n``). None: no pair to derive from."""
        sibs = self.siblings(key, config, self.choices, self.search.trace_key)
        if sibs is None:
            return None
        s0, s1, n = sibs
        there = [self._made_with(s0[0], batch), self._made_with(s1[0], batch)]
        family = self.search.trace_key(s0[1], any_batch=True)
        if there.count(None) == 1 and not {(family, None), (family, n)} & self.refused:
            missing = there.index(None)
            have = there[1 - missing]
            own = self.search.traced_changes(config)
            if have is not None and same_changes(have, own) and self.search.ahead(key, config):
                there[missing] = first(*(s1 if missing else s0))
        one, two = there
        pairs = one is not None and two is not None and same_changes(one, two)
        return (s0, s1, n, family) if pairs else None

    def _to_ask(self, key: Key, config: Config) -> set[int]:
        """The ``n`` a capture of ``config``'s siblings may be asked for (``key``: its trace
        key): of the choices that checkpoint every ``n``-th block of its class, those whose
        configuration the search has not traced (a key traced is not derived)."""
        spec = config[_KNOB].kwargs.get(_KNOB)
        assert isinstance(spec, CheckpointEvery) and isinstance(spec.modules, (list, tuple))
        blocks = list(spec.modules)
        own = self.search.trace_key(config)
        out = set()
        for choice in self.choices:
            other = choice.kwargs.get(_KNOB)
            if not isinstance(other, CheckpointEvery) or other.every < 2:
                continue
            if not isinstance(other.modules, (list, tuple)) or list(other.modules) != blocks:
                continue
            sibling, _ = _with(key, len(own), config, choice, self.search.trace_key)
            if self.search.trace_of(sibling) is None:
                out.add(other.every)
        return out

    def derived(
        self, keys: tuple[Key, Key], n: int, family: Key, to_ask: Callable[[], set[int]]
    ) -> Report | None:
        """The plan that checkpoints every ``n``-th block from the traces of the siblings
        ``keys`` (without checkpointing, with each block; their capture made once, kept
        while an ``n`` of ``to_ask`` is still to be asked for); None where not exact (noted:
        no sibling of ``family`` is traced ahead any more where the pair gave no capture,
        none for ``n`` where it did not derive ``n``)."""
        if keys not in self._captures:
            one, two = (self.search.trace_of(k) for k in keys)
            assert one is not None and two is not None
            self._captures[keys] = (checkpoint_capture(one.report, two.report), to_ask())
        capture, left = self._captures[keys]
        left.discard(n)
        if not left:
            del self._captures[keys]  # (each key is derived once: no n left to ask for)
        if capture is None or not capture.derives(n):
            self.refused.add((family, None if capture is None else n))
            return None
        plan = capture.every(n)
        for step in plan.profile.iterations if plan.profile is not None else []:
            step.moments = []  # (no micro-batch family takes a derived trace: let them go)
        return plan
