"""What happens on a rank, in order: :class:`Event` (a collective, free or copy of FSDP,
tensor, pipeline or context parallelism) and :class:`ModuleEvent` (a module's forward or
backward starting or ending, recordings only), with the kinds, phases, hooks and groups
they name. A :class:`~fsdpviz.schema.report.Report`'s ``iterations`` and ``module_events``
are lists of them; see its schema for their JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from fsdpviz.schema.names import unit_label
from fsdpviz.schema.rows import Scalar
from fsdpviz.schema.serial import Record, key

EventKind = Literal[
    "all_gather", "free", "reduce_scatter", "all_reduce", "h2d", "d2h", "cast",
    "tp_all_gather", "tp_reduce_scatter", "tp_all_reduce", "tp_all_to_all",
    "pp_send", "pp_recv", "cp_all_gather", "cp_all_to_all",
]  # fmt: skip
"""What an :class:`Event` is. FSDP's own: ``all_gather`` (a unit's parameters gathered), ``free``
(its unsharded parameters freed: the all-gather's buffer, or under FSDP1 ``NO_SHARD`` with
parameter mixed precision the low-precision copy it computes on), ``reduce_scatter`` and
``all_reduce`` (its gradient reduced), ``h2d`` and ``d2h`` (CPU offload's copies of its shard
to the device and of its gradient to the host), ``cast`` (FSDP1 ``NO_SHARD`` with parameter
mixed precision: the low-precision copy of the unit's parameters made when it unshards,
``FlatParamHandle._use_low_precision_shard``, which no collective marks); then tensor,
pipeline and context parallelism's (:data:`TP_KINDS`, :data:`PP_KINDS`, :data:`CP_KINDS`)."""


TP_KINDS = ("tp_all_gather", "tp_reduce_scatter", "tp_all_reduce", "tp_all_to_all")
"""Tensor parallelism's collectives (of activations, and of replicated parameters' partial
gradients): over the ``tp`` mesh dimension, issued by the model's parallel styles."""


PP_KINDS = ("pp_send", "pp_recv")
"""Pipeline parallelism's sends and receives of a microbatch's activations (``phase``
forward) or their gradients (backward) between stages, over the ``pp`` mesh dimension."""


CP_KINDS = ("cp_all_gather", "cp_all_to_all")
"""Context parallelism's collectives: ring attention's exchanges of keys and values (and of
their gradients) over the ``cp`` mesh dimension."""


Phase = Literal["forward", "backward"]


Hook = Literal["pre_forward", "post_forward", "pre_backward", "post_backward", "final_callback"]


Group = Literal["replicate", "shard", "tp", "pp", "cp"]
"""The ranks a collective runs over, where not FSDP's usual: ``replicate``, hybrid sharding's
replicas; ``shard``, an ``all_reduce`` over FSDP's shard group that reduces no gradient (the amax
of a float8 weight torchao's float8 all-gather casts, ``module`` its FQN; or of all of them at
once where the job precomputes their scales); ``tp``, ``pp``, ``cp``, those mesh dimensions."""


ModuleEventKind = Literal["forward_enter", "forward_exit", "backward_enter", "backward_exit"]


@dataclass(frozen=True)
class Event(Record):
    """One collective, free or copy on a rank, in issue order (its ``kind``:
    :data:`EventKind`)."""

    kind: EventKind
    unit: str
    phase: Phase
    prefetch: bool = field(default=False, metadata=key(read=bool))
    hook: Hook | None = None
    hook_unit: str | None = None
    t: float | None = None
    duration: float | None = None
    group: Group | None = None
    # tensor parallelism's collectives: the module (or parameter) they are issued for, and
    # the bytes of the whole tensor they move (the unsharded activation or gradient)
    module: str | None = None
    nbytes: int | None = None
    # pipeline parallelism: the stage whose action issued the event, the microbatch of that
    # action (None for UNSHARD, RESHARD, REDUCE_GRAD and the first step's shape inference)
    # and the action as torch writes it ("0F1", "2B0", "1UNSHARD", "0REDUCE_GRAD", "1SEND_F0")
    stage: int | None = None
    microbatch: int | None = None
    action: str | None = None
    # tensor parallelism's collectives: the dtype of the data the styles move ("bfloat16";
    # "float8_e4m3fn" for an activation torchao's float8 styles cast before gathering it,
    # "float8_e5m2" for such an output gradient)
    dtype: str | None = None

    @property
    def tensor_parallel(self) -> bool:
        """Whether this is a collective of tensor parallelism (not of FSDP)."""
        return self.kind in TP_KINDS

    @property
    def pipeline(self) -> bool:
        """Whether this is a send or receive of pipeline parallelism (not of FSDP)."""
        return self.kind in PP_KINDS

    @property
    def context_parallel(self) -> bool:
        """Whether this is a collective of context parallelism's ring attention."""
        return self.kind in CP_KINDS

    def to_dict(self) -> dict[str, Scalar]:
        d: dict[str, Scalar] = {"kind": self.kind, "unit": self.unit, "phase": self.phase}
        if self.kind in ("all_gather", "cast"):
            d["prefetch"] = self.prefetch
        if self.group is not None:
            d["group"] = self.group
        if self.module is not None:
            d["module"] = self.module
        if self.nbytes is not None:
            d["nbytes"] = self.nbytes
        for name in ("stage", "microbatch", "action", "dtype"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        if self.hook is not None:
            d["hook"] = self.hook
            d["hook_unit"] = self.hook_unit
        if self.t is not None:
            d["t"] = self.t
        if self.duration is not None:
            d["duration"] = self.duration
        return d

    def untimed(self) -> Event:
        """This event without ``t`` and ``duration``: what schedules are compared on."""
        if self.t is None and self.duration is None:
            return self
        return replace(self, t=None, duration=None)

    def describe(self) -> str:
        """One line for people: ``all_gather 'blocks.1' (prefetch, pre_backward of 'blocks.2')``;
        the root reads ``(root)``: ``free (root) (post_forward of (root))``; under pipeline
        parallelism the action that issued it follows (``..., in 1F0)``); a collective moving
        float8 names its dtype (``tp_all_gather 'layers.0.attention' (forward, float8_e4m3fn,
        in 'layers.0')``)."""
        if self.pipeline:
            what = "activations" if self.phase == "forward" else "gradients"
            return f"{self.kind} {what} of microbatch {self.microbatch} ({self.action})"
        hook = f"{self.hook} of {unit_label(self.hook_unit)}"
        how: list[str] = [self.phase if self.hook is None else hook]
        if self.prefetch:
            how.insert(0, "prefetch")
        if self.dtype is not None and self.dtype.startswith("float8"):
            how.append(self.dtype)
        if self.group == "replicate":
            how.insert(0, "across replicas")
        elif self.group == "shard":  # a float8 weight's amax, or all of them after the step
            how.insert(0, "float8 amax" if self.module else "float8 amaxes, after the optimizer")
        if self.action is not None:
            how.append(f"in {self.action}")
        elif self.stage is not None:
            how.append(f"stage {self.stage}'s shape inference")
        if self.module is not None:
            return f"{self.kind} {self.module!r} ({', '.join(how)}, in {unit_label(self.unit)})"
        return f"{self.kind} {unit_label(self.unit)} ({', '.join(how)})"


@dataclass(frozen=True)
class ModuleEvent(Record):
    """A module's forward or backward starting or ending on a rank (recordings only)."""

    kind: ModuleEventKind
    module: str
    t: float = field(metadata=key(read=float))
