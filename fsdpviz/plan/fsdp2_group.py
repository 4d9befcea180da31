"""One ``fully_shard`` call as the FSDP2 plan hands it on: :class:`Group` (its modules,
parameters, ``reshard_after_forward`` and sizes), what the options' statement, the
runtime port, the hook emulations and the replays read; that call's
``reshard_after_forward`` as the option's value gives it (:meth:`Group.reshard_as`), for a
planned, an applied or a replayed group alike, and checked as FSDP2 checks it
(:meth:`Group.check_reshard_ranks`); and the groups' resharding as ``Report.config`` states
it (:func:`reshard_map`, :func:`restate_resharding`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from fsdpviz.errors import FSDPConfigError
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.torch_fsdp import TorchFSDP
from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.names import unit_label
from fsdpviz.schema.report import Unit


@dataclass
class Group:
    """One ``fully_shard`` call: its modules, parameters and sizes."""

    name: str  # FSDP2's name: member FQNs joined by ", " in named_modules() order
    modules: tuple[nn.Module, ...]
    fqns: tuple[str, ...]
    params: list[nn.Parameter] = field(default_factory=list)
    # each parameter's name as its unit lists it (without wrapper segments: schema/names)
    param_fqns: list[str] = field(default_factory=list)
    # each parameter's first FQN in the model's named_parameters(), and the other FQNs of a
    # shared one -> its first (the modules that hold them: Report.modules)
    param_paths: list[str] = field(default_factory=list)
    shared_paths: dict[str, str] = field(default_factory=dict)
    reshard_after_forward: bool | int = True
    schema: Unit | None = None
    # tensor parallelism: the replicated parameters whose gradients are partial sums, all-
    # reduced over the tp dimension in post-backward (parameter FQN, unsharded bytes, and
    # the dtype autograd makes the gradient in: the compute dtype)
    tp_partial_grads: list[tuple[str, int, str | None]] = field(default_factory=list)
    # those of them sharded on the tp dimension, whose partial gradients (a column-wise
    # linear's weight multiplied by a batch of one's sequence-sharded input: DTensor's mm
    # strategy) are reduce-scattered back to their shard instead
    tp_scattered_grads: set[str] = field(default_factory=set)
    # the dtype a gradient kept unreduced between micro-steps is held in, None where it
    # stays as autograd made it (:func:`accumulated_grad_dtype`): a partial gradient all-
    # reduced after them is that
    tp_accumulated_dtype: str | None = None
    # the dim FSDP2 shards each parameter on (its call's shard_placement_fn); empty: all dim 0
    shard_dims: list[int] = field(default_factory=list)
    # FSDPModule.set_unshard_in_backward: False, its pre-backward does not all-gather
    unshard_in_backward: bool = True

    @property
    def is_root(self) -> bool:
        return self.fqns == ("",)

    @property
    def frees_after_forward(self) -> bool:
        """Whether its parameters are freed after forward: ``True``, or an int over 1 (kept
        sharded over that many ranks); ``False`` and 1 keep them unsharded."""
        raf = self.reshard_after_forward
        return raf if isinstance(raf, bool) else raf > 1

    def post_forward_ranks(self, world_size: int) -> int | None:
        """The ranks of the smaller mesh its parameters are resharded to after forward: an
        int between 1 and the ``world_size`` shard ranks; ``None`` for any other value."""
        raf = self.reshard_after_forward
        if isinstance(raf, bool) or not isinstance(raf, int) or not 1 < raf < world_size:
            return None
        return raf

    @property
    def sharding_strategy(self) -> str:
        """Its unit's ``sharding_strategy``, in FSDP1's words for what it keeps after
        forward: ``"SHARD_GRAD_OP"`` where it is told to keep its parameters (``False``),
        else ``"FULL_SHARD"``."""
        return "FULL_SHARD" if self.reshard_after_forward is not False else "SHARD_GRAD_OP"

    def reshard_text(self) -> str:
        """Its resharding as an error names it (``"reshard_after_forward=2 for 'layers.0'"``)."""
        return f"{RESHARD.code(self.reshard_after_forward)} for {unit_label(self.name)}"

    def reshard_as(self, value: Any, rules: TorchFSDP | None = None) -> None:
        """Set its ``reshard_after_forward`` as ``fully_shard`` takes it from the option's
        ``value`` (a bool, an int or ``{fqn: bool | int}``; None or a dict without the group:
        torch's default, reshard all but the root). Before torch 2.8 (``rules``) lazy init
        keeps the root unsharded after forward whatever it was given."""
        self.reshard_after_forward = _reshard_after_forward_of(value, self.name, self.fqns, rules)

    def check_reshard_ranks(self, world_size: int) -> None:
        """Raise as FSDP2 does where its ``reshard_after_forward`` is an int that does not
        divide the ``world_size`` shard ranks."""
        raf = self.reshard_after_forward
        if isinstance(raf, bool) or not isinstance(raf, int):
            return
        if raf < 1 or raf > world_size or world_size % raf:
            raise FSDPConfigError(
                f"{self.reshard_text()}: if passing "
                f"reshard_after_forward as an int, it should be a factor of {world_size} "
                "(FSDP2 raises this)"
            )


def reshard_map(groups: Iterable[Group]) -> dict[str, bool | int]:
    """Each group's resharding after forward by its name, as ``Report.config`` states it."""
    return {g.name: g.reshard_after_forward for g in groups}


def restate_resharding(config: ReportConfig, groups: Iterable[Group]) -> ReportConfig:
    """``config`` stating ``groups``' resharding after forward (:func:`reshard_map`): a
    replay's, whose groups may reshard otherwise than the report's."""
    return config.replace(reshard_after_forward=reshard_map(groups))


def _reshard_after_forward_of(
    value: Any, name: str, fqns: tuple[str, ...], rules: TorchFSDP | None
) -> bool | int:
    if fqns == ("",) and rules is not None and not rules.auto_reshard_after_forward:
        return False
    if isinstance(value, dict):
        for key in (name, *fqns):
            if key in value:
                return value[key]  # type: ignore[no-any-return]
        value = None
    if value is None:
        return fqns != ("",)
    return value  # type: ignore[no-any-return]


def accumulated_grad_dtype(compute_dtype: str | None, reduce_dtype: str | None) -> str | None:
    """The dtype FSDP2 keeps a gradient unreduced in between micro-steps (no gradient
    sync): the unit's reduce dtype where it is not the compute dtype
    (``FSDPParam.to_accumulated_grad_if_needed``; ``init_dtype_attrs`` drops a reduce dtype
    equal to the parameter dtype), else None: as autograd made it, in the compute dtype."""
    if compute_dtype is None or reduce_dtype is None or compute_dtype == reduce_dtype:
        return None
    return reduce_dtype


def owner_index(fqn: str, groups: list[Group]) -> int:
    """The group whose ``fully_shard`` call manages module ``fqn``: the deepest one above it."""
    best, depth = 0, -1
    for i, g in enumerate(groups):
        for f in g.fqns:
            if (f == "" or fqn == f or fqn.startswith(f + ".")) and len(f) > depth:
                best, depth = i, len(f)
    return best
