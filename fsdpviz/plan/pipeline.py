"""Pipeline parallelism's options: the schedule, the microbatches, the stages and where
they run, as torchtitan sets up ``torch.distributed.pipelining`` around FSDP2.

``analyze(..., mesh=("pp", P, "dp_shard", D[, "tp", T]), pipeline_schedule=...,
microbatches=M, pipeline_stages=...)``:

- ``pipeline_schedule``: a name ``get_schedule_class`` knows (``"GPipe"``, ``"1F1B"``,
  ``"Interleaved1F1B"``, ``"LoopedBFS"``, ``"InterleavedZeroBubble"``, ``"ZBVZeroBubble"``,
  ``"DualPipeV"``; case-insensitive) or a schedule class; default ``"1F1B"``, torchtitan's.
- ``microbatches``: microbatches per step; default one per sample of the batch (torchtitan's
  ``pipeline_parallel_microbatch_size = 1``). Each input tensor is split along dim 0 as
  ``PipelineSchedule.step`` splits it, so its batch must divide by it.
- ``pipeline_stages``: the module FQNs of each stage, as torchtitan's
  ``module_fqns_per_model_part`` (top-level modules and entries of the layers ``ModuleDict``:
  ``[["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]``), or the layers per
  stage (its ``pipeline_parallel_layers_per_stage``); default torchtitan's split
  (``_generate_llm_fqn_per_model_part``): one stage per pipeline rank for the single-stage
  schedules, two for the others, the modules before the layers and those after them counted
  as one layer each.

Each stage is a copy of the model holding its modules, the others set to ``None`` (empty
for the layers), as torchtitan's ``pipeline_module_split`` makes it: the model's
``forward`` must skip missing modules, as torchtitan's models do. Stages run on pipeline
ranks in a loop (stage ``s`` on rank ``s % P``) or, for ``ZBVZeroBubble`` and ``DualPipeV``,
in a V (rank ``r`` runs stages ``r`` and ``2P - 1 - r``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from fsdpviz.errors import ConfigError, did_you_mean
from fsdpviz.plan.fsdp2_options import mesh_ranks, parse_mesh
from fsdpviz.schema.pipeline import SINGLE_STAGE_SCHEDULES, V_SCHEDULES
from fsdpviz.schema.report import FsdpWarning

PIPELINE_KEYS = frozenset({"pipeline_schedule", "microbatches", "pipeline_stages"})
DEFAULT_SCHEDULE = "1F1B"
_CONTAINERS = (nn.ModuleDict, nn.ModuleList)


@dataclass(frozen=True)
class PipelineOptions:
    """The pipeline a plan runs in: its schedule, microbatches, stages and placement."""

    schedule: str  # as get_schedule_class names it: "1F1B", "Interleaved1F1B", ...
    schedule_class: type
    microbatches: int
    pp_size: int
    stage_modules: tuple[tuple[str, ...], ...]
    stage_ranks: tuple[int, ...]  # stage -> pipeline rank

    @property
    def num_stages(self) -> int:
        return len(self.stage_modules)

    @property
    def single_stage(self) -> bool:
        """GPipe and 1F1B: one stage per rank, run by the schedule's own loop."""
        from torch.distributed.pipelining.schedules import (
            PipelineScheduleSingle,
        )  # lazy: pipelining is slow to import; for pipelines only

        return issubclass(self.schedule_class, PipelineScheduleSingle)

    def stages_of(self, rank: int) -> list[int]:
        """The stages pipeline rank ``rank`` runs, in stage order."""
        return [s for s, r in enumerate(self.stage_ranks) if r == rank]


def wants_pipeline(kwargs: Mapping[str, Any]) -> bool:
    """Whether ``analyze``'s keywords plan pipeline parallelism."""
    if PIPELINE_KEYS & set(kwargs):
        return True
    mesh = kwargs.get("mesh")
    if isinstance(mesh, dict):
        return "pp" in mesh
    if isinstance(mesh, (tuple, list)):
        return "pp" in [x for x in mesh if isinstance(x, str)]
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return "pp" in names


def split_pipeline_mesh(kwargs: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The pipeline ranks of ``mesh=`` (its ``pp`` dimension, the outermost, as torchtitan's
    ``ParallelDims`` builds it) and ``kwargs`` with the mesh of the other dimensions."""
    rest = dict(kwargs)
    sizes, names = parse_mesh(kwargs.get("mesh"), 4)
    if sizes is None or "pp" not in names:
        raise ConfigError(
            "pipeline parallelism needs a mesh with a 'pp' dimension, the outermost: "
            "mesh=('pp', 8, 'dp_shard', 8) (or ('pp', 8, 'dp_shard', 8, 'tp', 8)), as "
            "torchtitan's ParallelDims builds it"
        )
    if names[0] != "pp":
        raise ConfigError(
            f"the mesh's 'pp' dimension must be the first (outermost), as torchtitan builds it; "
            f"got dimensions {names}"
        )
    if len(sizes) == 1:
        raise ConfigError(
            "the mesh has only a 'pp' dimension: give the data-parallel one too, "
            "mesh=('pp', P, 'dp_shard', 1) for pipeline parallelism without sharding"
        )
    rest["mesh"] = tuple(x for pair in zip(names[1:], sizes[1:], strict=True) for x in pair)
    mesh_ranks(kwargs, sizes)  # a world_size given agrees with the mesh
    rest.pop("world_size", None)
    return sizes[0], rest


def schedule_class(value: Any) -> tuple[str, type]:
    """``pipeline_schedule=`` as torch's class and the name ``get_schedule_class`` gives it."""
    # lazy: private torch API, looked up at use (and pipelining is slow to import)
    from torch.distributed.pipelining.schedules import _PipelineSchedule, get_schedule_class

    if value is None:
        value = DEFAULT_SCHEDULE
    if isinstance(value, type) and issubclass(value, _PipelineSchedule):
        return value.__name__.removeprefix("Schedule"), value
    if not isinstance(value, str):
        raise ConfigError(
            f"pipeline_schedule must be a schedule's name (such as '1F1B' or "
            f"'Interleaved1F1B') or a schedule class, got {value!r}"
        )
    try:
        cls = get_schedule_class(value)
    except ValueError as e:
        raise ConfigError(f"pipeline_schedule: {e}") from None
    if cls.__name__ in ("PipelineScheduleSingle", "PipelineScheduleMulti"):
        raise ConfigError(
            f"pipeline_schedule {value!r} is torch's abstract base class; name a schedule "
            "such as '1F1B' or 'Interleaved1F1B'"
        )
    return cls.__name__.removeprefix("Schedule"), cls


def parse_pipeline_options(
    model: nn.Module, batch: int | None, pp_size: int, kwargs: dict[str, Any]
) -> tuple[PipelineOptions, list[FsdpWarning]]:
    """The pipeline options of ``kwargs`` (``pipeline_schedule``, ``microbatches``,
    ``pipeline_stages``) for ``model`` on ``pp_size`` pipeline ranks; ``batch`` is the batch
    size of the inputs (dim 0 of their tensors), None when they hold no tensor."""
    name, cls = schedule_class(kwargs.get("pipeline_schedule"))
    single = name in SINGLE_STAGE_SCHEDULES
    m = kwargs.get("microbatches", batch)
    if m is None:
        raise ConfigError("microbatches=N is needed: the inputs hold no tensor to split")
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ConfigError(f"microbatches must be a positive int, got {m!r}")
    if batch is not None and batch % m:
        raise ConfigError(
            f"the batch of {batch} does not split into {m} microbatches: "
            "PipelineSchedule.step splits each input along dim 0 into equal microbatches; give "
            "a batch that divides by microbatches (torchtitan: local_batch_size a multiple of "
            "pipeline_parallel_microbatch_size)"
        )
    warnings: list[FsdpWarning] = []
    spec = kwargs.get("pipeline_stages")
    per_rank = 1 if single else 2
    if spec is None:
        stages = default_stages(model, pp_size * per_rank, warnings)
    elif isinstance(spec, int) and not isinstance(spec, bool):
        stages = stages_of_layers(model, spec, pp_size, single, warnings)
    elif isinstance(spec, (list, tuple)) and all(isinstance(s, (list, tuple)) for s in spec):
        stages = [[str(n) for n in s] for s in spec]
        check_stages(model, stages, warnings)
    else:
        raise ConfigError(
            "pipeline_stages must be the module names of each stage (torchtitan's "
            "module_fqns_per_model_part: [['tok_embeddings', 'layers.0'], ['layers.1', "
            f"'norm', 'output']]) or the layers per stage (an int); got {spec!r}"
        )
    n = len(stages)
    if n % pp_size:
        raise ConfigError(
            f"{n} stages do not divide over {pp_size} pipeline ranks (torchtitan asserts "
            f"num_stages % pp_degree == 0); give {pp_size * max(1, n // pp_size)} stages"
        )
    if single and n != pp_size:
        raise ConfigError(
            f"{name} runs one stage per pipeline rank, and {n} stages were given for "
            f"{pp_size} ranks; use a multi-stage schedule such as 'Interleaved1F1B', or "
            f"{pp_size} stages"
        )
    if not single and n // pp_size < 2:
        raise ConfigError(
            f"{name} runs at least 2 stages per pipeline rank, and {n} stages were given for "
            f"{pp_size} ranks; give {2 * pp_size} stages, or use 'GPipe' or '1F1B'"
        )
    v = name in V_SCHEDULES
    if v and n != 2 * pp_size:
        raise ConfigError(f"{name} places 2 stages per rank in a V; {n} stages were given")
    ranks = _placement(n, pp_size, v)
    opts = PipelineOptions(name, cls, m, pp_size, tuple(tuple(s) for s in stages), ranks)
    if m < n:
        warnings.append(
            FsdpWarning(
                "few_microbatches",
                f"{m} microbatches for {n} stages: torchtitan warns that this may leave a "
                "bubble in the pipeline (some ranks wait with nothing to run); fewer "
                "microbatches than stages has made multi-stage jobs hang (torchtitan issue "
                f"775). Give at least {n} microbatches.",
            )
        )
    return opts, warnings


def _placement(num_stages: int, pp: int, v: bool) -> tuple[int, ...]:
    """torch's ``generate_stage_to_rank_mapping``: stage -> rank in a loop or a V."""
    # lazy: private torch API, looked up at use
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    mapping = generate_stage_to_rank_mapping(pp, num_stages, style="v" if v else "loop")
    return tuple(mapping[s] for s in range(num_stages))


def model_parts(model: nn.Module) -> tuple[list[str], str, list[str], list[str]]:
    """The model's top-level modules before its layers, the layers container's name, its
    entries, and the modules after it (torchtitan: ``tok_embeddings``; ``layers``; ``norm``,
    ``output``)."""
    children = list(model.named_children())
    at = next((i for i, (_, c) in enumerate(children) if isinstance(c, _CONTAINERS)), None)
    if at is None:
        raise ConfigError(
            f"{type(model).__name__} has no layers container (a ModuleDict of blocks as a "
            "direct child, as torchtitan's models have) to split into pipeline stages; give "
            "pipeline_stages=[[module names of stage 0], [of stage 1], ...]"
        )
    name, layers = children[at]
    if isinstance(layers, nn.ModuleList):
        raise ConfigError(
            f"{type(model).__name__}.{name} is a ModuleList: torchtitan's pipeline split keeps "
            "the layers' names only in a ModuleDict (its models hold their blocks in one); "
            "hold the blocks in an nn.ModuleDict keyed '0', '1', ..."
        )
    before = [n for n, c in children[:at] if c is not None]
    after = [n for n, c in children[at + 1 :] if c is not None]
    return before, name, [f"{name}.{k}" for k in layers], after  # type: ignore[attr-defined]


def default_stages(
    model: nn.Module, num_stages: int, warnings: list[FsdpWarning], first: int = 1, last: int = 1
) -> list[list[str]]:
    """torchtitan's ``_generate_llm_fqn_per_model_part``: the layers spread evenly over
    ``num_stages``, the modules before them weighing ``first`` layers and those after
    ``last`` (the first stages take one layer more where they do not divide)."""
    before, _, layers, after = model_parts(model)
    effective = len(layers) + first + last
    if num_stages > effective or effective // num_stages == 0:
        raise ConfigError(
            f"{num_stages} stages for {len(layers)} layers (and the input and output modules, "
            f"counted as {first} and {last}): torchtitan refuses empty stages; use fewer "
            "pipeline ranks or stages"
        )
    per, extra = divmod(effective, num_stages)
    if first > per or last > per:
        raise ConfigError(
            f"the input and output modules weigh {first} and {last} layers, more than the "
            f"{per} layers per stage (torchtitan raises this)"
        )
    stages: list[list[str]] = []
    current = 0
    for s in range(num_stages):
        count = per + (1 if s < extra else 0)
        names = list(before) if s == 0 else []
        count -= first if s == 0 else last if s == num_stages - 1 else 0
        for _ in range(count):
            if current < len(layers):
                names.append(layers[current])
                current += 1
        if s == num_stages - 1:
            names += after
        stages.append(names)
    if extra:
        sizes = ", ".join(str(sum(1 for n in st if n in layers)) for st in stages)
        warnings.append(
            FsdpWarning(
                "uneven_stages",
                f"{len(layers)} layers (with the input and output modules counted as {first} "
                f"and {last}) do not divide into {num_stages} stages: the stages hold {sizes} "
                "layers, and the pipeline runs at the pace of the heaviest",
            )
        )
    return stages


def stages_of_layers(
    model: nn.Module, per_stage: int, pp: int, single: bool, warnings: list[FsdpWarning]
) -> list[list[str]]:
    """torchtitan's ``pipeline_parallel_layers_per_stage``: as many stages as the layers (and
    the input and output modules, one each) fill, checked as torchtitan checks them."""
    if per_stage < 1:
        raise ConfigError(f"pipeline_stages (layers per stage) must be positive, got {per_stage}")
    _, _, layers, _ = model_parts(model)
    n = math.ceil((len(layers) + 2) / per_stage)
    where = f"{len(layers)} layers at {per_stage} per stage make {n} stages"
    if n % pp:
        raise ConfigError(f"{where}, which do not divide over {pp} pipeline ranks")
    if single and n != pp:
        raise ConfigError(
            f"{where}: a single-stage schedule needs exactly 1 stage per rank "
            f"({pp}); give {math.ceil((len(layers) + 2) / pp)} layers per stage"
        )
    if not single and n // pp < 2:
        raise ConfigError(f"{where}: a multi-stage schedule needs at least 2 stages per rank")
    return default_stages(model, n, warnings)


def check_stages(model: nn.Module, stages: list[list[str]], warnings: list[FsdpWarning]) -> None:
    """Every name a top-level module or an entry of the layers container, each in one stage."""
    before, container, layers, after = model_parts(model)
    known = set(before) | set(layers) | set(after)
    seen: dict[str, int] = {}
    for s, names in enumerate(stages):
        if not names:
            raise ConfigError(f"pipeline_stages: stage {s} holds no module")
        for n in names:
            if n not in known:
                tip = did_you_mean(n, sorted(known))
                raise ConfigError(
                    f"pipeline_stages: {n!r} is not a top-level module of the model or an entry "
                    f"of {container!r}{tip}"
                )
            if n in seen:
                raise ConfigError(
                    f"pipeline_stages: {n!r} is in stage {seen[n]} and stage {s}; each module "
                    "belongs to one stage (torchtitan would run a copy of it in each)"
                )
            seen[n] = s
    left = [n for n in [*before, *layers, *after] if n not in seen and _has_params(model, n)]
    warnings += FsdpWarning.naming(
        "modules_in_no_stage",
        "These modules hold parameters and are in no pipeline stage, so no stage runs "
        "them (torchtitan's split drops them): ",
        left,
    )


def _has_params(model: nn.Module, name: str) -> bool:
    return any(True for _ in model.get_submodule(name).parameters())


def split_module(model: nn.Module, names: Sequence[str]) -> nn.Module:
    """torchtitan's ``_split_module`` without copying the layers: a new root holding
    ``names`` (the model's own module objects, so a traced copy's modules are shared, each
    by the one stage that holds it), the other top-level modules set to ``None`` and the
    other entries of the layers ``ModuleDict`` left out."""
    part = copy.copy(model)
    for key, value in vars(part).items():  # hooks and registries of its own
        if isinstance(value, dict):
            vars(part)[key] = type(value)(value)
    keep = set(names)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.ModuleDict):
            wanted = [k for k in child if f"{name}.{k}" in keep]
            setattr(part, name, nn.ModuleDict({k: child[k] for k in wanted}))
        elif name not in keep:
            setattr(part, name, None)
    return part


__all__ = [
    "PIPELINE_KEYS",
    "PipelineOptions",
    "default_stages",
    "parse_pipeline_options",
    "split_module",
    "split_pipeline_mesh",
    "wants_pipeline",
]
