"""The choices of each knob for one search, and the user's own: a :class:`Space`, built from
the model's structure, the keywords as given, the machine and the world sizes (the mesh and
pipeline knobs' in :mod:`~fsdpviz.tuning.mesh_choices`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, CPUOffloadPolicy, ShardingStrategy

from fsdpviz.cost.hardware import Machine
from fsdpviz.errors import ConfigError
from fsdpviz.plan.job import Float8, parse_job_options
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.trace.probe_records import batch_tokens
from fsdpviz.tuning.float8_styles import (
    FLOAT8_TP,
    float8_tp_plan,
    has_float8_styles,
    plain_tp_plan,
)
from fsdpviz.tuning.mesh_choices import MeshChoices, given_dims, pipelined
from fsdpviz.tuning.space import (
    OWNED,
    PIPELINE_KNOBS,
    Choice,
    Space,
    TuneKwargs,
    batch_size,
    block_class,
    block_names,
    checkpoint_choices,
    checkpoint_label,
    divisors,
    micro_batch_label,
    param_dtype,
    precision_label,
    reshard_kwargs,
    standard_precision,
    standard_tp_plan,
    wrap_plans,
)

__all__ = ["SpaceBuilder"]


class SpaceBuilder(MeshChoices):
    """Builds the :class:`Space` of a search (``build``); ``notes`` says what it pinned,
    ``tp_why`` why tensor parallelism cannot be tried, ``tp_standard`` whether its plan is
    the model's own."""

    pipelined = False

    def __init__(
        self,
        model: nn.Module,
        inputs: Any,
        api: str,
        machine: Machine,
        world_sizes: list[int],
        allowed: set[str],
        fixed: Mapping[str, Any],
        source: str,
    ) -> None:
        self.model = model
        self.inputs = inputs
        self.api = api
        self.machine = machine
        self.world_sizes = world_sizes
        self.allowed = allowed
        self._fixed = fixed
        self._source = source
        self.notes: list[str] = []
        self.tp_why = ""
        self.tp_standard = False
        self._tp_plan: Any = None  # the plan of the meshes tune makes (None: theirs as given)

    def build(self, kwargs: TuneKwargs, pinned: set[str], tokens_per_step: int | None) -> Space:
        """The choices of every knob, and the user's (see :class:`Space`)."""
        api, model = self.api, self.model
        self.pipelined = pipelined(kwargs)
        side = 0 if api == "FSDP2" else 1
        owned = set().union(*(o[side] for o in OWNED.values()))
        base = cast(TuneKwargs, {k: v for k, v in kwargs.items() if k not in owned})
        block = block_class(model)
        blocks = block_names(model, block)
        choices: dict[str, list[Choice]] = {}
        user: dict[str, Choice] = {}

        keywords: Mapping[str, object] = kwargs

        def given(knob: str) -> TuneKwargs:
            return cast(TuneKwargs, {k: keywords[k] for k in OWNED[knob][side] if k in keywords})

        # units
        plans = wrap_plans(model, api, block)
        wrap = [Choice("wrap", label, kw) for label, kw in plans.items()]
        user_wrap = given("wrap")
        if not user_wrap:
            user_wrap = {"fully_shard": []} if api == "FSDP2" else {"auto_wrap_policy": None}
        mine_wrap = next((c for c in wrap if _same_wrap(model, c.kwargs, user_wrap)), None)
        if mine_wrap is None:
            mine_wrap = Choice("wrap", "as given", user_wrap)
            wrap.append(mine_wrap)
        choices["wrap"], user["wrap"] = wrap, mine_wrap
        # resharding / sharding strategy, backward and forward prefetch (FSDP1)
        node = self.machine.gpus_per_node
        multi = any(ws > node and ws % node == 0 for ws in self.world_sizes)
        resharding = RESHARD.name  # the knob: FSDP2's option, FSDP1's sharding strategy
        if api == "FSDP2":
            raf = [
                Choice(resharding, "all but the root", reshard_kwargs(None)),
                Choice(resharding, "never", reshard_kwargs(False)),
            ]
            if blocks:
                last = blocks[-1]
                keep_last = reshard_kwargs({last: False})
                raf.append(Choice(resharding, f"all but the root and {last}", keep_last))
            if multi:
                raf.append(Choice(resharding, f"to {node} ranks (a node)", reshard_kwargs(node)))
            user[resharding] = self._user_choice(
                raf, resharding, given(resharding), reshard_kwargs(None)
            )
            choices[resharding] = raf
        else:
            strategies = [
                Choice(
                    resharding,
                    s,
                    {"sharding_strategy": ShardingStrategy[s], "shard_group_size": None},
                )
                for s in ("FULL_SHARD", "SHARD_GRAD_OP")
            ]
            if multi:
                strategies.append(
                    Choice(
                        resharding,
                        f"HYBRID_SHARD ({node} ranks a shard group)",
                        {
                            "sharding_strategy": ShardingStrategy.HYBRID_SHARD,
                            "shard_group_size": node,
                        },
                    )
                )
            user[resharding] = self._user_choice(
                strategies, resharding, given(resharding), strategies[0].kwargs
            )
            choices[resharding] = strategies
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
        # micro-batch: every size that divides the samples per step, its micro-steps without
        # gradient sync but the last (grad_accum) and each reducing (a plain loop's)
        batch = batch_size(self.inputs)
        accum = int(kwargs.get("grad_accum", 1))
        user_mb = Choice(
            "micro_batch",
            micro_batch_label(batch, accum),
            {"grad_accum": accum} if accum > 1 else {"grad_accum": 1},
            samples=batch,
        )
        mbs = [user_mb]
        pins: list[Choice] = []
        if batch:
            samples = batch * accum if tokens_per_step is None else 0
            if tokens_per_step is not None:
                samples = self._samples_per_step(tokens_per_step, batch)
            mbs = []
            for d in divisors(samples):
                if d > batch:
                    continue
                n = samples // d
                mbs.append(
                    Choice("micro_batch", micro_batch_label(d, n), {"grad_accum": n}, samples=d)
                )
                if n > 1 and not self.pipelined:
                    mbs.append(_reducing(d, n))
            if "grad_accum" not in kwargs and samples > batch and samples % batch == 0:
                # more tokens per step than the inputs, and no grad_accum: the inputs'
                # backward repeated, each reducing (FSDP syncs unless told not to)
                user_mb = _reducing(batch, samples // batch)
            if user_mb not in mbs:
                mbs.append(user_mb)
        if "micro_batch" in self._fixed:
            wanted = self._fixed["micro_batch"]
            pins = [c for c in mbs if c.samples == wanted]
            if not pins:
                sizes = ", ".join(str(c.samples) for c in mbs if not c.steps)
                raise ConfigError(
                    f"fixed micro_batch={wanted!r}: the micro-batches that make up the tokens "
                    f"per step are {sizes}"
                )
            user_mb = next((c for c in pins if c == user_mb), pins[0])
        choices["micro_batch"], user["micro_batch"] = mbs, user_mb
        # the mesh: data parallel (HSDP on multi-node jobs), and tensor parallelism with the
        # user's plan or, for a model that needs it, its own
        user_mesh = given("mesh")
        refused: set[tuple[str, str]] = set()
        if self.pipelined:  # the job's mesh and its other pp degrees (each traced)
            choices["pipeline"], user["pipeline"] = self._pipeline_choices(given("pipeline"))
            schedules = [user["pipeline"]] if "pipeline" in pinned else choices["pipeline"]
            meshes = self._pipeline_meshes(user_mesh, schedules, batch, "mesh" in pinned, refused)
            mine_mesh = meshes[0]
        elif given_dims(user_mesh).cp > 1:  # the job's context-parallel mesh, as given
            mine_mesh = self._context_parallel_mesh(user_mesh)
            meshes = [mine_mesh]
        else:
            tp = given_dims(user_mesh).tp
            plan = user_mesh.get("parallelize_plan")
            self.tp_standard = plan is None
            if plan is None:
                plan, why = standard_tp_plan(model, self._source)
                if plan is None:
                    self.tp_why = why
            self._tp_plan = plan
            meshes = []
            for ws in self.world_sizes:
                meshes.extend(self._meshes(ws, tp, plan))
            mine_mesh = self._user_mesh(user_mesh, meshes)
        choices["mesh"], user["mesh"] = meshes, mine_mesh
        # offload, compile, float8
        user_f8 = self._float8_spec(given("float8"))
        for knob, values in (
            ("cpu_offload", self._offload_choices()),
            ("compile", self._compile_choices(block)),
            ("float8", self._float8_choices(user_f8)),
        ):
            mine_value = given(knob)
            default = values[0]
            if knob == "float8":
                me = next((c for c in values if self._float8_spec(c.kwargs) == user_f8), None)
            else:
                me = next((c for c in values if _same_kwargs(c.kwargs, mine_value)), None)
            if me is None:
                label = _value_label(mine_value)
                if knob == "float8" and user_f8 is not None:
                    label = _float8_label(user_f8)
                me = Choice(knob, label, mine_value)
                values.append(me)
            if not mine_value:
                me = default
            choices[knob], user[knob] = values, me
        if self.pipelined:
            kept = sorted(set(choices) - PIPELINE_KNOBS - pinned)
            if kept:
                self.notes.append(
                    f"under pipeline parallelism {', '.join(kept)} stay as given: tune turns "
                    "the pipeline degree and schedule, checkpointing, precision and resharding "
                    "there"
                )
            pinned = pinned | set(kept)
        for knob in pinned & set(choices):
            # a micro-batch pinned by its size keeps both ways to accumulate
            choices[knob] = pins if knob == "micro_batch" and pins else [user[knob]]
        if "micro_batch" in pinned and tokens_per_step is not None:
            self.notes.append("micro_batch is pinned, so tokens_per_step is not applied")
        space = Space(
            api,
            blocks,
            choices,
            user,
            base,
            batch,
            frozenset(pinned),
            self.pipelined,
            frozenset(refused),
        )
        self._describe_pins(space)
        return space

    def _user_choice(
        self,
        choices: list[Choice],
        knob: str,
        given: TuneKwargs,
        default: TuneKwargs,
    ) -> Choice:
        wanted = given or default
        for c in choices:
            if _same_kwargs(c.kwargs, wanted):
                return c
        mine = Choice(knob, _value_label(wanted), wanted.copy())
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
        tokens = batch_tokens(self.inputs)
        return max(1, tokens // max(batch, 1))

    def _offload_choices(self) -> list[Choice]:
        if self.api == "FSDP2":
            on: TuneKwargs = {"offload_policy": CPUOffloadPolicy()}
            off: TuneKwargs = {}
        else:
            on, off = {"cpu_offload": CPUOffload(offload_params=True)}, {}
        return [Choice("cpu_offload", "off", off), Choice("cpu_offload", "on", on)]

    def _compile_choices(self, block: type[nn.Module] | None) -> list[Choice]:
        out = [Choice("compile", "off", {})]
        if "compile" in self.allowed:
            value: Any = [block] if block is not None else True
            label = f"each {block.__name__}" if block is not None else "the model"
            out.append(Choice("compile", label, {"compile": value}))
        return out

    def _float8_choices(self, user: Float8 | None) -> list[Choice]:
        """Off, tensorwise, and (FSDP2) tensorwise with float8 all-gathers; the linears the
        user's recipe keeps in high precision (``filter_fqns``: a choice of numerics, such as
        torchtitan's output head) stay so in each. On a tensor-parallel mesh a tensorwise
        recipe takes torchao's float8 styles where torchtitan's ``apply_tp`` would (see
        :func:`_tp_plans`)."""
        filters = list(user.filter_fqns) if user is not None else []
        specs = [Float8(filter_fqns=tuple(filters))]
        off, tensorwise, alternative = self._tp_plans(specs[0])
        out = [Choice("float8", "off", {}, tp_plan=off)]
        if "float8" not in self.allowed:
            return out
        if self.api == "FSDP2":
            specs.append(Float8(enable_fsdp_float8_all_gather=True, filter_fqns=tuple(filters)))
        for spec in specs:
            value: Any = True
            if spec.enable_fsdp_float8_all_gather or filters:
                value = {k: v for k, v in spec.to_dict().items() if k != "recipe_name" and v}
            label = _float8_label(spec)
            out.append(Choice("float8", label, {"float8": value}, tp_plan=tensorwise))
            if alternative is not None:
                kw: TuneKwargs = {"float8": value}
                out.append(Choice("float8", f"{label}, {FLOAT8_TP}", kw, tp_plan=alternative))
        return out

    def _tp_plans(self, spec: Float8) -> tuple[Any, Any, Any]:
        """The tensor-parallel plans of the float8 choices (None: the meshes' own): with
        float8 off, with a tensorwise recipe, and one to try beside it. torchtitan's
        ``enable_float8_tensorwise_tp`` is followed for the model's own plan and a
        torchtitan job's: torchao's float8 styles with a tensorwise recipe, torch's without
        (a plan given with torchao's styles, torch's for float8 off); the user's own plan of
        torch's styles is kept as given, torchao's styles tried beside it."""
        plan = self._tp_plan
        if not isinstance(plan, Mapping):
            return None, None, None
        if has_float8_styles(plan):
            return plain_tp_plan(plan), None, None
        titan = self._source == "torchtitan"
        block = block_class(self.model)
        f8 = float8_tp_plan(self.model, plan, spec, block, prepare_inputs=titan)
        if self.tp_standard or titan:
            return None, f8, None
        return None, None, f8

    def _float8_spec(self, kwargs: Mapping[str, Any]) -> Float8 | None:
        """The float8 training ``kwargs`` ask for, as analyze reads it (None: none)."""
        return parse_job_options({"float8": kwargs.get("float8")}, self.api).float8

    def _describe_pins(self, space: Space) -> None:
        for knob in sorted(space.pinned & set(space.choices)):
            self.notes.append(f"{knob} stays {space.user[knob].label} (pinned)")


def _same_wrap(model: nn.Module, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two wrap plans make the same units: ``fully_shard`` lists naming the same
    modules (by class or by FQN), or policies wrapping the same module classes."""
    if _same_kwargs(a, b):
        return True
    if "fully_shard" in a and "fully_shard" in b:
        return _shard_groups(model, a["fully_shard"]) == _shard_groups(model, b["fully_shard"])
    if "auto_wrap_policy" in a and "auto_wrap_policy" in b:
        classes = [_policy_classes(p) for p in (a["auto_wrap_policy"], b["auto_wrap_policy"])]
        return classes[0] is not None and classes[0] == classes[1]
    return False


def _shard_groups(model: nn.Module, calls: Any) -> frozenset[frozenset[str]] | None:
    """The modules each ``fully_shard`` call takes, by FQN (None where a call is neither a
    class, an FQN nor a tuple of FQNs)."""
    if not isinstance(calls, (list, tuple)):
        return None
    named = list(model.named_modules())
    out: set[frozenset[str]] = set()
    for call in calls:
        if isinstance(call, type):
            picked = [n for n, m in named if n and type(m) is call]
            out.update(
                frozenset([n]) for n in picked if not any(n.startswith(o + ".") for o in picked)
            )
        elif isinstance(call, str):
            out.add(frozenset([call]))
        elif isinstance(call, tuple) and all(isinstance(x, str) for x in call):
            out.add(frozenset(call))
        else:
            return None
    return frozenset(out)


def _policy_classes(policy: Any) -> frozenset[type] | None:
    """The module classes an FSDP1 wrap policy wraps (``ModuleWrapPolicy``, or
    ``transformer_auto_wrap_policy`` with its classes); None for any other policy."""
    classes = getattr(policy, "_module_classes", None)
    if classes is None:
        keywords = getattr(policy, "keywords", None) or {}
        classes = keywords.get("transformer_layer_cls")
    return frozenset(classes) if classes else None


def _reducing(samples: int, steps: int) -> Choice:
    """``steps`` micro-steps of ``samples`` per optimizer step, each reducing its gradients:
    the plan is one micro-step (no ``grad_accum``), the time and memory models repeat it."""
    label = f"{micro_batch_label(samples, steps)}, each reduced"
    return Choice("micro_batch", label, {"grad_accum": 1}, samples=samples, steps=steps)


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


def _float8_label(spec: Float8) -> str:
    """A float8 recipe in words: ``"tensorwise, float8 all-gather, except output"``."""
    parts = [spec.recipe_name]
    if spec.enable_fsdp_float8_all_gather:
        parts.append("float8 all-gather")
    if spec.filter_fqns:
        parts.append("except " + ", ".join(spec.filter_fqns))
    return ", ".join(parts)


def _value_label(kwargs: Mapping[str, Any]) -> str:
    """A value as given, in words (FSDP2's resharding per group: which keep their parameters
    after forward)."""
    if not kwargs:
        return "as given (default)"
    raf = kwargs.get(RESHARD.name)
    if len(kwargs) == 1 and isinstance(raf, Mapping):
        return _reshard_label(raf)
    if len(kwargs) == 1 and raf is True:
        return "all, the root too"
    parts = []
    for k, v in kwargs.items():
        name = getattr(v, "name", None) or getattr(v, "__name__", None)
        parts.append(f"{k}={name or v!r}")
    return ", ".join(parts)


def _reshard_label(per_group: Mapping[str, Any]) -> str:
    """``{group: bool | int}`` in words: ``"all but norm, output"`` (those keep theirs)."""
    kept = [g or "(root)" for g, v in per_group.items() if v is False]
    ints = sorted({v for v in per_group.values() if not isinstance(v, bool)})
    if not kept and not ints:
        return "all"
    if len(kept) == len(per_group):
        return "never"
    parts = [f"all but {', '.join(kept)}" if kept else "all"]
    if ints:
        parts.append(f"to {', '.join(map(str, ints))} ranks where given")
    return "; ".join(parts)
