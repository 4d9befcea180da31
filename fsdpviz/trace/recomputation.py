"""Whether autograd is inside an activation checkpoint's recomputation (:func:`recomputing`):
what ``torch.utils.checkpoint`` creates there lives until backward uses it, so
:class:`~fsdpviz.trace.probe.CostProbe` counts it as activations. Read from the saved-tensor
hooks torch has pushed, or, before torch 2.8, from the Python stack.
"""

from __future__ import annotations

import sys

import torch


def recomputing() -> bool:
    """True inside a non-reentrant activation-checkpoint recomputation (in backward).

    ``torch.utils.checkpoint`` pushes its ``_recomputation_hook`` saved-tensor hooks
    while it recomputes; what it creates there lives until backward uses it, like
    activations. (A reentrant checkpoint recomputes under our own hooks: what it
    saves is counted by ``_pack``.)
    """
    peek = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if peek is None:  # torch < 2.8 cannot show the hooks: find the recomputation's frame
        return _in_recompute_fn()
    top = peek(True)
    name = getattr(top[0], "__qualname__", "") if top is not None else ""
    return name.startswith("_recomputation_hook")


def _in_recompute_fn() -> bool:
    """Whether ``torch.utils.checkpoint``'s ``recompute_fn`` (which runs the checkpointed
    forward again under ``_recomputation_hook``) is on the Python stack."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "recompute_fn" and code.co_filename.endswith("checkpoint.py"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
