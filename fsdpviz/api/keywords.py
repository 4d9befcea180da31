"""The keyword arguments of :func:`fsdpviz.analyze`, typed once, for every function that
passes them on (``compare``'s plans, re-planning, ``tune``, the widgets' constructors).

FSDP's own keywords take the types torch's ``FullyShardedDataParallel`` (FSDP1) and
``fully_shard`` (FSDP2) take, plus the forms fsdpviz accepts besides (FSDP2's explicit
prefetch maps, ``fully_shard=``'s targets, ``mesh=`` as ``init_device_mesh`` shapes it);
then the job's (``grad_accum``, ``compile``, ``float8``, ...) and fsdpviz's own
(``world_size``, ``loss``, ``trace``, ...). Keywords fsdpviz answers with what to pass
instead (``process_group``, ``device_mesh``, ``no_sync``, ``requires_gradient_sync``) are
not here. The types are for type checkers only: ``analyze`` checks every keyword it is
given at run time, unknown ones included, and says what is wrong.

Three levels, as the functions that pass them on take them:

- :class:`FSDPKwargs`: FSDP's and the job's options (``tune`` and ``suggest`` take
  ``world_size``, ``machine`` and ``progress`` as their own arguments);
- :class:`PlanKwargs`: those and ``world_size``, ``progress`` (a dashboard's ``machine=``
  is the one its timeline is drawn on);
- :class:`AnalyzeKwargs`: every keyword of ``analyze``, ``machine`` too.

Example::

    def plan_twice(model: nn.Module, ids: Tensor, **kwargs: Unpack[AnalyzeKwargs]) -> Comparison:
        return fsdpviz.compare(fsdpviz.analyze(model, ids, **kwargs),
                               fsdpviz.analyze(model, ids, **{**kwargs, "world_size": 64}))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import (
        BackwardPrefetch,
        CPUOffload,
        MixedPrecision,
        MixedPrecisionPolicy,
        OffloadPolicy,
        ShardingStrategy,
    )
    from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy
    from torch.distributed.tensor.parallel import ParallelStyle

    from fsdpviz.cost.hardware import Machine
    from fsdpviz.schema.config import TraceMode
    from fsdpviz.trace.checkpointing import CheckpointSpec

PrefetchMap = Mapping[str, Sequence[str]]
"""FSDP2's explicit prefetches: ``{fqn: [fqn, ...]}`` (``set_modules_to_forward_prefetch`` /
``set_modules_to_backward_prefetch`` per group)."""


class FSDPKwargs(TypedDict, total=False):
    """FSDP's keywords (FSDP1's, FSDP2's) and the job's: every keyword of :func:`fsdpviz.analyze`
    but ``world_size``, ``progress`` and ``machine``."""

    # FSDP1: FullyShardedDataParallel's keywords, as torch types them
    sharding_strategy: ShardingStrategy | None
    cpu_offload: CPUOffload | None
    auto_wrap_policy: Callable[..., Any] | ModuleWrapPolicy | CustomPolicy | None
    mixed_precision: MixedPrecision | None
    ignored_modules: Iterable[nn.Module] | None
    param_init_fn: Callable[[nn.Module], None] | None
    device_id: int | torch.device | None
    sync_module_states: bool
    limit_all_gathers: bool
    use_orig_params: bool
    ignored_states: Iterable[nn.Parameter] | Iterable[nn.Module] | None
    shard_group_size: int | None
    # both: FSDP1's switch or enum, FSDP2's explicit maps
    forward_prefetch: bool | PrefetchMap | None
    backward_prefetch: BackwardPrefetch | PrefetchMap | None
    # FSDP2: fully_shard's keywords, and the modules it is called on
    fully_shard: (
        Sequence[type[nn.Module] | str | tuple[str, ...]] | Callable[[str, nn.Module], bool] | None
    )
    mesh: DeviceMesh | tuple[str | int, ...] | Mapping[str, int] | Sequence[int] | None
    reshard_after_forward: bool | int | Mapping[str, bool | int] | None
    shard_placement_fn: (
        Callable[[nn.Parameter], Any] | Mapping[str, Callable[[nn.Parameter], Any] | None] | None
    )
    mp_policy: MixedPrecisionPolicy | None
    offload_policy: OffloadPolicy | None
    ignored_params: set[nn.Parameter] | None
    reshard_after_backward: bool
    requires_all_reduce: bool
    parallelize_plan: ParallelStyle | Mapping[str, ParallelStyle] | None
    # pipeline parallelism (torch.distributed.pipelining, as torchtitan splits the model)
    pipeline_schedule: str | type | None
    microbatches: int | None
    pipeline_stages: Sequence[Sequence[str]] | int | None
    # the job around FSDP
    grad_accum: int
    compile: bool | Sequence[type[nn.Module]]
    float8: bool | Mapping[str, Any] | None
    float32_matmul_precision: Literal["highest", "high", "medium"] | None
    activation_checkpointing: CheckpointSpec
    # how fsdpviz plans it
    loss: Callable[[Any], torch.Tensor] | None
    trace: TraceMode
    torch_version: str | None
    profile: bool  # False: no activations or FLOPs measured (report.profile is None)


class PlanKwargs(FSDPKwargs, total=False):
    """:class:`FSDPKwargs` and the ranks, and whether to show a progress bar: every keyword
    of :func:`fsdpviz.analyze` but ``machine``."""

    world_size: int
    progress: bool | None


class AnalyzeKwargs(PlanKwargs, total=False):
    """Every keyword of :func:`fsdpviz.analyze`."""

    machine: str | Machine | None
