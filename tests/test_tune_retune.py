"""Tuning.retune: the same search for another machine, world size or budget, the earlier
traces reused; exactly what a fresh fsdpviz.tune gives."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import tp_models

import fsdpviz
from fsdpviz.cost import machine
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.tuning import Tuning

CONFIG = ExampleConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_heads=4,
                       num_layers=3)  # fmt: skip
# an H100 with just enough memory above the CUDA context for some configurations to fit
SMALL = machine("h100", memory_gib=1.506, name="small H100")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return example_model(CONFIG)


def _tune(model: torch.nn.Module, **kwargs: Any) -> Tuning:
    return fsdpviz.tune(model, example_inputs(CONFIG), progress=False, workers=1, **kwargs)


def _counts(text: str) -> str:
    counts = r"\(\d+ traced(, \d+ traces? reused)?(, \d+ derived from [^,)]+)*, the rest replayed\)"
    return re.sub(counts + r" in [\d.]+ s", "", text)


def _same_search(got: Tuning, fresh: Tuning, *, replayed: set[int] | None = None) -> None:
    """The same candidates in the same order, every number and plan equal, the same best,
    notes, needs and summary but for its counts; ``replayed``: the candidates the fresh search
    traced and ``got`` replayed from an earlier trace (their plans say so, and only that
    differs)."""
    assert [c.label for c in got.candidates] == [c.label for c in fresh.candidates]
    for a, b in zip(got.candidates, fresh.candidates, strict=True):
        ra, rb, da, db = a.row(), b.row(), a.report.to_dict(), b.report.to_dict()
        ra.pop("derived"), rb.pop("derived")  # a retune reuses what a fresh search derives
        if a.index in (replayed or set()):
            assert (ra.pop("traced"), rb.pop("traced")) == (False, True)
            assert (da["config"].pop("replayed"), db["config"].pop("replayed", False)) == (
                True,
                False,
            )
        assert ra == rb
        assert da == db
        assert a.kwargs.keys() == b.kwargs.keys()
    got_d, fresh_d = dict(got.to_dict()), dict(fresh.to_dict())
    for key in ("rows", "traces", "replays", "reused", "derived", "checkpoint_derived", "seconds"):
        got_d.pop(key), fresh_d.pop(key)
    assert got_d == fresh_d
    assert got.best is not None and fresh.best is not None
    assert got.best.index == fresh.best.index
    assert _counts(got.summary()) == _counts(fresh.summary())


def _replayed(got: Tuning, fresh: Tuning) -> set[int]:
    """The candidates a fresh search traced and ``got`` replayed from an earlier trace."""
    return {
        a.index
        for a, b in zip(got.candidates, fresh.candidates, strict=True)
        if b.traced > a.traced
    }


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return _model()


@pytest.fixture(scope="module")
def fsdp2(model: torch.nn.Module) -> Tuning:
    return _tune(model, world_size=8)


def test_another_machine_is_a_fresh_tune_with_its_traces_reused(
    model: torch.nn.Module, fsdp2: Tuning
) -> None:
    """On a machine where fewer configurations fit (their out-of-memory warnings its own),
    the search goes further: it traces only what the first search did not."""
    got = fsdp2.retune(machine=SMALL)
    fresh = _tune(model, world_size=8, machine=SMALL)
    _same_search(got, fresh)
    assert got.machine == "small H100" and len(got.fitting) < len(got.candidates)
    assert any(w.code == "out_of_memory" for c in got.candidates for w in c.report.warnings)
    assert not any(w.code == "out_of_memory" for c in fsdp2.candidates for w in c.report.warnings)
    assert got.reused > 0 and got.traces > 0 and got.traces + got.reused == fresh.traces
    assert f"({got.traces} traced, {got.reused} traces reused, the rest replayed)" in str(got)
    # the first search is left as it was
    assert fsdp2.machine == "H100 SXM 80GB" and fsdp2.reused == 0


def test_a_budget_and_an_optimizer(model: torch.nn.Module, fsdp2: Tuning) -> None:
    got = fsdp2.retune(memory_budget="2.3MiB", optimizer="sgd")
    fresh = _tune(model, world_size=8, memory_budget="2.3MiB", optimizer="sgd")
    _same_search(got, fresh)
    assert got.reused > 0 and got.traces + got.reused == fresh.traces
    again = got.retune(memory_budget="3MiB")  # all of its keys were traced by now
    _same_search(again, _tune(model, world_size=8, memory_budget="3MiB", optimizer="sgd"))
    assert again.traces == 0


def test_more_ranks_replay_the_traces(model: torch.nn.Module, fsdp2: Tuning) -> None:
    """A world size is replayed: every trace key the 8-rank search traced is reused, and only
    the keys its climb did not reach there (another micro-batch or precision, where more ranks
    leave room or shift the balance) are traced."""
    got = fsdp2.retune(world_size=[16, 32])
    fresh = _tune(model, world_size=[16, 32])
    replayed = _replayed(got, fresh)
    _same_search(got, fresh, replayed=replayed)
    assert got.reused > 0 and got.traces + got.reused == fresh.traces
    traced_fresh = {c.index for c in fresh.candidates if c.traced}
    traced_got = {c.index for c in got.candidates if c.traced}
    assert replayed == traced_fresh - traced_got and len(traced_got) == got.traces


def test_retunes_chain_and_reuse_every_trace_so_far(model: torch.nn.Module, fsdp2: Tuning) -> None:
    small = fsdp2.retune(machine=SMALL)
    back = small.retune(machine="h100", memory_budget="3MiB")
    fresh = _tune(model, world_size=8, memory_budget="3MiB")
    _same_search(back, fresh)
    again = back.retune(machine=SMALL)
    assert again.traces == 0 and again.reused == small.traces + small.reused


def test_fsdp1_on_another_machine_and_budget(model: torch.nn.Module) -> None:
    first = _tune(model, world_size=8, api="fsdp1", memory_budget="3MiB")
    got = first.retune(machine="a100-40gb", memory_budget="2.3MiB")
    fresh = _tune(model, world_size=8, api="fsdp1", machine="a100-40gb", memory_budget="2.3MiB")
    _same_search(got, fresh)
    assert got.reused > 0 and got.traces + got.reused == fresh.traces
    wider = first.retune(world_size=16)
    fresh = _tune(model, world_size=16, api="fsdp1", memory_budget="3MiB")
    _same_search(wider, fresh, replayed=_replayed(wider, fresh))
    assert wider.reused > 0 and wider.traces + wider.reused == fresh.traces


def test_more_ranks_trace_only_a_new_tensor_parallel_degree(model: torch.nn.Module) -> None:
    """On 2 ranks tensor parallelism is tried at degree 2 alone; on 8, degree 4 too: only
    its traces are new, the rest replayed (the tp degree keys a trace). (The mesh given is
    of the first world size.)"""
    given: dict[str, Any] = {
        "fully_shard": [DecoderLayer], "mesh": ("dp_shard", 1, "tp", 2),
        "parallelize_plan": tp_models.example_plan(), "knobs": ("mesh", "activation_checkpointing"),
    }  # fmt: skip
    first = _tune(model, world_size=2, **given)
    got = first.retune(world_size=[2, 8])
    fresh = _tune(model, world_size=[2, 8], **given)
    _same_search(got, fresh, replayed=_replayed(got, fresh))
    labels = {c.label for c in first.candidates}
    new = [c for c in got.candidates if c.traced and c.label not in labels]
    assert {c.report.config.tp_world_size for c in new} == {4} and got.traces == len(new)
    assert got.reused == first.traces
    assert got.traces + got.reused == fresh.traces


def test_a_changed_model_is_refused() -> None:
    model = _model()
    t = _tune(model, world_size=8, memory_budget="3MiB")
    model.layers[0].mlp.up_proj.weight.requires_grad_(False)
    with pytest.raises(fsdpviz.ConfigError, match=r"changed since it was tuned.*tune again"):
        t.retune(machine="h200")
    model.layers[0].mlp.up_proj.weight.requires_grad_(True)
    model.extra = torch.nn.Linear(2, 2)
    with pytest.raises(fsdpviz.ConfigError, match="changed since it was tuned"):
        t.retune(machine="h200")
    del model.extra
    assert t.retune(machine="h200").traces == 0  # as it was: the traces hold again
    config: dict[str, Any] = {"fully_shard": [DecoderLayer]}
    t = _tune(model, world_size=8, memory_budget="3MiB", config=config, knobs=("wrap",))
    config["activation_checkpointing"] = [DecoderLayer]
    with pytest.raises(fsdpviz.ConfigError, match="configuration changed since it was tuned"):
        t.retune(machine="h200")


@pytest.mark.parametrize(
    ("change", "name"),
    [({"api": "fsdp1"}, "'api'"), ({"fully_shard": [DecoderLayer]}, "'fully_shard'"),
     ({"fixed": {"micro_batch": 1}}, "'fixed'"), ({"inputs": None}, "'inputs'")],
)  # fmt: skip
def test_what_changes_the_traces_is_refused(
    fsdp2: Tuning, change: dict[str, Any], name: str
) -> None:
    with pytest.raises(fsdpviz.ConfigError, match=rf"retune cannot change {name}.*tune again"):
        fsdp2.retune(**change)


def test_a_failed_retune_leaves_the_tuning_as_it_was(fsdp2: Tuning) -> None:
    before = [c.report.to_dict() for c in fsdp2.candidates]
    with pytest.raises(fsdpviz.ConfigError, match="h999"):
        fsdp2.retune(machine="h999")
    with pytest.raises(fsdpviz.ConfigError, match="world_size"):
        fsdp2.retune(world_size=0)
    assert [c.report.to_dict() for c in fsdp2.candidates] == before
    assert fsdp2.retune(machine="h200").traces == 0


def test_a_pipeline_on_another_machine() -> None:
    """Every configuration of a pipeline is traced (nothing replays it): a retune traces
    none."""
    from fsdpviz.configs.torchtitan_model import build_llama3

    titan = build_llama3("debugmodel", 64)
    blocks = [f"layers.{i}" for i in range(6)]
    given: dict[str, Any] = {
        "fully_shard": ["tok_embeddings", *blocks, ("norm", "output")],
        "mesh": ("pp", 2, "dp_shard", 2), "pipeline_schedule": "1F1B", "microbatches": 2,
        "knobs": ("mesh", "pipeline"), "progress": False, "workers": 1,
    }  # fmt: skip
    inputs = torch.zeros(4, 64, dtype=torch.long)
    first = fsdpviz.tune(titan, inputs, **given)
    got = first.retune(machine="a100-40gb", memory_budget="100MiB")
    fresh = fsdpviz.tune(titan, inputs, machine="a100-40gb", memory_budget="100MiB", **given)
    _same_search(got, fresh)
    assert (got.traces, got.reused) == (0, len(fresh.candidates))


DEBUG_TOML = """\
[model]
name = "llama3"
flavor = "debugmodel"

[training]
local_batch_size = 2
seq_len = 64

[parallelism]
data_parallel_shard_degree = 4

[activation_checkpoint]
mode = "selective"
selective_ac_option = "2"
"""


def test_a_torchtitan_job(tmp_path: Any) -> None:
    path = tmp_path / "llama3.toml"
    path.write_text(DEBUG_TOML)
    job = fsdpviz.from_torchtitan(path)
    first = fsdpviz.tune(job, progress=False, workers=1, knobs=("wrap", "precision"))
    got = first.retune(machine="h200")
    fresh = fsdpviz.tune(
        job, machine="h200", progress=False, workers=1, knobs=("wrap", "precision")
    )
    _same_search(got, fresh)
    assert got.source == "torchtitan" and (got.traces, got.reused) == (0, fresh.traces)
    job.model.to(torch.bfloat16)
    with pytest.raises(fsdpviz.ConfigError, match="changed since it was tuned"):
        first.retune(machine="h200")


@pytest.mark.parametrize("api", ["fsdp2", "fsdp1"])
def test_precisions_sharing_a_trace(model: torch.nn.Module, api: str) -> None:
    """The recipe's bf16 reduction and the standard fp32 one share a trace (the reduce dtype
    replays): a retune takes it for both, as the fresh search does."""
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    bf16 = torch.bfloat16
    mine: dict[str, Any] = (
        {"mp_policy": MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)}
        if api == "fsdp2"
        else {"mixed_precision": MixedPrecision(param_dtype=bf16, reduce_dtype=bf16)}
    )
    first = _tune(model, world_size=8, api=api, memory_budget="3MiB", **mine)
    got = first.retune(machine=SMALL, memory_budget=None)
    fresh = _tune(model, world_size=8, api=api, machine=SMALL, **mine)
    _same_search(got, fresh)
    assert {c.knobs["precision"] for c in got.candidates} >= {
        "bf16 params", "bf16 params, fp32 reduce"
    }  # fmt: skip
    assert got.reused > 0 and got.traces + got.reused == fresh.traces


def test_a_trace_whose_mm_strategies_torch_picks_otherwise_on_the_new_nodes_is_traced_again() -> (
    None
):
    """A batch of one's sequence-sharded feed-forward input left to its column-wise linears
    (tp 4): DTensor's mm strategies are picked for the machine's nodes, within one node of
    8 GPUs, across nodes of 2. A retune on nodes of 2 traces those keys again (the earlier
    traces' collectives are not torch's there) and is the fresh search's, collective for
    collective; a retune on other nodes of 8 reuses every trace."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    plan = tp_models.plain_plan()
    plan["layers.*.feed_forward"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=False
    )
    model = tp_models.Llama(vocab=32, dim=128, n_heads=4, hidden=64)
    given: dict[str, Any] = {
        "world_size": 4, "fully_shard": tp_models.LAYERS, "mesh": ("dp_shard", 1, "tp", 4),
        "parallelize_plan": plan, "knobs": ("activation_checkpointing",), "progress": False,
        "workers": 1,
    }  # fmt: skip
    ids = torch.zeros(1, 64, dtype=torch.long)
    first = fsdpviz.tune(model, ids, machine=machine("h100", gpus_per_node=8), **given)
    two = machine("h100", gpus_per_node=2)
    got, fresh = first.retune(machine=two), fsdpviz.tune(model, ids, machine=two, **given)

    def tp_events(t: Tuning) -> list[list[tuple[str, int | None]]]:
        return [
            [(e.kind, e.nbytes) for e in c.report.iterations[0] if e.tensor_parallel]
            for c in t.candidates
        ]

    assert {c.report.config.tp_strategy_gpus_per_node for c in first.candidates} == {8}
    assert {c.report.config.tp_strategy_gpus_per_node for c in got.candidates} == {2}
    assert (got.traces, got.reused) == (fresh.traces, 0)
    assert tp_events(got) == tp_events(fresh) != tp_events(first)
    again = first.retune(machine="h200")
    assert (again.traces, again.reused) == (0, first.traces)
