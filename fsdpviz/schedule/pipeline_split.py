"""A zero-bubble schedule's backward as torch splits it, measured on a stage's trace.

InterleavedZeroBubble, ZBVZeroBubble and DualPipeV run the backward of every stage but the
first as two actions (``PipelineStage.backward_one_chunk(full_backward=False)``, then
``backward_weight_one_chunk``), torch's functions of ``torch/distributed/pipelining/
_backward.py``:

- ``I``, ``stage_backward_input``: ``autograd.grad`` from the outputs (the loss) to the
  stage's inputs with ``retain_graph=True``; a pre-hook keeps the gradient at each operator
  that takes a weight (``param_groups[...]["grads"]``), the inputs' gradients are left in
  their ``.grad``, the outputs detached. The graph below those operators stays, with what
  its nodes saved, until ``W``;
- ``W``, ``stage_backward_weight``: for one parameter group after another, ``autograd.grad``
  from its operators to its weights, each gradient set as the weight's ``.grad`` (or added
  into the one there), the group's graph and kept gradients then dropped.

:func:`split_backward` runs both, torch's own functions, in another trace of the stage
(:class:`SplitTraces`: one for each set of weights ``I`` finds and of gradients ``W``
adds into, as the replay meets them), and :class:`SplitBackward` keeps what it measured:
the ``I`` trace's profile, what a microbatch holds from ``I`` to ``W``, and ``W``'s most,
each beyond what stays after ``W`` (the stage's output, the loss, the inputs' gradients:
the stitching counts them, as after a whole backward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from fsdpviz.schema.profile import StepProfile
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.probe_records import ACT, FWD_TEMP, GRAD
from fsdpviz.trace.tracker import Backward

__all__ = ["SplitBackward", "SplitKey", "SplitTraces", "split_backward"]


@dataclass
class SplitBackward:
    """What a stage's split backward holds (bytes; see the module doc).

    Attributes:
        profile: the ``I`` trace's profile (its forward as the stage's, its backward as
            ``I`` runs it).
        held: activations and temporaries a microbatch holds from ``I``'s end until ``W``.
        most: ``W``'s most: bytes, activations and forward temporaries among them (the
            rest, the gradients it makes included, its temporaries).
        grads: by unit, the gradients ``W`` sets where there were none.
    """

    profile: StepProfile | None = None
    held: tuple[int, int] = (0, 0)
    most: tuple[int, int, int] = (0, 0, 0)
    grads: dict[str, int] = field(default_factory=dict)


# What a split trace follows: the units whose weights ``I`` finds resharded (``submod.
# parameters()`` then holds their sharded parameters, which the graph does not use: no
# parameter group, so their part of the graph is not kept and ``W`` gives them no
# gradient), and the units whose gradients an earlier ``W`` left (``W`` adds into them)
SplitKey = tuple[frozenset[str], frozenset[str]]


class SplitTraces:
    """A stage's split backward, traced once for each :data:`SplitKey` asked for; None
    where torch's functions fail on the traced stage (``failed`` says how)."""

    def __init__(self, trace: Callable[[SplitKey], SplitBackward]) -> None:
        self._trace = trace
        self._traced: dict[SplitKey, SplitBackward | None] = {}
        self.failed = ""

    def __getitem__(self, key: SplitKey) -> SplitBackward | None:
        if key not in self._traced:
            try:
                self._traced[key] = self._trace(key)
            except RuntimeError as e:  # as the second backward of a selective checkpoint
                self._traced[key], self.failed = None, str(e)
        return self._traced[key]


def split_backward(
    probe: CostProbe,
    part: nn.Module,
    inputs: Any,
    groups: dict[str, list[nn.Parameter]],
    key: SplitKey,
    into: SplitBackward,
) -> Backward:
    """``run_step``'s ``backward=``: ``I`` then ``W`` of stage ``part`` (its ``inputs``, the
    values it received; ``groups``: each unit's parameters; ``key``: see
    :data:`SplitKey`), as ``PipelineStage`` calls them; what they hold is put ``into``."""
    lost, had = key
    hidden = {id(p) for unit in lost for p in groups.get(unit, [])}
    owner = {id(p): unit for unit, params in groups.items() for p in params}

    def run(outputs: list[torch.Tensor], grads: list[torch.Tensor] | None, output: Any) -> None:
        weights = [p for p in part.parameters() if id(p) not in hidden]
        received = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
        _, param_groups = stage_backward_input(outputs, grads, received, iter(weights))
        if grads is None:  # the last stage: backward_one_chunk detaches its output too
            for t in tree_leaves(output):
                if isinstance(t, torch.Tensor) and not t._is_view():
                    t.detach_()
        after_input = list(probe.live)
        with _disable_current_modes():  # an earlier W's, which this one adds into
            for p in weights:
                if owner.get(id(p)) in had:
                    p.grad = torch.zeros_like(p)
        old = [p.grad for p in weights if p.grad is not None]
        probe.uncounted(old)
        probe.watch()
        stage_backward_weight(iter(weights), param_groups)
        most = probe.watched()
        del param_groups
        units: dict[str, int] = {}  # the gradients W set (counted as its temporaries)
        for p in weights:
            if p.grad is not None and not any(p.grad is g for g in old):
                unit = owner.get(id(p), "")
                units[unit] = units.get(unit, 0) + probe.local_bytes([p.grad])
        _measured(into, after_input, list(probe.live), most, units)

    return run


def _measured(
    into: SplitBackward,
    after_input: list[int],
    after_weight: list[int],
    most: list[int],
    grads: dict[str, int],
) -> None:
    """``into`` from the levels the probe saw (indexed by kind; ``most``: the most held in
    ``W``, then each kind's bytes at that moment)."""
    kept = sum(after_weight) - after_weight[GRAD] - sum(grads.values())  # stays after W
    act = after_input[ACT] - after_weight[ACT]
    into.held = (act, sum(after_input) - after_input[GRAD] - kept - act)
    into.grads = {unit: n for unit, n in grads.items() if unit}
    into.most = (most[0] - kept, most[1 + ACT] - after_weight[ACT],
                 most[1 + FWD_TEMP] - after_weight[FWD_TEMP])  # fmt: skip
