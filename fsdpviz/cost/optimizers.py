"""Optimizers as the memory and time models see them: the states each keeps per parameter
element and how its step runs (:class:`OptimizerSpec`), by name (:func:`optimizer_spec`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from fsdpviz.errors import ConfigError

__all__ = [
    "OPTIMIZER_IMPLEMENTATIONS",
    "OPTIMIZER_STATES",
    "OptimizerSpec",
    "optimizer_spec",
    "optimizer_states",
]

# Optimizer states per parameter element, in the sharded parameter's dtype.
OPTIMIZER_STATES = {
    "adam": 2,  # exp_avg, exp_avg_sq
    "adamw": 2,
    "sgd": 0,  # plain SGD keeps nothing
    "sgd_momentum": 1,  # momentum_buffer
}
# How torch.optim runs a step: "foreach" (its default on a GPU: one kernel per operation
# over all the parameters of a device and dtype), "fused" (fused=True: one kernel for the
# whole update), "for_loop" (foreach=False: parameter by parameter). A name may end in one:
# "adamw_fused".
OPTIMIZER_IMPLEMENTATIONS = ("foreach", "fused", "for_loop")


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer as the memory and time models see it: ``states`` per parameter element
    (in the shard's dtype), ``adam`` (Adam or AdamW's update), its ``implementation``.

    Memory of the step beyond the states (``step_temporaries``): Adam's foreach update makes
    ``exp_avg_sq.sqrt()`` for all the parameters at once (``torch._foreach_sqrt``: one
    state's bytes), the for-loop one for one parameter at a time (its ``sqrt()`` and the
    division of it: two of the largest parameter's state), the fused one none. Memory
    traffic of the step (``passes``, in bytes of one state per element): fused reads the
    parameter, gradient and both states and writes the parameter and states (7); foreach and
    for-loop run lerp, mul, addcmul, sqrt, div, add, addcdiv and the decoupled weight decay as
    separate passes (21). SGD with momentum: 5 (read parameter, gradient, buffer; write
    parameter, buffer) either way, no temporaries."""

    name: str
    states: int
    adam: bool
    implementation: str = "foreach"

    def passes(self) -> int:
        if self.adam:
            return 7 if self.implementation == "fused" else 21
        return 3 + 2 * self.states


@functools.lru_cache(maxsize=64)
def optimizer_spec(optimizer: str | int | None) -> OptimizerSpec:
    """The :class:`OptimizerSpec` of ``"adam"``, ``"adamw"``, ``"sgd"``, ``"sgd_momentum"``
    (each optionally ending in ``_foreach``, ``_fused`` or ``_for_loop``; default foreach,
    torch's on a GPU), an int (states per parameter element) or None (no optimizer)."""
    if optimizer is None:
        return OptimizerSpec("none", 0, False)
    if isinstance(optimizer, int) and not isinstance(optimizer, bool) and optimizer >= 0:
        return OptimizerSpec(str(optimizer), optimizer, False)
    key = str(optimizer).lower().replace("-", "_").replace(" ", "_")
    implementation = "foreach"
    for impl in OPTIMIZER_IMPLEMENTATIONS:
        if key.endswith("_" + impl):
            key, implementation = key.removesuffix("_" + impl), impl
    if key not in OPTIMIZER_STATES:
        raise ConfigError(
            f"optimizer={optimizer!r} is not known; use one of {', '.join(OPTIMIZER_STATES)} "
            f"(optionally ending in _{', _'.join(OPTIMIZER_IMPLEMENTATIONS)}), an int (states "
            "per parameter element) or None"
        )
    return OptimizerSpec(key, OPTIMIZER_STATES[key], key.startswith("adam"), implementation)


def optimizer_states(optimizer: str | int | None) -> int:
    """States per parameter element for ``"adam"``, ``"adamw"``, ``"sgd"``, ``"sgd_momentum"``
    (and their ``_fused`` / ``_foreach`` / ``_for_loop`` forms).

    An int is taken as the number of states; None means no optimizer state.
    """
    return optimizer_spec(optimizer).states
