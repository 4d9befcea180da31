"""The knobs :func:`fsdpviz.tune` turns and the values it tries for each, read from the model.

Each knob owns some :func:`fsdpviz.analyze` keywords; a :class:`Choice` is one value of a
knob: a label people read and the keywords it sets. A configuration is one choice per knob.
Choices of the knobs in :data:`REPLAYED` do not change the autograd graph, so they are
replayed from the trace of a configuration that differs only in them
(:func:`fsdpviz.replan.replay`); every other knob is part of the trace's key.

- ``wrap``: one unit per repeated block (the shallowest module class repeated at least twice
  that is not mostly nested in another, e.g. ``LlamaDecoderLayer``), the blocks plus the
  large modules outside them, pairs of blocks in one ``fully_shard`` call (FSDP2), the
  blocks' large children, the root alone, and the user's own plan;
- resharding (the knob named after FSDP2's option, :data:`~fsdpviz.plan.option_specs.RESHARD`):
  ``True``, ``False``, ``False`` on the last block only, and resharding to the node (an int)
  on multi-node jobs (not on a tensor-parallel mesh, where FSDP2 refuses it:
  ``Evaluations._tp_resharding``); FSDP1: ``sharding_strategy`` and ``backward_prefetch``;
- ``activation_checkpointing``: none, every 2nd block, per operator (torchtitan's
  selective policy), every block;
- ``precision``: bf16 parameters with float32 reduction (and the user's own);
- ``micro_batch``: the samples per forward, the micro-steps per optimizer step making up
  the tokens per step the inputs give, each accumulation both with the gradients reduced
  only after the last micro-step (``grad_accum``: ``no_sync``,
  ``set_requires_gradient_sync(False)``) and after each (as torchtitan and Composer
  accumulate; what a loop that calls ``backward()`` N times does);
- ``mesh``: the world size, and HSDP's shard group of one node on multi-node jobs;
- ``cpu_offload``, ``compile``, ``float8``: only where allowed (offload: when nothing else
  fits);
- ``pipeline`` (a job with a ``pp`` mesh dimension): the schedule (the job's own, 1F1B,
  Interleaved1F1B, ZBVZeroBubble) with the job's microbatches; there ``mesh`` turns the
  pipeline degree: on the job's ranks, each pp degree that divides them with the
  tensor-parallel degree as given and ``dp_shard`` the rest (``pp 2 x dp_shard 2`` also
  ``pp 4`` and ``pp 1``: plain FSDP, no pipeline), where torchtitan's default split gives
  the model that many stages and the schedule takes the job's microbatches (other degrees
  with the default split). The global batch stays: the inputs are one pipeline's batch (a
  data-parallel rank's), so at pp ``P'`` they are ``P' / P`` times the job's (repeated or
  cut along dim 0), the same tokens per rank per step. The micro-batch and the units stay
  as given, and every configuration is traced.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel
from torch.utils._pytree import tree_leaves, tree_map

from fsdpviz.configs.torchtitan_plan import tp_plan
from fsdpviz.errors import ConfigError, did_you_mean
from fsdpviz.plan.fsdp1_options import FSDP1_KEYWORDS
from fsdpviz.plan.fsdp2_options import FSDP2_KEYWORDS
from fsdpviz.plan.option_specs import FSDP_OPTIONS, RESHARD, RESHARD_KEYWORD
from fsdpviz.plan.pipeline import PIPELINE_KEYS
from fsdpviz.schema.checkpointing import CheckpointEvery, SelectiveCheckpoint
from fsdpviz.schema.keywords import FSDPKwargs
from fsdpviz.schema.mesh import ParallelDims

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)

# knob -> the analyze keywords it owns (FSDP2, FSDP1)
OWNED: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "wrap": (frozenset({"fully_shard"}), frozenset({"auto_wrap_policy"})),
    RESHARD.name: (
        frozenset({RESHARD.name}),
        frozenset({"sharding_strategy", "shard_group_size"}),
    ),
    "backward_prefetch": (frozenset(), frozenset({"backward_prefetch"})),
    "forward_prefetch": (frozenset(), frozenset({"forward_prefetch"})),
    "activation_checkpointing": (
        frozenset({"activation_checkpointing"}),
        frozenset({"activation_checkpointing"}),
    ),
    "precision": (frozenset({"mp_policy"}), frozenset({"mixed_precision"})),
    "micro_batch": (frozenset({"grad_accum"}), frozenset({"grad_accum"})),
    "mesh": (
        frozenset({"world_size", "mesh", "parallelize_plan"}),
        frozenset({"world_size"}),
    ),
    "cpu_offload": (frozenset({"offload_policy"}), frozenset({"cpu_offload"})),
    "compile": (frozenset({"compile"}), frozenset({"compile"})),
    "float8": (frozenset({"float8"}), frozenset({"float8"})),
    "pipeline": (
        frozenset({"pipeline_schedule", "microbatches", "pipeline_stages"}),
        frozenset(),
    ),
}
KNOBS = tuple(OWNED)
# The knobs in the order a person reads a configuration, and what each is called.
KNOB_NAMES = {
    "mesh": "ranks",
    "wrap": "units",
    # the knobs named after the FSDP option they turn, as the option table calls them
    **{spec.name: spec.knob for spec in FSDP_OPTIONS if spec.knob},
    "activation_checkpointing": "checkpointing",
    "precision": "precision",
    "micro_batch": "micro-batch",
    "cpu_offload": "CPU offload",
    "compile": "torch.compile",
    "float8": "float8",
    "pipeline": "pipeline",
}
# Under pipeline parallelism, the knobs tune turns (each traced: a replay keeps no pipeline).
PIPELINE_KNOBS = frozenset(
    {"pipeline", "mesh", "activation_checkpointing", "precision", RESHARD.name}
)
# The schedules tried against a pipeline's own: torchtitan's default, the interleaved one
# (two stages per rank: a smaller bubble), and the zero-bubble V.
PIPELINE_SCHEDULES = ("1F1B", "Interleaved1F1B", "ZBVZeroBubble")
# The pipeline knob's value at pp 1 (plain FSDP over the job's ranks).
NO_PIPELINE = "none (pp 1)"
# Knobs whose choices a replay of a trace applies (per API); the rest key a trace.
REPLAYED = {
    "FSDP2": frozenset({RESHARD.name, "mesh"}),
    "FSDP1": frozenset({RESHARD.name, "backward_prefetch", "mesh"}),
}
# What allow= may turn on (they change numerics or start-up, so only when asked).
ALLOWABLE = ("compile", "float8", "cpu_offload")


class TuneKwargs(FSDPKwargs, total=False):
    """The :func:`fsdpviz.analyze` keywords of a configuration (or those a knob's value
    sets): FSDP's and the job's, and the ranks; tune passes ``progress`` and ``machine``
    itself."""

    world_size: int


ReshardValue = bool | int | Mapping[str, bool | int] | None
"""FSDP2's resharding after forward as ``fully_shard`` takes it, or per group; ``None``:
torch's default."""


def reshard_kwargs(value: ReshardValue) -> TuneKwargs:
    """A configuration's keywords that set FSDP2's resharding after forward to ``value``."""
    return {RESHARD_KEYWORD: value}


def precision_kwargs(api: str, kwargs: TuneKwargs) -> TuneKwargs:
    """``api``'s precision policy as ``kwargs`` give it (``None``: not given), as keywords."""
    if api == "FSDP1":
        return {"mixed_precision": kwargs.get("mixed_precision")}
    return {"mp_policy": kwargs.get("mp_policy")}


def reshard_given(kwargs: TuneKwargs) -> ReshardValue:
    """FSDP2's resharding after forward as a configuration's keywords give it."""
    return kwargs.get(RESHARD_KEYWORD)


@dataclass(frozen=True)
class Choice:
    """One value of a knob: ``label`` (what people read), the ``kwargs`` it sets on
    :func:`fsdpviz.analyze` (its knob's other keywords are left out), and for
    ``micro_batch`` the samples per forward and, where each micro-step reduces its gradients
    (accumulation without ``no_sync`` / ``set_requires_gradient_sync(False)``), ``steps``:
    the micro-steps per optimizer step (the plan is one; the time and memory models repeat
    it). Otherwise ``grad_accum`` gives them, the first ``N - 1`` without gradient sync."""

    knob: str
    label: str
    kwargs: TuneKwargs = field(default_factory=TuneKwargs)
    samples: int = 0  # micro_batch: samples per forward (0: the inputs as given)
    steps: int = 0  # micro_batch: micro-steps each reducing its gradients (0: grad_accum's)
    # mesh: its ranks by dimension; a pipeline job's: every rank in one (the degree: ``pp``)
    parallel_dims: ParallelDims = field(default_factory=ParallelDims)
    # mesh: one a replay cannot apply (a context-parallel one): each configuration traced
    traced: bool = False
    # mesh of a pipeline job: its pp degree (1: no pipeline; 0: not a pipeline job), and
    # ``samples`` the batch of one pipeline (a data-parallel rank's) at that degree
    pp: int = 0
    # float8: the tensor-parallel plan a tp mesh takes with this recipe (torchao's float8
    # styles, or torch's where the plan given holds torchao's; None: the mesh's own)
    tp_plan: Any = None

    @property
    def micro_steps(self) -> int:
        """``micro_batch``: the micro-steps per optimizer step, however they synchronise."""
        return self.steps or int(self.kwargs.get("grad_accum", 1))

    def __hash__(self) -> int:
        return hash((self.knob, self.label))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Choice) and self.knob == other.knob and self.label == other.label


@dataclass
class Space:
    """The choices of every knob, in the order the search tries them (lightest first for
    ``activation_checkpointing``, largest first for ``micro_batch``), and the user's own
    configuration (``user``: one choice per knob, what the given keywords say)."""

    api: str
    blocks: list[str]
    choices: dict[str, list[Choice]]
    user: dict[str, Choice]
    base: TuneKwargs  # the keywords no knob owns (loss, trace, ignored_params, ...)
    batch: int  # samples in the inputs (0: not known, micro_batch fixed)
    pinned: frozenset[str]
    pipelined: bool = False  # a pipeline's: every configuration traced, none replayed
    # (mesh label, pipeline label) pairs the schedule refuses at that pp degree
    refused: frozenset[tuple[str, str]] = frozenset()

    def kwargs(self, config: Mapping[str, Choice]) -> TuneKwargs:
        """The :func:`fsdpviz.analyze` keywords of a configuration (a pipeline job's at pp 1:
        without the pipeline's keywords; at another degree than its own: the default stages)."""
        out = self.base.copy()
        for knob in KNOBS:
            choice = config.get(knob)
            if choice is not None:
                out.update(choice.kwargs)
        float8 = config.get("float8")
        if float8 is not None and float8.tp_plan is not None and out.get("parallelize_plan"):
            out["parallelize_plan"] = float8.tp_plan
        mesh, mine = config.get("mesh"), self.user.get("mesh")
        if mesh is not None and mesh.pp == 1:
            out = cast(TuneKwargs, {k: v for k, v in out.items() if k not in PIPELINE_KEYS})
        elif mesh is not None and mine is not None and mesh.pp > 1 and mesh.pp != mine.pp:
            out["pipeline_stages"] = None
        return out


# ------------------------------------------------------------------- the blocks
def block_class(model: nn.Module) -> type[nn.Module] | None:
    """The model's repeated block: the module class with children that occurs at least
    twice, is not mostly nested inside another such class, and holds the most parameters
    (``LlamaDecoderLayer``, not ``LlamaMLP`` or ``Linear``); a model whose repeated modules
    are all leaves (a stack of ``Linear``) gets the leaf class holding at least half the
    parameters. None when nothing repeats."""
    named = dict(model.named_modules())
    stats: dict[type[nn.Module], list[int]] = {}  # class -> [count, numel, has children]
    for name, m in named.items():
        if name and not isinstance(m, _CONTAINERS):
            s = stats.setdefault(type(m), [0, 0, 0])
            s[0] += 1
            s[1] += _numel(m)
            s[2] = s[2] or int(any(True for _ in m.children()))
    repeated = [c for c, s in stats.items() if s[0] >= 2 and s[1] > 0]
    inner = [c for c in repeated if stats[c][2]]
    if not inner:
        total = _numel(model)
        inner = [c for c in repeated if stats[c][1] * 2 >= total]
    outer: list[type[nn.Module]] = []
    for c in inner:
        others = tuple(d for d in inner if d is not c)
        roots = [n for n, m in named.items() if others and isinstance(m, others)]
        nested = sum(
            _numel(m)
            for n, m in named.items()
            if type(m) is c and any(n.startswith(r + ".") for r in roots)
        )
        if nested * 2 < stats[c][1]:
            outer.append(c)
    return max(outer, key=lambda c: stats[c][1]) if outer else None


def block_names(model: nn.Module, block: type[nn.Module] | None) -> list[str]:
    """The FQNs of the outermost instances of ``block``, in module order."""
    if block is None:
        return []
    out: list[str] = []
    for name, m in model.named_modules():
        if name and type(m) is block and not any(name.startswith(b + ".") for b in out):
            out.append(name)
    return out


def wrap_plans(model: nn.Module, api: str, block: type[nn.Module] | None) -> dict[str, TuneKwargs]:
    """Candidate wrap plans from the model's structure: ``{label: kwargs}`` (``fully_shard``
    for FSDP2, ``auto_wrap_policy`` for FSDP1), the usual recipe (one unit per block) first."""
    named = dict(model.named_modules())
    blocks = block_names(model, block)
    plans: dict[str, TuneKwargs] = {}
    if block is None or len(blocks) < 2:
        plans["the root alone"] = _plan(api, [], named)
        return plans
    total = _numel(model)
    cls = block.__name__
    plans[f"each {cls}"] = _plan(api, [(b,) for b in blocks], named)
    outside = _large_outside(named, blocks, total)
    # FSDP1 policies go by class: an outside module only where its class is not in the blocks
    inner = {type(m) for b in blocks for m in named[b].modules()}
    own_class = [g for g in outside if len(g) == 1 and type(named[g[0]]) not in inner]
    usable = outside if api == "FSDP2" else own_class
    if usable:
        label = ", ".join(" & ".join(g) for g in usable)
        plans[f"each {cls} + {label}"] = _plan(api, [*[(b,) for b in blocks], *usable], named)
    if api == "FSDP2" and len(blocks) >= 4:
        pairs = [tuple(blocks[i : i + 2]) for i in range(0, len(blocks), 2)]
        extra = f" + {', '.join(' & '.join(g) for g in outside)}" if outside else ""
        plans[f"pairs of {cls}{extra}"] = _plan(api, [*pairs, *outside], named)
    children = _large_children(named, blocks)
    kinds = {type(named[c]) for c in children}
    outside_kinds = {type(named[n]) for n in _outside_of(named, blocks)}
    if children and not kinds & outside_kinds:
        label = ", ".join(sorted(k.__name__ for k in kinds))
        plans[f"each {cls} child ({label})"] = _plan(
            api, [*[(c,) for c in children], *usable], named
        )
    plans["the root alone"] = _plan(api, [], named)
    return plans


def _plan(api: str, groups: list[tuple[str, ...]], named: dict[str, nn.Module]) -> TuneKwargs:
    if api == "FSDP2":
        return {"fully_shard": [g if len(g) > 1 else g[0] for g in groups]}
    if not groups:
        return {"auto_wrap_policy": None}
    return {"auto_wrap_policy": ModuleWrapPolicy({type(named[n]) for g in groups for n in g})}


def _outside_of(named: dict[str, nn.Module], blocks: list[str]) -> list[str]:
    return [n for n in named if n and not any(n == b or n.startswith(b + ".") for b in blocks)]


def _numel(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _large_outside(
    named: dict[str, nn.Module], blocks: list[str], total: int
) -> list[tuple[str, ...]]:
    """Modules outside the blocks whose own parameters are at least 5% of the model, grouped
    where they share parameters (a tied embedding and output head)."""
    inside = {id(p) for b in blocks for p in named[b].parameters()}
    picked: list[str] = []
    for name in _outside_of(named, blocks):
        own = [p for p in named[name].parameters(recurse=False) if id(p) not in inside]
        if own and sum(p.numel() for p in own) * 20 >= total:
            picked.append(name)
    groups: list[list[str]] = []
    owners: dict[int, int] = {}
    for name in picked:
        ids = {id(p) for p in named[name].parameters()}
        shared = {owners[i] for i in ids if i in owners}
        g = min(shared) if shared else len(groups)
        if not shared:
            groups.append([])
        groups[g].append(name)
        for i in ids:
            owners[i] = g
    return [tuple(g) for g in groups]


def _large_children(named: dict[str, nn.Module], blocks: list[str]) -> list[str]:
    out: list[str] = []
    for b in blocks:
        size = _numel(named[b])
        for child, m in named[b].named_children():
            if _numel(m) * 10 >= size:
                out.append(f"{b}.{child}")
    return out


# --------------------------------------------------------------- the batch
def batch_size(inputs: Any) -> int:
    """Samples in ``inputs``: the first dimension of the first tensor with one (0: none)."""
    for t in tree_leaves(inputs):
        if isinstance(t, torch.Tensor) and t.dim() >= 1:
            return int(t.shape[0])
    return 0


def micro_batch_inputs(inputs: Any, batch: int, samples: int) -> Any:
    """``inputs`` with every tensor whose first dimension is the batch cut to its first
    ``samples``, or repeated along it to ``samples`` (new tensors, so nothing is shared with
    the caller's)."""
    if samples == batch:
        return inputs

    def cut(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == batch:
            if samples > batch:  # a larger batch: the samples repeated
                t = t.repeat(-(-samples // batch), *([1] * (t.dim() - 1)))
            return t[:samples].clone()
        return t

    return tree_map(cut, inputs)


def keeps_a_cache(model: nn.Module, inputs: Any) -> bool:
    """Whether ``model`` (a Hugging Face model taking ``use_cache``) keeps a key/value cache
    with these keyword inputs."""
    if not isinstance(inputs, dict) or "use_cache" in inputs:
        return False
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    config = getattr(model, "config", None)
    return "use_cache" in params and bool(getattr(config, "use_cache", False))


def micro_batch_label(samples: int, steps: int) -> str:
    """A micro-batch in words: ``"2 x 4 micro-steps"`` (samples per forward x micro-steps)."""
    step = "micro-step" if steps == 1 else "micro-steps"
    return f"{samples} x {steps} {step}"


def divisors(n: int) -> list[int]:
    """``n``'s divisors, largest first."""
    return [d for d in range(n, 0, -1) if n % d == 0]


# ------------------------------------------------------------------ precision
def param_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype most of the model's floating-point parameters have."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=lambda d: counts[d]) if counts else None


def standard_precision(api: str) -> TuneKwargs:
    """bf16 parameters with float32 gradient reduction (torchtitan's and llm-foundry's
    default), as the API takes it."""
    if api == "FSDP2":
        return {
            "mp_policy": MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32
            )
        }
    return {
        "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    }


def precision_label(kwargs: Mapping[str, Any], dtype: torch.dtype | None) -> str:
    """How a configuration computes, in words: ``"bf16 params, fp32 reduce"``."""
    mp = kwargs.get("mp_policy", kwargs.get("mixed_precision"))
    param = getattr(mp, "param_dtype", None) or dtype
    reduce = getattr(mp, "reduce_dtype", None) or param
    short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    p = short.get(param, str(param).replace("torch.", "")) if param is not None else "fp32"
    r = short.get(reduce, str(reduce).replace("torch.", "")) if reduce is not None else p
    return f"{p} params" if p == r else f"{p} params, {r} reduce"


# -------------------------------------------------------------- tensor parallel
def standard_tp_plan(model: nn.Module, source: str) -> tuple[dict[str, ParallelStyle] | None, str]:
    """The model's own tensor-parallel plan, as ``parallelize_module`` takes it: torchtitan's
    for its Llama (``source="torchtitan"``), else the Hugging Face config's
    ``base_model_tp_plan`` (``"colwise"`` / ``"rowwise"`` entries); None and why where there
    is none."""
    if source == "torchtitan":
        return tp_plan(loss_parallel=False), ""
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        return None, "the model defines no tensor-parallel plan (pass parallelize_plan=...)"
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    prefix = getattr(model, "base_model_prefix", "")
    names = {n for n, _ in model.named_modules()}
    at = f"{prefix}." if prefix and prefix in names else ""
    out: dict[str, ParallelStyle] = {}
    for pattern, style in plan.items():
        if style not in styles:
            return None, (
                f"its Hugging Face plan uses {style!r} ({pattern}), which fsdpviz does not "
                "read; pass parallelize_plan=..."
            )
        out[at + pattern] = styles[style]()
    return out, ""


def heads(model: nn.Module) -> int:
    """The attention heads (key/value heads where fewer) a tensor-parallel degree must divide
    (0: not known)."""
    config = getattr(model, "config", None)
    for key in ("num_key_value_heads", "num_attention_heads", "n_kv_heads", "n_heads"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    for m in model.modules():
        for key in ("n_kv_heads", "n_heads", "num_key_value_heads", "num_heads"):
            value = getattr(m, key, None)
            if isinstance(value, int) and value > 0:
                return value
    return 0


# --------------------------------------------------------------------- fixed
def check_fixed(fixed: Mapping[str, Any], api: str) -> dict[str, Any]:
    """``fixed`` as analyze keywords; a knob's name pins its user value (``{"micro_batch":
    2}`` pins the samples per forward). Unknown names raise with a suggestion."""
    known = set(FSDP2_KEYWORDS if api == "FSDP2" else FSDP1_KEYWORDS) | set(KNOBS)
    for key in fixed:
        if key not in known:
            tip = did_you_mean(str(key), sorted(known))
            raise ConfigError(
                f"fixed: {key!r} is neither an analyze keyword of {api} nor a knob of tune "
                f"({', '.join(KNOBS)}){tip}"
            )
    return dict(fixed)


def pinned_knobs(keys: Sequence[str], api: str) -> set[str]:
    """The knobs whose keywords are among ``keys``."""
    side = 0 if api == "FSDP2" else 1
    out = {k for k in keys if k in OWNED}
    for knob, owned in OWNED.items():
        if owned[side] & set(keys):
            out.add(knob)
    return out


def checkpoint_choices(block: type[nn.Module] | None, blocks: int) -> list[Choice]:
    """No checkpointing, every 2nd block, per operator (torchtitan's policy), every block."""
    knob = "activation_checkpointing"
    out = [Choice(knob, "none", {"activation_checkpointing": None})]
    if block is None:
        return out
    cls = block.__name__
    if blocks >= 2:
        out.append(
            Choice(
                knob,
                f"every 2nd {cls}",
                {"activation_checkpointing": CheckpointEvery([block], 2)},
            )
        )
    out.append(
        Choice(
            knob,
            f"per op in each {cls}",
            {"activation_checkpointing": SelectiveCheckpoint([block])},
        )
    )
    out.append(Choice(knob, f"each {cls}", {"activation_checkpointing": [block]}))
    return out


def checkpoint_label(spec: Any) -> str:
    """A user's ``activation_checkpointing`` in words."""
    if spec is None:
        return "none"
    if isinstance(spec, SelectiveCheckpoint):
        return f"per op in {_classes(spec.modules)}"
    if isinstance(spec, CheckpointEvery):
        nth = {2: "2nd", 3: "3rd"}.get(spec.every, f"{spec.every}th")
        return f"every {nth} {_classes(spec.modules)}" if spec.every > 1 else _classes(spec.modules)
    return f"as given ({_classes(spec)})"


def _classes(spec: Any) -> str:
    if isinstance(spec, (list, tuple, set, frozenset)):
        return ", ".join(sorted(getattr(c, "__name__", str(c)) for c in spec))
    return getattr(spec, "__name__", None) or type(spec).__name__


__all__ = [
    "ALLOWABLE",
    "KNOBS",
    "KNOB_NAMES",
    "NO_PIPELINE",
    "OWNED",
    "PIPELINE_KNOBS",
    "PIPELINE_SCHEDULES",
    "REPLAYED",
    "Choice",
    "Space",
    "batch_size",
    "block_class",
    "block_names",
    "check_fixed",
    "checkpoint_choices",
    "checkpoint_label",
    "divisors",
    "heads",
    "keeps_a_cache",
    "micro_batch_inputs",
    "micro_batch_label",
    "param_dtype",
    "pinned_knobs",
    "precision_kwargs",
    "precision_label",
    "standard_precision",
    "standard_tp_plan",
    "wrap_plans",
]
