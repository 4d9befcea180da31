"""``Report.config``: how a report was made, as a typed, frozen record.

A prediction states the FSDP options :func:`fsdpviz.analyze` was given (as FSDP
names them: ``"FULL_SHARD"``, ``"BACKWARD_PRE"``, a policy's short description);
a recording states what the run knew about itself (rank, backend, start time).
Each field has one default, the value a reader gets when the report does not
state it. :meth:`ReportConfig.to_dict` writes the keys the report states, in the
order they were stated, with the same JSON as before the config was typed; keys
fsdpviz does not know (a recorder's ``config=`` extras) are kept in ``extra``.

For code written against the former plain dict, a config is also a read-only
``Mapping`` of its JSON form: ``report.config["world_size"]``,
``report.config.get("rank")`` and ``{**report.config}`` still work (a key the
report does not state is missing there, while the attribute gives its default).

Example::

    cfg = fsdpviz.analyze(model, ids, world_size=64).config
    cfg.world_size, cfg.sharding_strategy, cfg.backward_prefetch   # 64, 'FULL_SHARD', None
    cfg.to_dict()["auto_wrap_policy"]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, get_args

from fsdpviz.schema.mesh import ParallelDims

Api = Literal["FSDP1", "FSDP2"]
TraceMode = Literal["meta", "real", "fx"]

TRACE_MODES: tuple[str, ...] = get_args(TraceMode)
"""How a prediction traces its model (``analyze(trace=...)``), default first."""
# JSON keys that two fields share: FSDP1 and FSDP2 give prefetch settings of different
# shapes under one name, and a prediction's trace mode and a recording's profiler file
# are both "trace". The field that holds a value is the one written under the key.
_SHARED_KEYS = {
    "forward_prefetch": ("explicit_forward_prefetch", "forward_prefetch"),
    "backward_prefetch": ("explicit_backward_prefetch", "backward_prefetch"),
    "trace": ("profiler_trace", "trace"),
}


def costed_within_node(tp: int, gpus_per_node: int) -> bool:
    """Whether DTensor's cost model (``redistribute_cost``) weighs a tp group of ``tp``
    ranks as within one host on nodes of ``gpus_per_node`` GPUs, each visible to every rank
    on it: ``MeshTopoInfo.build_from_mesh`` takes a one-dimensional mesh as intra-host while
    its devices number at most ``num_devices_per_host`` (``torch.cuda.device_count()``).
    What :attr:`ReportConfig.tp_strategy_gpus_per_node` is compared by."""
    return tp <= gpus_per_node


@dataclass(frozen=True, eq=False)
class ReportConfig(Mapping[str, Any]):
    """How a report was made; see the module docstring.

    ``stated``: the JSON keys the report states, in order (what :meth:`to_dict`
    writes); build one with :meth:`from_dict` or with the fields and ``stated``.
    """

    api: Api = "FSDP1"
    # whose FSDP: the torch release a prediction follows, or a recording ran ("2.8.0"); None:
    # not stated (a report saved before fsdpviz stated it)
    torch_version: str | None = None
    world_size: int | None = None  # None: not known (a recording without torch.distributed)
    # FSDP1: FullyShardedDataParallel's options
    shard_world_size: int | None = None  # ranks a FlatParameter is sharded over; None: world_size
    process_group_size: int | None = None  # hybrid sharding: ranks of FSDP's group (a shard group)
    sharding_strategy_given: str | None = None  # asked for, where one rank made it NO_SHARD
    sharding_strategy: str = "FULL_SHARD"
    auto_wrap_policy: str | None = None  # a short description of the policy
    backward_prefetch: str | None = None  # None: no backward prefetch, or not stated
    forward_prefetch: bool = False
    use_orig_params: bool = False
    # param, reduce and buffer dtype, and MixedPrecision's other fields where not the default
    mixed_precision: Mapping[str, str | bool | list[str] | None] | None = None
    # parameters, gradients and optimizer state in host memory (FSDP1 CPUOffload(offload_params
    # =True), FSDP2 CPUOffloadPolicy): copied to the device before each all-gather
    cpu_offload: bool = False
    # FSDP2: fully_shard's options
    fully_shard: tuple[str, ...] = ()  # the groups, as FSDP2 names them
    reshard_after_forward: Mapping[str, bool | int] = field(default_factory=dict)  # per group
    mp_policy: Mapping[str, str | bool | None] | None = None
    # a 2-D mesh (HSDP): {replicate dim name: size, shard dim name: size}; None: 1-D; with
    # tensor parallelism its tp dimension last ({"dp_shard": 32, "tp": 8})
    mesh: Mapping[str, int] | None = None
    # tensor parallelism: the ranks of the tp dimension, and parallelize_module's plan as it
    # resolved ({module: its parallel style, as torch's repr shortens it})
    tp_world_size: int | None = None
    parallelize_plan: Mapping[str, str] | None = None
    # the GPUs per node DTensor's mm strategies were picked for, where a multiply's strategy
    # depends on it (torch costs the tp group within a node while tp <= it: a batch of one's
    # sequence-sharded input, fsdpviz/schedule/tp_mm_strategy.py); None: none depends on it
    tp_strategy_gpus_per_node: int | None = None
    # context parallelism: the ranks of the cp dimension (FSDP shards over dp_shard x cp;
    # each rank holds 1/cp of every sequence, ring attention exchanges keys and values)
    cp_world_size: int | None = None
    # set_modules_to_{forward|backward}_prefetch: {group module: [modules it prefetches]}
    explicit_forward_prefetch: Mapping[str, tuple[str, ...]] | None = None
    explicit_backward_prefetch: Mapping[str, tuple[str, ...]] | None = None
    # the job around FSDP, as the time model needs it: micro-steps per optimizer step (the
    # first grad_accum - 1 without gradient sync: FSDP1 no_sync(), FSDP2
    # set_requires_gradient_sync(False)); torch.compile (True, or the compiled module
    # classes); float8 linears ({"recipe_name", "enable_fsdp_float8_all_gather",
    # "filter_fqns"}, torchtitan's keys); torch's float32 matmul precision ("highest",
    # "high", "medium")
    grad_accum: int = 1
    # FSDP2, the micro-steps before the last: set_reshard_after_backward(False) (the
    # parameters stay gathered into the next one), set_requires_all_reduce(False) (each
    # reduce-scatters, HSDP's all-reduce runs in the last only)
    reshard_after_backward: bool = True
    requires_all_reduce: bool = True
    # FSDP2: the groups set_unshard_in_backward(False) was called on (each False), whose
    # pre-backward does not all-gather their parameters (their backward must not read them)
    unshard_in_backward: Mapping[str, bool] = field(default_factory=dict)
    compile: bool | tuple[str, ...] = False
    # activation checkpointing (analyze(..., activation_checkpointing=...), or the model's own
    # checkpoint wrappers): {"mode": "full" | "selective", "classes": [...], "modules": N}
    activation_checkpointing: Mapping[str, Any] | None = None
    float8: Mapping[str, Any] | None = None
    float32_matmul_precision: str | None = None
    # how a prediction was made
    trace: TraceMode | None = None
    replayed: bool = False  # predicted from another report's trace (fsdpviz.replan.replay)
    # pipeline parallelism (torch.distributed.pipelining): the ranks of the pp mesh dimension,
    # the schedule as get_schedule_class names it ("1F1B", "Interleaved1F1B", ...), the
    # microbatches of a step, and, in the report of one pipeline rank, that rank
    pp_world_size: int | None = None
    pipeline_schedule: str | None = None
    microbatches: int | None = None
    pp_rank: int | None = None
    # the machine the plan is modelled on (analyze(..., machine=...)): a GPU preset's name or a
    # Machine's constants (fsdpviz.cost.fit); None: the H100 preset
    machine: str | Mapping[str, Any] | None = None
    # recordings
    rank: int | None = None
    backend: str | None = None
    started_unix: float | None = None  # wall-clock time the recording started
    complete_iterations: int | None = None  # iterations that reached the final callback
    kinds: tuple[str, ...] | None = None  # the event kinds recorded; None: all
    iteration_offset: int = 0  # the first recorded iteration's number in the run
    unit_names: str | None = None  # where a profiler trace's unit names came from
    profiler_trace: str | None = None  # the torch.profiler trace file it was read from
    # bookkeeping
    stated: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ranks(self) -> int:
        """The ranks the schedule runs on: ``world_size``, or 1 when the report does not say."""
        return self.parallel_dims.world_size

    @property
    def whose_fsdp(self) -> str:
        """Whose FSDP the report is of: ``"FSDP2 of torch 2.8.0"``; the API alone where the
        report does not say (saved before fsdpviz stated it)."""
        api = self.api if "api" in self.stated or self.torch_version else "FSDP"
        return f"{api} of torch {self.torch_version}" if self.torch_version else api

    @cached_property
    def parallel_dims(self) -> ParallelDims:
        """The job's ranks by mesh dimension, from the counts the report states: FSDP's shard
        group (``shard_world_size``, FSDP2's ``dp_shard x cp``; all ranks where not stated),
        the replicas (FSDP1: its hybrid strategy's shard groups; FSDP2: the ranks the
        other dimensions leave), the tp, pp and cp dimensions, and whether it is HSDP."""
        ranks, cp = self.world_size or 1, self.cp_world_size or 1
        tp, pp = self.tp_world_size or 1, self.pp_world_size or 1
        shard = self.shard_world_size or ranks
        replicas = None  # the ranks the other dimensions leave
        if self.api == "FSDP1" and self.sharding_strategy is not None:
            group = self.process_group_size or shard
            replicas = ParallelDims.fsdp1(ranks, group, self.sharding_strategy).dp_replicate
        # FSDP2's 2-D data-parallel mesh: pp outermost, tp innermost, beside them dp_shard and
        # cp (a cp dimension of one rank stays in the mesh), and a replicate dimension
        names = [str(n) for n in (self.mesh or {})]
        if self.pp_world_size and names and names[0] == "pp":
            names = names[1:]
        if self.tp_world_size:
            names = names[:-1]
        hsdp = len([n for n in names if n != "cp"]) == 2 if self.api == "FSDP2" else None
        return ParallelDims.stated(ranks, shard, dp_replicate=replicas, cp=cp, tp=tp, pp=pp,
                                   hsdp=hsdp)  # fmt: skip

    @property
    def prefetches_backward(self) -> bool:
        """Whether the plan prefetches in backward: FSDP1 with a ``backward_prefetch``, or
        FSDP2 (it always prefetches the group before). False when a recording does not say."""
        return self.backward_prefetch is not None or self.explicit_backward_prefetch is not None

    def states(self, *keys: str) -> bool:
        """Whether the report states all these JSON keys (a recording may not know its world
        size; a prediction states its options)."""
        return all(k in self.stated for k in keys)

    def resharding(self, unit: str) -> bool | int | None:
        """FSDP2's ``reshard_after_forward`` for ``unit`` as the plan applied it: ``True``,
        ``False`` or a number of ranks; ``None`` where the report does not state it (a
        recording)."""
        return self.reshard_after_forward.get(unit)

    def reshard_ranks(self, unit: str) -> int | None:
        """FSDP2 ``reshard_after_forward=N`` of ``unit``: the ranks its parameters are
        resharded over after forward, when that is neither all its shard ranks nor none
        (torch takes ``N`` equal to the shard dimension's size as ``True``)."""
        value = self.resharding(unit)
        if (
            isinstance(value, bool)
            or value is None
            or not 1 < value < self.parallel_dims.dp_shard_cp
        ):
            return None
        return value

    @property
    def post_forward_ranks(self) -> dict[str, int]:
        """The FSDP2 units resharded after forward over fewer ranks than their shard ranks,
        and those ranks (:meth:`reshard_ranks`)."""
        return {u: n for u in self.reshard_after_forward if (n := self.reshard_ranks(u))}

    @property
    def kept_after_forward(self) -> list[str]:
        """The FSDP2 units, the root aside, told to keep their parameters unsharded from
        forward to backward (``False``)."""
        return [u for u, v in self.reshard_after_forward.items() if v is False and u != ""]

    def replace(self, **changes: Any) -> ReportConfig:
        """A copy with ``changes`` (field names); a field not stated before is stated now."""
        stated = changes.pop("stated", self.stated)
        keys = tuple(dict.fromkeys([*stated, *(_key(k) for k in changes)]))
        return dataclasses.replace(self, stated=keys, **changes)

    def unstate(self, *keys: str) -> ReportConfig:
        """A copy that no longer states the JSON ``keys``; their fields read their defaults."""
        names = [n for k in keys for n in _SHARED_KEYS.get(k, (k,))]
        defaults = {n: _default(n) for n in names if n in _FIELDS}
        stated = tuple(k for k in self.stated if k not in keys)
        extra = {k: v for k, v in self.extra.items() if k not in keys}
        return dataclasses.replace(self, **defaults, stated=stated, extra=extra)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The stated keys and their JSON values (what ``Report.to_dict`` writes)."""
        return {key: self[key] for key in self.stated}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReportConfig:
        """Read :meth:`to_dict`'s output (or any former ``Report.config`` dict)."""
        if isinstance(d, ReportConfig):
            return d
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        stated: list[str] = []
        for key, value in d.items():
            name = _field_for(key, value)
            if name is None:
                extra[key] = value
            elif value is None and not _optional(name):
                continue  # e.g. a recording that could not tell its world size: the default
            else:
                values[name] = _from_json(name, value)
            stated.append(key)
        return cls(**values, stated=tuple(stated), extra=extra)

    # --------------------------------------------------------------- Mapping
    def __getitem__(self, key: str) -> Any:
        if key not in self.stated:
            raise KeyError(key)
        if key in self.extra:
            return self.extra[key]
        names = _SHARED_KEYS.get(key, (key,))
        name = next((n for n in names if getattr(self, n) is not None), names[-1])
        return _to_json(getattr(self, name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.stated)

    def __len__(self) -> int:
        return len(self.stated)

    def __repr__(self) -> str:
        return f"ReportConfig({', '.join(f'{k}={self[k]!r}' for k in self.stated)})"


FSDP1_KEYS = (
    "api",
    "torch_version",
    "world_size",
    "shard_world_size",
    "sharding_strategy",
    "auto_wrap_policy",
    "backward_prefetch",
    "forward_prefetch",
    "use_orig_params",
    "mixed_precision",
    "trace",
)
"""What an FSDP1 prediction states, in order."""
FSDP2_KEYS = (
    "api",
    "torch_version",
    "world_size",
    "fully_shard",
    "reshard_after_forward",
    "mp_policy",
    "forward_prefetch",
    "backward_prefetch",
    "trace",
)
"""What an FSDP2 prediction states, in order."""

_FIELDS = {f.name: f for f in dataclasses.fields(ReportConfig) if f.name not in ("stated", "extra")}


def non_default_keys(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The JSON keys of the fields among ``values`` (by field name) whose value is not the
    field's default: of the options a report states only where they are set."""
    return tuple(_key(name) for name, value in values.items() if value != _default(name))


def _key(name: str) -> str:
    """The JSON key of field ``name``."""
    return next((k for k, names in _SHARED_KEYS.items() if name in names), name)


def _field_for(key: str, value: Any) -> str | None:
    if key in _SHARED_KEYS:
        explicit, plain = _SHARED_KEYS[key]
        if key == "trace":
            return plain if value is None or value in TRACE_MODES else explicit
        return explicit if isinstance(value, Mapping) else plain
    return key if key in _FIELDS else None


def _default(name: str) -> Any:
    f = _FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _optional(name: str) -> bool:
    return str(_FIELDS[name].type).endswith("| None")


def _from_json(name: str, value: Any) -> Any:
    """A JSON value as field ``name`` holds it: a list as a tuple where the field's type
    names one, a mapping as a dict (of tuples where the type says so)."""
    kind = str(_FIELDS[name].type)
    if isinstance(value, list) and "tuple[" in kind:
        return tuple(value)
    if isinstance(value, Mapping) and kind.startswith("Mapping[str, tuple["):
        return {str(k): tuple(v) for k, v in value.items()}
    return dict(value) if isinstance(value, Mapping) else value


def _to_json(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    return value
