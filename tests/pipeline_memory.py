"""Measure one pipeline rank's memory in one process, on the fake process group.

``measure`` builds this rank's stages of :mod:`pipeline_job`'s model (sharded as torchtitan
shards them), runs ``torch.distributed.pipelining``'s schedule for ``steps`` steps and
follows every tensor with torch's ``MemTracker``: the peak of the last step, and the bytes
in use at each event :class:`fsdpviz.recording.PipelineRecorder` records in it, as the event
is issued and as its call returns (what a plan's memory holds at the event: an all-gather
with its unit's own copy-out, which its hook's ``wait_for_unshard`` makes at once; a free
done; a reduce-scatter's buffers made).

On the fake process group nothing arrives: a receive leaves the buffer ``PipelineStage``
allocated for it as it was, which costs the same memory, and the shape inference of the
first step gets the metadata a neighbouring stage would send (``_recv_meta``: the hidden
state of one microbatch, or its gradient). The tracker's module statistics are left out:
``MemTracker`` refuses a module that runs again before its iteration ends, which a stage
does once per microbatch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest.mock import patch

import pipeline_job as pj
import torch
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
from torch.distributed.pipelining import PipelineStage

from fsdpviz.recording import PipelineRecorder
from fsdpviz.schema.events import Event
from fsdpviz.schema.report import Report


@dataclass
class Measured:
    peak: int  # bytes, the last step's
    events: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, unit, bytes)
    report: Report | None = None  # every step's events, as the recorder saw them
    # the bytes once each event's call returned (a unit's own all-gather: once its hook's
    # wait_for_unshard copied it out); None: a send or receive, whose call moves no memory
    after: list[int | None] = field(default_factory=list)


class _NoModules:
    """``MemTracker``'s module tracker without module hooks."""

    parents = frozenset({"Global"})

    @property
    def is_bw(self) -> bool:
        return bool(torch._C._current_graph_task_id() != -1)

    def register_user_hooks(self, *args: Any) -> None:
        pass

    def clear_user_hooks(self) -> None:
        pass

    def __enter__(self) -> _NoModules:
        return self

    def __exit__(self, *args: Any) -> None:
        pass


def _tracker() -> Any:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker._mod_tracker = _NoModules()
    return tracker


def _total(tracker: Any) -> int:
    return sum(snap["Total"] for snap in tracker.get_tracker_snapshot().values())


@contextmanager
def _neighbours_metadata(microbatch: int, dtype: torch.dtype, frozen: int = 0) -> Iterator[None]:
    """What the shape inference receives from a stage on another rank: one microbatch of
    the hidden state (forward), or its gradient (backward); ``frozen``: the stages before
    it are frozen, their outputs need no gradient (and get none back)."""
    from torch.distributed.pipelining import _utils

    shape = (microbatch, pj.SEQ, pj.MODEL_ARGS["dim"])

    def metas(stage: int) -> Any:  # the hidden state stage ``stage`` sends
        hidden = torch.empty(shape, dtype=dtype, requires_grad=stage >= frozen)
        return _utils.extract_tensor_metas((hidden,))

    def recv_meta(self: Any, src_stage: int) -> Any:
        if src_stage < self.stage_index:
            return _utils._StageForwardMeta(forward_metas=metas(src_stage))
        grads = _utils._derive_grad_metas(metas(self.stage_index))
        return _utils._StageBackwardMeta(backward_metas=grads)

    original = PipelineStage._recv_meta
    PipelineStage._recv_meta = recv_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        PipelineStage._recv_meta = original  # type: ignore[method-assign]


def measure(
    schedule_name: str,
    microbatches: int,
    policy: str = "default",
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = pj.loss_fn,
    target: Callable[[], torch.Tensor] = pj.labels,
    steps: int = 2,
    mp_policy: Any = None,
    accumulate: bool = False,
    adamw: int = 0,
    frozen: int = 0,
    not_unsharded: tuple[str, ...] = (),
) -> Measured:
    """This rank's (``dist.get_rank()`` on a ``pj.PP`` x ``pj.DP`` mesh) last step;
    ``loss_fn`` of the last stage's output and ``target()``'s microbatch; ``mp_policy``:
    ``fully_shard``'s; ``accumulate``: the gradients kept from step to step (torchtitan's
    gradient accumulation under PP: one ``step()`` per micro-step), not set to ``None``.
    ``adamw``: torch's AdamW (foreach, as on a GPU) steps after every ``adamw`` steps (the
    micro-steps of an optimizer step), the gradients then set to ``None``, for three
    optimizer steps: the peak and the events are the last's (its micro-steps' and its
    update's), less AdamW's step counters (on a GPU they stay on the CPU). ``frozen``: the
    first stages' parameters, all frozen (``_neighbours_metadata``). ``not_unsharded``: the
    top-level modules whose ``set_unshard_in_backward(False)`` is called."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (pj.PP, pj.DP), mesh_dim_names=("pp", "dp_shard"))
    options = {"mp_policy": mp_policy} if mp_policy else {}
    schedule, stages = pj.build_schedule(mesh, schedule_name, microbatches, policy, loss_fn,
                                         not_unsharded, **options)  # fmt: skip
    first = any(st.is_first for st in stages)
    last = any(st.is_last for st in stages)
    params = [p for st in stages for p in st.submod.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True) if adamw else None
    tracker = _tracker()
    tracker.track_external(*[st.submod for st in stages], *([opt] if opt else []))
    seen: list[list[Any]] = []  # [kind, unit, bytes as issued, bytes as its call returned]
    issued: dict[int, list[Any]] = {}  # index in the recorder's iteration -> its entry

    class Recorder(PipelineRecorder):
        def _append(self, event: Event) -> int:
            entry = [event.kind, event.unit, _total(tracker), None]
            seen.append(entry)
            super()._append(event)
            index = len(self._current) - 1  # for _timed, which the recorder's wrappers
            issued[index] = entry  # call as the event's call returns
            return index

        def _timed(self, index: int, start_ns: int) -> None:
            entry = issued.pop(index, None)
            if entry is not None:
                entry[3] = _total(tracker)

    group_cls = FSDPParamGroup
    wait = group_cls.wait_for_unshard

    def wait_for_unshard(group: Any) -> None:
        """A unit's own all-gather ends with its hook's copy-out; a grouped unit's
        later modules wait again, with nothing to wait for."""
        wait(group)
        last = recorder._current[-1] if recorder._current else None
        own = last is not None and last.kind == "all_gather" and not last.prefetch
        if own and last.unit == recorder._name(group) and seen and seen[-1][4:] == []:
            seen[-1][3] = _total(tracker)
            seen[-1].append("waited")

    dtype = getattr(mp_policy, "param_dtype", None) or torch.float32
    if adamw:
        steps = 3 * adamw
    recorder = Recorder(schedule)
    with (
        _neighbours_metadata(pj.BATCH // microbatches, dtype, frozen),
        tracker,
        recorder,
        patch.object(group_cls, "wait_for_unshard", wait_for_unshard),
    ):
        tokens = pj.tokens() if first else None  # the batch, held through the step
        labels = target() if last else None
        for step in range(steps):
            if step == steps - (adamw or 1):  # the last (optimizer) step's peak and events
                now = tracker.get_tracker_snapshot()
                tracker._peak_mem_snap = now
                tracker._peak_mem = {dev: snap["Total"] for dev, snap in now.items()}
                seen.clear()
            if first:
                schedule.step(tokens, target=labels)
            else:
                schedule.step(target=labels)
            if opt is not None and (step + 1) % adamw == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
            for st in stages if not (accumulate or opt) else ():
                for p in st.submod.parameters():
                    p.grad = None
        peak = sum(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
    counters = 0
    if opt is not None:  # AdamW's step counters: 4 bytes a parameter, on a GPU the CPU's
        counters = 4 * sum("step" in state for state in opt.state.values())
        peak -= counters
    events = [(kind, unit, used - counters) for kind, unit, used, *_ in seen]
    after = [None if e[3] is None else e[3] - counters for e in seen]
    return Measured(peak, events, recorder.report(), after)
