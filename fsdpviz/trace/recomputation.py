"""Whether autograd is inside an activation checkpoint's recomputation (:func:`recomputing`):
what ``torch.utils.checkpoint`` creates there lives until backward uses it, so
:class:`~fsdpviz.trace.probe.CostProbe` counts it as activations. Read from the saved-tensor
hooks torch has pushed.
"""

from __future__ import annotations

import torch


def recomputing() -> bool:
    """True inside a non-reentrant activation-checkpoint recomputation (in backward).

    ``torch.utils.checkpoint`` pushes its ``_recomputation_hook`` saved-tensor hooks
    while it recomputes; what it creates there lives until backward uses it, like
    activations. (A reentrant checkpoint recomputes under our own hooks: what it
    saves is counted by ``_pack``.)
    """
    top = torch._C._autograd._top_saved_tensors_default_hooks(True)
    name = getattr(top[0], "__qualname__", "") if top is not None else ""
    return name.startswith("_recomputation_hook")
