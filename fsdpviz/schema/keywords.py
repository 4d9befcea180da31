"""The keyword arguments of the conveniences every result shares, typed once where the data
types that declare them can name them (``**kwargs: Unpack[...]``).

FSDP's and the job's keywords (:class:`FSDPKwargs`), and with ``world_size`` and
``progress`` (:class:`PlanKwargs`), as :func:`fsdpviz.analyze` takes them (its
:class:`~fsdpviz.api.keywords.AnalyzeKwargs` adds ``machine``): FSDP's own take the types
torch's ``FullyShardedDataParallel`` (FSDP1) and ``fully_shard`` (FSDP2) take, plus the forms
fsdpviz accepts besides (FSDP2's explicit prefetch maps, ``fully_shard=``'s targets,
``mesh=`` as ``init_device_mesh`` shapes it). Then what the views of a plan are drawn with
(:class:`ViewKwargs`), and over them the keywords of ``show()`` (a report's
:class:`DashboardKwargs`, a recorded run's :class:`ShowKwargs`, a comparison's
:class:`TimelineKwargs`, a tuning's :class:`TuneShowKwargs`), of ``save()``
(:class:`SaveKwargs`, :class:`PageKwargs`, :class:`ReportFileKwargs`,
:class:`TuneSaveKwargs`) and of
``_repr_mimebundle_`` (IPython's :class:`MimeBundleKwargs`).

A keyword whose value is a type of a layer above the data types (``memory=``'s
``MemoryLane``, ``machine=``'s ``Machine``, ``ranks=``'s ``RecordedRun``) is typed ``Any``
here, with its forms in a comment: naming those types here would make the data types import
the cost model and the recorders (a circle, see ARCHITECTURE.md). The functions that take
them check every value at run time and say what is wrong. The types are for type checkers
only.

Example::

    def show_twice(report: Report, **kwargs: Unpack[DashboardKwargs]) -> tuple[Any, Any]:
        return report.show(**kwargs), report.show(**{**kwargs, "world_size": 64})
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
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

    from fsdpviz.schema.checkpointing import CheckpointSpec
    from fsdpviz.schema.config import TraceMode

MatmulPrecision = Literal["highest", "high", "medium"]
"""torch's float32 matmul precisions (``torch.set_float32_matmul_precision``)."""

PrefetchMap = Mapping[str, Sequence[str]]
"""FSDP2's explicit prefetches: ``{fqn: [fqn, ...]}`` (``set_modules_to_forward_prefetch`` /
``set_modules_to_backward_prefetch`` per group)."""


class FSDP1Kwargs(TypedDict, total=False):
    """FSDP1's own keywords: ``FullyShardedDataParallel``'s, as torch types them, and hybrid
    sharding's shard group (``shard_group_size``, fsdpviz's)."""

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


class FSDP2Kwargs(TypedDict, total=False):
    """FSDP2's own keywords: ``fully_shard``'s, the modules it is called on, the switches of
    the micro-steps before the last, ``FSDPModule.set_unshard_in_backward`` per group, and the
    tensor-parallel plan applied before it."""

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
    unshard_in_backward: bool | Mapping[str, bool]
    parallelize_plan: ParallelStyle | Mapping[str, ParallelStyle] | None


class BothKwargs(TypedDict, total=False):
    """The keywords both APIs' option parsers take: the prefetch options (FSDP1's switch or
    enum, FSDP2's explicit maps), the job around FSDP and how fsdpviz plans it."""

    forward_prefetch: bool | PrefetchMap | None
    backward_prefetch: BackwardPrefetch | PrefetchMap | None
    # the job around FSDP
    grad_accum: int
    compile: bool | Sequence[type[nn.Module]]
    float8: bool | Mapping[str, Any] | None
    float32_matmul_precision: MatmulPrecision | None
    activation_checkpointing: CheckpointSpec
    # how fsdpviz plans it
    loss: Callable[[Any], torch.Tensor] | None
    trace: TraceMode
    torch_version: str | None


class FSDPKwargs(FSDP1Kwargs, FSDP2Kwargs, BothKwargs, total=False):
    """FSDP's keywords (FSDP1's, FSDP2's) and the job's: every keyword of :func:`fsdpviz.analyze`
    but ``world_size``, ``progress`` and ``machine``. Besides the parsers': pipeline
    parallelism's and ``profile``, which ``analyze`` reads before them."""

    # pipeline parallelism (torch.distributed.pipelining, as torchtitan splits the model)
    pipeline_schedule: str | type | None
    microbatches: int | None
    pipeline_stages: Sequence[Sequence[str]] | int | None
    profile: bool  # False: no activations or FLOPs measured (report.profile is None)


class PlanKwargs(FSDPKwargs, total=False):
    """:class:`FSDPKwargs` and the ranks, and whether to show a progress bar: every keyword
    of :func:`fsdpviz.analyze` but ``machine``."""

    world_size: int
    progress: bool | None


class ViewKwargs(TypedDict, total=False):
    """How the views of a plan are drawn: the iteration, the memory lane, the machine that
    times a prediction."""

    iteration: int | Literal["auto"] | None
    # "auto": the memory model's lane; a MemoryLane (fsdpviz.cost); bytes after each event;
    # a callable report -> either; None: no memory lane (fsdpviz.views.timeline_lanes's
    # MemoryOption)
    memory: Any
    # "auto": the machine the report was planned for; a Machine (fsdpviz.cost.machine) or a
    # preset's name; None: by event index
    machine: Any


class DashboardOptions(PlanKwargs, ViewKwargs, total=False):
    """What every dashboard a result opens takes besides the model: how its views are drawn
    and the :func:`fsdpviz.analyze` keywords its controls re-plan with."""


class ShowKwargs(DashboardOptions, total=False):
    """``show()`` of a recorded run (and of a flight recorder's diagnosis): a dashboard's
    keywords but ``ranks`` (the run's ranks are its own)."""

    model: Any  # the model (an nn.Module) the controls re-plan
    inputs: Any  # its inputs, as analyze takes them


class DashboardKwargs(ShowKwargs, total=False):
    """What :class:`~fsdpviz.widgets.Dashboard` takes besides the report
    (``report.show(**kwargs)``): its own keywords and the :func:`fsdpviz.analyze` keywords its
    controls re-plan with."""

    ranks: Any  # Sequence[Report] or a RecordedRun (fsdpviz.recording): a lane group per rank


class TuneShowKwargs(DashboardOptions, total=False):
    """``show()`` of a tuning (:class:`~fsdpviz.widgets.TuneView`): the configuration shown
    first, the model tuned, and what each opened dashboard takes."""

    selected: int | Literal["best"] | None
    model: Any  # the model (an nn.Module) tuned: each opened dashboard re-plans it


class TimelineTraits(TypedDict, total=False):
    """The timeline view's state a constructor may set (its traits)."""

    step: int
    playing: bool
    speed: float
    order: Literal["issue", "stream"]
    selected_unit: str | None
    sync_interval_ms: int


class TimelineKwargs(ViewKwargs, TimelineTraits, total=False):
    """What :class:`~fsdpviz.widgets.TimelineWidget` takes besides what it shows
    (``comparison.show(**kwargs)``)."""

    rank_names: Sequence[str] | None


class ReportFileKwargs(ViewKwargs, total=False):
    """A page's views and its title: what a ``.fsdpviz.json`` file holds besides the report
    (:func:`fsdpviz.export.save`)."""

    title: str | None


class PageKwargs(ReportFileKwargs, total=False):
    """A page (``.html``) written by :func:`fsdpviz.export.save`: ``comparison.save()``."""

    theme: Literal["auto", "light", "dark"]


class SaveKwargs(PageKwargs, total=False):
    """Every option of :func:`fsdpviz.export.save` (``report.save()``, ``run.save()``); each
    format takes some of them, and refuses the others saying which it takes."""

    figure: Literal["explorer", "prefetch", "timeline"]
    width: int | None
    height: int | None
    scale: float | None
    indent: int | str | None
    graph: Literal["unit", "module"]


class TuneSaveKwargs(TypedDict, total=False):
    """Every option of ``tuning.save()`` (:func:`fsdpviz.export.save_tuning`): its page's
    (``.html``) and its image's; each format refuses the others saying which it takes."""

    theme: Literal["auto", "light", "dark"]
    title: str | None
    selected: int | None
    max_plans: int
    max_bytes: int
    iteration: int | Literal["auto"] | None
    machine: Any  # a Machine (fsdpviz.cost.machine), a preset's name, "auto" or None
    width: int | None
    height: int | None
    scale: float | None


class MimeBundleKwargs(TypedDict, total=False):
    """What IPython's display formatter passes ``_repr_mimebundle_``: the mimetypes asked for
    and those left out."""

    include: Container[str] | None
    exclude: Container[str] | None
