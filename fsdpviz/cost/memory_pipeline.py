"""The pipeline's own steps of :class:`~fsdpviz.cost.memory_walker.Walker`: a rank's stages
as FSDP roots of their own, a stage's ``UNSHARD`` (gathered on the compute stream, or, over
a shard group of one rank, copied as the stage's next compute action starts), the backward
of one microbatch keeping the all-gathers no hook waited for, an input backward keeping the
post-forward shards it found, and the last gradient ``foreach_reduce`` keeps in the reduce
dtype a post-backward moved it to.
:class:`PipelineSteps` is that part of the walker (a mixin, typed by :class:`PipelineHost`).
"""

from __future__ import annotations

import re
from typing import Protocol

from fsdpviz.cost.grad_sizes import Upcast, param_grads, upcasts
from fsdpviz.cost.hook_calls import HookCall, Tape
from fsdpviz.cost.sizes import UnitBytes
from fsdpviz.schema.pipeline import stage_root
from fsdpviz.schema.report import Report

__all__ = ["PipelineHost", "PipelineSteps"]

_BACKWARD_ACTION = re.compile(r"\d+[BIW]\d+")  # a pipeline stage's backward of a microbatch
_STAGE_ACTION = re.compile(r"(\d+)(UNSHARD|F|B|I|W)\d*")  # a stage's UNSHARD, or compute


class PipelineHost(Protocol):
    """What the pipeline's steps read and change of the walker they are part of."""

    sizes: dict[str, UnitBytes]
    tape: Tape
    resident: set[str]
    on_compute: set[str]
    _microbatch_backward: bool
    _to_copy: dict[int, list[str]]
    _stage_roots: set[str]
    _root_of: dict[str, str]
    _stage_units: dict[int, list[str]]
    _pipeline_upcast: dict[str, Upcast]
    _found_by_input: set[str]
    _held_by_input: int
    cat: dict[str, int]
    post_forward_shard: dict[str, int]
    stale: set[str]

    def _wait(self, unit: str, c: HookCall) -> None: ...
    def _stage_unshard(self, c: HookCall) -> None: ...
    def _input_backward(self, action: str) -> None: ...


class PipelineSteps:
    """The pipeline's steps of the walker (its state: see :class:`PipelineHost`)."""

    on_compute: set[str]
    _microbatch_backward: bool
    _to_copy: dict[int, list[str]]
    _stage_roots: set[str]
    _root_of: dict[str, str]
    _stage_units: dict[int, list[str]]
    _pipeline_upcast: dict[str, Upcast]
    _found_by_input: set[str]
    _held_by_input: int

    def _pipeline_setup(self: PipelineHost, report: Report) -> None:
        """The pipeline's own state at the start of a walk (none outside a pipeline)."""
        # a pipeline stage's backward of one microbatch running (set_is_last_backward(False)):
        # its final callback keeps the all-gathers no hook waited for
        self._microbatch_backward = False
        self.on_compute = set()  # pending all-gathers on the compute stream (UNSHARD)
        # by stage: the units a stage's UNSHARD left to copy, over a shard group of one rank
        # (FSDPParamGroup.unshard issues nothing there; wait_for_unshard copies the shard
        # into the unsharded parameters): the runtime waits for them all as the stage's next
        # compute action starts (_assert_unsharded), before its first unit's hook
        self._to_copy = {}
        # a pipeline rank's stages are FSDP roots each: each one's post-forward frees the
        # all-gather buffer its forward kept (FSDPState._post_forward, iter_forward_root)
        pipe = report.pipeline
        self._stage_roots = {stage_root(st.index) for st in pipe.stages} if pipe else set()
        # each unit's stage root: a stage is an FSDP root of its own, whose final callback
        # finalizes its own states only
        self._root_of = (
            {u: stage_root(st.index) for st in pipe.stages for u in st.units} if pipe else {}
        )
        self._stage_units = {st.index: list(st.units) for st in pipe.stages} if pipe else {}
        # a pipeline's units reducing in another dtype: a post-backward of theirs moved their
        # gradients into FSDP2's reduce-dtype copy (to_accumulated_grad_if_needed), unless a
        # W's .grad is all there is (a split backward: no post-backward ran since)
        self._pipeline_upcast = upcasts(report, param_grads(report)) if pipe else {}
        # an input backward's units resharded after forward onto fewer ranks, found by
        # their post-forward parameters, and the bytes of those it has gathered since (see
        # :meth:`_input_backward`)
        self._found_by_input = set()
        self._held_by_input = 0

    def _pipeline_action(self: PipelineHost, c: HookCall) -> None:
        """A pipeline hook call: whether a backward of one microbatch runs from here on,
        and the stage's ``UNSHARD`` (:meth:`_stage_unshard`)."""
        if c.hook == "pipeline" and isinstance(c.arg, str) and c.arg != "forward_end":
            self._microbatch_backward = _BACKWARD_ACTION.fullmatch(c.arg) is not None
            self._input_backward(c.arg)
            self._stage_unshard(c)

    def _input_backward(self: PipelineHost, action: str) -> None:
        """A pipeline action starts: the input backward before it (``I``) has returned, and
        an ``I`` of a stage finds its weights. ``stage_backward_input`` looks them up
        (``self.submod.parameters()``, ``_get_grad_fn_or_grad_acc``) before autograd runs
        FSDP's pre-backward: a unit resharded after forward onto fewer ranks holds its
        post-forward parameters then, whose ``AccumulateGrad`` nodes (``weight_grad_fns``)
        keep them, their shards with them, until it returns, although the unit's copy-out
        (``to_unsharded``) lets FSDP's references go."""
        self.cat["sharded_params"] -= self._held_by_input
        self._held_by_input = 0
        found = _STAGE_ACTION.fullmatch(action)
        self._found_by_input = (
            {
                u
                for u in self._stage_units.get(int(found[1]), ())
                if u in self.post_forward_shard and u not in self.stale
            }
            if found and found[2] == "I"
            else set()
        )

    def _drop_post_forward_shard(self: PipelineHost, unit: str) -> None:
        """A unit's copy-out lets its post-forward shard go (``to_unsharded``): freed, unless
        the running input backward found it (:meth:`_input_backward`)."""
        n = self.post_forward_shard.pop(unit)
        if unit in self._found_by_input:
            self._held_by_input += n
        else:
            self.cat["sharded_params"] -= n

    def _moved_to_reduce_dtype(self: PipelineHost, unit: str, grads: int) -> bool:
        """A pipeline's unit whose ``grads`` bytes are FSDP2's reduce-dtype copy, not the
        compute-dtype ``.grad``: ``foreach_reduce``'s loop over the gradients (``world_size
        > 1``) keeps its last one alive, in that dtype, until it returns."""
        up = self._pipeline_upcast.get(unit)
        if up is None:
            return False
        compute = sum(up.grads)
        return abs(grads - compute) * 2 > abs(compute * (up.ratio - 1.0))

    def _stage_unshard(self: PipelineHost, c: HookCall) -> None:
        """A pipeline action: a stage's ``UNSHARD`` (``unshard(async_op=True)`` on each of
        its FSDP modules), or a compute action of a stage whose ``UNSHARD`` the runtime
        waits for first (``_assert_unsharded``: each handle's ``wait_for_unshard``)."""
        action = _STAGE_ACTION.fullmatch(str(c.arg))
        if action is None:
            return
        stage = int(action[1])
        if action[2] == "UNSHARD":
            gathered = {self.tape.events[e].unit for e in c.events}
            units = self._stage_units.get(stage, ())
            self._to_copy[stage] = [
                u for u in units if u in self.sizes and u not in gathered | self.resident
            ]
        elif action[2] in ("F", "B", "I", "W"):
            for unit in self._to_copy.pop(stage, ()):
                self._wait(unit, c)

    def _pool_of(self: PipelineHost, unit: str) -> str:
        """The category a pending all-gather's buffer is counted in (see ``on_compute``)."""
        if unit in self.on_compute:
            self.on_compute.discard(unit)
            return "unsharded_params"
        return "all_gather"
