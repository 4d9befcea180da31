"""One ``fully_shard`` call as the FSDP2 plan hands it on: :class:`Group` (its modules,
parameters, ``reshard_after_forward`` and sizes), what the options' statement, the
runtime port, the hook emulations and the replays read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from fsdpviz.schema.report import Unit


@dataclass
class Group:
    """One ``fully_shard`` call: its modules, parameters and sizes."""

    name: str  # FSDP2's name: member FQNs joined by ", " in named_modules() order
    modules: tuple[nn.Module, ...]
    fqns: tuple[str, ...]
    params: list[nn.Parameter] = field(default_factory=list)
    param_fqns: list[str] = field(default_factory=list)
    reshard_after_forward: bool | int = True
    auto_reshard: bool = False
    schema: Unit | None = None
    # tensor parallelism: the replicated parameters whose gradients are partial sums, all-
    # reduced over the tp dimension in post-backward (parameter FQN, unsharded bytes)
    tp_partial_grads: list[tuple[str, int]] = field(default_factory=list)
    # the dim FSDP2 shards each parameter on (its call's shard_placement_fn); empty: all dim 0
    shard_dims: list[int] = field(default_factory=list)

    @property
    def is_root(self) -> bool:
        return self.fqns == ("",)
