"""fsdpviz.tune: the fastest configuration that fits, each one exactly what analyze plans."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
import torch
import tp_models

import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.tuning import Tuning

CONFIG = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=250, num_heads=4)
# tensor parallelism over 4 ranks needs an MLP width 4 divides (torch fails on 250's chunks)
TP_CONFIG = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=256, num_heads=4)


def _model() -> torch.nn.Module:
    return example_model(CONFIG)


def _tp_model() -> torch.nn.Module:
    return example_model(TP_CONFIG)


@pytest.fixture(scope="module")
def tuning() -> Tuning:
    return fsdpviz.tune(
        _model(),
        example_inputs(CONFIG),
        world_size=[8, 16],
        memory_budget="3MiB",
        progress=False,
        workers=1,
    )


def _same(a: fsdpviz.Report, b: fsdpviz.Report) -> None:
    """The same plan: units, every event, the config (but how it was made), the memory and
    the time model's totals, the warnings."""
    assert [u.to_dict() for u in a.units] == [u.to_dict() for u in b.units]
    assert [[e.to_dict() for e in it] for it in a.iterations] == [
        [e.to_dict() for e in it] for it in b.iterations
    ]
    ca, cb = a.config.to_dict(), b.config.to_dict()
    ca.pop("replayed", None)
    cb.pop("replayed", None)
    assert ca == cb
    assert a.memory.to_dict()["peak"] == b.memory.to_dict()["peak"]
    assert a.timeline.totals == b.timeline.totals
    assert [w.to_dict() for w in a.warnings] == [w.to_dict() for w in b.warnings]


def test_every_configuration_is_the_plan_analyze_gives(tuning: Tuning) -> None:
    model = _model()
    sample = [*tuning.candidates[:: max(1, len(tuning.candidates) // 25)], tuning.candidates[-1]]
    for c in sample:
        _same(fsdpviz.analyze(model, c.inputs, machine="h100", **c.kwargs), c.report)
    assert tuning.traces < len(tuning.candidates) / 4  # the rest were replayed


def test_the_best_fits_and_is_the_fastest_that_does(tuning: Tuning) -> None:
    best = tuning.best
    assert best is not None and best.fits
    assert best.memory_bytes <= 3 * 2**20
    assert best.tokens_per_s == max(c.tokens_per_s for c in tuning.candidates if c.fits)
    assert all(c.fits == (c.memory_bytes <= 3 * 2**20) for c in tuning.candidates)
    # the user's configuration (the root alone, as given) is evaluated and marked
    assert tuning.user.user and tuning.user.knobs["wrap"] == "the root alone"
    assert not tuning.user.fits
    assert best.knobs["precision"] == "bf16 params, fp32 reduce"


def test_the_frontier_is_what_nothing_else_beats(tuning: Tuning) -> None:
    front = tuning.frontier
    assert front and front == sorted(front, key=lambda c: c.memory_bytes)
    for c in tuning.candidates:
        dominated = any(
            o.memory_bytes <= c.memory_bytes
            and o.tokens_per_s >= c.tokens_per_s
            and (o.memory_bytes, o.tokens_per_s) != (c.memory_bytes, c.tokens_per_s)
            for o in tuning.candidates
        )
        assert (c in front) != dominated or any(
            (o.memory_bytes, o.tokens_per_s) == (c.memory_bytes, c.tokens_per_s) and o in front
            for o in tuning.candidates
        )


def test_world_sizes_are_compared(tuning: Tuning) -> None:
    assert {c.world_size for c in tuning.candidates} == {8, 16}
    for ws in (8, 16):
        best = tuning.best_for(ws)
        assert best is not None and best.world_size == ws
        assert best.total_tokens_per_s == pytest.approx(best.tokens_per_s * ws)
    # on 16 ranks of 8-GPU nodes: HSDP with a node per shard group, and resharding to a node
    labels = {c.knobs["mesh"] for c in tuning.candidates}
    assert "16 ranks (HSDP 2 x 8)" in labels
    assert any(c.knobs["reshard_after_forward"] == "to 8 ranks (a node)" for c in tuning.candidates)


def test_the_summary_names_the_best_and_each_knobs_alternative(tuning: Tuning) -> None:
    text = str(tuning)
    best = tuning.best
    assert best is not None
    assert f"Best: {best.tokens_per_s:,.0f} tokens/s per GPU" in text
    assert "The configuration as given:" in text
    alts = tuning.alternatives()
    assert {a["knob"] for a in alts} >= {"activation_checkpointing", "micro_batch", "precision"}
    for a in alts:
        assert a["text"] in text
        other = a["candidate"]
        assert other.knobs[a["knob"]] != best.knobs[a["knob"]]
        assert f"{other.knobs[a['knob']]} instead of {best.knobs[a['knob']]}" in a["text"]
    rows = tuning.table.rows
    assert len(rows) == len(tuning.candidates)
    json.dumps(tuning.to_dict())


def test_micro_batches_keep_the_tokens_per_step(tuning: Tuning) -> None:
    for c in tuning.candidates:
        assert c.micro_batch * c.grad_accum == 2  # the inputs' 2 samples per optimizer step
        assert c.inputs["input_ids"].shape[0] == c.micro_batch
        # every micro-step planned where only the last reduces; one where each does
        assert c.report.config.grad_accum == (1 if c.sync_each else c.grad_accum)
    assert {c.micro_batch for c in tuning.candidates} == {1, 2}
    ways = {(c.micro_batch, c.sync_each) for c in tuning.candidates}
    assert ways == {(2, False), (1, False), (1, True)}


def test_accumulation_reducing_every_micro_step_is_the_plan_of_one_repeated(
    tuning: Tuning,
) -> None:
    """Micro-steps that each reduce their gradients (torchtitan's and Composer's way; a loop
    calling backward() N times): the plan of one micro-step, its time and memory those of N
    (each reduction adding into the gradient shards the ones before left), beside the same
    micro-batch accumulated without sync, from the same trace."""
    from fsdpviz.cost import memory_model, timeline

    each = [c for c in tuning.candidates if c.sync_each]
    assert each
    for c in each:
        assert c.knobs["micro_batch"] == f"1 x {c.grad_accum} micro-steps, each reduced"
        n = c.grad_accum
        tl = timeline(c.report, optimizer="adamw", grad_accum=n)
        mem = memory_model(c.report, optimizer="adamw", grad_accum=n)
        assert c.tokens_per_s == tl.totals["tokens_per_s"]
        assert c.peak_bytes == mem.peak["bytes"] > c.report.memory.peak["bytes"]
        sibling = [
            o
            for o in tuning.candidates
            if not o.sync_each
            and o.grad_accum == n
            and {k: v for k, v in o.knobs.items() if k != "micro_batch"}
            == {k: v for k, v in c.knobs.items() if k != "micro_batch"}
        ]
        assert sibling and sibling[0].report.config.grad_accum == n
        code = c.code()
        assert "set_requires_gradient_sync" not in code and "for i in range(0, " in code


def test_a_step_of_more_tokens_than_the_inputs_reducing_every_micro_step() -> None:
    """``tokens_per_step`` of four times the inputs and no ``grad_accum``: the configuration
    as given is the inputs' forward and backward four times, each reducing (what FSDP does
    unless told not to sync); under a budget that FSDP's unsharded gradients kept over
    ``no_sync`` micro-steps exceed, only reducing every micro-step fits."""
    from fsdpviz.cost import memory_model, timeline

    model, ids = _model(), torch.zeros(1, 64, dtype=torch.long)
    mine = {"fully_shard": [DecoderLayer]}
    one = fsdpviz.analyze(_model(), ids, machine="h100", world_size=8, **mine)
    reducing = memory_model(one, grad_accum=4)
    quiet = fsdpviz.analyze(_model(), ids, machine="h100", world_size=8, grad_accum=4, **mine)
    assert quiet.memory.peak["bytes"] > reducing.peak["bytes"]
    budget = (quiet.memory.peak["bytes"] + reducing.peak["bytes"]) // 2
    t = fsdpviz.tune(model, ids, world_size=8, tokens_per_step=4 * 64, memory_budget=budget,
                     knobs=("micro_batch",), progress=False, workers=1, **mine)  # fmt: skip
    user = t.user
    assert (user.micro_batch, user.grad_accum, user.sync_each) == (1, 4, True)
    assert user.tokens_per_s == timeline(one, grad_accum=4).totals["tokens_per_s"]
    assert user.peak_bytes == reducing.peak["bytes"] and user.fits
    _same(one, user.report)
    quiet_one = next(c for c in t.candidates if not c.sync_each)
    assert not quiet_one.fits and quiet_one.peak_bytes == quiet.memory.peak["bytes"]
    assert t.best is user


def test_a_context_parallel_mesh_stays_as_given() -> None:
    """tune has no context-parallel knob: a job's ``cp`` mesh is kept (every configuration
    on it traced or replayed in the knobs a replay can change, each the plan analyze
    gives), and a world size other than its ranks is refused."""
    import warnings

    job = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": 2, "seq_len": 256},
        "parallelism": {"context_parallel_degree": 2},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tt = fsdpviz.from_torchtitan(job, world_size=8)
    t = fsdpviz.tune(tt, progress=False, workers=1)
    assert {c.knobs["mesh"] for c in t.candidates} == {"8 ranks (dp_shard 4 x cp 2)"}
    assert "the mesh stays as given (dp_shard 4 x cp 2): tune has no context-parallel knob" in (
        t.notes
    )
    assert any(not c.traced for c in t.candidates)
    for c in t.candidates:
        assert c.report.config.cp_world_size == 2
        _same(fsdpviz.analyze(tt.model, c.inputs, machine="h100", **c.kwargs), c.report)
        # torchtitan's job: dp_shard 4 (it wrote 8: the cp ranks too), the cp degree
        par = tomllib.loads(c.code("torchtitan"))["parallelism"]
        assert (par["data_parallel_shard_degree"], par["context_parallel_degree"]) == (4, 2)
    with pytest.raises(fsdpviz.ConfigError, match="keeps a context-parallel mesh as given"):
        fsdpviz.tune(tt, world_size=16, progress=False)


def test_a_context_parallel_mesh_with_tensor_parallelism_stays_as_given() -> None:
    """A job's ``dp_replicate x dp_shard x cp x tp`` mesh (four dimensions) is kept as given,
    each configuration on it the plan analyze gives."""
    import warnings

    job = {
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "training": {"local_batch_size": 2, "seq_len": 256},
        "parallelism": {
            "data_parallel_replicate_degree": 2,
            "context_parallel_degree": 2,
            "tensor_parallel_degree": 2,
        },
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tt = fsdpviz.from_torchtitan(job, world_size=8)
    t = fsdpviz.tune(tt, progress=False, workers=1)
    dims = "dp_replicate 2 x dp_shard 1 x cp 2 x tp 2"
    assert {c.knobs["mesh"] for c in t.candidates} == {f"8 ranks ({dims})"}
    for c in t.candidates:
        assert (c.report.config.cp_world_size, c.report.config.tp_world_size) == (2, 2)
        _same(fsdpviz.analyze(tt.model, c.inputs, machine="h100", **c.kwargs), c.report)
        # torchtitan's degrees, the replicas too (it wrote replicate 1, dp_shard 4, no cp)
        par = tomllib.loads(c.code("torchtitan"))["parallelism"]
        keys = ["data_parallel_replicate", "data_parallel_shard"]
        keys += ["context_parallel", "tensor_parallel"]
        assert [par[f"{k}_degree"] for k in keys] == [2, 1, 2, 2]


def test_fixed_options_stay_and_fsdp1_is_tuned_in_its_own_words() -> None:
    from torch.distributed.fsdp import MixedPrecision

    mp = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float32)
    t = fsdpviz.tune(
        _model(),
        example_inputs(CONFIG),
        world_size=8,
        api="fsdp1",
        fixed={"mixed_precision": mp, "micro_batch": 1},
        memory_budget="3MiB",
        progress=False,
    )
    assert {c.knobs["precision"] for c in t.candidates} == {"fp16 params, fp32 reduce"}
    assert {c.micro_batch for c in t.candidates} == {1}
    assert {c.knobs["reshard_after_forward"] for c in t.candidates} >= {
        "FULL_SHARD",
        "SHARD_GRAD_OP",
    }
    assert {c.knobs["backward_prefetch"] for c in t.candidates} == {
        "BACKWARD_PRE",
        "BACKWARD_POST",
    }
    assert all(c.report.config.api == "FSDP1" for c in t.candidates)
    assert "micro_batch stays 1 x 2 micro-steps (pinned)" in t.notes


@pytest.mark.parametrize("api", ["fsdp2", "fsdp1"])
def test_precisions_differing_in_the_reduce_dtype_share_a_trace(api: str) -> None:
    """The recipe's bf16 reduction and the standard fp32 one: one trace, the other replayed,
    each exactly the plan analyze gives."""
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    bf16 = torch.bfloat16
    mine: dict[str, Any] = (
        {"mp_policy": MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)}
        if api == "fsdp2"
        else {"mixed_precision": MixedPrecision(param_dtype=bf16, reduce_dtype=bf16)}
    )
    fixed: dict[str, Any] = {"micro_batch": 1, "activation_checkpointing": None}
    t = fsdpviz.tune(
        _model(), example_inputs(CONFIG), world_size=8, api=api, memory_budget="3MiB",
        fixed=fixed, exhaustive=True, progress=False, workers=1, **mine,
    )  # fmt: skip
    by_rest: dict[tuple[Any, ...], list[Any]] = {}
    for c in t.candidates:
        rest = tuple(sorted((k, v) for k, v in c.knobs.items() if k != "precision"))
        by_rest.setdefault(rest, []).append(c)
    pairs = [cs for cs in by_rest.values() if len(cs) > 1]
    assert pairs
    labels = {"bf16 params", "bf16 params, fp32 reduce"}
    for cs in pairs:
        assert {c.knobs["precision"] for c in cs} == labels
        assert sum(c.traced for c in cs) <= 1
    model = _model()
    for c in [c for cs in pairs for c in cs]:
        _same(fsdpviz.analyze(model, c.inputs, machine="h100", **c.kwargs), c.report)


def test_nothing_fits_says_how_many_ranks_would() -> None:
    wide = ExampleConfig(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_heads=4)
    model, ids = example_model(wide), torch.zeros(2, 8, dtype=torch.long)
    keep = ("wrap", "reshard_after_forward", "activation_checkpointing", "micro_batch")
    t = fsdpviz.tune(model, ids, world_size=8, memory_budget="90MiB", knobs=keep, progress=False)
    assert t.best is None and t.needs is not None
    low = min(t.candidates, key=lambda c: c.memory_bytes)
    assert t.needs["candidate"] == low.index
    ws = t.needs["world_size"]
    assert ws is not None and ws > 8
    assert f"It fits from {ws} ranks" in str(
        t
    ) and "Nothing fits. The lightest configuration needs" in str(t)
    fresh = fsdpviz.analyze(model, low.inputs, **{**low.kwargs, "world_size": ws})
    assert fresh.memory.peak["bytes"] <= 90 * 2**20
    half = fsdpviz.analyze(model, low.inputs, **{**low.kwargs, "world_size": ws // 2})
    assert half.memory.peak["bytes"] > 90 * 2**20


def test_nothing_fits_says_when_more_ranks_would_not_help() -> None:
    t = fsdpviz.tune(
        _model(), example_inputs(CONFIG), world_size=8, memory_budget="64KiB", progress=False
    )
    assert t.best is None and t.needs is not None and t.needs["world_size"] is None
    assert "More ranks do not make it fit" in str(t)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"knobs": ["wraps"]}, "unknown knob 'wraps'.*did you mean 'wrap'"),
        ({"fixed": {"mp_polcy": None}}, "fixed: 'mp_polcy'.*did you mean 'mp_policy'"),
        ({"allow": ["fp8"]}, "allow: 'fp8'"),
        ({"world_size": 0}, "world_size"),
        ({"api": "fsdp3"}, "api must be 'fsdp1' or 'fsdp2'"),
        ({"fixed": {"micro_batch": 3}}, "fixed micro_batch=3.*2, 1"),
        ({"tokens_per_step": 100}, "tokens_per_step=100 is not a whole number of samples of 64"),
        (
            {"world_size": 6, "mesh": ("dp_shard", 2, "tp", 4), "parallelize_plan": "PLAN"},
            "world_size 6 does not divide by the mesh's tensor-parallel degree 4",
        ),
    ],
)
def test_bad_requests_say_what_to_do(kwargs: dict[str, Any], message: str) -> None:
    if kwargs.get("parallelize_plan") == "PLAN":
        kwargs["parallelize_plan"] = tp_models.example_plan()
    with pytest.raises(fsdpviz.ConfigError, match=message):
        fsdpviz.tune(_model(), example_inputs(CONFIG), progress=False, **kwargs)


def test_suggest_turns_only_the_wrap_plan_and_fsdps_switches() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    t = fsdpviz.suggest(
        _model(), example_inputs(CONFIG), memory_budget="4MiB", world_size=16, mp_policy=mp
    )
    assert {c.knobs["activation_checkpointing"] for c in t.candidates} == {"none"}
    assert {c.knobs["precision"] for c in t.candidates} == {"bf16 params"}
    assert len({c.knobs["wrap"] for c in t.candidates}) >= 3
    assert t.best is not None and t.best.fits
    again = fsdpviz.analyze(_model(), t.best.inputs, **t.best.kwargs)
    assert again.memory.peak["bytes"] == t.best.memory_bytes


def test_the_model_and_inputs_come_back_untouched() -> None:
    model, inputs = _model(), example_inputs(CONFIG)
    before = {n: (p.shape, p.dtype, p.device) for n, p in model.named_parameters()}
    forward = model.forward
    fsdpviz.tune(model, inputs, world_size=8, memory_budget="3MiB", progress=False)
    assert {n: (p.shape, p.dtype, p.device) for n, p in model.named_parameters()} == before
    assert model.forward == forward and not model._forward_hooks
    assert inputs["input_ids"].shape == (2, 64)


def test_every_nth_block_checkpointing_picks_every_nth() -> None:
    from fsdpviz.trace.checkpointing import checkpointed_modules

    model = _model()
    picked = checkpointed_modules(model, fsdpviz.CheckpointEvery([DecoderLayer], 2))
    layers = list(model.get_submodule("layers"))
    assert picked == [layers[1], layers[3]]
    with pytest.raises(fsdpviz.ConfigError, match="every must be a positive int"):
        fsdpviz.CheckpointEvery([DecoderLayer], 0)


def test_workers_change_no_number(tuning: Tuning) -> None:
    """Traces made side by side in forked workers give the very same search."""
    other = fsdpviz.tune(
        _model(),
        example_inputs(CONFIG),
        world_size=[8, 16],
        memory_budget="3MiB",
        progress=False,
        workers=2,
    )
    assert [c.label for c in other.candidates] == [c.label for c in tuning.candidates]
    assert [c.traced for c in other.candidates] == [c.traced for c in tuning.candidates]
    for a, b in zip(other.candidates, tuning.candidates, strict=True):
        assert a.report.to_dict() == b.report.to_dict()


def test_tensor_parallelism_with_the_users_plan() -> None:
    """A plan with tensor parallelism: each degree up to a node that divides the heads, and
    plain data parallelism, each traced (a replay keeps its tensor-parallel mesh)."""
    plan = tp_models.example_plan()
    t = fsdpviz.tune(
        _tp_model(),
        example_inputs(TP_CONFIG),
        world_size=8,
        fully_shard=[DecoderLayer],
        mesh=("dp_shard", 4, "tp", 2),
        parallelize_plan=plan,
        knobs=("mesh", "activation_checkpointing"),
        progress=False,
        workers=1,
    )
    meshes = {c.knobs["mesh"] for c in t.candidates}
    assert meshes == {"8 ranks", "8 ranks (FSDP 4 x TP 2)", "8 ranks (FSDP 2 x TP 4)"}
    assert t.user.knobs["mesh"] == "8 ranks (FSDP 4 x TP 2)"
    for c in t.candidates:
        if c.report.config.tp_world_size:
            assert c.traced
            _same(fsdpviz.analyze(_tp_model(), c.inputs, machine="h100", **c.kwargs), c.report)


def test_float8_tp_styles_beside_the_users_plan_only_on_tensor_parallel_meshes() -> None:
    """With the user's plan of torch's styles, tensorwise float8 is tried with it as given and
    with torchao's float8 styles beside it (their gathers in float8: the faster on a slow
    link); a mesh without tensor parallelism then takes the best's float8 as the plain recipe
    it is there. It kept the float8 styles' name on plain FSDP ("tensorwise, float8
    all-gather, torchao's float8 TP styles" on "4 ranks"), a change the code cannot apply."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(0))
    t = fsdpviz.tune(
        tp_models.Llama(layers=2),
        {"tokens": tokens},
        fully_shard=[tp_models.TransformerBlock],
        mesh=("dp_shard", 2, "tp", 2),
        parallelize_plan=tp_models.whole_plan(),
        knobs=("mesh", "float8"),
        allow=("float8",),
        world_size=4,
        machine=fsdpviz.cost.machine("h100", intra_node_gbps=0.01, inter_node_gbps=0.01),
        progress=False,
        workers=1,
    )
    styles = "torchao's float8 TP styles"
    tp = [c for c in t.candidates if c.report.config.tp_world_size]
    best_tp = max(tp, key=lambda c: c.tokens_per_s)
    assert best_tp.knobs["float8"] == f"tensorwise, float8 all-gather, {styles}"
    plain = [c for c in t.candidates if not c.report.config.tp_world_size]
    assert plain and all(styles not in c.knobs["float8"] for c in plain)
    assert "tensorwise, float8 all-gather" in {c.knobs["float8"] for c in plain}


def test_a_tensor_parallel_degree_torch_cannot_run_is_noted() -> None:
    """An MLP of 250 over 4 tp ranks: each rank's chunk (63, 63, 63, 61) made a DTensor by
    ``RowwiseParallel`` as if even fails in torch, so tune leaves that mesh out and says
    why; tp 2 divides it and is evaluated."""
    t = fsdpviz.tune(
        _model(),
        example_inputs(CONFIG),
        world_size=8,
        fully_shard=[DecoderLayer],
        mesh=("dp_shard", 4, "tp", 2),
        parallelize_plan=tp_models.example_plan(),
        knobs=("mesh",),
        progress=False,
        workers=1,
    )
    assert {c.knobs["mesh"] for c in t.candidates} == {"8 ranks", "8 ranks (FSDP 4 x TP 2)"}
    refused = [n for n in t.notes if "8 ranks (FSDP 2 x TP 4)" in n]
    assert len(refused) == 1 and "the 250 input features of layers.0.mlp.down_proj" in refused[0]


def test_a_tensor_parallel_degree_is_traced_once_across_world_sizes() -> None:
    """On more ranks, FSDP x TP of a degree traced already is replayed (the trace reads no
    data-parallel size), and HSDP x TP beside it on two nodes, each the plan analyze
    gives."""
    t = fsdpviz.tune(
        _tp_model(),
        example_inputs(TP_CONFIG),
        world_size=[8, 16],
        fully_shard=[DecoderLayer],
        mesh=("dp_shard", 4, "tp", 2),
        parallelize_plan=tp_models.example_plan(),
        knobs=("mesh", "activation_checkpointing"),
        progress=False,
        workers=1,
    )
    tp = [c for c in t.candidates if c.report.config.tp_world_size]
    assert {c.knobs["mesh"] for c in tp} == {
        "8 ranks (FSDP 4 x TP 2)", "8 ranks (FSDP 2 x TP 4)",
        "16 ranks (FSDP 8 x TP 2)", "16 ranks (FSDP 4 x TP 4)",
        "16 ranks (HSDP 2 x 4 x TP 2)", "16 ranks (HSDP 2 x 2 x TP 4)",
    }  # fmt: skip
    at_8 = {(c.report.config.tp_world_size, c.knobs["activation_checkpointing"]) for c in tp
            if c.world_size == 8}  # fmt: skip
    for c in tp:
        key = (c.report.config.tp_world_size, c.knobs["activation_checkpointing"])
        assert c.traced == (c.world_size == 8 or key not in at_8)
        _same(fsdpviz.analyze(_tp_model(), c.inputs, machine="h100", **c.kwargs), c.report)
    assert any(not c.traced for c in tp if c.world_size == 16)


def test_a_mesh_of_tensor_parallelism_alone_is_the_users() -> None:
    """FSDP over one rank with every rank tensor parallel (KempnerForge's "TP alone", a
    dp_shard of 1 kept in the mesh): the configuration as given is evaluated, as analyze
    plans it, beside the meshes tune would try."""
    t = fsdpviz.tune(
        _model(),
        example_inputs(CONFIG),
        fully_shard=[DecoderLayer],
        mesh=("dp_shard", 1, "tp", 2),
        parallelize_plan=tp_models.example_plan(),
        knobs=("mesh",),
        progress=False,
        workers=1,
    )
    assert t.user.knobs["mesh"] == "2 ranks (FSDP 1 x TP 2)"
    assert {c.knobs["mesh"] for c in t.candidates} == {"2 ranks", "2 ranks (FSDP 1 x TP 2)"}
    _same(fsdpviz.analyze(_model(), t.user.inputs, machine="h100", **t.user.kwargs), t.user.report)


def test_accumulation_under_tensor_parallelism_is_replayed() -> None:
    """Gradient accumulation with tensor parallelism (KempnerForge's FSDP x TP with
    ``set_requires_gradient_sync(False)``): one trace per micro-batch size, the configuration
    as given traced, the other way to accumulate replayed from it (the parallel styles'
    collectives in every micro-step), and each is the plan analyze gives."""
    t = fsdpviz.tune(
        _model(),
        example_inputs(CONFIG),
        fully_shard=[DecoderLayer],
        mesh=("dp_shard", 4, "tp", 2),
        parallelize_plan=tp_models.example_plan(),
        grad_accum=2,
        knobs=("micro_batch",),
        progress=False,
        workers=1,
    )
    user = t.user
    assert (user.micro_batch, user.grad_accum, user.sync_each) == (2, 2, False)
    assert user.report.config.grad_accum == 2 and user.report.config.tp_world_size == 2
    ways = {(c.micro_batch, c.grad_accum, c.sync_each) for c in t.candidates}
    assert ways == {(2, 2, False), (2, 2, True)}  # the first fits: no smaller micro-batch
    assert [c.traced for c in t.candidates] == [True, False]
    assert (t.traces, t.replays) == (1, 1)
    for c in t.candidates:
        _same(fsdpviz.analyze(_model(), c.inputs, machine="h100", **c.kwargs), c.report)


def test_resharding_under_tensor_parallelism_is_replayed() -> None:
    """On each tensor-parallel mesh every resharding choice is evaluated at its fastest fit,
    replayed from the mesh's one trace, but resharding to a node, which FSDP2 refuses for
    tensor-parallel DTensors; HSDP x TP (two nodes: a node per shard group and its tp ranks)
    beside FSDP x TP, replayed from the trace of its tp degree; each is the plan analyze
    gives."""
    t = fsdpviz.tune(
        _tp_model(),
        example_inputs(TP_CONFIG),
        world_size=16,
        fully_shard=[DecoderLayer],
        mesh=("dp_shard", 8, "tp", 2),
        parallelize_plan=tp_models.example_plan(),
        knobs=("mesh", "reshard_after_forward"),
        progress=False,
        workers=1,
    )
    both = ["all but the root", "never", "all but the root and layers.3"]
    shown: dict[str, list[str]] = {}
    for row in t.table.rows:
        shown.setdefault(str(row["mesh"]), []).append(str(row["reshard_after_forward"]))
    assert shown == {
        "16 ranks (FSDP 8 x TP 2)": both,
        "16 ranks": [*both, "to 8 ranks (a node)"],
        "16 ranks (HSDP 2 x 8)": [*both, "to 8 ranks (a node)"],
        "16 ranks (FSDP 4 x TP 4)": both,
        "16 ranks (HSDP 2 x 4 x TP 2)": both,
        "16 ranks (HSDP 2 x 2 x TP 4)": both,
    }
    tp = [c for c in t.candidates if c.report.config.tp_world_size]
    for mesh in ("16 ranks (FSDP 8 x TP 2)", "16 ranks (FSDP 4 x TP 4)"):
        on_mesh = [c for c in tp if c.knobs["mesh"] == mesh]
        assert [c.traced for c in on_mesh].count(True) == 1 and len(on_mesh) == 3
    hsdp = [c for c in tp if "HSDP" in c.knobs["mesh"]]
    assert not any(c.traced for c in hsdp)
    assert {tuple(c.report.config.mesh.items()) for c in hsdp} == {  # type: ignore[union-attr]
        (("dp_replicate", 2), ("dp_shard", 4), ("tp", 2)),
        (("dp_replicate", 2), ("dp_shard", 2), ("tp", 4)),
    }
    model = _tp_model()
    for c in tp:
        fresh = fsdpviz.analyze(model, c.inputs, machine="h100", **c.kwargs)
        assert fresh.timeline.totals["tokens_per_s"] == c.tokens_per_s
        assert fresh.memory.peak["bytes"] == c.peak_bytes
        _same(fresh, c.report)


def test_allowed_compile_and_float8_are_tried_at_the_best() -> None:
    t = fsdpviz.tune(
        _model(),
        example_inputs(CONFIG),
        world_size=8,
        allow=("compile", "float8"),
        knobs=("compile", "float8", "wrap"),
        fully_shard=[DecoderLayer],
        progress=False,
        workers=1,
    )
    assert {c.knobs["compile"] for c in t.candidates} == {"off", "each DecoderLayer"}
    assert {c.knobs["float8"] for c in t.candidates} == {
        "off",
        "tensorwise",
        "tensorwise, float8 all-gather",
    }
    compiled = next(c for c in t.candidates if c.knobs["compile"] != "off")
    assert compiled.report.config.compile == ("DecoderLayer",)
    plain = fsdpviz.tune(
        _model(), example_inputs(CONFIG), world_size=8, progress=False, workers=1, knobs=("wrap",)
    )
    assert {c.knobs["compile"] for c in plain.candidates} == {"off"}


def test_resharding_every_unit_the_root_too_reads_so() -> None:
    """``reshard_after_forward=True`` (KempnerForge's) reshards the root too, unlike FSDP2's
    default: its own choice, read in words."""
    t = fsdpviz.tune(_model(), example_inputs(CONFIG), world_size=8, fully_shard=[DecoderLayer],
                     reshard_after_forward=True, knobs=("reshard_after_forward",),
                     progress=False, workers=1)  # fmt: skip
    assert t.user.knobs["reshard_after_forward"] == "all, the root too"
    per_group = t.user.report.config.to_dict()["reshard_after_forward"]
    assert per_group[""] is True and all(v is True for v in per_group.values())


def test_float8_keeps_the_linears_the_recipe_keeps_in_high_precision() -> None:
    """The linears a recipe leaves out of float8 (``filter_fqns``: torchtitan's output head)
    are a choice of numerics, not speed: tune's float8 choices keep them out too, and the
    recipe's own is one of them, not a duplicate."""
    t = fsdpviz.tune(
        _model(),
        example_inputs(CONFIG),
        world_size=8,
        allow=("float8",),
        knobs=("float8",),
        fully_shard=[DecoderLayer],
        float8={"recipe_name": "tensorwise", "filter_fqns": ["q_proj"]},
        progress=False,
        workers=1,
    )
    assert {c.knobs["float8"] for c in t.candidates} == {
        "off",
        "tensorwise, except q_proj",
        "tensorwise, float8 all-gather, except q_proj",
    }
    assert t.user.knobs["float8"] == "tensorwise, except q_proj"
    for c in t.candidates:
        if c.knobs["float8"] != "off":
            assert c.report.config.float8 is not None
            assert c.report.config.float8["filter_fqns"] == ["q_proj"]
    gather = next(c for c in t.candidates if "all-gather" in c.knobs["float8"])
    toml = gather.code("torchtitan")
    assert 'enable_fsdp_float8_all_gather = true\nfilter_fqns = ["q_proj"]' in toml


def test_a_hugging_face_search_is_exact_too() -> None:
    """A Hugging Face model (its inputs without the key/value cache but for the given)."""
    import hf_models

    model, inputs, block = hf_models.llama()
    t = fsdpviz.tune(
        model, inputs, world_size=[4, 8], fully_shard=[block], progress=False, workers=1
    )
    assert any("use_cache=False" in n for n in t.notes)
    assert "use_cache" not in t.user.inputs
    sample = [c for c in t.candidates if c.traced] + t.candidates[1::7]
    for c in sample:
        if c is not t.user:
            assert c.inputs["use_cache"] is False
        _same(fsdpviz.analyze(model, c.inputs, machine="h100", **c.kwargs), c.report)
    assert {c.knobs["activation_checkpointing"] for c in t.candidates} >= {"none"}


def _titan_pipeline(**options: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """torchtitan's debug Llama 3 (six blocks, sequences of 64) and the FSDP2 plan over 2
    pipeline ranks x 2 shard ranks the pipeline tests tune from (``options`` over it)."""
    from fsdpviz.configs.torchtitan_model import build_llama3

    blocks = [f"layers.{i}" for i in range(6)]
    given = {
        "fully_shard": ["tok_embeddings", *blocks, ("norm", "output")],
        "reshard_after_forward": False,
        "mesh": ("pp", 2, "dp_shard", 2),
        "pipeline_schedule": "1F1B",
        "microbatches": 2,
    }
    return build_llama3("debugmodel", 64), {**given, **options}


def test_a_pipeline_is_tuned_by_its_schedule_and_degree_every_configuration_traced() -> None:
    titan, given = _titan_pipeline()
    inputs = torch.zeros(4, 64, dtype=torch.long)
    t = fsdpviz.tune(titan, inputs, **given, progress=False, workers=1)
    pairs = {(c.knobs["mesh"], c.knobs["pipeline"]) for c in t.candidates}
    assert pairs == {
        ("4 ranks (PP 2 x FSDP 2)", "1F1B, 2 microbatches"),
        ("4 ranks (PP 2 x FSDP 2)", "Interleaved1F1B, 2 microbatches"),
        ("4 ranks (PP 2 x FSDP 2)", "ZBVZeroBubble, 2 microbatches"),
        # 1F1B runs one stage per rank and refuses fewer microbatches than stages
        ("4 ranks (PP 4)", "Interleaved1F1B, 2 microbatches"),
        ("4 ranks (PP 4)", "ZBVZeroBubble, 2 microbatches"),
        ("4 ranks (FSDP 4)", "none (pp 1)"),
    }
    assert any(
        n.startswith("4 ranks (PP 4) with 1F1B, 2 microbatches not tried: torch's 1F1B refuses")
        for n in t.notes
    )
    assert all(c.traced for c in t.candidates) and t.traces == len(t.candidates)
    # the global batch stays: a pipeline's batch (the inputs) scales with the pp degree
    batch = {"4 ranks (PP 2 x FSDP 2)": 4, "4 ranks (PP 4)": 8, "4 ranks (FSDP 4)": 2}
    pp = {"4 ranks (PP 2 x FSDP 2)": 2, "4 ranks (PP 4)": 4, "4 ranks (FSDP 4)": 1}
    for c in t.candidates:
        mesh = c.knobs["mesh"]
        assert c.inputs.shape == (batch[mesh], 64) and c.micro_batch == batch[mesh]
        assert c.knobs["micro_batch"] == f"{batch[mesh]} x 1 micro-step"
        assert c.world_size == 4
        # the same tokens per rank per step (a pipeline's batch over its ranks) at every degree
        assert c.report.timeline.totals["tokens"] / pp[mesh] == 2 * 64
        if pp[mesh] == 1:
            assert not {"mesh", "pipeline_schedule", "microbatches"} & set(c.kwargs)
            assert c.report.pipeline is None
        else:
            assert c.report.pipeline is not None and c.report.pipeline.pp_size == pp[mesh]
            assert c.kwargs["mesh"] == ("pp", pp[mesh], "dp_shard", 4 // pp[mesh])
            assert c.kwargs["microbatches"] == 2
        fresh = fsdpviz.analyze(titan, c.inputs, machine="h100", **c.kwargs)
        assert fresh.timeline.totals == c.report.timeline.totals
        assert fresh.memory.peak == c.report.memory.peak
    slow = t.why_slow()
    assert slow[0]["cause"] == "bubbles" and slow[0]["knob"] == "pipeline"
    # the micro-batch follows the pp degree: no alternative of its own, and a cause that a
    # larger micro-batch would help points at the mesh that gives one
    assert "micro_batch" not in {a["knob"] for a in t.alternatives()}
    for row in slow:
        if row["knob"] == "micro_batch" and row["predicted"]:
            assert row["predicted"].startswith("tune: ranks ")
    # the mesh kept as given when pinned or not turned
    for pin in ({"fixed": {"mesh": given["mesh"]}}, {"knobs": ("pipeline", "precision")}):
        kept = fsdpviz.tune(titan, inputs, **given, **pin, progress=False, workers=1)
        assert {c.knobs["mesh"] for c in kept.candidates} == {"4 ranks (PP 2 x FSDP 2)"}
    with pytest.raises(fsdpviz.ConfigError, match="keeps a pipeline's ranks as given"):
        fsdpviz.tune(
            titan,
            torch.zeros(4, 64, dtype=torch.long),
            world_size=8,
            mesh=("pp", 2, "dp_shard", 2),
            progress=False,
        )


def test_a_pipeline_torch_would_fail_is_not_evaluated_and_says_why() -> None:
    """InterleavedZeroBubble with 3 stages per rank resharding after forward fails in
    torch's weight backward (see tests/test_schedule_pipeline.py): tune skips that
    resharding with a note and plans the rest."""
    stages = [["tok_embeddings", "layers.0"], *[[f"layers.{i}"] for i in range(1, 5)],
              ["layers.5", "norm", "output"]]  # fmt: skip
    titan, given = _titan_pipeline(
        pipeline_schedule="InterleavedZeroBubble", pipeline_stages=stages, microbatches=4
    )
    t = fsdpviz.tune(titan, torch.zeros(4, 64, dtype=torch.long), **given,
                     knobs=("reshard_after_forward",), progress=False, workers=1)  # fmt: skip
    assert {c.knobs["reshard_after_forward"] for c in t.candidates} == {"never"}
    skipped = [n for n in t.notes if n.startswith("not evaluated")]
    assert skipped and all(
        "InterleavedZeroBubble on pipeline rank 1: torch fails at 3W1" in n
        and "KeyError: <AccumulateGrad ...>" in n
        for n in skipped
    )


def test_a_shard_placement_fn_as_given_stays_and_is_in_the_code() -> None:
    from torch.distributed.tensor import Shard

    def columns(p: torch.nn.Parameter) -> Shard | None:
        return Shard(1) if p.ndim == 2 and p.shape[1] % 16 == 0 else None

    model = _model()
    t = fsdpviz.tune(
        model,
        example_inputs(CONFIG),
        world_size=8,
        config={"fully_shard": [DecoderLayer], "shard_placement_fn": columns},
        knobs=("wrap", "reshard_after_forward"),
        memory_budget="3MiB",
        progress=False,
        workers=1,
    )
    for c in [t.user, *t.candidates[:: max(1, len(t.candidates) // 4)]]:
        assert c.kwargs["shard_placement_fn"] is columns
        assert any(u.shard_dims for u in c.report.units)
        _same(fsdpviz.analyze(model, c.inputs, machine="h100", **c.kwargs), c.report)
    code = t.user.code()
    assert "# shard_placement_fn: your function, as given" in code
    calls = [line for line in code.splitlines() if "fully_shard(" in line and "import" not in line]
    assert calls and all("shard_placement_fn=shard_placement_fn" in line for line in calls)


def test_a_pipelines_code_builds_its_stages_and_schedule() -> None:
    import ast
    import tomllib

    from fsdpviz.plan.pipeline import schedule_class

    titan, given = _titan_pipeline()
    t = fsdpviz.tune(titan, torch.zeros(4, 64, dtype=torch.long), **given,
                     knobs=("pipeline",), progress=False, workers=1)  # fmt: skip
    seen = set()
    for c in t.candidates:
        pipe = c.report.pipeline
        assert pipe is not None
        code = c.code()
        ast.parse(code)  # valid Python
        tree = ast.parse(code.split("stage_modules = ", 1)[1].split("\n}", 1)[0] + "\n}")
        parts = ast.literal_eval(tree.body[0].value)  # type: ignore[attr-defined]
        assert parts == {st.index: st.modules for st in pipe.stages}
        _, cls = schedule_class(pipe.schedule)
        assert f"schedule = {cls.__name__}(" in code
        assert f"n_microbatches={pipe.microbatches}" in code
        ranks: dict[int, list[int]] = {}
        for st in pipe.stages:
            ranks.setdefault(st.rank, []).append(st.index)
        assert f"stages_of_rank = {ranks!r}" in code
        titan_cfg = tomllib.loads(c.code("torchtitan"))
        par = titan_cfg["parallelism"]
        assert par["pipeline_parallel_degree"] == pipe.pp_size == 2
        assert par["data_parallel_shard_degree"] == 2
        assert par["module_fqns_per_model_part"] == [
            st.modules for st in sorted(pipe.stages, key=lambda st: st.index)
        ]
        assert par["pipeline_parallel_microbatch_size"] * pipe.microbatches == c.micro_batch
        assert titan_cfg["training"]["global_batch_size"] == c.micro_batch * 2
        with pytest.raises(fsdpviz.ConfigError, match="no pipeline parallelism"):
            c.code("accelerate")
        seen.add(cls.__name__)
    assert seen == {"Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble"}
