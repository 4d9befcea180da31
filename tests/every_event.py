"""What the every-event anchors share: a real run's events, each with the bytes torch's
``MemTracker`` holds at the moment the plan's row stands for and the most since the event
before, and the plan's same two figures (``total``, ``peak_before``) to compare them with.

FSDP2's moments (:func:`fsdp2_events`): a free or a prefetch, once its call returns; a
group's own all-gather, once its hook's ``wait_for_unshard`` copied it out; the all-reduce
across HSDP's replicas, ``foreach_reduce``'s last collective, once the post-backward that
called ``foreach_reduce`` returns (the function's buffers let go, and the group's partial
reduce output of ``set_requires_all_reduce(False)``'s micro-steps, which the post-backward
rebinds to what the function returns); a reduce-scatter, once its collective returns where
that all-reduce follows it (inside ``foreach_reduce``), else once the post-backward returns
(the function's loop's last gradient let go).

FSDP1's moments (:func:`fsdp1_events`): a free or a prefetch, once its call returns; an
all-gather once ``_unshard`` returns (``post_unshard`` frees the low-precision shard it
gathered); a reduce-scatter and the all-reduce across the replicas, once the post-backward
hook's work is let go (autograd lets go of the gradients the hook was passed, a post hook
of the ``AccumulateGrad`` node, as it returns).

The plan walks each micro-step from its start (:func:`steady`): the most since the event
before a micro-step's first counts the bytes at that event, the previous micro-step's last,
and what that micro-step reached after it (its compute after its last event: a backward
whose last groups neither reshard nor reduce), and any micro-step between without events
(each group kept gathered through it) in whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import torch
import torch.distributed as dist
from pipeline_memory import _NoModules, _total, _tracker
from torch import nn

import fsdpviz
from fsdpviz.cost.memory import memory_model
from fsdpviz.schema.events import Event

Measured = list[tuple[str, str, int, int]]  # (kind, unit, bytes after it, peak since the last)


def settler(tracker: Any) -> Callable[[list[Any]], None]:
    """Sets an entry's bytes (``[2]``) to those in use now and its peak (``[3]``) to the
    most since the entry settled before; the tracker's peak starts afresh from now."""

    def settle(entry: list[Any]) -> None:
        now = tracker.get_tracker_snapshot()
        entry[2:] = [_total(tracker), int(sum(tracker._peak_mem.values()))]
        tracker._peak_mem_snap = now
        tracker._peak_mem = {dev: snap["Total"] for dev, snap in now.items()}

    return settle


def settled_after(
    original: Callable[..., Any], entries: list[list[Any]], settle: Callable[[list[Any]], None]
) -> Callable[..., Any]:
    """``original``, which settles ``entries`` (and empties it) as it returns."""

    def run(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        for entry in entries:
            settle(entry)
        entries.clear()
        return out

    return run


def steady(report: fsdpviz.Report, micro_steps: int) -> Measured:
    """The plan's events of its second optimizer step's micro-steps, each with the bytes
    after it and the most since the event before."""
    out: Measured = []
    after = 0  # the most the micro-step before reached after its last event
    for i in range(micro_steps, 2 * micro_steps):
        mem = memory_model(report, optimizer=None, iteration=i)
        events = zip(report.iterations[i], mem.events, strict=True)
        rows = [(e.kind, e.unit, row.total, row.peak_before) for e, row in events]
        if out and rows:
            # a micro-step's walk peaks from its own start, after the step before let go of
            # what its end frees: the most since the event before counts that event's bytes,
            # and the compute of the step before that followed it
            kind, unit, total, peak = rows[0]
            rows[0] = (kind, unit, total, max(peak, out[-1][2], after))
        n = len(mem.events)
        reached = max((sum(m.bytes) for m in mem.moments if m.before >= n), default=0)
        # a micro-step without events (every group kept gathered through it) adds its
        # compute to what the one before reached after its last event
        after = reached if rows else max(after, reached)
        out += rows
    return out


def planned_step(
    report: fsdpviz.Report, named: Callable[[Event], bool]
) -> tuple[Measured, int, list[Event]]:
    """The plan's second step (one micro-step), each event with the bytes after it and the
    most since the event before (a ``named`` event, a parallel style's collective, by its
    bytes in place of its unit); the step's peak; its events."""
    mem = memory_model(report, optimizer=None, iteration=1)
    events = report.iterations[1]
    seen = [
        (e.kind, e.nbytes if named(e) else e.unit, row.total, row.peak_before)
        for e, row in zip(events, mem.events, strict=True)
    ]
    return seen, mem.peak["bytes"], events


def same(real: Measured, mine: Measured) -> None:
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)


class EventLog:
    """The entries of a run, ``[kind, unit, bytes, peak since the event before]`` each, in
    the order they happen; ``settle`` fills an entry's last two in."""

    def __init__(self, settle: Callable[[list[Any]], None], tracker: Any = None) -> None:
        self.settle = settle
        self.tracker = tracker  # the MemTracker that measures them
        self.seen: list[list[Any]] = []

    def restart(self) -> None:
        """Forget the entries so far (the steady step begins); its peaks start afresh."""
        self.seen.clear()
        self.settle([None] * 4)

    def measured(self) -> list[tuple[Any, ...]]:
        assert all(None not in entry for entry in self.seen), self.seen
        return [tuple(entry) for entry in self.seen]

    def step_end(self) -> tuple[list[tuple[Any, ...]], int]:
        """At the step's end (the tracker still on): the entries, and the step's peak (the
        most at any event, or since the last one to now)."""
        tail: list[Any] = [None] * 4
        self.settle(tail)
        seen = self.measured()
        return seen, max(tail[3], *(e[3] for e in seen))


@contextmanager
def fsdp2_events(model: nn.Module, inputs: Any, hsdp: bool) -> Iterator[EventLog]:
    """While it is open, the FSDP2 events of ``model`` (``fully_shard`` applied; ``inputs``
    held by the caller through the step) go into the log at the moments the module's
    docstring names; ``hsdp``: its mesh is 2-D, its groups all-reduce across the replicas
    (where ``set_requires_all_reduce`` has not turned it off)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg_mod

    from fsdpviz.recording import FSDP2Recorder

    tracker = _tracker()
    tracker.track_external(model, inputs)
    log = EventLog(settler(tracker))
    issued: dict[int, list[Any]] = {}  # index in the recorder's iteration -> its entry
    deferred: dict[str, list[list[Any]]] = {"copy_out": [], "collective": [], "reduce": []}

    class Recorder(FSDP2Recorder):
        def _append(self, event: Event) -> int:
            entry = [event.kind, event.unit, None, None]
            log.seen.append(entry)
            super()._append(event)
            index = len(self._current) - 1
            if event.kind == "all_gather" and not event.prefetch:
                deferred["copy_out"].append(entry)
            elif event.kind == "reduce_scatter":
                # HSDP's group all-reduces after it unless set_requires_all_reduce(False)
                all_reduces = hsdp and self._group.all_reduce_grads
                deferred["collective" if all_reduces else "reduce"].append(entry)
            elif event.kind == "all_reduce":
                deferred["reduce"].append(entry)
            else:
                issued[index] = entry
            return index

        def _timed(self, index: int, start_ns: int) -> None:
            entry = issued.pop(index, None)
            if entry is not None:
                log.settle(entry)

    group_cls = pg_mod.FSDPParamGroup
    copy_out = settled_after(group_cls.wait_for_unshard, deferred["copy_out"], log.settle)
    scatter = settled_after(dist.reduce_scatter_single, deferred["collective"], log.settle)
    reduced = settled_after(group_cls.post_backward, deferred["reduce"], log.settle)
    with (
        tracker,
        patch.object(group_cls, "post_backward", reduced),  # under the recorder's wrapper
        Recorder(model),
        patch.object(group_cls, "wait_for_unshard", copy_out),
        patch.object(dist, "reduce_scatter_single", scatter),
    ):
        yield log


@contextmanager
def fsdp1_events(fsdp: nn.Module, inputs: Any) -> Iterator[EventLog]:
    """While it is open, the events of the FSDP1 model ``fsdp`` (its buffers made: a step
    run before; ``inputs`` held by the caller through the step) go into the log at the
    moments the module's docstring names, its peaks from the opening on. The log's tracker
    follows no modules: the hooks of torch's ``ModTracker`` keep a module's input that is a
    leaf requiring grad alive, with its gradient, past the step (peft's
    ``enable_input_require_grads`` makes the embedding's output one under transformers'
    checkpointing), bytes torch's own run lets go of; ``log.tracker.reset_mod_stats()``
    after each iteration is harmless."""
    import warnings
    import weakref

    from test_cost_fsdp1_memtracker import _Tracker
    from torch.distributed._tools.mem_tracker import _MemRefType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import _runtime_utils as ru
    from torch.utils._pytree import tree_leaves

    from fsdpviz.recording import FSDP1Recorder

    tracker = _Tracker()
    tracker._mod_tracker = _NoModules()  # see the docstring
    tracker.track_external(fsdp, inputs)
    for module in fsdp.modules():
        if isinstance(module, FSDP) and module._handle is not None:
            flat = module._handle.flat_param
            for name in ("_full_param_padded", "_mp_shard"):
                buffer = getattr(flat, name, None)
                if buffer is not None:
                    tracker._update_and_maybe_create_winfos(buffer, _MemRefType.OTH)
    log = EventLog(settler(tracker), tracker)
    issued: dict[int, list[Any]] = {}  # index in the recorder's iteration -> its entry
    # events whose moment is the end of an enclosing call: an all-gather's, its
    # ``_unshard`` (``post_unshard`` frees the low-precision shard it gathered); a
    # reduction's, the post-backward hook's, once autograd lets go of the gradients it was
    # passed (as it returns; its buffers and .grad went before)
    deferred: dict[str, list[list[Any]]] = {"unshard": [], "post_backward": []}

    class Recorder(FSDP1Recorder):
        def _append(self, event: Event) -> int:
            entry = [event.kind, event.unit, None, None]
            log.seen.append(entry)
            super()._append(event)
            if event.kind == "all_gather":
                deferred["unshard"].append(entry)
            elif event.kind in ("reduce_scatter", "all_reduce"):
                deferred["post_backward"].append(entry)
            else:
                issued[len(self._current) - 1] = entry
            return len(self._current) - 1

        def _timed(self, index: int, start_ns: int) -> None:
            entry = issued.pop(index, None)
            if entry is not None:
                log.settle(entry)

    unshard = settled_after(ru._unshard, deferred["unshard"], log.settle)
    original_hook = ru._post_backward_hook
    passed: list[weakref.ref[Any]] = []  # the storages of the gradients the hook was passed

    def post_backward_hook(*args: Any) -> Any:
        grads = [t for t in tree_leaves(args[3:]) if isinstance(t, torch.Tensor)]
        passed[:] = [weakref.ref(t.untyped_storage()) for t in grads]
        out = original_hook(*args)
        # NO_SHARD all-reduces the gradient autograd put in .grad in place: that one stays
        grad = args[1].flat_param.grad
        kept = None if grad is None else grad.untyped_storage()
        passed[:] = [ref for ref in passed if ref() is not None and ref() is not kept]
        if not passed:
            settled_after(lambda: None, deferred["post_backward"], log.settle)()
        return out

    def delete_callback(*args: Any) -> None:
        """The tracker lets go of a storage: once autograd lets go of every gradient the
        post-backward hook was passed (as the hook returns), its reductions are done."""
        tracker_delete(*args)
        if passed and all(ref() is None for ref in passed):
            passed.clear()
            settled_after(lambda: None, deferred["post_backward"], log.settle)()

    tracker_delete = tracker._delete_callback
    tracker._delete_callback = delete_callback
    with (
        warnings.catch_warnings(),
        tracker,
        patch.object(ru, "_unshard", unshard),
        patch.object(ru, "_post_backward_hook", post_backward_hook),
        Recorder(fsdp),
    ):
        warnings.simplefilter("ignore")
        log.settle([None] * 4)  # its peaks start afresh
        yield log


def fsdp1_run(
    fsdp: nn.Module,
    ids: torch.Tensor,
    micro_steps: int,
    forward: Callable[[nn.Module], Any] | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> Measured:
    """Real FSDP1 ``fsdp`` (``ids`` its input, held through the step; ``forward``: a
    micro-step's call, by default ``fsdp(ids)``, its output held through the backward of
    ``loss`` of it, by default its sum): one optimizer step
    (its buffers made, its orders recorded), then the events of the next one's micro-steps
    (the first ``micro_steps - 1`` under ``no_sync``), each with the bytes at its moment and
    the most since the event before.

    The moments, as FSDP1's code runs them: a free or a prefetch, once its call returns; an
    all-gather (``NO_SHARD``'s cast) once ``_unshard`` returns (``post_unshard`` frees the
    low-precision shard it gathered); a reduce-scatter and an all-reduce, once the
    post-backward hook's work is let go (autograd lets go of the gradients the hook was
    passed, a post hook of the ``AccumulateGrad`` node, as it returns; ``NO_SHARD``'s
    gradient all-reduced in place stays in ``.grad``)."""
    import warnings
    from contextlib import nullcontext

    from test_cost_fsdp1_memtracker import _loss

    call = forward or (lambda m: m(ids))
    loss_of = loss or _loss

    def step(tracker: Any = None) -> None:
        for k in range(micro_steps):
            with fsdp.no_sync() if k < micro_steps - 1 else nullcontext():  # type: ignore[operator]
                out = call(fsdp)
                loss_of(out).backward()
                del out
            if tracker is not None:
                tracker.reset_mod_stats()  # it follows one iteration at a time

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step()
    fsdp.zero_grad(set_to_none=True)
    with fsdp1_events(fsdp, ids) as log:
        step(log.tracker)
    return log.measured()
