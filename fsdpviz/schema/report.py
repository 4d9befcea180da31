"""The JSON-serialisable types every fsdpviz view reads.

A prediction (:func:`fsdpviz.analyze`) and a recording of a real FSDP run
(:class:`fsdpviz.FSDP1Recorder`) both produce a :class:`Report` made of
these types, so every graph, table and figure works for both.

Schema of :meth:`Report.to_dict` (``schema_version`` 1):

``units``
    One entry per FSDP wrap unit (one ``FullyShardedDataParallel`` instance),
    in FSDP's handle order (depth-first over the module tree, root first).
    ``module`` is the wrapped module's FQN in the user's model (``""`` for the
    root); ``params`` the FQNs of the parameters its FlatParameter holds, in
    flattening order, a shared parameter under its first FQN (the other names
    are in ``shared_params``). Sizes: ``numel`` (sum of the parameters),
    ``flat_numel`` (with the alignment padding of ``use_orig_params=True``),
    ``padded_numel`` (padded to a multiple of the shard world size),
    ``sharded_numel`` (held by each rank), and the matching ``bytes`` /
    ``sharded_bytes`` in ``dtype``. ``requires_grad`` is None for a unit that mixes
    frozen and trainable parameters (a LoRA adapter beside its frozen base weight); such a
    unit also states ``frozen_params``, ``trainable_numel`` and ``trainable_sharded_numel``
    (the trainable elements one rank holds: what its optimizer state is of); an FSDP2 unit
    with parameters that require grad but that no gradient reached in the traced step states
    them in ``unused_params`` (not reduced, no optimizer state). An FSDP2
    group whose parameters have several dtypes has ``dtype`` of its trainable ones and
    states ``param_dtypes`` and ``dtype_numels``; ``bytes`` counts each in its own. An FSDP2
    group whose ``shard_placement_fn`` shards parameters on a dim other than 0 states them in
    ``shard_dims`` (FQN -> dim) and every parameter's padded shard in ``shard_shapes``.
``forward_order``
    Unit ``module`` names in FSDP's pre-forward order (first use only, as
    recorded in the first iteration).
``iterations``
    ``[first_iteration_events, steady_state_events]``; with gradient accumulation
    (``config.grad_accum = N``) the ``N`` micro-steps of the first optimizer step, then
    the ``N`` of a steady one (the first ``N - 1`` of each without gradient sync). Each event:
    ``kind`` (``all_gather`` | ``free`` | ``reduce_scatter``, ``all_reduce``
    for ``NO_SHARD`` and hybrid sharding, and with CPU offload ``h2d`` (the unit's
    shard copied from host memory before its all-gather) and ``d2h`` (its sharded
    gradient copied to host memory after its reduction), and for FSDP1 ``NO_SHARD`` with
    parameter mixed precision ``cast`` (the low-precision copy of the unit's parameters
    made when it unshards; its ``free`` at the reshard)), ``unit``, ``phase``
    (``forward`` | ``backward``), ``prefetch`` (all-gathers and casts only), ``hook`` (the
    FSDP hook that issued it: ``pre_forward``, ``post_forward``, ``pre_backward``,
    ``post_backward``, ``final_callback``) and ``hook_unit`` (the unit whose hook ran). ``group``
    (only where set): ``"replicate"`` for hybrid sharding's all-reduce of a gradient
    shard across the shard groups, ``"tp"`` for tensor parallelism's collectives;
    absent, a collective runs over the unit's own process group (the shard group, or
    every rank under ``NO_SHARD``). Tensor parallelism's collectives have kinds of their
    own (``tp_all_gather`` | ``tp_reduce_scatter`` | ``tp_all_reduce`` |
    ``tp_all_to_all``), ``unit`` the FSDP unit whose module issued them, ``module`` that
    module (or, for a replicated parameter's partial gradient, that parameter) and
    ``nbytes`` the size of the whole tensor, and ``dtype`` the data's dtype
    (``"float8_e4m3fn"`` / ``"float8_e5m2"`` where torchao's float8 styles cast an
    activation or its gradient before moving it). Context parallelism's ring attention has
    ``cp_all_gather`` (every rank's keys and values, in forward and again in backward) and
    ``cp_all_to_all`` (the gradients of keys and values passed on to the next rank, in
    backward) over the ``cp`` group, ``module`` the module that called the attention and
    ``nbytes`` what one rank sends and receives in all: the gathered buffer, the buffer passed on.
    Recordings of real runs (:func:`fsdpviz.record`, :func:`fsdpviz.load_profile`)
    may add ``t`` (seconds since the recording started, when the event was
    issued) and ``duration`` (seconds the call took on the host, or the device
    time a profiler measured); predictions never set them, and schedules are
    compared without them (:meth:`Event.untimed`). A recording has one event
    list per iteration it saw, not two.
``config``
    How the report was made: the FSDP options of a prediction, the rank and
    backend of a recording (:class:`~fsdpviz.schema.config.ReportConfig`).
``warnings``
    What FSDP would warn or fsdpviz noticed, as ``{"code", "message", "units"}``, and
    where fsdpviz advises a change it can state, ``fix`` (the :func:`fsdpviz.analyze`
    options that make it, as JSON: ``{"activation_checkpointing": ["LlamaDecoderLayer"]}``;
    ``use_cache`` is the model call's own keyword) and ``frees`` (the bytes per rank it
    takes off the peak, where measured).
``modules``
    The module tree: ``fqn``, ``module_class``, ``parent``, ``unit`` (the unit
    that manages its direct parameters), ``numel``/``bytes`` (direct
    parameters), ``calls`` and the ``input_shapes``/``output_shapes`` seen.
``ignored_params`` (omitted when empty)
    The parameters FSDP does not manage (FSDP2's ``ignored_params``, FSDP1's
    ``ignored_modules`` / ``ignored_states``, a parameter outside every unit): ``fqn``,
    ``shape``, ``dtype``, ``bytes`` and ``requires_grad``. Each rank holds all of each, its
    gradient unreduced and its optimizer states (``report.memory`` counts them).
``module_order`` / ``module_backward_order``
    Module FQNs in the order their forward first ran / their backward was first
    reached (the gradient of one of their outputs computed).
``param_first_use``
    Parameter FQN (first FQN of a shared parameter) -> the module whose forward
    used it first.
``module_events`` (recordings only, omitted when empty)
    One list per iteration, parallel to ``iterations``: ``{"kind", "module", "t"}``
    with ``kind`` one of ``forward_enter`` | ``forward_exit`` | ``backward_enter``
    | ``backward_exit``, ``module`` the module FQN (FSDP wrappers named like the
    module they wrap) and ``t`` on the same clock as the events' ``t``.
``profile`` (predictions traced with autograd, omitted when absent)
    What the trace measured for the memory and time model: per iteration, the
    FSDP hook calls, the event each hook issued, and the FLOPs, activation and
    temporary bytes and unsharded gradients between hooks; see
    :mod:`fsdpviz.schema.profile`. ``report.memory`` and ``report.timeline``
    (:mod:`fsdpviz.cost`) are computed from the report, not stored.
``pipeline`` (under pipeline parallelism, omitted otherwise)
    The schedule, the stages, each pipeline rank's actions and (predictions) each pipeline
    rank's own report; see :mod:`fsdpviz.schema.pipeline`. Events then carry the ``stage``,
    ``microbatch`` and ``action`` that issued them; ``pp_send`` / ``pp_recv`` events (group
    ``"pp"``) are the sends and receives of activations and gradients between stages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, TypeVar, Unpack

from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.events import Event, ModuleEvent
from fsdpviz.schema.extensions import report_method
from fsdpviz.schema.keywords import DashboardKwargs, SaveKwargs
from fsdpviz.schema.memory import MemoryReport, size_text, trainable_text
from fsdpviz.schema.names import UnitNames, param_names, unwrapped_fqn
from fsdpviz.schema.names import unit_label as unit_label
from fsdpviz.schema.pipeline import Pipeline
from fsdpviz.schema.profile import TraceProfile
from fsdpviz.schema.serial import OMIT_EMPTY, OMIT_NONE, Record, each, key, record_dict, record_from
from fsdpviz.schema.timeline import Timeline

SCHEMA_VERSION = 1


DTYPE_SIZES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
    "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "int64": 8, "int32": 4,
    "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
"""Bytes per element of the dtypes reports name (``Unit.dtype``)."""


def dtype_name(dtype: Any) -> str | None:
    """``torch.bfloat16`` -> ``"bfloat16"`` (None stays None), as reports store dtypes."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Unit(Record):
    """One FSDP wrap unit and the FlatParameter it manages."""

    module: str
    module_class: str
    params: list[str]
    shared_params: dict[str, str] = field(default_factory=dict)
    numel: int = 0
    flat_numel: int = 0
    padded_numel: int = 0
    sharded_numel: int = 0
    dtype: str | None = None
    compute_dtype: str | None = None
    reduce_dtype: str | None = None
    requires_grad: bool | None = None
    sharding_strategy: str = "FULL_SHARD"
    itemsize: int = 0
    # tensor parallelism (FSDP2 on a mesh with a tp dimension), or parameters FSDP2 shards on
    # a dim other than 0 (shard_placement_fn): each parameter's shard on one rank (its tp
    # shard, then FSDP's padded shard) and the tp placement of the parameters that are
    # DTensors over the tp dimension ("Shard(0)", "Replicate()")
    shard_shapes: dict[str, list[int]] = field(default_factory=dict, metadata=OMIT_EMPTY)
    tp_placements: dict[str, str] = field(default_factory=dict, metadata=OMIT_EMPTY)
    # FSDP2's shard_placement_fn: the dim of each parameter it shards on a dim other than 0
    shard_dims: dict[str, int] = field(default_factory=dict, metadata=OMIT_EMPTY)
    # a unit that mixes frozen and trainable parameters (requires_grad None; LoRA adapters
    # beside frozen base weights): the frozen ones, the elements of the trainable ones, and
    # of those the most one rank's shard holds (FSDP2: their padded dim-0 shards; FSDP1
    # with use_orig_params: the trainable elements in the rank's slice of the FlatParameter)
    frozen_params: list[str] = field(default_factory=list, metadata=OMIT_EMPTY)
    # FSDP2: parameters that require grad but that no gradient reached in the traced step
    # (unused in the forward): ``FSDPParamGroup.post_backward`` reduce-scatters only the
    # parameters whose ``.grad`` exists and the optimizer skips a parameter without one,
    # so they count as frozen ones do (``trainable_numel`` leaves them out)
    unused_params: list[str] = field(default_factory=list, metadata=OMIT_EMPTY)
    trainable_numel: int | None = field(default=None, metadata=OMIT_NONE)
    trainable_sharded_numel: int | None = field(default=None, metadata=OMIT_NONE)
    # an FSDP2 group of parameters in several dtypes (frozen bf16 weights beside fp32
    # adapters; FSDP2 asks only the trainable ones to share a dtype, ``dtype`` then): the
    # parameters of each dtype, and their elements in all and in one rank's padded shard
    param_dtypes: dict[str, list[str]] = field(default_factory=dict, metadata=OMIT_EMPTY)
    dtype_numels: dict[str, list[int]] = field(default_factory=dict, metadata=OMIT_EMPTY)

    @property
    def bytes(self) -> int:
        if self.dtype_numels:
            return sum(n * DTYPE_SIZES[d] for d, (n, _) in self.dtype_numels.items())
        return self.numel * self.itemsize

    @property
    def sharded_bytes(self) -> int:
        if self.dtype_numels:
            return sum(n * DTYPE_SIZES[d] for d, (_, n) in self.dtype_numels.items())
        return self.sharded_numel * self.itemsize

    @property
    def shard_ranks(self) -> int:
        """The ranks its parameters are sharded over (its all-gather's and reduce-scatter's
        group, ``padded_numel / sharded_numel``); 0 where it holds no shard."""
        return self.padded_numel // self.sharded_numel if self.sharded_numel else 0

    @cached_property
    def _own_dtypes(self) -> dict[str, str]:
        return {f: d for d, fs in self.param_dtypes.items() for f in fs}

    def param_dtype(self, fqn: str) -> str | None:
        """Parameter ``fqn``'s own dtype: its entry in ``param_dtypes`` where the group has
        several, else the unit's ``dtype``. ``fqn`` as ``params`` lists it or with the
        wrapper segments that list leaves out (``schema/names``)."""
        own = self._own_dtypes
        return own.get(fqn) or own.get(unwrapped_fqn(fqn)) or self.dtype

    @property
    def gradless_params(self) -> set[str]:
        """The parameters no gradient is reduced or stepped for: frozen and unused ones."""
        return {*self.frozen_params, *self.unused_params}

    @property
    def trainable(self) -> tuple[int, int]:
        """Elements of the parameters that require grad: in all, and in one rank's shard
        (the rank that holds the most). What optimizer state and sharded gradients are of."""
        if self.trainable_numel is not None:
            return self.trainable_numel, self.trainable_sharded_numel or 0
        if self.requires_grad is False:
            return 0, 0
        return self.numel, self.sharded_numel

    def to_dict(self) -> dict[str, Any]:
        """Its fields, and ``bytes`` and ``sharded_bytes`` (which ``from_dict`` skips)."""
        return {**record_dict(self), "bytes": self.bytes, "sharded_bytes": self.sharded_bytes}


@dataclass(frozen=True)
class ModuleInfo(Record):
    """One module of the traced model."""

    fqn: str
    module_class: str
    parent: str | None
    unit: str | None
    numel: int
    bytes: int
    params: dict[str, list[int]] = field(default_factory=dict)
    calls: int = 0
    input_shapes: list[list[int]] = field(default_factory=list)
    output_shapes: list[list[int]] = field(default_factory=list)


_T = TypeVar("_T")


def param_modules(modules: Iterable[ModuleInfo]) -> dict[str, str]:
    """The module holding each parameter of ``modules``, by the parameter's FQN, each
    followed by the name a unit lists it under where that differs (FSDP2's, without
    wrapper segments: ``schema/names``)."""
    return _also_as_listed({_param_fqn(m, n): m.fqn for m in modules for n in m.params})


def param_shapes(modules: Iterable[ModuleInfo]) -> dict[str, list[int]]:
    """Each parameter's shape, by the names :func:`param_modules` gives it, in its order."""
    return _also_as_listed({_param_fqn(m, n): s for m in modules for n, s in m.params.items()})


def _param_fqn(module: ModuleInfo, name: str) -> str:
    return f"{module.fqn}.{name}" if module.fqn else name


def _also_as_listed(by_fqn: dict[str, _T]) -> dict[str, _T]:
    """``by_fqn``, each entry followed by the same value under the name a unit lists the
    parameter under (:func:`~fsdpviz.schema.names.param_names`) where that differs."""
    shown = param_names(by_fqn)
    out: dict[str, _T] = {}
    for fqn, value in by_fqn.items():
        out.setdefault(fqn, value)
        out.setdefault(shown[fqn], value)
    return out


IGNORED = "<ignored>"
"""The owner a trace's gradient counts (``TraceProfile``'s ``grads``) give the gradients of
the parameters FSDP does not manage (:class:`IgnoredParam`): no unit's name."""


@dataclass(frozen=True)
class IgnoredParam(Record):
    """A parameter FSDP does not manage: whole on every rank, in its own dtype (no mixed
    precision), its gradient as autograd leaves it (neither reduced nor freed by FSDP)."""

    fqn: str
    shape: list[int]
    dtype: str
    bytes: int
    requires_grad: bool = True


@dataclass(frozen=True)
class FsdpWarning(Record):
    """A warning FSDP would raise for this configuration, or one fsdpviz adds."""

    code: str
    message: str
    units: list[str] = field(default_factory=list)
    # the analyze options that act on it ({option: JSON value}; see option_text) and the
    # bytes per rank that takes off the peak, where measured
    fix: dict[str, object] = field(default_factory=dict, metadata=OMIT_EMPTY)
    frees: int | None = field(default=None, metadata=OMIT_EMPTY)

    @classmethod
    def naming(cls, code: str, message: str, units: list[str]) -> list[FsdpWarning]:
        """The warning ``code`` about ``units``, its ``message`` ending in their names (none
        where there are no units).

        Example::

            FsdpWarning.naming("frozen_mixed", "These groups mix ...: ", ["layers.0"])
            # [FsdpWarning('frozen_mixed', "These groups mix ...: 'layers.0'", ['layers.0'])]
        """
        return [cls(code, message + ", ".join(repr(u) for u in units), units)] if units else []


def option_text(fix: Mapping[str, object], api: str = "FSDP1") -> str:
    """A warning's ``fix`` as :func:`fsdpviz.analyze` takes it (``use_cache``: as the model
    takes it): ``activation_checkpointing=[LlamaDecoderLayer]``, ``world_size=128``.
    Command lines show their own flags for the same ``fix``."""
    parts = []
    for option, value in fix.items():
        if option in ("mixed_precision", "mp_policy"):
            cls = "MixedPrecisionPolicy" if api == "FSDP2" else "MixedPrecision"
            option = "mp_policy" if api == "FSDP2" else "mixed_precision"
            text = f"{cls}(param_dtype=torch.{value})"
        elif option == "cpu_offload" and value:
            option, text = (
                ("offload_policy", "CPUOffloadPolicy()")
                if api == "FSDP2"
                else ("cpu_offload", "CPUOffload(offload_params=True)")
            )
        elif option == "sharding_strategy":
            text = f"ShardingStrategy.{value}"
        elif isinstance(value, list):
            text = "[" + ", ".join(str(v) for v in value) + "]"
        else:
            text = repr(value)
        parts.append(f"{option}={text}")
    return ", ".join(parts)


_LIST = key(read=list)


@dataclass
class Report:
    """What FSDP does with a model: units, forward order and the event schedule.

    Example::

        report = fsdpviz.analyze(model, ids, auto_wrap_policy=policy, world_size=8)
        [u.module for u in report.units]
        report.to_dict()["iterations"][1][:3]
    """

    source: Literal["prediction", "recording"]
    config: ReportConfig = field(
        metadata=key(write=ReportConfig.to_dict, read=ReportConfig.from_dict)
    )
    units: list[Unit] = field(metadata=key(read=each(Unit.from_dict)))
    forward_order: list[str] = field(metadata=_LIST)
    iterations: list[list[Event]] = field(metadata=key(read=each(each(Event.from_dict))))
    warnings: list[FsdpWarning] = field(
        default_factory=list, metadata=key(read=each(FsdpWarning.from_dict))
    )
    modules: list[ModuleInfo] = field(
        default_factory=list, metadata=key(read=each(ModuleInfo.from_dict))
    )
    module_order: list[str] = field(default_factory=list, metadata=_LIST)
    module_backward_order: list[str] = field(default_factory=list, metadata=_LIST)
    param_first_use: dict[str, str] = field(default_factory=dict, metadata=key(read=dict))
    ignored_params: list[IgnoredParam] = field(
        default_factory=list, metadata=key(omit="empty", read=each(IgnoredParam.from_dict))
    )
    module_events: list[list[ModuleEvent]] = field(
        default_factory=list, metadata=key(omit="empty", read=each(each(ModuleEvent.from_dict)))
    )
    profile: TraceProfile | None = field(
        default=None,
        metadata=key(omit="none", read=lambda p: TraceProfile.from_dict(p) if p else None),
    )
    # read by from_dict, with its ranks' reports
    pipeline: Pipeline[Report] | None = field(
        default=None, metadata=key(omit="none", write=lambda p: p.to_dict())
    )

    def __post_init__(self) -> None:
        if not isinstance(self.config, ReportConfig):  # a plain dict, as configs once were
            self.config = ReportConfig.from_dict(self.config)
        if not isinstance(self.forward_order, UnitNames):  # printed with (root) for the root
            self.forward_order = UnitNames(self.forward_order)

    @cached_property
    def memory(self) -> MemoryReport:
        """Per-rank memory at every event of the steady state, and its peak (computed once).

        Defaults of :func:`fsdpviz.cost.memory_model`: AdamW optimizer state, last
        iteration. Call that function for other options.
        """
        model: Callable[[Report], MemoryReport] = report_method("memory")
        return model(self)

    @cached_property
    def timeline(self) -> Timeline:
        """Estimated start and end of every event of the steady state on an H100 node.

        Defaults of :func:`fsdpviz.cost.timeline` (``machine="h100"``); call it
        with another :class:`fsdpviz.cost.Machine` or preset name for other hardware.
        """
        model: Callable[[Report], Timeline] = report_method("timeline")
        return model(self)

    @property
    def profiled(self) -> bool:
        """Whether the memory and time model have what the trace measured to go on: the
        report's ``profile``, or a pipeline's report every pipeline rank's."""
        pipe = self.pipeline
        if pipe is not None and pipe.ranks:
            return all(r.profile is not None for r in pipe.ranks)
        return self.profile is not None

    def unit(self, module: str) -> Unit:
        """The unit wrapping ``module`` (its FQN, ``""`` for the root; a module inside a
        checkpoint wrapper also by its FQN with the wrapper's segment, as a unit is named
        without it)."""
        for name in dict.fromkeys((module, unwrapped_fqn(module))):
            for u in self.units:
                if u.module == name:
                    return u
        names = ", ".join(unit_label(u.module) for u in self.units[:8])
        raise KeyError(f"no wrap unit for module {unit_label(module)}; units are {names}...")

    def iteration_indices(self, iteration: int | None = -1) -> list[int]:
        """Indices into ``iterations`` of ``iteration`` (negative counts from the end;
        ``None``: every iteration, in order). IndexError when it is out of range."""
        n = len(self.iterations)
        if iteration is None:
            return list(range(n))
        if not -n <= iteration < n:
            raise IndexError(f"iteration {iteration} is out of range: the report has {n}")
        return [iteration % n]

    def to_dict(self) -> dict[str, Any]:
        """Its ``schema_version`` and its fields (see :mod:`fsdpviz.schema.serial`)."""
        return {"schema_version": SCHEMA_VERSION, **record_dict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """Read :meth:`to_dict`'s output; other keys (a Chrome trace's ``traceEvents``,
        ``displayTimeUnit``, ``otherData``, as :func:`fsdpviz.export.save` writes) are ignored.
        """
        if "ranks" in d and "units" not in d:
            raise ValueError(
                f"this holds a recorded run of {len(d['ranks'])} ranks, not one report; "
                "read it with fsdpviz.load(path) (a RecordedRun)"
            )
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"report schema_version {version!r} is not supported by this fsdpviz "
                f"(expects {SCHEMA_VERSION}); re-create the report with this version"
            )
        pipe = d.get("pipeline")
        ranks = [Report.from_dict(r) for r in pipe.get("ranks", [])] if pipe else []
        report = record_from(cls, d, pipeline=Pipeline.from_dict(pipe, ranks) if pipe else None)
        for rank in report.pipeline.ranks if report.pipeline is not None else []:
            if rank.pipeline is not None:
                rank.pipeline.job = report
        return report

    def to_json(self, path: str | Path | None = None, *, indent: int | None = 1) -> str:
        """The report as JSON; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Report:
        """Read a report written by :meth:`to_json`."""
        p = Path(text_or_path)
        text = p.read_text() if p.suffix == ".json" and p.exists() else str(text_or_path)
        return cls.from_dict(json.loads(text))

    def module_graph(self) -> Any:
        """The module tree as a ``networkx.DiGraph`` (see :mod:`fsdpviz.graphs`)."""
        return report_method("module_graph")(self)

    def unit_graph(self, iteration: int = -1) -> Any:
        """Units with forward-order and prefetch edges of one iteration (default: steady state).

        A ``networkx.MultiDiGraph`` (a ``DiGraph`` subclass); see :mod:`fsdpviz.graphs`.
        """
        return report_method("unit_graph")(self, iteration)

    def show(self, **kwargs: Unpack[DashboardKwargs]) -> Any:
        """The interactive views in a notebook: wrap-unit explorer, prefetch graph, timeline.

        Returns a :class:`fsdpviz.widgets.Dashboard` (displayed as the last line of a
        cell). ``model=`` and ``inputs=`` enable re-planning from the explorer's
        controls; ``memory=`` takes bytes per event, or a callable ``report -> series``.

        Example::

            view = report.show(model=model, inputs=ids)
            view.timeline.step = 40
        """
        return report_method("show")(self, **kwargs)

    def save(self, path: str | Path, **kwargs: Unpack[SaveKwargs]) -> Path:
        """Write the report in the format its suffix names; see :func:`fsdpviz.export.save`.

        ``.html`` (interactive, self-contained), ``.png`` / ``.svg`` / ``.pdf`` (one figure),
        ``.json`` (a Chrome trace that :func:`fsdpviz.load` also reads back), ``.graphml``.
        """
        save: Callable[..., Path] = report_method("save")
        return save(self, path, **kwargs)

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: object
    ) -> dict[str, object]:
        """The compact summary a notebook shows for a report in a cell's last line."""
        card: Callable[[Report], dict[str, object]] = report_method("card")
        return card(self)

    def summary(self) -> str:
        """A few lines: units, bytes per rank, event counts, warnings."""
        cfg = self.config
        ws = f"world size {cfg.world_size}"
        if cfg.mesh:
            ws += " (" + " x ".join(f"{name} {size}" for name, size in cfg.mesh.items()) + ")"
        per_rank = sum(u.sharded_bytes for u in self.units)
        where = " in host memory (CPU offload)" if cfg.cpu_offload else ""
        pipe = self.pipeline
        if pipe is not None and pipe.ranks:  # each pipeline rank holds its stages' units
            per_rank = max(sum(u.sharded_bytes for u in r.units) for r in pipe.ranks)
            where += " (the most of any pipeline rank)"
        units = f"{len(self.units)} unit{'' if len(self.units) == 1 else 's'}"
        whose = f"; {cfg.whose_fsdp}" if cfg.torch_version else ""
        lines = [
            f"fsdpviz {self.source}: {units}, {ws}, "
            f"{size_text(per_rank)} of parameters per rank{where}{whose}",
        ]
        trainable = self.trainable_text()
        if trainable:
            lines.append(f"  {trainable}: optimizer state and gradients of those")
        whole = sum(q.bytes for q in self.ignored_params)  # not FSDP's: on every rank
        if whole:
            names = ", ".join(f"{q.fqn} ({size_text(q.bytes)})" for q in self.ignored_params[:4])
            more = len(self.ignored_params) - 4
            lines.append(
                f"  and {size_text(whole)} of parameters not managed by FSDP, whole on every rank: "
                f"{names}{f' and {more} more' if more > 0 else ''}"
            )
        if pipe is not None:
            rank = f"; this is pipeline rank {pipe.rank}'s" if pipe.rank is not None else ""
            lines.append(
                f"  pipeline {pipe.schedule}: {len(pipe.stages)} stages on {pipe.pp_size} "
                f"pipeline ranks, {pipe.microbatches} microbatches{rank}"
            )
        if cfg.tp_world_size:
            plan = cfg.parallelize_plan or {}
            tp_sharded = sum(
                1 for u in self.units for p in u.tp_placements.values() if p.startswith("Shard")
            )
            lines.append(
                f"  tensor parallel over {cfg.tp_world_size} ranks: {len(plan)} modules "
                f"parallelised, {tp_sharded} parameters tp-sharded"
            )
        if cfg.cp_world_size:
            rings = sum(
                1 for e in (self.iterations[-1] if self.iterations else []) if
                e.kind == "cp_all_gather" and e.phase == "forward"
            )  # fmt: skip
            lines.append(
                f"  context parallel over {cfg.cp_world_size} ranks: each holds 1/"
                f"{cfg.cp_world_size} of every sequence; {rings} ring attentions in forward, "
                f"parameters sharded over dp_shard x cp ({cfg.shard_world_size} ranks)"
            )
        accum = cfg.grad_accum if self.source == "prediction" else 1
        for i, it in enumerate(self.iterations):
            counts: dict[str, int] = {}
            for e in it:
                key = e.kind + (" (prefetch)" if e.prefetch else "")
                counts[key] = counts.get(key, 0) + 1
            name = "first iteration" if i == 0 else "steady state"
            if accum > 1:  # two optimizer steps of accum micro-steps (a pipeline's each sync)
                last = i % accum == accum - 1 or cfg.pipeline_schedule is not None
                sync = "synced" if last else "no gradient sync"
                step = "first step" if i < accum else "steady step"
                name = f"{step}, micro-step {i % accum + 1}/{accum} ({sync})"
            lines.append(f"  {name}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        lines.extend(f"  warning [{w.code}]: {w.message.splitlines()[0]}" for w in self.warnings)
        return "\n".join(lines)

    def trainable_text(self) -> str:
        """``"57,344 trainable of 2,943,232 parameters (1.95%)"`` where some of the units'
        parameters are frozen (a fine-tune with adapters); ``""`` where all train."""
        total = sum(u.numel for u in self.units)
        return trainable_text(sum(u.trainable[0] for u in self.units), total)

    def __repr__(self) -> str:
        return self.summary()
