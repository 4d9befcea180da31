"""tune's code, run: each configuration's ``Candidate.code()`` executed as printed on real
FSDP (the fake process group's 4 ranks, on the CPU), its loop trained for three optimizer
steps and recorded, and the recording compared with the configuration's plan: the units
(which modules are sharded, their parameters and dtypes), the events of every micro-step in
order (resharding after forward included, CPU offload's copies to and from the host), the
modules checkpointed and, per operator, what the policy saves. The edits: the device mesh (and
FSDP1's ``device_id``) on ``"cpu"`` instead of ``"cuda"``, and the offloaded shards unpinned
(pinning needs a GPU: FSDP2's ``pin_memory=False``, FSDP1's ``pin_memory`` patched, see
``_offload_on_cpu``).

The configurations are a cover of two exhaustive searches (the knobs traced, the knobs
replayed): every pair of values of two knobs, on a plain ``nn.Module`` and a Hugging Face
Llama, FSDP2 and FSDP1. A machine of two GPUs a node makes the 4 ranks two nodes, so that
the resharding to a node (an int) and HSDP are among them. Also the torchtitan TOML and the
accelerate YAML of each, their keys against the configuration.
"""

from __future__ import annotations

import contextlib
import math
import tomllib
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import torch
import yaml
from fsdp_harness import assert_same_accumulation, assert_same_schedule
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    OffloadPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.utils.checkpoint import CheckpointPolicy

import fsdpviz
from fsdpviz.configs.torchtitan_job import mesh_degrees
from fsdpviz.configs.torchtitan_plan import EveryNthBlock
from fsdpviz.cost import machine
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_model
from fsdpviz.schema.checkpointing import CheckpointEvery, SelectiveCheckpoint
from fsdpviz.trace.checkpointing import checkpointed_modules
from fsdpviz.trace.tracker import default_loss
from fsdpviz.tuning import Candidate, Tuning
from fsdpviz.tuning.code import configuration_code
from fsdpviz.tuning.fsdp_code import Candidate as CodeOf
from fsdpviz.tuning.space import TuneKwargs

TWO_A_NODE = machine("h100", gpus_per_node=2)
CONFIG = ExampleConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_heads=4)
STEPS = 3


def _plain() -> nn.Module:
    torch.manual_seed(0)
    return example_model(CONFIG, device="cpu")


def _llama() -> nn.Module:
    import hf_models

    torch.manual_seed(0)
    return hf_models.llama()[0]


def _ids(vocab: int, batch: int = 4, seq: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g)}


def _block(name: str) -> type[nn.Module]:
    if name == "plain":
        return DecoderLayer
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return LlamaDecoderLayer


MODELS: dict[str, tuple[Callable[[], nn.Module], int]] = {
    "plain": (_plain, 128),
    "llama": (_llama, 96),
}


# What the searches turn: the knobs that change what is traced (each configuration traced),
# and those replayed from a trace (FSDP's options, the mesh, offload), apart: every
# combination of each set, of which the tests run a cover.
KNOB_SETS = {
    "traced": ("wrap", "activation_checkpointing", "micro_batch"),
    "replayed": (
        "reshard_after_forward", "mesh", "precision", "cpu_offload", "backward_prefetch",
        "forward_prefetch",
    ),
}  # fmt: skip


def _tune(name: str, api: str, knobs: tuple[str, ...]) -> Tuning:
    build, vocab = MODELS[name]
    block = _block(name)
    mine: dict[str, Any] = (
        {"fully_shard": [block]}
        if api == "FSDP2"
        else {"auto_wrap_policy": ModuleWrapPolicy({block})}
    )
    return fsdpviz.tune(
        build(),
        _ids(vocab),
        world_size=4,
        machine=TWO_A_NODE,
        exhaustive=True,
        knobs=knobs,
        allow=("cpu_offload",),
        memory_budget=1 << 40,
        progress=False,
        workers=1,
        **mine,
    )


def cover(candidates: list[Candidate]) -> list[Candidate]:
    """Few configurations that hold every pair of values of two knobs (greedy: the one that
    adds the most pairs first, the search's order breaking ties)."""

    def pairs(c: Candidate) -> set[tuple[str, str, str, str]]:
        items = sorted(c.knobs.items())
        return {(k, v, k2, v2) for i, (k, v) in enumerate(items) for k2, v2 in items[i:]}

    left = set().union(*(pairs(c) for c in candidates))
    out: list[Candidate] = []
    while left:
        best = max(candidates, key=lambda c: len(pairs(c) & left))
        out.append(best)
        left -= pairs(best)
    return out


# ------------------------------------------------------------------ running the code
def on_cpu(code: str) -> str:
    """The code as printed, its device mesh (and FSDP1's device) on the CPU."""
    return (
        code.replace('init_device_mesh("cuda"', 'init_device_mesh("cpu"')
        .replace("device_id=torch.cuda.current_device()", 'device_id=torch.device("cpu")')
        .replace("CPUOffloadPolicy()", "CPUOffloadPolicy(pin_memory=False)")
    )


class _Optimizer:
    """What the loop calls: ``step`` (the plan has no optimizer's events) and ``zero_grad``,
    which drops the gradients as an optimizer's does."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def step(self) -> None:
        pass

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)


@contextlib.contextmanager
def _policies_logged(log: list[list[tuple[Any, bool, CheckpointPolicy]]]) -> Iterator[None]:
    """Each selective checkpoint region's decisions, ``(operator, recomputing, policy)``, as
    the emitted policy makes them (``create_selective_checkpoint_contexts`` wrapped)."""
    import torch.utils.checkpoint as cp

    made = cp.create_selective_checkpoint_contexts

    def logging(policy: Any, *args: Any, **kwargs: Any) -> Any:
        region: list[tuple[Any, bool, CheckpointPolicy]] = []
        log.append(region)

        def logged(ctx: Any, func: Any, *a: Any, **kw: Any) -> CheckpointPolicy:
            decision: CheckpointPolicy = policy(ctx, func, *a, **kw)
            region.append((func, ctx.is_recompute, decision))
            return decision

        return made(logged, *args, **kwargs)  # type: ignore[no-untyped-call]

    cp.create_selective_checkpoint_contexts = logging  # type: ignore[assignment]
    try:
        yield
    finally:
        cp.create_selective_checkpoint_contexts = made


@contextlib.contextmanager
def _offload_on_cpu() -> Iterator[None]:
    """FSDP1's CPU offload on a CPU: ``Tensor.pin_memory`` the tensor itself, as FSDP1 pins
    each unit's shard and gradient (``FlatParamHandle.init_flat_param_attributes``,
    ``_pre_forward``'s ``_cpu_grad``) unconditionally and pinning needs a GPU (FSDP2's code
    pins nothing on the CPU: ``pin_memory=False``, ``on_cpu``); and the CPU's stream
    synchronized at the end of backward (``_post_backward_final_callback`` waits there for
    the gradients' copies to the CPU; ``torch.cpu.Stream``, whose work is done when it is
    called, has no ``synchronize``). Pinned or not, the offload's copies and events are the
    same."""
    pin = torch.Tensor.pin_memory
    had = hasattr(torch.cpu.Stream, "synchronize")
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    if not had:
        torch.cpu.Stream.synchronize = lambda self: None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.Tensor.pin_memory = pin  # type: ignore[method-assign]
        if not had:
            del torch.cpu.Stream.synchronize  # type: ignore[attr-defined]


def run(
    c: CodeOf, build: Callable[[], nn.Module]
) -> tuple[nn.Module, fsdpviz.Report, list[list[tuple[Any, bool, CheckpointPolicy]]]]:
    """Execute ``c``'s code on ``build()`` and train ``STEPS`` optimizer steps with its loop,
    recorded."""
    setup, _, loop = on_cpu(configuration_code(c)).partition("\n# each")
    assert loop, "the code has no loop"
    model = build()
    # the model's classes, imported as the code's comments ask
    ns: dict[str, Any] = {"model": model, **{type(m).__name__: type(m) for m in model.modules()}}
    n = c.grad_accum
    batch = {
        k: v.repeat(n, 1) for k, v in c.inputs.items() if isinstance(v, torch.Tensor)
    }  # one rank's samples of a step: the micro-batch's, n times
    log: list[list[tuple[Any, bool, CheckpointPolicy]]] = []
    recorder = fsdpviz.FSDP2Recorder if c.report.config.api == "FSDP2" else fsdpviz.FSDP1Recorder
    with warnings.catch_warnings(), _policies_logged(log), _offload_on_cpu():
        warnings.simplefilter("ignore")
        exec(compile(setup, "<tune code>", "exec"), ns)
        model = ns["model"]
        step = compile("# each" + loop, "<tune loop>", "exec")
        with recorder(model) as rec:
            for _ in range(STEPS):
                exec(
                    step,
                    {**ns, "batch": batch, "loss_fn": default_loss, "optimizer": _Optimizer(model)},
                )
    return model, rec.report(), log


# ------------------------------------------------------------------ what is compared
def assert_ran_as_planned(c: CodeOf, real: fsdpviz.Report) -> None:
    """The recording is the plan, event for event: every micro-step of it where the
    gradients are reduced only after the last, else (each micro-step reducing) the plan of
    one micro-step, its steady state repeated."""
    assert len(real.iterations) == STEPS * c.grad_accum
    if c.grad_accum > 1 and not c.sync_each:
        assert_same_accumulation(real, c.report, c.grad_accum)
        return
    assert_same_schedule(real, c.report)
    steady = [e.to_dict() for e in real.iterations[1]]
    assert all([e.to_dict() for e in it] == steady for it in real.iterations[1:])


def _unwrapped(name: str) -> str:
    for part in ("._fsdp_wrapped_module", "._checkpoint_wrapped_module", "_fsdp_wrapped_module."):
        name = name.replace(part, "")
    return name


def assert_checkpointed_as_planned(
    c: CodeOf, model: nn.Module, build: Callable[[], nn.Module], log: list[Any]
) -> None:
    spec = c.kwargs.get("activation_checkpointing")
    wrappers = {
        _unwrapped(n): m for n, m in model.named_modules() if isinstance(m, CheckpointWrapper)
    }
    fresh = build()
    names = {id(m): n for n, m in fresh.named_modules()}
    planned = [names[id(m)] for m in checkpointed_modules(fresh, spec)]
    assert sorted(wrappers) == sorted(planned), c.knobs
    stated = c.report.config.activation_checkpointing
    assert (stated or {}).get("modules", 0) == len(planned)
    if not isinstance(spec, SelectiveCheckpoint):
        assert not log, "a policy where the plan checkpoints whole modules"
        return
    assert stated is not None and stated["mode"] == "selective"
    # every region (a block's forward and its recomputation) decides as SelectiveCheckpoint says
    assert len(log) == len(planned) * STEPS * c.grad_accum  # one a forward and its recomputation
    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.linear.default}
    saved = 0
    for region in log:
        counts = {False: 0, True: 0}
        for func, recomputing, decision in region:
            if func in matmuls:
                counts[recomputing] += 1
            every = spec.recompute_every_mm
            save = func in spec.save_ops and not (
                func in matmuls and every and counts[recomputing] % every == 0
            )
            want = CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
            assert decision == want, (func, recomputing, counts)
            saved += save
    assert saved  # the multiplies and the attention the plan saves met the policy


# ------------------------------------------------------------------ the trainers' keys
def assert_trainer_keys(c: Candidate) -> None:
    cfg = c.report.config
    spec = c.kwargs.get("activation_checkpointing")
    raf = c.kwargs.get("reshard_after_forward")
    offload = c.kwargs.get("offload_policy", c.kwargs.get("cpu_offload")) is not None
    mp = c.kwargs.get("mp_policy", c.kwargs.get("mixed_precision"))
    param = getattr(mp, "param_dtype", None)
    acc = yaml.safe_load(c.code("accelerate"))
    fsdp = acc["fsdp_config"]
    assert acc["num_processes"] == c.world_size
    assert acc["mixed_precision"] == {torch.bfloat16: "bf16"}.get(param, "no")  # type: ignore[arg-type]
    assert fsdp["fsdp_version"] == (2 if cfg.api == "FSDP2" else 1)
    assert fsdp["fsdp_activation_checkpointing"] is (spec is not None)
    assert fsdp["fsdp_offload_params"] is offload
    if cfg.api == "FSDP2":
        assert fsdp["fsdp_reshard_after_forward"] is (raf is not False)
    else:
        assert fsdp["fsdp_sharding_strategy"] == cfg.sharding_strategy
        assert fsdp["fsdp_backward_prefetch"] == (cfg.backward_prefetch or "NO_PREFETCH")
        assert fsdp["fsdp_forward_prefetch"] is cfg.forward_prefetch
    if cfg.api != "FSDP2":
        return
    titan = tomllib.loads(c.code("torchtitan"))
    training, par, ac = titan["training"], titan["parallelism"], titan["activation_checkpoint"]
    assert training["local_batch_size"] == c.micro_batch
    assert training["global_batch_size"] == c.micro_batch * c.grad_accum * c.world_size
    assert training["mixed_precision_param"] == (
        "bfloat16" if param is torch.bfloat16 else "float32"
    )
    shard = cfg.parallel_dims.dp_shard
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == c.world_size
    assert par["data_parallel_shard_degree"] == shard
    assert training.get("enable_cpu_offload", False) is offload
    # torchtitan's policy gives the groups below the root the values the plan applied
    applied = [v for u, v in cfg.reshard_after_forward.items() if u]
    if not applied:  # the root alone: torchtitan shards its blocks, and says so
        assert "# note: units 'the root alone'" in c.code("torchtitan")
    elif all(isinstance(v, bool) for v in applied):
        made = {
            "always": [True] * len(applied),
            "never": [False] * len(applied),
            "default": [True] * (len(applied) - 1) + [False],
        }
        assert made[par["fsdp_reshard_after_forward"]] == applied
    else:  # to a node: torchtitan has no key for it, and says so
        assert "# note: reshard_after_forward=" in c.code("torchtitan")
    if spec is None:
        assert ac["mode"] == "none"
    elif isinstance(spec, SelectiveCheckpoint):
        assert (ac["mode"], ac["selective_ac_option"]) == ("selective", "op")
    elif isinstance(spec, CheckpointEvery):
        assert (ac["mode"], ac["selective_ac_option"]) == ("selective", str(spec.every))
    else:
        assert ac["mode"] == "full"


# ------------------------------------------------------------------ the tests
@pytest.mark.slow
@pytest.mark.parametrize("knobs", list(KNOB_SETS))
@pytest.mark.parametrize("api", ["FSDP2", "FSDP1"])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_code_tune_prints_runs_as_planned(
    fake_pg: int, name: str, api: str, knobs: str
) -> None:
    assert fake_pg == 4
    tuning = _tune(name, api, KNOB_SETS[knobs])
    build = MODELS[name][0]
    picked = cover(tuning.candidates)
    assert len(picked) < len(tuning.candidates)
    for c in picked:
        assert_trainer_keys(c)
        code = c.code()
        calls = [line for line in code.splitlines() if line.strip().startswith("fully_shard(")]
        offloads = c.knobs["cpu_offload"] == "on"
        if api == "FSDP2":
            assert calls and {"offload_policy=CPUOffloadPolicy()" in x for x in calls} == {offloads}
        else:
            assert ("cpu_offload=CPUOffload(offload_params=True)," in code) is offloads
        model, real, log = run(c, build)
        # the offload's copies (each shard to the device before its all-gather, each
        # gradient's shard to the host after its reduce-scatter), as planned below
        kinds = {e.kind for it in real.iterations for e in it}
        assert ({"h2d", "d2h"} <= kinds) is offloads, (c.knobs, kinds)
        assert_ran_as_planned(c, real)
        assert_checkpointed_as_planned(c, model, build, log)


# ------------------------------------------------------------------ one configuration each
@dataclass
class Planned:
    """A configuration as ``analyze`` plans it, its code written as tune writes a
    candidate's."""

    kwargs: TuneKwargs
    inputs: Any
    report: fsdpviz.Report
    micro_batch: int
    grad_accum: int = 1
    sync_each: bool = False
    knobs: dict[str, str] = field(default_factory=dict)


def planned(model: nn.Module, inputs: Any, **kwargs: Any) -> Planned:
    report = fsdpviz.analyze(model, inputs, world_size=4, progress=False, **kwargs)
    micro = len(inputs["input_ids"])
    return Planned(cast(TuneKwargs, kwargs), inputs, report, micro, kwargs.get("grad_accum", 1))


def check(model: Callable[[], nn.Module], inputs: Any, **kwargs: Any) -> tuple[str, Any]:
    """Run the configuration's code, check it did what the plan says; the code and the log
    of per-operator decisions."""
    c = planned(model(), inputs, **kwargs)
    real_model, real, log = run(c, model)
    assert_ran_as_planned(c, real)
    assert_checkpointed_as_planned(c, real_model, model, log)
    return configuration_code(c), log


BLOCKS = [f"layers.{i}" for i in range(4)]


def test_per_op_checkpointing_code_names_torch_operators(fake_pg: int) -> None:
    """``aten.mm.default`` is ``torch.ops.aten.mm.default`` (the code said
    ``torch.ops.aten.aten.mm.default``: an AttributeError), and the policy saves what the
    plan's does, the CPU's fused attention too."""
    code, log = check(
        _plain,
        _ids(128),
        fully_shard=BLOCKS,
        activation_checkpointing=SelectiveCheckpoint([DecoderLayer]),
    )
    assert "torch.ops.aten.mm.default," in code and "aten.aten" not in code
    saved = {f for region in log for f, _, d in region if d == CheckpointPolicy.MUST_SAVE}
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in saved
    assert torch.ops.aten.mm.default in saved


def test_blocks_before_one_kept_unsharded_are_looped_over_alone(fake_pg: int) -> None:
    """Blocks 0-2 resharded and block 3 kept: the loop shards the first three only (it
    looped over all four, and block 3's own call then failed: fully_shard applied twice)."""
    code, _ = check(
        _plain, _ids(128), fully_shard=BLOCKS, reshard_after_forward={"layers.3": False}
    )
    assert "for block in model.get_submodule('layers')[:3]:" in code


def test_every_second_block_checkpointed_under_units_of_its_children(fake_pg: int) -> None:
    """Every 2nd block checkpointed, its children the units: only those blocks' children are
    inside a checkpoint wrapper (the code named every block's so)."""
    children = [f"layers.{i}.{c}" for i in range(4) for c in ("self_attn", "mlp")]
    code, _ = check(
        _plain,
        _ids(128),
        fully_shard=children,
        activation_checkpointing=CheckpointEvery([DecoderLayer], 2),
    )
    assert "'layers.1._checkpoint_wrapped_module.mlp'" in code
    assert "'layers.0.mlp'" in code


def test_fsdp1_checkpoints_inside_its_units(fake_pg: int) -> None:
    """FSDP1: checkpointing applied after FSDP (accelerate's order), inside each unit, as
    planned; applied before, the policy wrapped each block inside its checkpoint wrapper and
    the recomputation all-gathered the unit again. The recording names the unit's class as
    the block's (it said ``CheckpointWrapper``)."""
    code, _ = check(
        _plain,
        _ids(128),
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        activation_checkpointing=[DecoderLayer],
    )
    assert code.index("model = FSDP(") < code.index("apply_activation_checkpointing(")


def test_fsdp1_names_torchs_classes_and_its_hybrid_shard_groups(fake_pg: int) -> None:
    """``torch.nn.Embedding`` in the wrap policy (a bare ``Embedding`` was undefined), and
    hybrid sharding's groups as planned, by a device mesh (FSDP1 otherwise shards within the
    machine's visible GPUs)."""
    code, _ = check(
        _plain,
        _ids(128),
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer, nn.Embedding}),
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        shard_group_size=2,
    )
    assert "ModuleWrapPolicy({DecoderLayer, torch.nn.Embedding})" in code
    assert 'device_mesh=init_device_mesh("cuda", (2, 2)' in code


@pytest.mark.parametrize("sync_each", [False, True])
def test_the_loop_cuts_keyword_inputs(fake_pg: int, sync_each: bool) -> None:
    """Inputs as keywords (a dict, as Hugging Face's): the loop cuts each tensor into
    micro-batches and passes the others as planned (it called ``batch.split`` on the dict)."""
    c = planned(_plain(), _ids(128, batch=2), fully_shard=BLOCKS, grad_accum=2)
    if sync_each:  # one micro-step's plan, its gradients reduced each time
        c = planned(_plain(), _ids(128, batch=2), fully_shard=BLOCKS)
        c.grad_accum, c.sync_each = 2, True
    _, real, _ = run(c, _plain)
    assert_ran_as_planned(c, real)
    inputs = {**_ids(96, batch=2), "use_cache": False}
    hf = planned(_llama(), inputs, fully_shard=["model.layers.0"], grad_accum=2)
    code = configuration_code(hf)
    assert "model(**micro_batch, use_cache=False)" in code
    _, real, _ = run(hf, _llama)
    assert_ran_as_planned(hf, real)


def test_trainer_keys_of_a_plan() -> None:
    """accelerate's ``mixed_precision: "no"`` quoted (bare, YAML reads false, which
    accelerate launch cannot lower()); torchtitan's resharding policy of one block kept
    unsharded, the others torch's default, is ``default`` (it said ``never``)."""
    c = planned(_plain(), _ids(128), fully_shard=BLOCKS, reshard_after_forward={"layers.3": False})
    assert yaml.safe_load(configuration_code(c, "accelerate"))["mixed_precision"] == "no"
    titan = tomllib.loads(configuration_code(c, "torchtitan"))
    assert titan["parallelism"]["fsdp_reshard_after_forward"] == "default"


# The meshes tune plans on (1-D, HSDP, FSDP x TP, HSDP x TP, a context-parallel mesh as
# given, a pipeline's), as torchtitan's degrees on 8 ranks
TITAN_MESHES = {
    "1-D": {},
    "HSDP": {"data_parallel_replicate_degree": 2},
    "FSDP x TP": {"tensor_parallel_degree": 2},
    "HSDP x TP": {"data_parallel_replicate_degree": 2, "tensor_parallel_degree": 2},
    "FSDP x cp": {"context_parallel_degree": 2},
    "HSDP x cp": {"data_parallel_replicate_degree": 2, "context_parallel_degree": 2},
    "FSDP x cp x TP": {"context_parallel_degree": 2, "tensor_parallel_degree": 2},
    "HSDP x cp x TP": {"data_parallel_replicate_degree": 2, "context_parallel_degree": 2,
                       "tensor_parallel_degree": 2},
    "PP x FSDP": {"pipeline_parallel_degree": 2},
    "PP x FSDP x TP": {"pipeline_parallel_degree": 2, "tensor_parallel_degree": 2},
}  # fmt: skip


def _titan_keywords(config: Mapping[str, Any]) -> dict[str, Any]:
    """A torchtitan job's analyze keywords, comparable: the loss left out (its labels are the
    sequence's), the tensor-parallel plan as its styles' names."""
    out = {k: v for k, v in config.items() if k not in ("loss", "parallelize_plan")}
    plan = config.get("parallelize_plan") or {}
    return {**out, "parallelize_plan": {k: type(v).__name__ for k, v in plan.items()}}


@pytest.mark.parametrize("degrees", TITAN_MESHES.values(), ids=TITAN_MESHES.keys())
def test_the_torchtitan_job_reads_back_as_planned(degrees: dict[str, int]) -> None:
    """The job TOML of each mesh, read by fsdpviz's torchtitan reader, is the plan's: its
    degrees (their product the world size), its analyze keywords, and its global batch (the
    micro-batches of a step over ``dp_replicate x dp_shard`` ranks: the cp ranks of one share
    its samples). It wrote a context-parallel mesh's cp ranks into ``data_parallel_shard_degree``
    with no ``context_parallel_degree``, counted them in the global batch, and wrote HSDP x cp
    x TP's replicas as 1."""
    job = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": 4, "seq_len": 64},
        "parallelism": degrees,
        "activation_checkpoint": {"mode": "full"},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = fsdpviz.from_torchtitan(job, world_size=8)
    report = fsdpviz.analyze(source.model, source.inputs, progress=False, **source.config)
    c = Planned(cast(TuneKwargs, dict(source.config)), source.inputs, report, 4, 2, True)
    text = configuration_code(c, "torchtitan")
    dims = report.config.parallel_dims
    par = tomllib.loads(text)["parallelism"]
    written = [par.get(f"{k}_degree", 1) for k in ("data_parallel_replicate", "data_parallel_shard",
                                                   "context_parallel", "tensor_parallel",
                                                   "pipeline_parallel")]  # fmt: skip
    assert written == [dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp, dims.pp]
    assert math.prod(written) == 8
    assert ("context_parallel_degree" in par) == (dims.cp > 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = fsdpviz.from_torchtitan(tomllib.loads(text))
    assert _titan_keywords(back.config) == _titan_keywords(source.config)
    parallel = tomllib.loads(text)["parallelism"]
    assert mesh_degrees(parallel, None, "job", []) == dims
    # two micro-batches a step, each reducing its gradients, as planned
    steps = [n for n in back.config.notes if "micro-batches per step" in n]
    assert len(steps) == 1 and "means 2 micro-batches per step" in steps[0]


@pytest.mark.parametrize(("strategy", "degrees"), [("HYBRID_SHARD", [2, 2]), ("NO_SHARD", [4, 1])])
def test_fsdp1s_sharding_as_torchtitans_degrees(strategy: str, degrees: list[int]) -> None:
    """FSDP1's hybrid sharding over shard groups of 2 of 4 ranks is torchtitan's HSDP 2 x 2,
    ``NO_SHARD`` its DDP (4 replicas); it wrote both as FSDP over the 4 ranks."""
    c = planned(_plain(), _ids(128), auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
                sharding_strategy=ShardingStrategy[strategy],
                shard_group_size=2 if strategy == "HYBRID_SHARD" else None)  # fmt: skip
    titan = tomllib.loads(configuration_code(c, "torchtitan"))
    par = titan["parallelism"]
    assert [par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]] == degrees
    assert titan["training"]["global_batch_size"] == 4 * 4


def test_a_context_parallel_torchtitan_job() -> None:
    """A ``dp_shard 4 x cp 2`` plan's job: the cp degree and the ring's rotation as planned,
    the global batch over the 4 data-parallel ranks."""
    job = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": 2, "seq_len": 64},
        "parallelism": {"context_parallel_degree": 2},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = fsdpviz.from_torchtitan(job, world_size=8)
    report = fsdpviz.analyze(source.model, source.inputs, progress=False, **source.config)
    text = configuration_code(Planned(cast(TuneKwargs, dict(source.config)), source.inputs,
                                      report, 2), "torchtitan")  # fmt: skip
    assert "global_batch_size = 8  # 1 micro-batch per step\n" in text
    assert "data_parallel_replicate_degree = 1\ndata_parallel_shard_degree = 4\n" in text
    assert "context_parallel_degree = 2\n" in text
    assert 'context_parallel_rotate_method = "allgather"\n' in text
    assert "training.seq_len must divide by 4 (2 x cp x tp)" in text
    assert "# note: each ring step of the context-parallel attention" in text


@pytest.mark.parametrize(
    ("kwargs", "written"),
    [
        (
            {"offload_policy": CPUOffloadPolicy(pin_memory=False)},
            "CPUOffloadPolicy(pin_memory=False)",
        ),
        ({"offload_policy": OffloadPolicy()}, None),
        ({"cpu_offload": CPUOffload(offload_params=True)}, "CPUOffload(offload_params=True)"),
        ({"cpu_offload": CPUOffload(offload_params=False)}, None),
    ],
)
def test_offload_code_offloads_as_planned(
    fake_pg: int, kwargs: dict[str, Any], written: str | None
) -> None:
    """The code offloads where the plan does, the policy as given: ``OffloadPolicy()`` and
    ``CPUOffload(offload_params=False)`` offload nothing (the code offloaded for any value),
    ``pin_memory=False`` is kept (the code pinned); the run's copies to and from the host
    those planned."""
    fsdp2 = "offload_policy" in kwargs
    wrap: dict[str, Any] = (
        {"fully_shard": BLOCKS} if fsdp2 else {"auto_wrap_policy": ModuleWrapPolicy({DecoderLayer})}
    )
    c = planned(_plain(), _ids(128), **wrap, **kwargs)
    code = configuration_code(c)
    assert c.report.config.cpu_offload is (written is not None)
    assert ("Offload" in code) is (written is not None)
    assert written is None or written in code
    _, real, _ = run(c, _plain)
    assert_ran_as_planned(c, real)
    kinds = {e.kind for it in real.iterations for e in it}
    assert ({"h2d", "d2h"} <= kinds) is (written is not None)
    accelerate = yaml.safe_load(configuration_code(c, "accelerate"))
    assert accelerate["fsdp_config"]["fsdp_offload_params"] is (written is not None)


def _titan_planned(degrees: Mapping[str, int], **job: Any) -> tuple[fsdpviz.TorchtitanJob, Planned]:
    """A torchtitan job of ``degrees`` on 8 ranks (``job``: its other sections), as tune's
    candidate of it."""
    data = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": 2, "seq_len": 64},
        "parallelism": dict(degrees),
        **job,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = fsdpviz.from_torchtitan(data, world_size=8)
    report = fsdpviz.analyze(source.model, source.inputs, progress=False, **source.config)
    return source, Planned(cast(TuneKwargs, dict(source.config)), source.inputs, report, 2)


def test_every_nth_block_checkpointing_is_torchtitans_selective_option() -> None:
    """torchtitan's default ``selective_ac_option = "2"`` (read as ``EveryNthBlock(2)``) is
    written back as itself and reads back as the same plan (it was written ``mode =
    "full"``); accelerate, which checkpoints every wrapped block or none, says so."""
    source, c = _titan_planned({})
    assert source.config["activation_checkpointing"] == EveryNthBlock(2)
    text = configuration_code(c, "torchtitan")
    assert '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "2"\n' in text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = fsdpviz.from_torchtitan(tomllib.loads(text))
    assert _titan_keywords(back.config) == _titan_keywords(source.config)
    accelerate = configuration_code(c, "accelerate")
    assert "  fsdp_activation_checkpointing: true\n" in accelerate
    assert "# note: accelerate checkpoints every wrapped block; per-op or every-nth" in accelerate


@pytest.mark.parametrize(
    ("degrees", "sizes"),
    [
        ({}, None),
        ({"data_parallel_replicate_degree": 2}, [2, 4, 1, 1]),
        ({"tensor_parallel_degree": 2}, [1, 4, 2, 1]),
        ({"data_parallel_replicate_degree": 2, "context_parallel_degree": 2}, [2, 2, 1, 2]),
    ],
    ids=["1-D", "HSDP", "FSDP x TP", "HSDP x cp"],
)
def test_accelerates_config_names_the_mesh_and_the_blocks(
    tmp_path: Any, degrees: dict[str, int], sizes: list[int] | None
) -> None:
    """accelerate's ``parallelism_config`` gives an HSDP, TP or cp plan's mesh (it wrote
    plain FSDP over ``num_processes``), and accelerate's own loader and
    ``ParallelismConfig`` take it; the units of a torchtitan-style list of names are
    ``TRANSFORMER_BASED_WRAP`` of the classes all of whose modules are units (it wrote
    ``NO_WRAP``): each block and the embedding; the head's unit of two modules is no class's."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.parallelism_config import ParallelismConfig

    _, c = _titan_planned(degrees, activation_checkpoint={"mode": "full"})
    text = configuration_code(c, "accelerate")
    fsdp = yaml.safe_load(text)["fsdp_config"]
    assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "Embedding,TransformerBlock"
    assert "the plan's units 'norm, output' join the root's unit there" in text
    parallel = yaml.safe_load(text).get("parallelism_config")
    if sizes is None:
        assert parallel is None
        return
    keys = [f"parallelism_config_{k}_size" for k in ("dp_replicate", "dp_shard", "tp", "cp")]
    assert [parallel[k] for k in keys] == sizes
    assert parallel.get("parallelism_config_cp_comm_strategy") == (
        "allgather" if sizes[3] > 1 else None
    )
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    assert load_config_from_file(str(path)).parallelism_config == parallel
    mesh = ParallelismConfig(**{k.removeprefix("parallelism_config_"): v
                                for k, v in parallel.items() if k.endswith("_size")})  # fmt: skip
    assert mesh.total_size == 8


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x))


class _Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class _EncoderDecoder(nn.Module):
    """Three encoder blocks, then two decoder blocks of another class."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(64, 32)
        self.encoder = nn.ModuleList(_Encoder() for _ in range(3))
        self.decoder = nn.ModuleList(_Decoder() for _ in range(2))
        self.head = nn.Linear(32, 64)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in [*self.encoder, *self.decoder]:
            x = block(x)
        return cast(torch.Tensor, self.head(x))


@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
def test_accelerates_wrap_list_names_every_block_class(api: str) -> None:
    """A plan that wraps the blocks of two classes (3 encoders, 2 decoders) is
    ``TRANSFORMER_BASED_WRAP`` of both, and reads back as the same units; it named the
    more frequent class only, and put the decoders in the root's unit."""
    kwargs: dict[str, Any] = (
        {"auto_wrap_policy": ModuleWrapPolicy({_Encoder, _Decoder})}
        if api == "FSDP1"
        else {"fully_shard": [_Encoder, _Decoder]}
    )
    c = planned(_EncoderDecoder(), _ids(64, seq=8), **kwargs)
    text = configuration_code(c, "accelerate")
    fsdp = yaml.safe_load(text)["fsdp_config"]
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "_Encoder,_Decoder"
    assert "join the root's unit" not in text
    back = fsdpviz.from_accelerate(yaml.safe_load(text), _EncoderDecoder())
    report = fsdpviz.analyze(_EncoderDecoder(), _ids(64, seq=8), progress=False, **back)
    assert [u.module for u in report.units] == [u.module for u in c.report.units]
    assert [u.module for u in c.report.units][1:] == [
        "encoder.0", "encoder.1", "encoder.2", "decoder.0", "decoder.1"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("strategy", "policy"),
    [("FULL_SHARD", "always"), ("SHARD_GRAD_OP", "never"), ("NO_SHARD", "default")],
)
def test_fsdp1s_options_as_torchtitans(strategy: str, policy: str) -> None:
    """FSDP1's ``MixedPrecision`` is torchtitan's mixed precision (it was written float32)
    and its strategy the resharding that means the same (``SHARD_GRAD_OP`` was written
    ``"default"``), with a note that torchtitan runs FSDP2."""
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    c = planned(_plain(), _ids(128), auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
                mixed_precision=mp, sharding_strategy=ShardingStrategy[strategy])  # fmt: skip
    text = configuration_code(c, "torchtitan")
    assert 'mixed_precision_param = "bfloat16"\nmixed_precision_reduce = "float32"\n' in text
    assert f'fsdp_reshard_after_forward = "{policy}"\n' in text
    assert "# note: torchtitan runs FSDP2 (fully_shard); this plan is FSDP1's" in text


def test_a_replicate_dimension_of_one_rank_beside_cp() -> None:
    """A mesh ``dp_replicate 1 x dp_shard 4 x cp 2`` is HSDP (FSDP2 all-reduces over the
    replicate dimension of one rank); torchtitan and accelerate build no such dimension,
    and both files say so (they wrote it as plain FSDP, silently)."""
    source, _ = _titan_planned(
        {"context_parallel_degree": 2}, activation_checkpoint={"mode": "none"}
    )
    config = {**source.config, "mesh": ("dp_replicate", 1, "dp_shard", 4, "cp", 2)}
    report = fsdpviz.analyze(source.model, source.inputs, progress=False, **config)
    assert report.config.parallel_dims.hsdp
    c = Planned(cast(TuneKwargs, config), source.inputs, report, 2)
    titan = configuration_code(c, "torchtitan")
    assert "data_parallel_replicate_degree = 1\ndata_parallel_shard_degree = 4\n" in titan
    assert "torchtitan's ParallelDims builds no replicate dimension of size 1" in titan
    accelerate = configuration_code(c, "accelerate")
    assert "  parallelism_config_dp_replicate_size: 1\n" in accelerate
    assert "accelerate's ParallelismConfig builds no replicate dimension of size 1" in accelerate


@pytest.mark.parametrize(
    "degrees",
    [
        {},
        {"data_parallel_replicate_degree": 2},
        {"data_parallel_replicate_degree": 2, "context_parallel_degree": 2},
        {"context_parallel_degree": 2},
    ],
    ids=["1-D", "HSDP", "HSDP x cp", "FSDP x cp"],
)
def test_accelerates_parallelism_config_reads_back_as_the_same_mesh(
    degrees: dict[str, int],
) -> None:
    """The accelerate YAML of a plan reads back (``from_accelerate``) as the same mesh: the
    same ``mesh=`` / ``world_size=`` keywords and ``config.parallel_dims`` (its
    ``parallelism_config`` was ignored, with a note, and read as plain FSDP)."""
    source, c = _titan_planned(degrees, activation_checkpoint={"mode": "none"})
    data = yaml.safe_load(configuration_code(c, "accelerate"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = fsdpviz.from_accelerate(data, source.model)
    mesh_keys = ("mesh", "world_size")
    assert {k: back.get(k) for k in mesh_keys} == {k: source.config.get(k) for k in mesh_keys}
    report = fsdpviz.analyze(source.model, source.inputs, progress=False, **back)
    assert report.config.parallel_dims == c.report.config.parallel_dims


def test_accelerates_handwritten_parallelism_config_and_its_errors() -> None:
    """A hand-written ``parallelism_config`` is accelerate's mesh (dimensions of more than
    one rank, in its order); sizes whose product is not ``num_processes``, an unknown key,
    tensor parallelism (the model's own plan) and FSDP1 are refused, naming the key and
    the fix."""
    from fsdpviz.errors import ConfigError

    model = example_model(CONFIG, device="cpu")

    def read(section: dict[str, object], processes: int = 16, version: int = 2) -> Any:
        data = {
            "distributed_type": "FSDP",
            "num_processes": processes,
            "fsdp_config": {"fsdp_version": version},
            "parallelism_config": section,
        }
        return fsdpviz.from_accelerate(data, model)

    p = "parallelism_config_"
    sizes = {f"{p}dp_replicate_size": 2, f"{p}dp_shard_size": 4, f"{p}cp_size": 2}
    assert read(sizes)["mesh"] == ("dp_replicate", 2, "dp_shard", 4, "cp", 2)
    assert "world_size" not in read(sizes)
    plain = read({f"{p}dp_shard_size": 16, f"{p}tp_size": 1})
    assert plain["world_size"] == 16 and "mesh" not in plain
    with pytest.raises(ConfigError, match=r"is 16 ranks, not num_processes 8.*dp_shard_size: 2"):
        read(sizes, processes=8)
    with pytest.raises(ConfigError, match=r"unknown key 'parallelism_config_dp_shard'"):
        read({f"{p}dp_shard": 16})
    tp = r"tp_size=2.*mesh=\(.dp_shard., 8, .tp., 2\), parallelize_plan=\{module name: \w+, \.+\}\)"
    with pytest.raises(ConfigError, match=tp):
        read({f"{p}dp_shard_size": 8, f"{p}tp_size": 2})
    with pytest.raises(ConfigError, match=r"fsdp_version: 2"):
        read(sizes, version=1)
    with pytest.raises(ConfigError, match=r"dp_shard_size must be a whole number"):
        read({f"{p}dp_shard_size": 0})
