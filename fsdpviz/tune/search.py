"""``fsdpviz.tune``: the fastest configuration that fits, found with fsdpviz's exact plans.

Every configuration evaluated is the plan :func:`fsdpviz.analyze` gives for its keywords:
the model is traced once per *trace key* (the knobs that change the autograd graph: units,
checkpointing, precision, micro-batch, tensor parallelism, compile, float8, FSDP1's forward
prefetch) and every choice of the other knobs (resharding, the mesh, FSDP1's sharding
strategy and backward prefetch, the micro-steps of gradient accumulation) is replayed from
that trace (:func:`fsdpviz.replan.replay`, milliseconds each), then costed by the memory
and time models.

The search, in stages (each trace key once):

1. the user's configuration as given;
2. the usual units (one per block) in the standard precision (bf16 parameters, float32
   reduction, unless pinned), for each micro-batch from the largest: checkpointing from
   the lightest, stopping at the first that fits (heavier checkpointing only recomputes
   more); a smaller micro-batch tries only checkpointing lighter than what fitted the larger
   one, and not at all once the larger micro-batch was as fast without fitting (more
   micro-steps only add collectives) as the fastest fit found;
3. the other wrap plans (and FSDP1's forward prefetch) at the best trace key;
4. what ``allow=`` permits (compile, float8) at the best trace key;
5. when nothing fits: CPU offload, and how many ranks the lightest configuration needs.

``exhaustive=True`` evaluates every combination instead (slow: one trace per key).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fsdpviz.cost.fit import check_fit
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.hardware import machine as make_machine
from fsdpviz.cost.memory import memory_model
from fsdpviz.cost.sizes import parse_bytes
from fsdpviz.cost.time import timeline
from fsdpviz.errors import ConfigError, FsdpvizError
from fsdpviz.plan.options import DEFAULT_WORLD_SIZE, check_world_size
from fsdpviz.replan.hook_replay import replay
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.report import Report
from fsdpviz.trace.copy import check_model
from fsdpviz.tune.result import Candidate, Tuning
from fsdpviz.tune.space import (
    ALLOWABLE,
    KNOBS,
    OWNED,
    REPLAYED,
    Choice,
    Space,
    batch_size,
    block_class,
    block_names,
    check_fixed,
    checkpoint_choices,
    checkpoint_label,
    divisors,
    heads,
    micro_batch_inputs,
    param_dtype,
    pinned_knobs,
    precision_label,
    standard_precision,
    standard_tp_plan,
    wrap_plans,
)

Config = dict[str, Choice]
_FSDP1_ONLY = {
    "auto_wrap_policy", "sharding_strategy", "mixed_precision", "shard_group_size",
    "use_orig_params", "cpu_offload", "limit_all_gathers", "ignored_modules", "ignored_states",
}  # fmt: skip


def tune(
    model: nn.Module | Any,
    inputs: Any = None,
    *,
    world_size: int | Sequence[int] = DEFAULT_WORLD_SIZE,
    machine: Machine | str = "h100",
    api: str | None = None,
    fixed: Mapping[str, Any] | None = None,
    allow: Iterable[str] = (),
    tokens_per_step: int | None = None,
    optimizer: str | int | None = "adamw",
    memory_budget: str | int | None = None,
    knobs: Iterable[str] | None = None,
    config: Mapping[str, Any] | None = None,
    exhaustive: bool = False,
    progress: bool | None = None,
    **kwargs: Any,
) -> Tuning:
    """Find the configuration with the most tokens/s per GPU that fits, and show why.

    ``model`` and ``inputs`` as :func:`fsdpviz.analyze` takes them (``inputs``: one rank's
    batch), or a torchtitan job (:func:`fsdpviz.from_torchtitan`) alone. ``kwargs`` are the
    user's own configuration (``analyze`` keywords: ``fully_shard=[...]``, ``mp_policy``,
    ``activation_checkpointing``, ...; ``config=``: a trainer's, e.g.
    :func:`fsdpviz.from_accelerate`), which is evaluated too and marked. The knobs (see
    :mod:`fsdpviz.tune.space`) are turned from there, except:

    - ``fixed``: analyze keywords (or knob names) that stay as given
      (``fixed={"mp_policy": mp}``, ``fixed={"micro_batch": 2}``);
    - ``knobs``: only these knobs are turned (default: all of them);
    - ``allow``: ``"compile"``, ``"float8"`` (they change numerics or start-up, so only when
      asked), ``"cpu_offload"`` (otherwise tried only when nothing else fits).

    ``world_size``: the ranks, or a list of counts to compare (tokens/s per GPU and in
    total). ``machine``: the GPU (a preset name or :class:`fsdpviz.cost.Machine`).
    ``tokens_per_step``: tokens per rank per optimizer step (default: what the inputs and
    ``grad_accum`` give); micro-batches and gradient accumulation keep it.
    ``memory_budget``: a peak per rank to fit instead of the machine's memory.

    Example::

        tuning = fsdpviz.tune(model, {"input_ids": ids}, world_size=8, machine="h100")
        print(tuning)                        # the best, and what each alternative changes
        best = tuning.best
        report = fsdpviz.analyze(model, best.inputs, **best.kwargs)   # == best.report
        print(best.code())                   # the fully_shard calls to paste
        tuning.show()                        # the frontier; click a point for its plan
    """
    started = time.perf_counter()
    source = ""
    if _is_torchtitan_job(model):
        job: Any = model
        model = job.model
        inputs = job.inputs if inputs is None else inputs
        config = job.config
        source = "torchtitan"
    if inputs is None:
        raise ConfigError("tune needs the model's inputs: tune(model, inputs, world_size=...)")
    check_model(model, "tune")
    if config is not None:
        source = source or _source(config)
        kwargs = {**dict(config), **kwargs}
    world_sizes = _world_sizes(world_size, kwargs)
    m = make_machine(machine) if isinstance(machine, str) else machine
    chosen_api = _api(api, kwargs, fixed or {})
    fixed_kw = check_fixed(fixed or {}, chosen_api)
    allowed = _allowed(allow)
    turned = set(KNOBS) if knobs is None else _knobs(knobs)
    budget = None if memory_budget is None else parse_bytes(memory_budget)
    search = _Search(
        model,
        inputs,
        chosen_api,
        {**kwargs, **{k: v for k, v in fixed_kw.items() if k not in KNOBS}},
        fixed_kw,
        allowed,
        turned,
        world_sizes,
        m,
        machine,
        tokens_per_step,
        optimizer,
        budget,
        progress,
        source,
    )
    search.run(exhaustive)
    tuning = Tuning(
        candidates=search.candidates,
        user=search.user,
        api=chosen_api,
        machine=m.name,
        world_sizes=world_sizes,
        budget=budget,
        traces=search.trace_count,
        replays=search.replay_count,
        seconds=time.perf_counter() - started,
        notes=search.notes,
        source=source,
        needs=search.needs,
    )
    return tuning


def suggest(
    model: nn.Module,
    inputs: Any,
    *,
    memory_budget: str | int | None = None,
    world_size: int | Sequence[int] = DEFAULT_WORLD_SIZE,
    api: str = "fsdp2",
    machine: Machine | str = "h100",
    optimizer: str | int | None = "adamw",
    **options: Any,
) -> Tuning:
    """:func:`tune` turning only the wrap plan and FSDP's own switches (FSDP2's
    ``reshard_after_forward``; FSDP1's sharding strategy and prefetch): the rest of the job
    (``options``: ``mp_policy``, ``activation_checkpointing``, ``grad_accum``, ...) stays
    as given.

    Example::

        tuning = fsdpviz.suggest(model, {"input_ids": ids}, memory_budget="60GiB", world_size=64)
        tuning.best.kwargs        # pass them to fsdpviz.analyze
    """
    return tune(
        model,
        inputs,
        world_size=world_size,
        machine=machine,
        api=api,
        optimizer=optimizer,
        memory_budget=memory_budget,
        knobs=("wrap", "reshard_after_forward", "backward_prefetch", "forward_prefetch"),
        **options,
    )


# ------------------------------------------------------------------ arguments
def _is_torchtitan_job(obj: Any) -> bool:
    return type(obj).__name__ == "TorchtitanJob" and hasattr(obj, "model")


def _source(config: Mapping[str, Any]) -> str:
    text = str(getattr(config, "source", "")).lower()
    for name in ("torchtitan", "accelerate", "lightning"):
        if name in text:
            return name
    return ""


def _world_sizes(world_size: int | Sequence[int], kwargs: Mapping[str, Any]) -> list[int]:
    if "world_size" in kwargs:
        raise ConfigError(
            "pass the ranks as tune(..., world_size=N) (or a list of counts to compare), "
            "not among the configuration's keywords"
        )
    sizes = [world_size] if isinstance(world_size, int) else list(world_size)
    if not sizes:
        raise ConfigError("world_size must be a positive int or a non-empty list of them")
    for ws in sizes:
        check_world_size(ws)
    mesh = kwargs.get("mesh")
    if mesh is not None:
        from fsdpviz.plan.fsdp2 import mesh_dims

        dims, _ = mesh_dims(mesh, 3)
        ranks = math.prod(dims) if dims is not None else 0
        for ws in sizes:
            if ws != ranks and ws % (dims[-1] if dims and kwargs.get("parallelize_plan") else 1):
                raise ConfigError(
                    f"world_size {ws} does not divide by the mesh's tensor-parallel degree "
                    f"{dims[-1] if dims else 1}; give a world size that does"
                )
    return list(dict.fromkeys(sizes))


def _api(api: str | None, kwargs: Mapping[str, Any], fixed: Mapping[str, Any]) -> str:
    if api is not None:
        if api.lower() not in ("fsdp1", "fsdp2"):
            raise ConfigError(f"api must be 'fsdp1' or 'fsdp2', got {api!r}")
        return api.upper()
    given = set(kwargs) | set(fixed)
    if "fully_shard" in given:
        return "FSDP2"
    return "FSDP1" if given & _FSDP1_ONLY else "FSDP2"


def _allowed(allow: Iterable[str]) -> set[str]:
    out = set()
    for key in [allow] if isinstance(allow, str) else allow:
        if key not in ALLOWABLE:
            raise ConfigError(
                f"allow: {key!r} is not something tune tries only when allowed; give any of "
                f"{', '.join(ALLOWABLE)}"
            )
        out.add(key)
    return out


def _knobs(knobs: Iterable[str]) -> set[str]:
    out = set()
    for key in [knobs] if isinstance(knobs, str) else knobs:
        if key not in KNOBS:
            import difflib

            close = difflib.get_close_matches(str(key), KNOBS, n=1)
            tip = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"knobs: unknown knob {key!r} (tune turns {', '.join(KNOBS)}){tip}")
        out.add(key)
    return out


# --------------------------------------------------------------------- search
class _Search:
    def __init__(
        self,
        model: nn.Module,
        inputs: Any,
        api: str,
        user_kwargs: dict[str, Any],
        fixed: dict[str, Any],
        allowed: set[str],
        turned: set[str],
        world_sizes: list[int],
        machine: Machine,
        machine_arg: Machine | str,
        tokens_per_step: int | None,
        optimizer: str | int | None,
        budget: int | None,
        progress: bool | None,
        source: str = "",
    ) -> None:
        self.model = model
        self.inputs = inputs
        self.api = api
        self.machine = machine
        self.machine_arg = machine_arg
        self.optimizer = optimizer
        self.budget = budget
        self.allowed = allowed
        self.world_sizes = world_sizes
        self.notes: list[str] = []
        self.candidates: list[Candidate] = []
        self.trace_count = 0
        self.replay_count = 0
        self.needs: dict[str, Any] | None = None
        self._traces: dict[tuple[Any, ...], Report | None] = {}
        self._seen: dict[tuple[str, ...], Candidate | None] = {}
        self._configs: dict[int, Config] = {}  # candidate index -> its configuration
        self._fixed = fixed
        self._inputs: dict[tuple[int, bool], Any] = {}
        self._cache_off = _keeps_a_cache(model, inputs)
        self._source = source
        self._tp_why = ""
        self._tp_standard = False
        if self._cache_off:
            self.notes.append(
                "use_cache=False in the inputs of every configuration but the one as given: "
                "training never reads Hugging Face's key/value cache, and a checkpointed layer "
                "would append to it again when recomputed (gradient_checkpointing_enable sets "
                "it so)"
            )
        self._bar: Any = None
        self._progress = progress
        pinned = pinned_knobs(list(fixed), api) | (set(KNOBS) - turned)
        self.space = self._space(user_kwargs, pinned, tokens_per_step)
        self.user: Candidate = None  # type: ignore[assignment]

    # ------------------------------------------------------------ the space
    def _space(
        self, kwargs: dict[str, Any], pinned: set[str], tokens_per_step: int | None
    ) -> Space:
        api, model = self.api, self.model
        side = 0 if api == "FSDP2" else 1
        owned = set().union(*(o[side] for o in OWNED.values()))
        base = {k: v for k, v in kwargs.items() if k not in owned}
        block = block_class(model)
        blocks = block_names(model, block)
        choices: dict[str, list[Choice]] = {}
        user: dict[str, Choice] = {}

        def given(knob: str) -> dict[str, Any]:
            return {k: kwargs[k] for k in OWNED[knob][side] if k in kwargs}

        # units
        plans = wrap_plans(model, api, block)
        wrap = [Choice("wrap", label, kw) for label, kw in plans.items()]
        user_wrap = given("wrap")
        if not user_wrap:
            key = "fully_shard" if api == "FSDP2" else "auto_wrap_policy"
            user_wrap = {key: [] if api == "FSDP2" else None}
        mine_wrap = next((c for c in wrap if _same_kwargs(c.kwargs, user_wrap)), None)
        if mine_wrap is None:
            mine_wrap = Choice("wrap", "as given", user_wrap)
            wrap.append(mine_wrap)
        choices["wrap"], user["wrap"] = wrap, mine_wrap
        # resharding / sharding strategy, backward and forward prefetch (FSDP1)
        node = self.machine.gpus_per_node
        multi = any(ws > node and ws % node == 0 for ws in self.world_sizes)
        if api == "FSDP2":
            raf = [
                Choice("reshard_after_forward", "all but the root", {"reshard_after_forward": None})
            ]
            raf.append(Choice("reshard_after_forward", "never", {"reshard_after_forward": False}))
            if blocks:
                last = blocks[-1]
                raf.append(
                    Choice(
                        "reshard_after_forward",
                        f"all but the root and {last}",
                        {"reshard_after_forward": {last: False}},
                    )
                )
            if multi:
                raf.append(
                    Choice(
                        "reshard_after_forward",
                        f"to {node} ranks (a node)",
                        {"reshard_after_forward": node},
                    )
                )
            user["reshard_after_forward"] = self._user_choice(
                raf,
                "reshard_after_forward",
                given("reshard_after_forward"),
                {"reshard_after_forward": None},
            )
            choices["reshard_after_forward"] = raf
        else:
            from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

            strategies = [
                Choice(
                    "reshard_after_forward",
                    s,
                    {"sharding_strategy": ShardingStrategy[s], "shard_group_size": None},
                )
                for s in ("FULL_SHARD", "SHARD_GRAD_OP")
            ]
            if multi:
                strategies.append(
                    Choice(
                        "reshard_after_forward",
                        f"HYBRID_SHARD ({node} ranks a shard group)",
                        {
                            "sharding_strategy": ShardingStrategy.HYBRID_SHARD,
                            "shard_group_size": node,
                        },
                    )
                )
            user["reshard_after_forward"] = self._user_choice(
                strategies,
                "reshard_after_forward",
                given("reshard_after_forward"),
                strategies[0].kwargs,
            )
            choices["reshard_after_forward"] = strategies
            bp = [
                Choice("backward_prefetch", p.name, {"backward_prefetch": p})
                for p in (BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST)
            ]
            user["backward_prefetch"] = self._user_choice(
                bp, "backward_prefetch", given("backward_prefetch"), bp[0].kwargs
            )
            choices["backward_prefetch"] = bp
            fp = [
                Choice("forward_prefetch", str(v), {"forward_prefetch": v}) for v in (False, True)
            ]
            user["forward_prefetch"] = self._user_choice(
                fp, "forward_prefetch", given("forward_prefetch"), fp[0].kwargs
            )
            choices["forward_prefetch"] = fp
        # checkpointing
        ac = checkpoint_choices(block, len(blocks))
        user_ac = given("activation_checkpointing")
        spec = user_ac.get("activation_checkpointing")
        same = next((c for c in ac if _same_ac(c, spec)), None)
        if same is None:
            same = Choice("activation_checkpointing", checkpoint_label(spec), user_ac)
            ac.append(same)
        choices["activation_checkpointing"], user["activation_checkpointing"] = ac, same
        # precision
        dtype = param_dtype(model)
        standard = standard_precision(api)
        user_mp = given("precision")
        prec = [Choice("precision", precision_label(standard, dtype), standard)]
        mine = Choice("precision", precision_label(user_mp, dtype), user_mp)
        if dtype is not torch.float32 and not user_mp:
            prec = []  # a model in bf16 already: nothing to cast
        if mine not in prec:
            prec.append(mine)
        choices["precision"], user["precision"] = prec, mine
        # micro-batch
        batch = batch_size(self.inputs)
        accum = int(kwargs.get("grad_accum", 1))
        user_mb = Choice(
            "micro_batch",
            _mb_label(batch, accum),
            {"grad_accum": accum} if accum > 1 else {"grad_accum": 1},
            samples=batch,
        )
        mbs = [user_mb]
        if batch:
            tokens = batch * accum if tokens_per_step is None else 0
            if tokens_per_step is not None:
                tokens = self._samples_per_step(tokens_per_step, batch)
            mbs = []
            for d in divisors(tokens):
                if d > batch:
                    continue
                n = tokens // d
                mbs.append(Choice("micro_batch", _mb_label(d, n), {"grad_accum": n}, samples=d))
            if user_mb not in mbs:
                mbs.append(user_mb)
        if "micro_batch" in self._fixed:
            wanted = self._fixed["micro_batch"]
            pick = [c for c in mbs if c.samples == wanted]
            if not pick:
                sizes = ", ".join(str(c.samples) for c in mbs)
                raise ConfigError(
                    f"fixed micro_batch={wanted!r}: the micro-batches that make up the tokens "
                    f"per step are {sizes}"
                )
            user_mb = pick[0]
        choices["micro_batch"], user["micro_batch"] = mbs, user_mb
        # the mesh: data parallel (HSDP on multi-node jobs), and tensor parallelism with the
        # user's plan or, for a model that needs it, its own
        user_mesh = given("mesh")
        tp = _tp_degree(user_mesh)
        plan = user_mesh.get("parallelize_plan")
        self._tp_standard = plan is None
        if plan is None:
            plan, why = standard_tp_plan(model, self._source)
            if plan is None:
                self._tp_why = why
        meshes = []
        for ws in self.world_sizes:
            meshes.extend(self._meshes(ws, tp, plan))
        mine_mesh = self._user_mesh(user_mesh, meshes)
        choices["mesh"], user["mesh"] = meshes, mine_mesh
        # offload, compile, float8
        for knob, values in (
            ("cpu_offload", self._offload_choices()),
            ("compile", self._compile_choices(block)),
            ("float8", self._float8_choices()),
        ):
            mine_value = given(knob)
            default = values[0]
            me = next((c for c in values if _same_kwargs(c.kwargs, mine_value)), None)
            if me is None:
                me = Choice(knob, _value_label(mine_value), mine_value)
                values.append(me)
            if not mine_value:
                me = default
            choices[knob], user[knob] = values, me
        for knob in pinned & set(choices):
            choices[knob] = [user[knob]]
        if "micro_batch" in pinned and tokens_per_step is not None:
            self.notes.append("micro_batch is pinned, so tokens_per_step is not applied")
        space = Space(api, block, blocks, choices, user, base, batch, frozenset(pinned))
        self._describe_pins(space)
        return space

    def _user_choice(
        self,
        choices: list[Choice],
        knob: str,
        given: Mapping[str, Any],
        default: Mapping[str, Any],
    ) -> Choice:
        wanted = given or default
        for c in choices:
            if _same_kwargs(c.kwargs, wanted):
                return c
        mine = Choice(knob, _value_label(wanted), dict(wanted))
        choices.append(mine)
        return mine

    def _samples_per_step(self, tokens_per_step: int, batch: int) -> int:
        per_sample = self._tokens_per_sample(batch)
        if tokens_per_step % per_sample:
            raise ConfigError(
                f"tokens_per_step={tokens_per_step} is not a whole number of samples of "
                f"{per_sample} tokens; give a multiple of {per_sample}"
            )
        return tokens_per_step // per_sample

    def _tokens_per_sample(self, batch: int) -> int:
        from fsdpviz.trace.probe import batch_tokens

        tokens = batch_tokens(self.inputs)
        return max(1, tokens // max(batch, 1))

    def _meshes(self, ws: int, tp: int, plan: dict[str, Any] | None) -> list[Choice]:
        """The meshes on ``ws`` ranks: FSDP over all, HSDP with a node per shard group
        (FSDP2 on more than a node), and FSDP x TP for each tensor-parallel degree up to a
        node that divides the ranks and the heads (with the user's plan, else the model's
        own; ``tp``: the user's degree)."""
        node = self.machine.gpus_per_node
        out = [Choice("mesh", f"{ws} ranks", {"world_size": ws}, mesh=(ws, ws, 1))]
        if self.api == "FSDP2" and ws > node and ws % node == 0:
            kw: dict[str, Any] = {"mesh": ("dp_replicate", ws // node, "dp_shard", node)}
            out.append(
                Choice("mesh", f"{ws} ranks (HSDP {ws // node} x {node})", kw, mesh=(ws, node, 1))
            )
        if self.api != "FSDP2" or plan is None:
            return out
        n_heads = heads(self.model)
        degree = 2
        while degree <= max(node, tp):
            fits = ws % degree == 0 and ws > degree and (not n_heads or n_heads % degree == 0)
            if fits and (degree <= node or degree == tp):
                kw = {"mesh": ("dp_shard", ws // degree, "tp", degree), "parallelize_plan": plan}
                label = f"{ws} ranks (FSDP {ws // degree} x TP {degree})"
                out.append(Choice("mesh", label, kw, mesh=(ws, ws // degree, degree)))
            degree *= 2
        return out

    def _user_mesh(self, given: dict[str, Any], meshes: list[Choice]) -> Choice:
        ws0 = self.world_sizes[0]
        if "mesh" not in given:
            return next(c for c in meshes if c.mesh[0] == ws0)
        wanted = _flat_mesh(given["mesh"])
        for c in meshes:
            if _flat_mesh(c.kwargs.get("mesh")) == wanted:
                return c
        raise ConfigError(
            f"the mesh given, {given['mesh']!r}, is not one of the meshes tune plans on "
            f"{', '.join(str(w) for w in self.world_sizes)} ranks ("
            + ", ".join(c.label for c in meshes)
            + "): pass world_size= matching it"
        )

    def _offload_choices(self) -> list[Choice]:
        if self.api == "FSDP2":
            from torch.distributed.fsdp import CPUOffloadPolicy

            on: dict[str, Any] = {"offload_policy": CPUOffloadPolicy()}
            off: dict[str, Any] = {}
        else:
            from torch.distributed.fsdp import CPUOffload

            on, off = {"cpu_offload": CPUOffload(offload_params=True)}, {}
        return [Choice("cpu_offload", "off", off), Choice("cpu_offload", "on", on)]

    def _compile_choices(self, block: type[nn.Module] | None) -> list[Choice]:
        out = [Choice("compile", "off", {})]
        if "compile" in self.allowed:
            value: Any = [block] if block is not None else True
            label = f"each {block.__name__}" if block is not None else "the model"
            out.append(Choice("compile", label, {"compile": value}))
        return out

    def _float8_choices(self) -> list[Choice]:
        out = [Choice("float8", "off", {})]
        if "float8" in self.allowed:
            out.append(Choice("float8", "tensorwise", {"float8": True}))
            if self.api == "FSDP2":
                out.append(
                    Choice(
                        "float8",
                        "tensorwise, float8 all-gather",
                        {"float8": {"enable_fsdp_float8_all_gather": True}},
                    )
                )
        return out

    def _describe_pins(self, space: Space) -> None:
        for knob in sorted(space.pinned & set(space.choices)):
            self.notes.append(f"{knob} stays {space.user[knob].label} (pinned)")

    # ------------------------------------------------------------ evaluation
    def _key(self, config: Config) -> tuple[Any, ...]:
        """What the trace of ``config`` depends on: the knobs a replay cannot change (and the
        mesh, where it has a tensor-parallel dimension)."""
        mesh = config["mesh"]
        out: list[Any] = [mesh.label if mesh.mesh[2] > 1 else 1]
        if self._traces_accum(config):
            out.append(config["micro_batch"].label)
        for knob in KNOBS:
            c = config.get(knob)
            if c is None or knob in REPLAYED[self.api]:
                continue
            out.append(c.samples if knob == "micro_batch" else c.label)
        return tuple(out)

    def _traces_accum(self, config: Config) -> bool:
        """Whether the micro-steps of gradient accumulation are traced, not replayed: FSDP1
        with forward prefetch (its steady state depends on the first micro-step's sync)."""
        prefetch = config.get("forward_prefetch")
        return prefetch is not None and bool(prefetch.kwargs.get("forward_prefetch"))

    def _replay_changes(self, config: Config) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        for knob in REPLAYED[self.api]:
            c = config.get(knob)
            if c is None or (knob == "mesh" and c.mesh[2] > 1):
                continue
            kw = dict(c.kwargs)
            if knob == "mesh" and self.api == "FSDP2" and "world_size" in kw:
                kw["mesh"] = None
            changes.update(kw)
        if self.api == "FSDP1":
            changes = {k: v for k, v in changes.items() if k != "shard_group_size" or v}
        changes["grad_accum"] = int(config["micro_batch"].kwargs.get("grad_accum", 1))
        return changes

    def _micro_inputs(self, samples: int, user: bool = False) -> Any:
        """The inputs of a micro-batch of ``samples``; a Hugging Face model's without its
        key/value cache (``use_cache=False``, as ``gradient_checkpointing_enable`` sets it:
        training never reads the cache, and a recomputed layer would append to it again),
        except in the configuration as given."""
        key = (samples, user)
        if key not in self._inputs:
            inputs = micro_batch_inputs(self.inputs, self.space.batch, samples or self.space.batch)
            if not user and self._cache_off:
                inputs = {**inputs, "use_cache": False}
            self._inputs[key] = inputs
        return self._inputs[key]

    def evaluate(self, config: Config, user: bool = False) -> Candidate | None:
        """The candidate of ``config`` (None when FSDP refuses it); each once."""
        labels = tuple(config[k].label for k in KNOBS if k in config)
        if labels in self._seen:
            found = self._seen[labels]
            if found is not None and user:
                found.user = True
            return found
        self._seen[labels] = None
        key = (*self._key(config), user and self._cache_off)
        kwargs = self.space.kwargs(config)
        inputs = self._micro_inputs(config["micro_batch"].samples, user and self._cache_off)
        traced = False
        try:
            if key not in self._traces:
                trace_kw = dict(kwargs)
                if not self._traces_accum(config):
                    trace_kw.pop("grad_accum", None)  # replayed
                self._traces[key] = self._analyze(inputs, trace_kw)
                traced = True
            base = self._traces[key]
            if base is None:
                return None
            changes = self._replay_changes(config)
            if traced and changes["grad_accum"] == base.config.grad_accum:
                report = base
            else:
                report = replay(base, **changes)
                self.replay_count += not traced
        except FsdpvizError as e:
            if user:
                raise ConfigError(f"the configuration as given cannot be planned: {e}") from e
            self.notes.append(f"not evaluated ({', '.join(labels)}): {str(e).splitlines()[0]}")
            return None
        candidate = self._candidate(config, kwargs, inputs, report, traced, user)
        self._seen[labels] = candidate
        self._configs[candidate.index] = dict(config)
        return candidate

    def _analyze(self, inputs: Any, kwargs: dict[str, Any]) -> Report | None:
        from fsdpviz.schedule.predict import analyze

        self.trace_count += 1
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.trace_count} traces", refresh=False)
        try:
            return analyze(self.model, inputs, progress=False, machine=self.machine_arg, **kwargs)
        except FsdpvizError:
            raise

    def _candidate(
        self,
        config: Config,
        kwargs: dict[str, Any],
        inputs: Any,
        report: Report,
        traced: bool,
        user: bool,
    ) -> Candidate:
        check_fit(report)
        mem = self._memory(report)
        tl = timeline(report, optimizer=self.optimizer)
        peak = int(mem.peak["bytes"])
        reserved = int(mem.reserved.get("bytes", 0))
        fits = mem.fits if self.budget is None else peak <= self.budget
        usable = mem.usable if self.budget is None else self.budget
        t = tl.totals
        c = Candidate(
            knobs={k: config[k].label for k in _SHOWN if k in config},
            kwargs=kwargs,
            inputs=inputs,
            report=report,
            fits=bool(fits),
            peak_bytes=peak,
            reserved_bytes=reserved,
            usable_bytes=int(usable),
            step_s=float(t["step_s"]),
            tokens_per_s=float(t["tokens_per_s"]),
            mfu=float(t["mfu"]),
            exposed_comm_s=float(t["exposed_comm_s"]),
            compute_s=float(t["compute_s"]),
            world_size=report.config.ranks,
            micro_batch=config["micro_batch"].samples or self.space.batch,
            grad_accum=int(config["micro_batch"].kwargs.get("grad_accum", 1)),
            dominant=str(mem.peak.get("dominant", "")),
            memory_bytes=peak if self.budget is not None else max(peak, reserved),
            traced=traced,
            user=user,
            index=len(self.candidates),
        )
        self.candidates.append(c)
        if self._bar is not None:
            self._bar.update(1)
        return c

    def _variants(self, config: Config) -> list[Config]:
        """``config`` under every choice of the replayed knobs (none with tensor parallelism:
        a replay does not recompute its shards)."""
        replayed = sorted(REPLAYED[self.api])
        tp = config["mesh"].mesh[2]
        if tp > 1:  # a replay keeps no tensor-parallel plan: each is traced
            return [config]
        options = []
        for knob in replayed:
            values = self.space.choices[knob]
            if knob == "mesh":
                values = [config["mesh"]] if tp > 1 else [c for c in values if c.mesh[2] == 1]
            options.append(values)
        return [
            {**config, **dict(zip(replayed, combo, strict=True))}
            for combo in itertools.product(*options)
        ]

    def evaluate_key(self, config: Config) -> list[Candidate]:
        """``config`` (traced once) and every choice of the replayed knobs (replayed)."""
        out = []
        for variant in [config, *self._variants(config)]:
            c = self.evaluate(variant)
            if c is not None and c not in out:
                out.append(c)
        return out

    # ----------------------------------------------------------------- stages
    def run(self, exhaustive: bool) -> None:
        from tqdm.auto import tqdm

        enabled = self._progress
        self._bar = (
            None
            if enabled is False
            else tqdm(desc="fsdpviz tune", unit="config", delay=0 if enabled else 1.0, leave=False)
        )
        try:
            user = self.evaluate(dict(self.space.user), user=True)
            assert user is not None
            self.user = user
            self.evaluate_key(dict(self.space.user))
            if exhaustive:
                self._exhaustive()
            else:
                self._staged()
            self._needs()
        finally:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def _exhaustive(self) -> None:
        traced = [k for k in KNOBS if k in self.space.choices and k not in REPLAYED[self.api]]
        for combo in itertools.product(*(self.space.choices[k] for k in traced)):
            config = {**self.space.user, **dict(zip(traced, combo, strict=True))}
            self.evaluate_key(config)

    def _start(self) -> Config:
        sp = self.space
        config = dict(sp.user)
        for knob in ("wrap", "precision", "activation_checkpointing", "micro_batch"):
            if knob not in sp.pinned:
                config[knob] = sp.choices[knob][0]
        for knob in ("cpu_offload", "compile", "float8", "forward_prefetch"):
            if knob in sp.choices and knob not in sp.pinned:
                config[knob] = sp.user[knob]
        return config

    def _fastest_fit(self, world_size: int | None = None) -> Candidate | None:
        fitting = [
            c
            for c in self.candidates
            if c.fits and (world_size is None or c.world_size == world_size)
        ]
        return max(fitting, key=lambda c: c.tokens_per_s) if fitting else None

    def _staged(self) -> None:
        for ws in self.world_sizes:
            self._stages(ws)
        sp = self.space
        if "cpu_offload" in sp.pinned:
            return
        offload = sp.choices["cpu_offload"][-1]
        best = self._best_traced(self._start())
        if self._fastest_fit() is None:  # CPU offload: the last resort
            lightest = min(self.candidates, key=lambda c: c.memory_bytes)
            config = self._config_of(lightest)
            if config is not None and config["cpu_offload"].label != offload.label:
                self.evaluate_key({**config, "cpu_offload": offload})
        elif "cpu_offload" in self.allowed and best["cpu_offload"].label != offload.label:
            self.evaluate_key({**best, "cpu_offload": offload})

    def _stages(self, ws: int) -> None:
        """The search on ``ws`` ranks (the meshes of other world sizes come with each trace,
        replayed)."""
        sp = self.space
        start = self._start()
        user_tp = sp.user["mesh"].mesh[2]
        mine = [m for m in sp.choices["mesh"] if m.mesh[0] == ws and m.mesh[2] == user_tp]
        if not mine:
            return
        start["mesh"] = mine[0]
        self._climb(start, ws)
        if self._state_too_big(ws):
            note = (
                f"on {ws} ranks the sharded parameters, gradients and optimizer state alone "
                "exceed the memory: no units, checkpointing or tensor parallelism can fit it"
            )
            self.notes.append(note)
            return
        # the other wrap plans: at the best trace key, or climbing each where the usual
        # units fit nowhere; then FSDP1's forward prefetch and what allow= permits
        if "wrap" not in sp.pinned:
            fitted = self._fastest_fit(ws) is not None
            best = self._best_traced(start, ws)
            others = [c for c in sp.choices["wrap"] if c.label != start["wrap"].label]
            if len(others) > 1:
                others = [c for c in others if c.label != "the root alone"]
            for choice in others:
                if fitted:
                    self.evaluate_key({**best, "wrap": choice})
                else:
                    self._climb({**start, "wrap": choice}, ws)
        best = self._best_traced(start, ws)
        for knob in ("forward_prefetch", "compile", "float8"):
            if knob not in sp.choices or knob in sp.pinned:
                continue
            for choice in sp.choices[knob]:
                if choice.label != best[knob].label:
                    self.evaluate_key({**best, knob: choice})
            best = self._best_traced(best, ws)
        # tensor parallelism: where nothing fits without it, or the user plans with it
        tp_meshes = [
            m
            for m in sp.choices["mesh"]
            if m.mesh[0] == ws and m.mesh[2] > 1 and m.mesh[2] != user_tp
        ]
        if "mesh" not in sp.pinned and (self._fastest_fit(ws) is None or user_tp > 1):
            if not tp_meshes and self._fastest_fit(ws) is None and self._tp_why:
                note = f"tensor parallelism not tried: {self._tp_why}"
                if note not in self.notes:
                    self.notes.append(note)
            for mesh in sorted(tp_meshes, key=lambda m: m.mesh[2]):
                self._climb({**best, "mesh": mesh}, ws)
            if self._tp_standard and any(c.report.config.tp_world_size for c in self.candidates):
                note = (
                    "tensor parallelism with the model's own plan "
                    f"({'torchtitan' if self._source == 'torchtitan' else 'its config'}'s)"
                )
                if note not in self.notes:
                    self.notes.append(note)

    def _state_too_big(self, ws: int) -> bool:
        """Whether, on ``ws`` ranks, what every rank holds of the sharded state (parameters,
        gradients and optimizer state: the whole state over the ranks, whatever the mesh)
        is already more than the memory, in the lightest configuration evaluated."""
        if self._fastest_fit(ws) is not None:
            return False
        mine = [c for c in self.candidates if c.world_size == ws and not c.user]
        if not mine:
            return False
        keys = ("sharded_params", "sharded_grads", "optimizer")

        def state(c: Candidate) -> int:
            mem = self._memory(c.report)
            return sum(int(mem.peak.get("breakdown", {}).get(k, 0)) for k in keys)

        least = min(mine, key=state)
        return state(least) > least.usable_bytes

    def _memory(self, report: Report) -> Any:
        """The memory model of ``report`` for this search's optimizer."""
        if self.optimizer == "adamw":
            return report.memory
        return memory_model(report, optimizer=self.optimizer)

    def _climb(self, start: Config, ws: int) -> None:
        """From the lightest configurations (the most checkpointing; if they do not fit on
        ``ws`` ranks, nothing with the other knobs of ``start`` does) to the fastest: each
        micro-batch from the largest, checkpointing from the lightest until one fits on
        ``ws`` ranks."""
        sp = self.space
        acs = sp.choices["activation_checkpointing"]
        mbs = sp.choices["micro_batch"]

        def fits(found: list[Candidate]) -> bool:
            return any(c.fits and c.world_size == ws for c in found)

        # The least memory is at the most checkpointing, and at the largest micro-batch (no
        # accumulation: no unsharded gradients kept between micro-steps) or the smallest
        # (the fewest activations): if neither fits, nothing with these knobs does.
        heaviest = acs[-1]
        if not any(
            fits(
                self.evaluate_key(
                    {**start, "micro_batch": mb, "activation_checkpointing": heaviest}
                )
            )
            for mb in dict.fromkeys([mbs[-1], mbs[0]])
        ):
            return
        lightest_fit: int | None = None
        fastest_at: dict[int, float] = {}  # checkpointing index -> fastest at a larger mb
        for mb in mbs:
            limit = len(acs) if lightest_fit is None else lightest_fit
            fitted = None
            for i, ac in enumerate(acs[:limit]):
                fastest = self._fastest_fit(ws)
                bound = fastest_at.get(i)
                if fastest is not None and bound is not None and bound <= fastest.tokens_per_s:
                    continue  # a smaller micro-batch is no faster than this one was
                found = self.evaluate_key(
                    {**start, "micro_batch": mb, "activation_checkpointing": ac}
                )
                mine = [c for c in found if c.world_size == ws]
                if mine:
                    fastest_at[i] = max(c.tokens_per_s for c in mine)
                if fits(found):
                    fitted = i
                    break
            if fitted is not None:
                lightest_fit = fitted if lightest_fit is None else min(lightest_fit, fitted)
            if lightest_fit == 0:
                break

    def _config_of(self, c: Candidate) -> Config | None:
        return self._configs.get(c.index)

    def _best_traced(self, fallback: Config, world_size: int | None = None) -> Config:
        """The configuration of the fastest fit so far on ``world_size`` ranks (any: None),
        else of the lowest peak."""
        best = self._fastest_fit(world_size)
        pool = [c for c in self.candidates if world_size is None or c.world_size == world_size]
        if best is None and pool:
            best = min(pool, key=lambda c: c.memory_bytes)
        if best is None:
            return fallback
        return self._config_of(best) or fallback

    def _needs(self) -> None:
        """When nothing fits: how many ranks the lowest peak needs to fit (its sharded state
        shrinks with them), or why more ranks do not help."""
        if self._fastest_fit() is not None or not self.candidates:
            return
        lightest = min(self.candidates, key=lambda c: c.memory_bytes)
        needs: dict[str, Any] = {
            "candidate": lightest.index, "world_size": None, "peak_bytes": None, "reason": ""
        }  # fmt: skip
        self.needs = needs
        report = lightest.report
        if report.config.tp_world_size or report.config.mesh is not None:
            needs["reason"] = "how many ranks would fit is not worked out for a 2-D mesh"
            return
        ws, low = lightest.world_size, lightest.peak_bytes
        while ws < 1 << 16:
            ws *= 2
            changes: dict[str, Any] = {"world_size": ws}
            if report.config.api == "FSDP2":
                changes["mesh"] = None
            try:
                other = replay(report, **changes)
            except FsdpvizError as e:
                needs["reason"] = str(e).splitlines()[0]
                return
            mem = (
                other.memory
                if self.optimizer == "adamw"
                else memory_model(other, optimizer=self.optimizer)
            )
            peak = int(mem.peak["bytes"])
            if mem.fits if self.budget is None else peak <= self.budget:
                needs.update(world_size=ws, peak_bytes=peak)
                return
            if peak >= low:  # the sharded state no longer shrinks what the peak holds
                break
            low = peak
        breakdown = lightest.report.memory.peak.get("breakdown", {})
        per_rank = sum(
            v
            for k, v in breakdown.items()
            if k not in ("sharded_params", "sharded_grads", "optimizer")
        )
        needs["reason"] = (
            f"more ranks do not make it fit: {size_text(per_rank)} of its peak (activations, "
            "unsharded parameters and gradients, buffers) does not shrink with the ranks; "
            "a smaller micro-batch or sequence, or more checkpointing, would"
        )


_SHOWN = (
    "mesh", "wrap", "reshard_after_forward", "backward_prefetch", "forward_prefetch",
    "activation_checkpointing", "precision", "micro_batch", "cpu_offload", "compile", "float8",
)  # fmt: skip


def _keeps_a_cache(model: nn.Module, inputs: Any) -> bool:
    """Whether ``model`` (a Hugging Face model taking ``use_cache``) keeps a key/value cache
    with these keyword inputs."""
    import inspect

    if not isinstance(inputs, dict) or "use_cache" in inputs:
        return False
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    config = getattr(model, "config", None)
    return "use_cache" in params and bool(getattr(config, "use_cache", False))


def _mb_label(samples: int, steps: int) -> str:
    step = "micro-step" if steps == 1 else "micro-steps"
    return f"{samples} x {steps} {step}"


def _tp_degree(given: Mapping[str, Any]) -> int:
    if "parallelize_plan" not in given or "mesh" not in given:
        return 1
    from fsdpviz.plan.fsdp2 import mesh_dims

    sizes, _ = mesh_dims(given["mesh"], 3)
    return int(sizes[-1]) if sizes else 1


def _flat_mesh(mesh: Any) -> list[Any]:
    if mesh is None:
        return []
    from fsdpviz.plan.fsdp2 import mesh_dims

    sizes, names = mesh_dims(mesh, 3)
    return [*names, *(sizes or ())]


def _same_kwargs(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = set(a) | set(b)
    return all(_same_value(a.get(k), b.get(k)) for k in keys)


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        if a == b:
            return True
    except Exception:
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is type(b) and hasattr(a, "__dict__") and hasattr(b, "__dict__"):
        return bool(vars(a) == vars(b))
    return False


def _same_ac(choice: Choice, spec: Any) -> bool:
    mine = choice.kwargs.get("activation_checkpointing")
    return _same_value(mine, spec)


def _value_label(kwargs: Mapping[str, Any]) -> str:
    if not kwargs:
        return "as given (default)"
    parts = []
    for k, v in kwargs.items():
        name = getattr(v, "name", None) or getattr(v, "__name__", None)
        parts.append(f"{k}={name or v!r}")
    return ", ".join(parts)


__all__ = ["suggest", "tune"]
