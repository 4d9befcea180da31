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

:func:`split_backward` runs both, torch's own functions, in a second trace of the stage
(each group's ``W`` on its own, to see the bytes between groups), and :class:`SplitBackward`
keeps what it measured: the ``I`` trace's profile, what a microbatch holds from ``I`` to
``W``, and ``W``'s most, each beyond what stays after ``W`` (the stage's output, the loss,
the inputs' gradients: the stitching counts them, as after a whole backward).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.utils._pytree import tree_leaves

from fsdpviz.schema.profile import StepProfile
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.probe_records import ACT, FWD_TEMP, GRAD
from fsdpviz.trace.tracker import Backward


@dataclass
class SplitBackward:
    """What a stage's split backward holds (bytes; see the module doc).

    Attributes:
        profile: the ``I`` trace's profile (its forward as the stage's, its backward as
            ``I`` runs it).
        held: activations and temporaries a microbatch holds from ``I``'s end until ``W``.
        first: ``W``'s most when the stage has no gradients yet: bytes, activations,
            forward temporaries and new gradients among them.
        later: ``W``'s most when it adds into gradients there: bytes, activations, forward
            temporaries (the gradients it adds are freed group by group).
        grads: by unit, the gradients ``W`` sets where there were none.
    """

    profile: StepProfile | None = None
    held: tuple[int, int] = (0, 0)
    first: tuple[int, int, int, int] = (0, 0, 0, 0)
    later: tuple[int, int, int] = (0, 0, 0)
    grads: dict[str, int] = field(default_factory=dict)


def split_backward(
    probe: CostProbe,
    part: nn.Module,
    inputs: Any,
    owner: dict[nn.Parameter, str],
    into: SplitBackward,
) -> Backward:
    """``run_step``'s ``backward=``: ``I`` then ``W`` of stage ``part`` (its ``inputs``, the
    values it received; ``owner``: each parameter's unit), as ``PipelineStage`` calls them;
    what they hold is put ``into``."""

    def run(outputs: list[torch.Tensor], grads: list[torch.Tensor] | None, output: Any) -> None:
        params = list(part.parameters())
        received = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
        _, groups = stage_backward_input(outputs, grads, received, iter(params))
        if grads is None:  # the last stage: backward_one_chunk detaches its output too
            for t in tree_leaves(output):
                if isinstance(t, torch.Tensor) and not t._is_view():
                    t.detach_()
        after_input = list(probe.live)
        most: list[list[int]] = []  # each group's W: the most held, each kind's then
        made = [0]  # the gradients set, after each group
        for group in groups:
            probe.watch()
            stage_backward_weight(iter(params), [group])
            most.append(probe.watched())
            probe.grads_set()
            made.append(probe.live[GRAD])
        del groups
        units: dict[str, int] = {}
        for p in params:
            if p.grad is not None and p in owner:
                units[owner[p]] = units.get(owner[p], 0) + probe.local_bytes([p.grad])
        _measured(into, after_input, list(probe.live), most, made, units)

    return run


def _measured(
    into: SplitBackward,
    after_input: list[int],
    after_weight: list[int],
    most: list[list[int]],
    made: list[int],
    grads: dict[str, int],
) -> None:
    """``into`` from the levels the probe saw (indexed by kind; see :func:`split_backward`)."""
    kept = sum(after_weight) - after_weight[GRAD]  # what stays after W
    act = after_input[ACT] - after_weight[ACT]
    into.held = (act, sum(after_input) - after_input[GRAD] - kept - act)
    into.grads = grads
    if not most:
        return
    # the first W, group j: the gradients of the groups before it are set; a later W adds
    # each group's into the one there, the previous group's (torch's ``dweights``) alive
    # until this group's are made
    j = max(range(len(most)), key=lambda j: most[j][0])
    top = most[j]
    into.first = (top[0] - kept, top[1 + ACT] - after_weight[ACT],
                  top[1 + FWD_TEMP] - after_weight[FWD_TEMP], top[1 + GRAD])  # fmt: skip
    j = max(range(len(most)), key=lambda j: most[j][0] - made[max(j - 1, 0)])
    top = most[j]
    into.later = (top[0] - made[max(j - 1, 0)] - kept, top[1 + ACT] - after_weight[ACT],
                  top[1 + FWD_TEMP] - after_weight[FWD_TEMP])  # fmt: skip


__all__ = ["SplitBackward", "split_backward"]
