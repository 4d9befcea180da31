"""tune's code around FSDP, run: tensor parallelism, float8 linears and ``torch.compile``
as ``Candidate.code()`` prints them, executed on real FSDP2 (and FSDP1) on the fake process
group's 4 ranks, on the CPU, as tests/test_tune_code_runs.py runs it, and compared with the
plan: the units (each parameter's tp placement and shard) and events, DTensor's tensor-
parallel collectives, the linears converted to float8, the blocks compiled. Pipelines too,
a rank at a time (tests/test_cost_pipeline_memory.py's way): each rank's stages, the
schedule's actions and every event, with the same checks on each stage. The code said
nothing of float8 and compile, and tensor parallelism only in a comment: run as printed, the
model trained without them.

The edits to the code: the device mesh and ``PipelineStage``'s device on ``"cpu"``,
``split_stage`` torchtitan's split (``pipeline_job.split_module``), and compile's backend
dynamo's eager one."""

from __future__ import annotations

import dataclasses
import tomllib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pipeline_job as pj
import pytest
import torch
import torch.distributed as dist
import tp_models
from fsdp_harness import assert_same_schedule
from gloo_worker import _tp_collectives
from pipeline_memory import _neighbours_metadata
from test_tune_code_runs import _unwrapped, assert_ran_as_planned, run
from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import fsdpviz
from fsdpviz.schema.checkpointing import CheckpointEvery
from fsdpviz.tuning import Candidate


def _llama() -> nn.Module:
    torch.manual_seed(0)
    return tp_models.Llama(layers=2)


def _tokens() -> dict[str, torch.Tensor]:
    return {"tokens": torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(0))}


def _tune(api: str = "FSDP2", **kwargs: Any) -> list[Candidate]:
    block = tp_models.TransformerBlock
    mine: dict[str, Any] = (
        {"fully_shard": [block]}
        if api == "FSDP2"
        else {"auto_wrap_policy": ModuleWrapPolicy({block})}
    )
    kwargs.setdefault("world_size", 4)
    t = fsdpviz.tune(
        _llama(),
        _tokens(),
        **mine,
        progress=False,
        workers=1,
        **kwargs,
    )
    return t.candidates


def fsdp_only(report: fsdpviz.Report) -> fsdpviz.Report:
    """The plan without tensor parallelism's events (what FSDP's recorder records)."""
    its = [[e.to_dict() for e in it if not e.tensor_parallel] for it in report.iterations]
    return fsdpviz.Report.from_dict({**report.to_dict(), "iterations": its})


@pytest.fixture
def ranks(fake_pg: int) -> Iterator[Callable[[int], None]]:
    """Run on a fake process group of another number of ranks (as rank 0), then on the
    usual one again."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def on(world_size: int) -> None:
        dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        _clear_sharding_prop_cache()  # its decisions are by mesh, and the groups are new

    yield on
    on(fake_pg)


@pytest.mark.parametrize(
    ("world_size", "meshes"),
    [
        (4, {"4 ranks (FSDP 2 x TP 2)"}),
        # two nodes of 4: HSDP x TP beside FSDP x TP, replayed from its trace
        (8, {"8 ranks (FSDP 4 x TP 2)", "8 ranks (HSDP 2 x 2 x TP 2)"}),
    ],
)
def test_tensor_parallel_code_parallelizes_as_planned(
    ranks: Callable[[int], None], world_size: int, meshes: set[str]
) -> None:
    """FSDP x TP, and HSDP x TP on more than a node (``fully_shard`` on the mesh's
    replicate x shard dimensions, ``parallelize_module`` on its tp one, as torchtitan
    applies them): each parameter's tp placement and shard, FSDP's events and DTensor's
    collectives as planned."""
    ranks(world_size)
    cands = [
        c
        for c in _tune(
            mesh=("dp_shard", world_size // 2, "tp", 2),
            parallelize_plan=tp_models.whole_plan(),
            knobs=("mesh",),
            world_size=world_size,
            machine=fsdpviz.cost.machine("h100", gpus_per_node=4),
        )
        if c.report.config.tp_world_size == 2
    ]
    assert {c.knobs["mesh"] for c in cands} == meshes
    for c in cands:
        with _tp_collectives() as seen:
            _, real, _ = run(c, _llama)
        # the units (each parameter's tp placement and shard) and the FSDP recorder's events
        assert_ran_as_planned(dataclasses.replace(c, report=fsdp_only(c.report)), real)
        # DTensor's collectives of the three steps: the first's, then the steady one's twice
        first, steady = (
            [[e.kind, e.nbytes] for e in it if e.tensor_parallel] for it in c.report.iterations
        )
        assert steady and seen == first + steady + steady
        hsdp = "HSDP" in c.knobs["mesh"]
        # HSDP's all-reduce of the gradients' shards across the replicas
        assert ("all_reduce" in {e.kind for it in real.iterations for e in it}) is hsdp
        if hsdp:
            code = c.code()
            assert 'mesh_dim_names=("dp_replicate", "dp_shard", "tp"))' in code
            assert 'dp_mesh = mesh["dp_replicate", "dp_shard"]' in code
            assert {u.shard_ranks for u in real.units} == {2}
            par = tomllib.loads(c.code("torchtitan"))["parallelism"]
            assert [par[f"{k}_degree"] for k in ("data_parallel_replicate", "data_parallel_shard",
                                                 "tensor_parallel")] == [2, 2, 2]  # fmt: skip


@pytest.mark.parametrize(
    ("plan", "labels"),
    [
        # the user's plan of torch's styles: kept with float8, torchao's float8 styles beside
        (tp_models.whole_plan, {
            "off", "tensorwise", "tensorwise, torchao's float8 TP styles",
            "tensorwise, float8 all-gather",
            "tensorwise, float8 all-gather, torchao's float8 TP styles",
        }),
        # torchtitan's float8 plan (enable_float8_tensorwise_tp): torch's styles when off
        ("float8", {"off", "tensorwise", "tensorwise, float8 all-gather"}),
    ],
    ids=["torch-styles", "float8-styles"],
)  # fmt: skip
def test_tensor_parallel_float8_code_moves_what_was_planned(
    fake_pg: int, plan: Any, labels: set[str]
) -> None:
    """FSDP x TP with each float8 choice: the code applies the candidate's plan, torchao's
    ``Float8ColwiseParallel`` / ``Float8RowwiseParallel`` / ``PrepareFloat8ModuleInput``
    where it planned them (the blocks' inputs gathered in float8_e4m3fn, the row-wise
    outputs' gradients in float8_e5m2), torch's where not: DTensor's collectives of the
    real run, with their dtypes, are the candidate's. tune planned torch's styles with every
    float8 recipe, so a torchtitan job's float8 plan was refused with float8 off and never
    tried with its float8 gathers beside a plan of torch's styles."""
    given = tp_models.float8_plan() if plan == "float8" else plan()
    cands = _tune(
        mesh=("dp_shard", 2, "tp", 2),
        parallelize_plan=given,
        float8={"filter_fqns": ["output"]} if plan == "float8" else None,
        allow=("float8",),
        knobs=("float8",),
    )
    shown = {c.knobs["float8"].removesuffix(", except output") for c in cands}
    assert shown == labels
    for c in cands:
        f8 = "float8 TP" in c.knobs["float8"] or (plan == "float8" and c.report.config.float8)
        styles = {type(s).__name__ for s in c.kwargs["parallelize_plan"].values()}
        assert ("Float8ColwiseParallel" in styles) == bool(f8)
        assert ("PrepareFloat8ModuleInput" in styles) == (plan == "float8" and bool(f8))
        # torchtitan's TOML: its enable_float8_tensorwise_tp applies them with tensorwise + TP
        toml = c.code("torchtitan")
        assert ("(enable_float8_tensorwise_tp), as planned" in toml) == bool(f8)
        assert ("planned with torch's tensor-parallel styles" in toml) == (
            bool(c.report.config.float8) and not f8
        )
        with _tp_collectives(dtypes=True) as seen:
            run(c, _llama)
        first, steady = (
            [[e.kind, e.nbytes, e.dtype] for e in it if e.tensor_parallel]
            for it in c.report.iterations
        )
        # the parallel styles' gathers, dtype and all (three steps: the first, steady twice)
        gathers = [x for x in first + steady + steady if x[0] == "tp_all_gather"]
        assert [x for x in seen if x[0] == "tp_all_gather"] == gathers
        assert [x[:2] for x in seen] == [x[:2] for x in first + steady + steady]
        dtypes = {x[2] for x in gathers}
        assert ("float8_e4m3fn" in dtypes) == (plan == "float8" and bool(f8))
        assert ("float8_e5m2" in dtypes) == bool(f8)


@pytest.mark.parametrize("api", ["FSDP2", "FSDP1"])
def test_float8_code_converts_the_planned_linears(fake_pg: int, api: str) -> None:
    from torchao.float8.float8_linear import Float8Linear

    from fsdpviz.plan.job import Float8, float8_weights

    cands = _tune(api, allow=("float8",), knobs=("float8",), float8={"filter_fqns": ["output"]})
    assert {c.knobs["float8"] for c in cands} == {
        "off", "tensorwise, except output", "tensorwise, float8 all-gather, except output",
    } - ({"tensorwise, float8 all-gather, except output"} if api == "FSDP1" else set())  # fmt: skip
    for c in cands:
        model, real, _ = run(c, _llama)
        assert_ran_as_planned(c, real)
        spec = c.report.config.float8
        converted = {
            f"{_unwrapped(n)}.weight"
            for n, m in model.named_modules()
            if isinstance(m, Float8Linear)
        }
        planned = float8_weights(c.report.modules, Float8.from_dict(spec)) if spec else set()
        assert converted == planned and bool(planned) == bool(spec)
        assert "output.weight" not in planned
        gather = [
            m.config.enable_fsdp_float8_all_gather
            for m in model.modules()
            if isinstance(m, Float8Linear)
        ]
        assert set(gather) <= {bool(spec and spec["enable_fsdp_float8_all_gather"])}


@pytest.mark.parametrize("api", ["FSDP2", "FSDP1"])
def test_compile_code_compiles_the_planned_blocks(
    fake_pg: int, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    """Each block compiled in place, as planned (dynamo's eager backend: inductor's C++ on a
    CPU takes minutes), FSDP's events as planned around them."""
    compile_module = nn.Module.compile

    def eager(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        compile_module(self, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(nn.Module, "compile", eager)
    torch._dynamo.reset()
    cands = _tune(api, allow=("compile",), knobs=("compile",))
    (c,) = [c for c in cands if c.knobs["compile"] != "off"]
    assert c.report.config.compile == ("TransformerBlock",)
    model, real, _ = run(c, _llama)
    assert_ran_as_planned(c, real)
    compiled = [
        _unwrapped(n)
        for n, m in model.named_modules()
        if getattr(m, "_compiled_call_impl", None) is not None
        and isinstance(m, tp_models.TransformerBlock)
    ]
    assert compiled == ["layers.0", "layers.1"]
    assert not [
        m for m in model.modules()
        if getattr(m, "_compiled_call_impl", None) is not None
        and not isinstance(m, tp_models.TransformerBlock)
    ]  # fmt: skip


# ------------------------------------------------------------------ pipelines
@pytest.fixture
def as_rank(fake_pg: int) -> Iterator[Callable[[int], None]]:
    """Run as another rank of the fake process group, then as rank 0 again."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def become(rank: int) -> None:
        dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=fake_pg)
        _clear_sharding_prop_cache()  # its decisions are by mesh, and the groups are new

    yield become
    become(0)


def _eager_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Module.compile`` with dynamo's eager backend: inductor's C++ on a CPU takes
    minutes."""
    compile_module = nn.Module.compile

    def eager(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        compile_module(self, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(nn.Module, "compile", eager)
    torch._dynamo.reset()


def run_pipeline_rank(
    c: Candidate, build: Callable[[], nn.Module] = pj.model
) -> tuple[list[Any], fsdpviz.Report]:
    """Execute ``c``'s code as this rank (the device mesh and ``PipelineStage`` on the CPU,
    ``split_stage`` torchtitan's split) and run three steps of its schedule, recorded."""
    from fsdpviz.recording import PipelineRecorder

    pipe = c.report.pipeline
    assert pipe is not None
    code = c.code().replace('init_device_mesh("cuda"', 'init_device_mesh("cpu"')
    code = code.replace('torch.device("cuda")', 'torch.device("cpu")')
    model = build()
    ns: dict[str, Any] = {
        **{type(m).__name__: type(m) for m in model.modules()},
        "model": model,
        "split_stage": pj.split_module,
        "loss_fn": pj.loss_fn,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "<tune code>", "exec"), ns)
        schedule, stages = ns["schedule"], ns["stages"]
        first = any(st.is_first for st in stages)
        last = any(st.is_last for st in stages)
        with (
            _neighbours_metadata(pj.BATCH // pipe.microbatches, torch.float32),
            PipelineRecorder(schedule) as rec,
        ):
            for _ in range(3):
                target = pj.labels() if last else None
                if first:
                    schedule.step(pj.tokens(), target=target)
                else:
                    schedule.step(target=target)
                for st in stages:
                    st.submod.zero_grad(set_to_none=True)
    return [st.submod for st in stages], rec.report()


def assert_pipeline_rank_as_planned(
    c: Candidate, pp_rank: int, build: Callable[[], nn.Module] = pj.model, tp: bool = False
) -> list[Any]:
    """This rank's run of ``c``'s code is the plan's rank: its stages, their actions, units
    and events (``tp``: the FSDP recorder's, without tensor parallelism's); its modules."""
    pipe = c.report.pipeline
    assert pipe is not None
    parts, real = run_pipeline_rank(c, build)
    mine = fsdp_only(pipe.ranks[pp_rank]) if tp else pipe.ranks[pp_rank]
    assert real.pipeline is not None and mine.pipeline is not None
    assert [(s.index, s.modules, s.units) for s in real.pipeline.stages] == [
        (s.index, s.modules, s.units) for s in pipe.stages_of(pp_rank)
    ]
    assert real.pipeline.actions == mine.pipeline.actions  # the schedule's, action by action
    assert_same_schedule(real, mine)  # units, and every event of both steps
    return parts


BLOCKS = [f"layers.{i}" for i in range(pj.MODEL_ARGS["n_layers"])]


def _tune_pipeline(build: Callable[[], nn.Module] = pj.model, **kwargs: Any) -> list[Candidate]:
    from test_conformance_pipeline import cross_entropy

    t = fsdpviz.tune(
        build(),
        pj.tokens(),
        fully_shard=["tok_embeddings", *BLOCKS, ("norm", "output")],
        reshard_after_forward=False,
        pipeline_schedule="1F1B",
        microbatches=2,
        loss=cross_entropy(2),
        knobs=("pipeline",),
        progress=False,
        workers=1,
        **kwargs,
    )
    return [c for c in t.candidates if c.report.pipeline is not None]


@pytest.mark.slow
def test_pipeline_code_applies_float8_checkpointing_and_compile_on_each_stage(
    as_rank: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank's stages of each schedule tune tries, their units, actions and events as
    planned; on each stage the linears converted to float8, every 2nd block of the whole
    model checkpointed and each block compiled, as the plan says (the code did none)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torchao.float8.float8_linear import Float8Linear

    from fsdpviz.plan.job import Float8, float8_weights

    _eager_compile(monkeypatch)
    block = type(pj.model().layers["0"])
    cands = _tune_pipeline(
        mesh=("pp", 2, "dp_shard", 2),
        float8=True,
        compile=[block],
        activation_checkpointing=CheckpointEvery([block], 2),
    )
    assert {c.knobs["pipeline"].split(",")[0] for c in cands} == {
        "1F1B", "Interleaved1F1B", "ZBVZeroBubble",
    }  # fmt: skip
    for c in cands:
        pipe = c.report.pipeline
        assert pipe is not None and c.report.config.float8
        weights = float8_weights(c.report.modules, Float8.from_dict(c.report.config.float8))
        for rank in (0, 2):
            as_rank(rank)
            pp_rank = rank // 2
            parts = assert_pipeline_rank_as_planned(c, pp_rank)
            names = [(_unwrapped(n), m) for p in parts for n, m in p.named_modules()]
            mine = {m for st in pipe.stages_of(pp_rank) for m in st.modules}
            assert {f"{n}.weight" for n, m in names if isinstance(m, Float8Linear)} == {
                w for w in weights if w.split(".")[0] in mine or ".".join(w.split(".")[:2]) in mine
            }
            assert {n for n, m in names if isinstance(m, CheckpointWrapper)} == {
                b for b in ("layers.1", "layers.3") if b in mine
            }
            compiled = {
                n
                for n, m in names
                if getattr(m, "_compiled_call_impl", None) is not None and isinstance(m, block)
            }
            assert compiled == {b for b in BLOCKS if b in mine}


class _StagedLlama(tp_models.Llama):
    """A Llama whose attention takes its heads from its input (``view(b, s, -1, d)``): one
    tensor parallelism can split, with ``pipeline_job``'s sizes and names; as torchtitan's,
    a stage passes its input by the modules it does not hold."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def _tp_llama() -> nn.Module:
    torch.manual_seed(0)
    return _StagedLlama(layers=pj.MODEL_ARGS["n_layers"])


@pytest.mark.slow
def test_pipeline_code_applies_tensor_parallelism_on_each_stage(
    as_rank: Callable[[int], None],
) -> None:
    """pp 2 x tp 2, each block checkpointed: each stage's linears parallelized as the plan
    says (its units' tp placements; before checkpointing, whose wrapper renames the blocks'
    children), and DTensor's collectives those the plan counts (the code had a comment)."""
    plan = {
        "layers.*.attention.w[qkv]": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(),
    }
    cands = _tune_pipeline(_tp_llama, mesh=("pp", 2, "dp_shard", 1, "tp", 2), parallelize_plan=plan)
    assert cands
    for c in cands[:1]:
        pipe = c.report.pipeline
        assert pipe is not None and c.report.config.tp_world_size == 2
        for rank in (0, 2):
            as_rank(rank)
            pp_rank = rank // 2
            with _tp_collectives() as seen:
                assert_pipeline_rank_as_planned(c, pp_rank, _tp_llama, tp=True)
            first, steady = (
                [[e.kind, e.nbytes] for e in it if e.tensor_parallel]
                for it in pipe.ranks[pp_rank].iterations
            )
            assert steady and seen == first + steady + steady


def test_a_stage_keeps_module_names_that_say_model() -> None:
    """On a stage, the code's ``model`` is ``stage_model``, but a module's name is left as
    written (``'model.norm'``: Hugging Face's names begin so; it became
    ``'stage_model.norm'``)."""
    from fsdpviz.tuning.pipeline_code import on_stage

    line = "fully_shard([model.get_submodule('model.norm'), model.lm_head], mesh=dp_mesh)"
    assert on_stage(line) == (
        "fully_shard([stage_model.get_submodule('model.norm'), stage_model.lm_head], mesh=dp_mesh)"
    )
    assert on_stage("x = model  # the model's") == "x = stage_model  # the model's"
