"""What :class:`~fsdpviz.cost.memory_walker.Walker` records as it steps a tape: every moment
the total is looked at (:class:`~fsdpviz.schema.memory.Moment`), the bytes at each event
(:class:`~fsdpviz.schema.memory.MemoryEvent`), the peak and where it falls, and each unit's
forward and backward windows with their peaks (with the bytes of each stream's pool,
:mod:`~fsdpviz.cost.memory_pools`). :class:`MemoryRecords` is the part of the walker that does
it."""

from __future__ import annotations

from operator import itemgetter
from typing import Protocol

import numpy as np

from fsdpviz.cost.hook_calls import HookCall, Tape
from fsdpviz.schema.events import Event
from fsdpviz.schema.memory import POOLS, MemoryEvent, MemoryPeak, Moment
from fsdpviz.schema.report import unit_label

__all__ = ["WAITS", "Block", "MemoryRecords", "RecordsHost"]

Block = tuple[str | int, ...]
"""A buffer of a pool besides the compute stream's: what, unit[, index]."""

WAITS = ("pre_forward", "pre_backward")
"""The hook calls that open a unit's window (and wait for its all-gather)."""


class RecordsHost(Protocol):
    """What the records read and keep of the walker they are part of."""

    tape: Tape
    cat: dict[str, int]
    pools: dict[str, int]
    records: list[MemoryEvent]
    moments: list[Moment]
    unit_peaks: dict[str, dict[str, int]]
    in_backward: bool
    fsdp2: bool
    _call: int
    _event_index: int
    _open: dict[tuple[str, str], tuple[int, int]]
    _totals: list[int]
    _closed: list[tuple[str, str, int, int, int]]
    _closing: list[tuple[str, str]]
    _since: int
    _peak: int
    _peak_at: MemoryPeak

    def _total(self) -> int: ...
    def _close(self, key: tuple[str, str]) -> None: ...


_OTHER_POOLS = itemgetter(*POOLS[1:])  # the pools besides the compute stream's, in order


def _described(tape: Tape, of: Event | HookCall) -> str:
    """An event's ``describe()``, or a hook call's ``hook of 'unit'``, as moments name them:
    made once per tape (a tape is walked for every micro-step, option and iteration)."""
    found = tape.described.get(id(of))
    if found is None or found[0] is not of:
        text = of.describe() if isinstance(of, Event) else f"{of.hook} of {unit_label(of.unit)}"
        found = tape.described[id(of)] = (of, text)
    return found[1]


class MemoryRecords:
    """The walker's records (a mixin of :class:`~fsdpviz.cost.memory_walker.Walker`, typed by
    :class:`RecordsHost`)."""

    _peak_at: MemoryPeak

    def _total(self: RecordsHost) -> int:
        return sum(self.cat.values())

    def _moment(self: RecordsHost, where: str, c: HookCall | None, e: Event | None = None) -> None:
        values = tuple(self.cat.values())
        total = sum(values)
        others = _OTHER_POOLS(self.pools)
        pools = (total - sum(others), *others)
        if total > self._since:
            self._since = total
        self._totals.append(total)
        if e is not None:
            kind, event = "event", self._event_index
            what = f"{where} {_described(self.tape, e)}"
        else:
            kind, event = ("compute" if where.startswith("during") else "hook"), -1
            what = where
            if c is not None:
                what = f"{where} {_described(self.tape, c)}" if c.hook != "end" else "at the end"
        self.moments.append(Moment(kind, self._call, event, len(self.records), what, values, pools))
        if total > self._peak:
            self._peak = total
            self._peak_at = {
                "where": what,
                "event": len(self.records),
                "moment": len(self.moments) - 1,
                "breakdown": dict(self.cat),
            }

    def _snapshot(self: RecordsHost, index: int) -> None:
        e = self.tape.events[index]
        total = self._total()
        event = (e.kind, e.unit, e.phase, e.hook, e.hook_unit)
        peak_before = max(self._since, total)
        self.records.append(MemoryEvent.of(index, event, self.cat, total, peak_before))
        self._since = total

    def _window(self: RecordsHost, c: HookCall, opening: bool) -> None:
        """Open/close the per-unit windows of ``unit_peaks``.

        A unit's forward runs from its pre-forward to its post-forward hook (FSDP2: to the
        start of it, whose resharding counts in the windows of the units around it). Its
        backward runs from its pre-backward hook to its post-backward hook, plus the
        pre-backward hooks that fire on the same gradients (the previous unit's, with its
        copy-out), as in ``ModTracker``: FSDP registered its hook on that tensor first. It
        ends at the next compute, any operator (a norm's backward counts no FLOPs), or the
        next hook call of another kind; FSDP2's final callback is in no unit's window.
        """
        if opening and c.hook == "final_callback" and self.fsdp2:
            # ModTracker's own end-of-backward callback, queued before FSDP2's (its global
            # forward hook put its hook on the root's output first), leaves every module:
            # none holds the final callback (FSDP1 hooks the output inside its forward, first)
            opening = False
        if opening:
            if c.hook not in WAITS or (c.hook == "pre_forward" and self.in_backward):
                return  # (a recomputation's pre-forward opens no window)
            key = (c.unit, "backward" if c.backward else "forward")
            if key not in self._open:
                self._open[key] = (self._total(), len(self._totals))
            return
        if c.hook == "post_forward":
            self._close((c.unit, "forward"))
        elif c.hook.startswith("post_backward"):
            self._closing.append((c.unit, "backward"))
        elif c.hook in ("final_callback", "end"):
            for key in [k for k in self._open if k[1] == "backward"]:
                self._close(key)
            self._closing.clear()

    def _close(self: RecordsHost, key: tuple[str, str]) -> None:
        if key in self._open:
            opened, start = self._open.pop(key)
            self._closed.append((key[0], key[1], opened, start, len(self._totals)))

    def _unit_peaks(self: RecordsHost) -> None:
        """Each closed window's peak: the most of its opening total and the moments in it.

        Range maxima from a sparse table (windows can span most of an iteration, and
        there is one per unit and direction).
        """
        totals = np.asarray(self._totals, dtype=np.int64)
        table = [totals]  # table[k][i]: the most of totals[i : i + 2**k]
        while (1 << len(table)) <= len(totals):
            half = 1 << (len(table) - 1)
            table.append(np.maximum(table[-1][:-half], table[-1][half:]))
        for unit, direction, opened, start, end in self._closed:
            peak = opened
            if end > start:
                k = (end - start).bit_length() - 1
                level = table[k]
                peak = max(peak, int(level[start]), int(level[end - (1 << k)]))
            slot = self.unit_peaks.setdefault(unit, {"forward": 0, "backward": 0})
            slot[direction] = max(slot[direction], peak)

    def peak_record(self: RecordsHost) -> MemoryPeak:
        breakdown = self._peak_at.get("breakdown", dict(self.cat))
        dominant = max(breakdown, key=lambda k: breakdown[k]) if breakdown else None
        last = max(len(self.tape.events) - 1, 0)
        return {
            "bytes": max(self._peak, 0),
            # the event the peak precedes or happens in (the last one after the final callback)
            "event": min(self._peak_at.get("event", 0), last),
            "moment": self._peak_at.get("moment", 0),
            "where": self._peak_at.get("where", ""),
            "breakdown": breakdown,
            "dominant": dominant,
        }
