"""Conformance of FSDP2 + tensor parallelism (2-D) against real torch on 4 gloo ranks.

The ranks form a dp 2 x tp 2 mesh; a Llama-style model (``tp_models.Llama``) gets
torchtitan's tensor-parallel plan with ``parallelize_module`` and ``fully_shard`` on the dp
dimension, and each rank records its run. ``analyze`` of the unparallelised model with the
same plan (``parallelize_plan=``, ``mesh=("dp", 2, "tp", 2)``) must equal every rank: its
units with each parameter's shard shape and tp placement, and both iterations' FSDP events;
the tensor-parallel collectives, which FSDP's recorder does not see, are recorded apart
from DTensor's functional collectives and must equal the predicted ones, kind and bytes.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import tp_models
from fsdp_harness import assert_same_schedule
from gloo_worker import TP_MESH, spawn_suite

import fsdpviz

WORLD_SIZE = TP_MESH[0] * TP_MESH[1]


@pytest.fixture(scope="module")
def tp_recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spawn_suite(tmp_path_factory.mktemp("gloo-tp"), WORLD_SIZE, "tp")


def predict(**kwargs: Any) -> fsdpviz.Report:
    torch.manual_seed(0)
    return fsdpviz.analyze(
        tp_models.Llama(),
        tp_models.tokens(),
        fully_shard=tp_models.LAYERS,
        mesh=("dp", TP_MESH[0], "tp", TP_MESH[1]),
        parallelize_plan=tp_models.whole_plan(),
        **kwargs,
    )


def fsdp_only(report: fsdpviz.Report) -> fsdpviz.Report:
    """The report without tensor parallelism's events (what FSDP's recorder records)."""
    its = [[e for e in it if not e.tensor_parallel] for it in report.iterations]
    return fsdpviz.Report.from_dict({**report.to_dict(), "iterations": [
        [e.to_dict() for e in it] for it in its]})  # fmt: skip


@pytest.mark.slow
def test_fsdp_and_tensor_parallel_on_a_2x2_mesh_match_four_gloo_ranks(tp_recordings: Path) -> None:
    predicted = predict()
    for rank in range(WORLD_SIZE):
        real = fsdpviz.load(str(tp_recordings / f"tp-llama-rank{rank}.json"))
        assert real.config["rank"] == rank and real.config["world_size"] == WORLD_SIZE
        assert_same_schedule(real, fsdp_only(predicted))
        assert fsdpviz.diff(real, predicted).equal  # compared on FSDP's kinds
        for r_unit, p_unit in zip(real.units, predicted.units, strict=True):
            assert r_unit.shard_shapes == p_unit.shard_shapes and r_unit.shard_shapes
            assert r_unit.tp_placements == p_unit.tp_placements
        # tensor parallelism's collectives, as DTensor issued them, in order, three iterations
        seen = json.loads((tp_recordings / f"tp-llama-collectives-rank{rank}.json").read_text())
        tp = [[e.kind, e.nbytes] for e in predicted.iterations[1] if e.tensor_parallel]
        assert seen == tp * 3
    wq = predicted.units[1].shard_shapes["layers.0.attention.wq.weight"]
    assert wq == [16 // 2 // 2, 16]  # tp Shard(0), then FSDP's dim-0 shard
    assert predicted.units[1].tp_placements["layers.0.attention.wo.weight"] == "Shard(1)"


def test_a_model_parallelised_on_meta_is_read_from_its_dtensors(fake_pg: int) -> None:
    """parallelize_module + fully_shard on a meta model (fake process group): the plan read
    from the model's DTensor placements and hooks equals the plan given as options."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    assert fake_pg == WORLD_SIZE
    mesh = init_device_mesh("cpu", TP_MESH, mesh_dim_names=("dp", "tp"))
    with torch.device("meta"):
        model = tp_models.parallelize(tp_models.Llama(), mesh["tp"])
    for (name,) in tp_models.LAYERS:
        fully_shard(model.get_submodule(name), mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    applied = fsdpviz.analyze(model, tp_models.tokens())
    predicted = predict()
    assert [u.to_dict() for u in applied.units] == [u.to_dict() for u in predicted.units]
    assert applied.config.to_dict() == predicted.config.to_dict()
    for a, b in zip(applied.iterations, predicted.iterations, strict=True):
        assert [e.to_dict() for e in a] == [e.to_dict() for e in b]
    assert type(model.layers["0"].attention.wq.weight).__name__ == "DTensor"  # left as it was


def test_tensor_parallel_collectives_of_torchtitans_plan() -> None:
    """Sequence parallel: each block all-gathers its attention and MLP inputs and
    reduce-scatters their outputs in forward, the reverse in backward; the norms' partial
    gradients are all-reduced in the block's post-backward, before its reduce-scatter."""
    report = predict()
    steady = report.iterations[1]
    block = [
        (e.kind, e.module, e.phase) for e in steady if e.tensor_parallel and e.unit == "layers.1"
    ]
    assert block == [
        ("tp_all_gather", "layers.1.attention", "forward"),
        ("tp_reduce_scatter", "layers.1.attention.wo", "forward"),
        ("tp_all_gather", "layers.1.feed_forward", "forward"),
        ("tp_reduce_scatter", "layers.1.feed_forward.w2", "forward"),
        ("tp_all_gather", "layers.1.feed_forward.w2", "backward"),
        ("tp_reduce_scatter", "layers.1.feed_forward", "backward"),
        ("tp_all_gather", "layers.1.attention.wo", "backward"),
        ("tp_reduce_scatter", "layers.1.attention", "backward"),
        ("tp_all_reduce", "layers.1.attention_norm.weight", "backward"),
        ("tp_all_reduce", "layers.1.ffn_norm.weight", "backward"),
    ]
    kinds = [(e.kind, e.module) for e in steady if e.unit == "layers.1" and e.phase == "backward"]
    assert kinds.index(("reduce_scatter", None)) > kinds.index(
        ("tp_all_reduce", "layers.1.ffn_norm.weight")
    )
    activation = 2 * 8 * 16 * 4  # batch x sequence x dim, float32: the whole tensor
    assert {e.nbytes for e in steady if e.module == "layers.1.attention"} == {activation}
    assert all(e.group == "tp" for e in steady if e.tensor_parallel)
    assert report.config.mesh == {"dp": 2, "tp": 2} and report.config.tp_world_size == 2
    assert report.config.world_size == 4 and report.config.shard_world_size == 2


def test_a_plan_without_prepare_module_input_matches_dtensor(
    fake_pg: int, bench_published: ModuleType
) -> None:
    """KempnerForge's plan as benchmarks/bench_published.py rebuilds it, each projection its
    own ``ColwiseParallel(input_layouts=Shard(1))``: q, k, v (and the
    MLP's w1, w3) each all-gather the norm's sequence-sharded output in forward and each
    reduce-scatter its gradient in backward; the replicated embedding output's chunk for the
    first norm all-gathers its gradient back. Compared with what DTensor issues on the fake
    process group, in order, kind and bytes; one collective is not modelled: DTensor's own
    redistribution of that replicated output in the first block's residual add (a chunk in
    forward, so an all-gather of its gradient in backward)."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", TP_MESH, mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = tp_models.Llama()
    parallelize_module(model, mesh["tp"], bench_published.kempner_tp_plan())
    tp_models.rewrap_block_outputs(model, mesh["tp"])
    for (name,) in tp_models.LAYERS:
        fully_shard(model.get_submodule(name), mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    with _tp_collectives() as seen:
        for _ in range(2):
            model(tp_models.tokens()).sum().backward()
    real = seen[len(seen) // 2 :]
    torch.manual_seed(0)
    report = fsdpviz.analyze(
        tp_models.Llama(), tp_models.tokens(), fully_shard=tp_models.LAYERS,
        mesh=("dp", 2, "tp", 2), parallelize_plan=bench_published.kempner_tp_plan(),
        progress=False,
    )  # fmt: skip
    steady = [e for e in report.iterations[1] if e.tensor_parallel]
    activation = 2 * 8 * 16 * 4  # batch x sequence x dim, float32
    residual = ["tp_all_gather", activation]  # before the root's norm.weight all-reduce
    assert real[-2] == residual and real[-1][0] == "tp_all_reduce"
    assert [[e.kind, e.nbytes] for e in steady] == real[:-2] + real[-1:]
    first = [(e.kind, e.module, e.phase) for e in steady if e.unit == "layers.0"]
    assert first[:7] == [
        ("tp_all_gather", "layers.0.attention.wq", "forward"),
        ("tp_all_gather", "layers.0.attention.wk", "forward"),
        ("tp_all_gather", "layers.0.attention.wv", "forward"),
        ("tp_reduce_scatter", "layers.0.attention.wo", "forward"),
        ("tp_all_gather", "layers.0.feed_forward.w1", "forward"),
        ("tp_all_gather", "layers.0.feed_forward.w3", "forward"),
        ("tp_reduce_scatter", "layers.0.feed_forward.w2", "forward"),
    ]
    assert ("tp_all_gather", "layers.0.attention_norm", "backward") in first


def test_tensor_parallel_option_errors() -> None:
    model, ids = tp_models.Llama(), tp_models.tokens()
    plan = tp_models.whole_plan()
    with pytest.raises(fsdpviz.ConfigError, match="needs a mesh with a tensor-parallel"):
        fsdpviz.analyze(model, ids, fully_shard=tp_models.LAYERS, parallelize_plan=plan)
    with pytest.raises(fsdpviz.ConfigError, match="'tp' dimension but no parallelize_plan"):
        fsdpviz.analyze(model, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2))
    with pytest.raises(fsdpviz.ConfigError, match="matches no module"):
        fsdpviz.analyze(model, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2),
                        parallelize_plan={"layers.*.attn.wq": plan["output"]})  # fmt: skip
    with pytest.raises(fsdpviz.ConfigError, match="must be parallelize_module's plan"):
        fsdpviz.analyze(model, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2),
                        parallelize_plan={"output": "colwise"})  # fmt: skip
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"only support nn\.Linear and nn\.Embedding"):
        fsdpviz.analyze(model, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2),
                        parallelize_plan={"norm": plan["output"]})  # fmt: skip
    # FSDPParam.to_sharded_post_forward: no smaller post-forward mesh for DTensor parameters
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"reshard_after_forward=2 for 'layers.0', "
                       "whose parameters are tensor-parallel DTensors"):  # fmt: skip
        fsdpviz.analyze(model, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 4, "tp", 2),
                        parallelize_plan=plan, reshard_after_forward={"layers.0": 2})  # fmt: skip
    fsdpviz.analyze(model, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 4, "tp", 2),
                    parallelize_plan=plan, reshard_after_forward=4, progress=False)  # fmt: skip
    with pytest.raises(fsdpviz.ConfigError, match="tp dimension must be the last"):
        fsdpviz.analyze(model, ids, fully_shard=tp_models.LAYERS, mesh=("tp", 2, "dp", 2),
                        parallelize_plan=plan)  # fmt: skip


def test_partial_gradients_accumulated_in_the_reduce_dtype(fake_pg: int) -> None:
    """bf16 parameters reducing in float32, two micro-steps, the first without gradient sync:
    FSDP2 keeps the norms' unreduced partial gradients in float32 between them
    (``FSDPParam.to_accumulated_grad_if_needed``), so the syncing micro-step all-reduces them
    over tp in float32, twice the bytes of a micro-step alone; a micro-step alone
    all-reduces them as autograd made them, bf16. Every micro-step's tp collectives equal
    DTensor's on the fake process group, kind, bytes and dtype (the all-reduces' had none)."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = init_device_mesh("cpu", TP_MESH, mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = tp_models.parallelize(tp_models.Llama(), mesh["tp"])
    for (name,) in tp_models.LAYERS:
        fully_shard(model.get_submodule(name), mesh=mesh["dp"], mp_policy=mp)
    fully_shard(model, mesh=mesh["dp"], mp_policy=mp)
    real = []
    with _tp_collectives(dtypes=True) as seen:
        for k in range(4):  # two optimizer steps of two micro-steps
            model.set_requires_gradient_sync(k % 2 == 1)
            model(tp_models.tokens()).sum().backward()
            real.append(list(seen))
            seen.clear()
        model.zero_grad()
    report = predict(mp_policy=mp, grad_accum=2, progress=False)
    predicted = [
        [[e.kind, e.nbytes, e.dtype] for e in it if e.tensor_parallel] for it in report.iterations
    ]
    assert predicted == real
    norm = 16 * 4  # the norms' float32 partial gradients, all-reduced in the syncing step
    assert [c[1:] for c in real[1] if c[0] == "tp_all_reduce"] == [[norm, "float32"]] * 5
    assert not any(c[0] == "tp_all_reduce" for c in real[0])


def test_an_uneven_vocabulary_is_padded(fake_pg: int) -> None:
    """A vocabulary the tp ranks do not divide: DTensor pads each rank's chunk to the
    first's before it all-gathers it (``Shard._to_replicate_tensor``), so the logits'
    all-gather moves 64 of the 63 columns. Every collective equals DTensor's, kind and bytes."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", TP_MESH, mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = tp_models.parallelize(tp_models.Llama(vocab=63), mesh["tp"])
    for (name,) in tp_models.LAYERS:
        fully_shard(model.get_submodule(name), mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    with _tp_collectives() as seen:
        model(tp_models.tokens()).sum().backward()
    torch.manual_seed(0)
    report = fsdpviz.analyze(tp_models.Llama(vocab=63), tp_models.tokens(),
                             fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2),
                             parallelize_plan=tp_models.whole_plan(), progress=False)  # fmt: skip
    assert [[e.kind, e.nbytes] for e in report.iterations[0] if e.tensor_parallel] == seen
    assert ["tp_all_gather", 2 * 8 * 64 * 4] in seen  # the logits, 63 columns padded to 64


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_an_uneven_sequence_is_padded(fake_pg: int, checkpointed: bool) -> None:
    """A sequence of 30 over 4 tp ranks with the residual stream kept a DTensor: DTensor
    pads every sequence-parallel all-gather and reduce-scatter to 4 x 8 rows
    (``Shard._to_replicate_tensor``, ``Shard._reduce_shard_tensor``). Every collective
    equals DTensor's, kind and bytes; with each block checkpointed too, whose recomputation
    in backward fsdpviz once refused as a plain tensor sharded unevenly."""
    plan, ids = tp_models.dtensor_plan(), torch.zeros(2, 30, dtype=torch.long)
    torch.manual_seed(0)
    model = tp_models.Llama(vocab=32, dim=8, n_heads=4, hidden=16, layers=2,
                            checkpointed=checkpointed)  # fmt: skip
    seen = _real_tp_collectives(model, plan, ids, (1, 4))
    with torch.device("meta"):
        meta = tp_models.Llama(vocab=32, dim=8, n_heads=4, hidden=16, layers=2)
    checkpointing = [tp_models.TransformerBlock] if checkpointed else None
    report = fsdpviz.analyze(meta, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 1, "tp", 4),
                             parallelize_plan=plan, progress=False,
                             activation_checkpointing=checkpointing)  # fmt: skip
    assert [[e.kind, e.nbytes] for e in report.iterations[0] if e.tensor_parallel] == seen
    assert ["tp_all_gather", 2 * 32 * 8 * 4] in seen  # a block's input, 30 rows padded to 32


def _real_tp_collectives(model: torch.nn.Module, plan: dict[str, Any], ids: torch.Tensor,
                         mesh: tuple[int, int]) -> list[list[Any]]:  # fmt: skip
    """DTensor's collectives of one step of ``model`` parallelised with ``plan`` and
    sharded per block on the fake process group."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    dm = init_device_mesh("cpu", mesh, mesh_dim_names=("dp", "tp"))
    parallelize_module(model, dm["tp"], plan)
    for (name,) in tp_models.LAYERS:
        fully_shard(model.get_submodule(name), mesh=dm["dp"])
    fully_shard(model, mesh=dm["dp"])
    with _tp_collectives() as seen:
        model(ids).sum().backward()
    return seen


def _small_llama_tp(plan: dict[str, Any], mesh: tuple[int, int]) -> tuple[list[list[Any]], Any]:
    """DTensor's collectives of a step of a small Llama under ``plan`` on ``mesh`` (dp, tp),
    and fsdpviz's report of the same job."""
    sizes = {"vocab": 32, "dim": 8, "n_heads": 2, "hidden": 16}
    ids = torch.zeros(2, 8, dtype=torch.long)
    torch.manual_seed(0)
    real = _real_tp_collectives(tp_models.Llama(**sizes), plan, ids, mesh)
    with torch.device("meta"):
        meta = tp_models.Llama(**sizes)
    report = fsdpviz.analyze(meta, ids, fully_shard=tp_models.LAYERS, parallelize_plan=plan,
                             mesh=("dp", mesh[0], "tp", mesh[1]), progress=False)  # fmt: skip
    return real, report


def _predicted_tp_collectives(report: fsdpviz.Report) -> list[list[Any]]:
    return [[e.kind, e.nbytes] for e in report.iterations[0] if e.tensor_parallel]


def _frozen_but_output(model: torch.nn.Module) -> torch.nn.Module:
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("output"))
    return model


def test_sequence_parallel_makes_frozen_norms_trainable(fake_pg: int) -> None:
    """A fine-tune that trains the output projection alone, its other parameters frozen
    before parallelize_module: SequenceParallel wraps the norms' weights in
    ``nn.Parameter(DTensor.from_local(...))``, which requires grad
    (``SequenceParallel._replicate_module_fn``), so the norms train and tensor parallelism's
    backward collectives run through every block (fsdpviz kept them frozen and predicted
    the forward's 11 collectives alone, against torch's 25). fsdpviz trains them too and
    warns, naming them."""
    ids, sizes = tp_models.tokens(), {"vocab": 32, "dim": 8, "hidden": 16}
    torch.manual_seed(0)
    real = _real_tp_collectives(_frozen_but_output(tp_models.Llama(**sizes)),
                                tp_models.whole_plan(), ids, TP_MESH)  # fmt: skip
    with torch.device("meta"):
        meta = _frozen_but_output(tp_models.Llama(**sizes))
    report = fsdpviz.analyze(meta, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2),
                             parallelize_plan=tp_models.whole_plan(), progress=False)  # fmt: skip
    assert _predicted_tp_collectives(report) == real
    assert sum(1 for k, _ in real if k == "tp_all_reduce") == 5  # the norms' partial gradients
    (warning,) = [w for w in report.warnings if w.code == "tp_unfreezes"]
    assert "layers.0.attention_norm.weight, layers.0.ffn_norm.weight" in warning.message
    assert not any(p.requires_grad for n, p in meta.named_parameters() if "norm" in n)


@pytest.mark.parametrize("no_grad", [False, True], ids=["frozen-embedding", "no-grad"])
def test_a_dtensor_computed_without_an_autograd_graph_is_known(fake_pg: int, no_grad: bool) -> None:
    """A sequence of 30 over 4 tp ranks with the residual stream kept a DTensor, the
    embedding's output scaled (Gemma) where no autograd graph is built: the embedding
    frozen, or the scale under ``torch.no_grad()``. The scaled tensor is a DTensor (an
    operator on a DTensor gives one), which pads its uneven sequence right, and torch runs;
    fsdpviz found DTensors through autograd's graph and refused it as a plain tensor
    sharded unevenly. Every collective equals DTensor's, kind and bytes."""
    ids, plan = torch.zeros(2, 30, dtype=torch.long), tp_models.dtensor_plan()
    sizes: dict[str, Any] = {"vocab": 32, "dim": 8, "hidden": 16, "no_grad": no_grad}

    def model() -> tp_models.ScaledLlama:
        m = tp_models.ScaledLlama(**sizes)
        m.tok_embeddings.weight.requires_grad_(no_grad)
        return m

    torch.manual_seed(0)
    real = _real_tp_collectives(model(), plan, ids, (1, 4))
    with torch.device("meta"):
        meta = model()
    report = fsdpviz.analyze(meta, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 1, "tp", 4),
                             parallelize_plan=plan, progress=False)  # fmt: skip
    assert _predicted_tp_collectives(report) == real
    assert ["tp_all_gather", 2 * 32 * 8 * 4] in real  # a block's input, 30 rows padded to 32


class _Resharded(torch.nn.Module):
    """An embedding whose sequence-sharded output a parameterless module takes sharded on
    the features (``PrepareModuleInput``: ``Shard(1) -> Shard(2)``, an all-to-all)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.emb, self.mix = torch.nn.Embedding(32, dim), torch.nn.Identity()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mix(self.emb(ids))


@pytest.mark.parametrize("dim", [8, 10])
def test_an_all_to_all_pads_both_dims(fake_pg: int, dim: int) -> None:
    """A sequence of 30 going from ``Shard(1)`` to ``Shard(2)`` over 4 tp ranks: DTensor
    pads the dim it leaves and the dim it shards (``Shard._pad_for_new_shard_dim``), so the
    all-to-all moves 32 rows of 8 or 12 features (fsdpviz padded the new dim only: 30 rows,
    1,920 B and 2,880 B of 2,048 and 3,072). Gloo has no all-to-all: DTensor all-gathers the
    padded chunks and keeps its own (``shard_dim_alltoall``), the same bytes. The forward's
    collectives equal DTensor's."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {
        "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                               use_local_output=False),
        "mix": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(2),),
                                  use_local_output=False),
    }  # fmt: skip
    ids = torch.zeros(2, 30, dtype=torch.long)
    mesh = init_device_mesh("cpu", (1, 4), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(_Resharded(dim), mesh["tp"], plan)
    fully_shard(model, mesh=mesh["dp"])
    with _tp_collectives() as seen:
        model(ids)
    with torch.device("meta"):
        meta = _Resharded(dim)
    report = fsdpviz.analyze(meta, ids, fully_shard=[], mesh=("dp", 1, "tp", 4),
                             parallelize_plan=plan, progress=False)  # fmt: skip
    forward = [[e.kind, e.nbytes] for e in report.iterations[0]
               if e.tensor_parallel and e.phase == "forward"]  # fmt: skip
    padded = -(-dim // 4) * 4
    assert forward == [["tp_reduce_scatter", 2 * 32 * dim * 4],
                       ["tp_all_to_all", 2 * 32 * padded * 4]]  # fmt: skip
    assert seen == [["tp_reduce_scatter", 2 * 32 * dim * 4], ["tp_all_gather", 2 * 32 * padded * 4]]
    # the time model: a rank sends 3 of the 4 chunks of its quarter (it priced the whole
    # tensor as an all-gather's, 4 times the bytes)
    (a2a,) = [r for r in report.timeline.records() if r["kind"] == "tp_all_to_all"
              and r["phase"] == "forward"]  # fmt: skip
    assert a2a["bytes"] == pytest.approx(3 / 4 * 2 * 32 * padded * 4 / 4)


def test_a_dtensor_meeting_a_plain_tensor_is_noted_as_torch_refuses_it(fake_pg: int) -> None:
    """The feed-forward's output left a DTensor (``use_local_output=False``) while the
    residual stream is plain (torchtitan's sequence-parallel plan): the residual add meets
    a DTensor and a plain tensor, which DTensor's dispatch refuses. fsdpviz warns, naming
    the style and the fix (it was silent); a warning, as a model may make the plain one a
    DTensor in hooks fsdpviz does not see (KempnerForge's, above)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import RowwiseParallel

    plan = tp_models.whole_plan()
    plan["layers.*.feed_forward.w2"] = RowwiseParallel(
        output_layouts=Shard(1), use_local_output=False
    )
    assert re.search(
        r"add takes a DTensor \(the output of 'layers\.0\.feed_forward\.w2' "
        r"\(RowwiseParallel, use_local_output=False\)\) of shape \(2, 8, 8\) and a plain "
        r"tensor .*mixed torch\.Tensor and DTensor.*use_local_output alike",
        _mixed_dtensor_warning(plan),
    )
    assert not [w for w in predict(progress=False).warnings if w.code == "tp_mixed_dtensor"]


def test_attention_taking_a_dtensor_and_a_plain_tensor_is_noted_as_torch_refuses_it(
    fake_pg: int,
) -> None:
    """The query and key projections leave DTensors (``use_local_output=False``), the value
    projection a plain tensor: ``scaled_dot_product_attention`` meets both, and DTensor's
    dispatch refuses its operators (``aten.bmm`` or ``aten.add`` on the CPU). fsdpviz
    noted arithmetic alone and was silent; now it warns, naming the attention operator it
    traced."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    plan = tp_models.plain_plan()
    for w in "qk":
        plan[f"layers.*.attention.w{w}"] = ColwiseParallel(use_local_output=False)
    assert re.search(
        r"scaled_dot_product_\w*attention\w* takes a DTensor \(the output of "
        r"'layers\.0\.attention\.wq' \(ColwiseParallel, use_local_output=False\)\).*a plain "
        r"tensor .*mixed torch\.Tensor and DTensor",
        _mixed_dtensor_warning(plan),
    )


def _mixed_dtensor_warning(plan: dict[str, Any]) -> str:
    """The ``tp_mixed_dtensor`` warning of ``plan`` on a one-block Llama, whose real run
    DTensor refuses ("got mixed torch.Tensor and DTensor")."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    sizes = {"vocab": 32, "dim": 8, "n_heads": 2, "hidden": 16, "layers": 1}
    mesh = init_device_mesh("cpu", TP_MESH, mesh_dim_names=("dp", "tp"))
    model = parallelize_module(tp_models.Llama(**sizes), mesh["tp"], plan)
    with pytest.raises(RuntimeError, match=r"got mixed torch\.Tensor and DTensor"):
        model(tp_models.tokens())
    with torch.device("meta"):
        meta = tp_models.Llama(**sizes)
    report = fsdpviz.analyze(meta, tp_models.tokens(), fully_shard=[("layers.0",)],
                             mesh=("dp", 2, "tp", 2), parallelize_plan=plan,
                             progress=False)  # fmt: skip
    (warning,) = [w for w in report.warnings if w.code == "tp_mixed_dtensor"]
    return warning.message


def _analyze_tp4(plan: dict[str, Any], hidden: int, seq: int) -> fsdpviz.Report:
    with torch.device("meta"):
        model = tp_models.Llama(vocab=32, dim=8, n_heads=4, hidden=hidden, layers=1)
    return fsdpviz.analyze(model, torch.zeros(2, seq, dtype=torch.long),
                           fully_shard=[("layers.0",)], mesh=("dp", 1, "tp", 4),
                           parallelize_plan=plan, progress=False)  # fmt: skip


def test_an_uneven_hidden_size_is_refused_as_torch_refuses_it(fake_pg: int) -> None:
    """A feed-forward hidden size of 18 over 4 tp ranks: the column-parallel ``w1``/``w3``
    are chunked 5, 5, 5, 3, but ``RowwiseParallel`` makes ``w2``'s plain input a DTensor
    with ``DTensor.from_local``, which takes it for even shards (5 x 4 = 20 features), and
    DTensor's sharding propagation fails against the weight's 18. fsdpviz refuses it too,
    naming the parameter and the fix (it drew a report before)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    model = parallelize_module(tp_models.Llama(vocab=32, dim=8, n_heads=4, hidden=18, layers=1),
                               mesh, tp_models.plain_plan())  # fmt: skip
    with pytest.raises(RuntimeError, match=r"same reduction dim.*\[16, 20\] X \[18, 8\]"):
        model(torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(
        fsdpviz.ConfigError,
        match=r"layers\.0\.feed_forward\.w2 \(RowwiseParallel\).*18 input features of "
        r"layers\.0\.feed_forward\.w2\.weight \(8, 18\).*\[5, 5, 5, 3\].*multiple of the "
        r"tp degree \(20 or 16",
    ):
        _analyze_tp4(tp_models.plain_plan(), hidden=18, seq=8)


def test_an_uneven_sequence_under_sequence_parallelism_is_refused(fake_pg: int) -> None:
    """A sequence of 30 over 4 tp ranks under torchtitan's sequence-parallel plan: the
    embedding's reduce-scatter pads it and leaves each rank its ``torch.chunk`` part (8, 8,
    8, 6 rows), but ``SequenceParallel`` makes the plain tensor a DTensor again with
    ``DTensor.from_local``, which takes it for even shards: a sequence of 32 on the first
    three ranks, 24 on the last, whose all-gathers then disagree (on 4 gloo ranks: "Received
    data size doesn't match expected size"; the fake process group, every rank the first,
    hides it). fsdpviz refuses it (it drew a report of a 30-token sequence before); without
    sequence parallelism the sequence is never sharded and the same model runs."""
    with pytest.raises(
        fsdpviz.ConfigError,
        match=r"layers\.0\.attention_norm \(SequenceParallel\).*the sequence \(30\).*"
        r"\[8, 8, 8, 6\].*\(32 or 28; a sequence padded to it\)",
    ):
        _analyze_tp4(tp_models.whole_plan(), hidden=16, seq=30)
    report = _analyze_tp4(tp_models.plain_plan(), hidden=16, seq=30)
    assert any(e.kind == "tp_all_reduce" for e in report.iterations[0])


def _cross_entropy(out: torch.Tensor) -> torch.Tensor:
    labels = torch.zeros(out.shape[:2], dtype=torch.long, device=out.device)
    return torch.nn.functional.cross_entropy(out.flatten(0, 1), labels.flatten())


def test_drawn_fsdp_and_tensor_parallel_jobs(fake_pg: int) -> None:
    """Six drawn FSDP2 x TP jobs on the 2 x 2 mesh (the model's sizes and the batch;
    torchtitan's sequence-parallel plan, with loss parallel, or a plain column/row plan;
    resharding as a bool or per group; bf16 parameters reducing in fp32 or bf16; gradient
    accumulation without sync; activation checkpointing): FSDP's events equal the
    recording's, event for event, and the tp collectives of every micro-step DTensor's,
    kind and bytes, loss parallel's own all-reduces of a few values per token among them
    (fsdpviz left those out)."""
    from contextlib import nullcontext

    from fsdp_harness import assert_same_accumulation
    from gloo_worker import _tp_collectives
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        loss_parallel,
        parallelize_module,
    )

    from fsdpviz.recording import FSDP2Recorder

    rng = random.Random("fsdp x tp conformance")
    mesh = init_device_mesh("cpu", TP_MESH, mesh_dim_names=("dp", "tp"))
    for _ in range(6):
        heads, layers = rng.choice([2, 4]), rng.choice([2, 3])
        sizes = {"vocab": rng.choice([32, 40, 42]), "dim": heads * rng.choice([4, 8]),
                 "n_heads": heads, "hidden": rng.choice([8, 10, 12]), "layers": layers}  # fmt: skip
        ids = torch.randint(0, sizes["vocab"], (rng.choice([1, 2, 3]), rng.choice([4, 6, 8])),
                            generator=torch.Generator().manual_seed(0))  # fmt: skip
        style = rng.choice(["sequence_parallel", "loss_parallel", "plain"])
        plan = tp_models.whole_plan() if style != "plain" else tp_models.plain_plan()
        lp = style == "loss_parallel"
        if lp:
            plan["output"] = ColwiseParallel(input_layouts=Shard(1), use_local_output=False)
        raf = rng.choice([None, True, False, {"layers.0": False}, {"": True, "layers.1": False}])
        mp = rng.choice([None, torch.float32, torch.bfloat16])
        n, checkpointed = rng.choice([1, 2]), rng.random() < 0.4
        units = [(f"layers.{i}",) for i in range(layers)]
        kw: dict[str, Any] = {} if raf is None else {"reshard_after_forward": raf}
        if mp is not None:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=mp)
        torch.manual_seed(0)
        model = tp_models.Llama(**sizes)
        parallelize_module(model, mesh["tp"], plan)
        if checkpointed:
            apply_activation_checkpointing(
                model, check_fn=lambda m: isinstance(m, tp_models.TransformerBlock)
            )
        for names in [*units, ("",)]:
            group = raf.get(names[0]) if isinstance(raf, dict) else raf
            own = {**kw, "reshard_after_forward": group} if group is not None else {
                k: v for k, v in kw.items() if k != "reshard_after_forward"}  # fmt: skip
            fully_shard(model.get_submodule(names[0]), mesh=mesh["dp"], **own)
        loss = _cross_entropy if lp else torch.sum
        real_tp: list[list[Any]] = []
        with FSDP2Recorder(model) as rec, _tp_collectives() as seen:
            for _ in range(3):
                for k in range(n):
                    if n > 1:
                        model.set_requires_gradient_sync(k == n - 1)  # type: ignore[operator]
                    out = model(ids)
                    with loss_parallel() if lp else nullcontext():
                        loss(out).backward()
                    real_tp.append(list(seen))
                    seen.clear()
                model.zero_grad()
        torch.manual_seed(0)
        predicted = fsdpviz.analyze(
            tp_models.Llama(**sizes), ids, fully_shard=units, mesh=("dp", 2, "tp", 2),
            parallelize_plan=plan, loss=loss, grad_accum=n, progress=False,
            activation_checkpointing=[tp_models.TransformerBlock] if checkpointed else None, **kw,
        )  # fmt: skip
        if n > 1:
            assert_same_accumulation(rec.report(), fsdp_only(predicted), n)
        else:
            assert_same_schedule(rec.report(), fsdp_only(predicted))
        tp = [[[e.kind, e.nbytes] for e in it if e.tensor_parallel] for it in predicted.iterations]
        assert real_tp[: 2 * n] == tp


def test_loss_parallels_own_all_reduces_are_planned(fake_pg: int) -> None:
    """torchtitan's loss parallel (logits left sharded over the vocabulary, bf16 parameters):
    the cross-entropy's handlers all-reduce each token's maximum and sum of exponents
    (``_log_softmax``, in float32, its computation dtype) and its picked log-probability
    (``_MaskPartial._reduce_value``, in bf16, the result's dtype) over the tp ranks, three
    all-reduces of a value per token, which fsdpviz left out. Every collective equals
    DTensor's, kind, bytes and dtype, in order."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        loss_parallel,
        parallelize_module,
    )

    plan = tp_models.whole_plan()
    plan["output"] = ColwiseParallel(input_layouts=Shard(1), use_local_output=False)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    sizes = {"vocab": 32, "dim": 8, "n_heads": 4, "hidden": 16}
    ids = torch.zeros(3, 8, dtype=torch.long)
    mesh = init_device_mesh("cpu", (1, 4), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_module(tp_models.Llama(**sizes), mesh["tp"], plan)
    for (name,) in [*tp_models.LAYERS, ("",)]:
        fully_shard(model.get_submodule(name), mesh=mesh["dp"], mp_policy=policy)
    with _tp_collectives(dtypes=True) as real:
        out = model(ids)
        with loss_parallel():
            _cross_entropy(out).backward()
    with torch.device("meta"):
        meta = tp_models.Llama(**sizes)
    report = fsdpviz.analyze(meta, ids, fully_shard=tp_models.LAYERS, parallelize_plan=plan,
                             mesh=("dp", 1, "tp", 4), mp_policy=policy, loss=_cross_entropy,
                             progress=False)  # fmt: skip
    predicted = [[e.kind, e.nbytes, e.dtype] for e in report.iterations[0] if e.tensor_parallel]
    assert predicted == real
    loss = [e for e in report.iterations[0] if e.tensor_parallel and e.module == ""]
    assert [(e.kind, e.nbytes, e.dtype, e.phase) for e in loss] == [
        *[("tp_all_reduce", 3 * 8 * 4, "float32", "forward")] * 2,
        ("tp_all_reduce", 3 * 8 * 2, "bfloat16", "forward"),  # of log_softmax's bf16 result
    ]


def test_a_dtensor_a_style_does_not_redistribute_is_left_to_the_operators(fake_pg: int) -> None:
    """The attention's ``PrepareModuleInput`` declares ``Replicate() -> Replicate()`` while
    the norm leaves a sequence-sharded DTensor: the style redistributes only where its
    declared layouts differ (``input_layouts != desired_input_layouts``), so the DTensor
    goes on in ``Shard(1)`` and each of ``wq``, ``wk``, ``wv`` (``ColwiseParallel``, its
    declared layouts the same too) all-gathers it in its multiply's sharding propagation.
    fsdpviz all-gathered it once at the attention, from the layout it has (11 forward
    collectives against DTensor's 15). The forward's collectives equal DTensor's, kind and
    bytes, in order; in backward each projection's weight gradient gathers its saved input
    again (fsdpviz planned the style's reduce-scatter of the input's gradient instead), so
    the backward equals DTensor's up to the norm, whose operators reduce the Partial()
    gradient the projections give back: noted as not planned."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import PrepareModuleInput

    plan = tp_models.dtensor_plan()
    plan["layers.*.attention"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)
    )
    real, report = _small_llama_tp(plan, (1, 2))
    forward = [e for e in report.iterations[0] if e.tensor_parallel and e.phase == "forward"]
    assert [[e.kind, e.nbytes] for e in forward] == real[: len(forward)]
    gathers = [e.module for e in forward if e.unit == "layers.0" and e.kind == "tp_all_gather"]
    assert gathers[:3] == [f"layers.0.attention.w{x}" for x in "qkv"]
    (warning, *linears) = [w for w in report.warnings if w.code == "tp_implicit_redistribution"]
    assert "layers.0.attention (PrepareModuleInput) takes a DTensor in Shard(1)" in warning.message
    assert "input_layouts=(Shard(1),)" in warning.message
    # backward: each projection's weight gradient all-gathers its saved input again (the
    # style's reduce-scatter of the input's gradient was planned); the gradient goes back
    # Partial() to the norm's operators, whose own redistributions are not planned (noted)
    backward = [e for e in report.iterations[0] if e.tensor_parallel and e.phase == "backward"]
    real_backward = real[len(forward) :]
    assert [[e.kind, e.nbytes] for e in backward[:7]] == real_backward[:7]
    assert [(e.kind, e.module) for e in backward[4:7]] == [
        ("tp_all_gather", f"layers.1.attention.w{x}") for x in "vkq"
    ]  # fmt: skip
    assert real_backward[7][0] == "tp_reduce_scatter"  # the norm's: not planned
    assert "layers.0.attention.wq (ColwiseParallel)" in linears[0].message
    assert "reduce that gradient by their own" in linears[0].message
    assert "does not plan" in linears[0].message


@pytest.mark.parametrize(
    ("prepared", "mesh", "batch", "seq", "mp"),
    [("attention", (2, 2), 2, 8, False), ("feed_forward", (1, 2), 3, 8, True),
     ("attention", (1, 4), 2, 8, True), ("feed_forward", (1, 4), 2, 6, False)],
    ids=["attention-2x2", "mlp-1x2-bf16", "attention-1x4-bf16", "mlp-1x4-uneven"],
)  # fmt: skip
def test_a_linears_multiply_gathers_a_sequence_sharded_input_in_both_passes(
    fake_pg: int, prepared: str, mesh: tuple[int, int], batch: int, seq: int, mp: bool
) -> None:
    """Without sequence parallelism, a ``PrepareModuleInput`` shards the attention's (or the
    MLP's) replicated input on the sequence and leaves it a DTensor; its column-wise
    projections declare ``Replicate()`` both ways, so they leave it to the multiply: the
    linear's ``view`` to 2-D makes it ``_StridedShard(0)``, which ``mm`` all-gathers in
    forward, and again in backward for the weight's gradient, whose input gradient comes
    back ``Partial()``, which the prepared input's ``Redistribute.backward`` all-reduces
    back to ``Replicate()``. fsdpviz planned the style's backward instead (a reduce-scatter
    per projection, an all-gather at the prepared input) and warned. A sequence the tp ranks
    do not divide is padded in both all-gathers (fsdpviz's uneven gather also left the
    projection's input out of the autograd graph). Every collective equals DTensor's, kind,
    bytes and dtype, in order; the warning notes the memory alone."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module

    plan = tp_models.plain_plan()
    plan[f"layers.*.{prepared}"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=False
    )
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if mp else MixedPrecisionPolicy()
    sizes = {"vocab": 32, "dim": 8, "n_heads": 4, "hidden": 16}
    ids = torch.zeros(batch, seq, dtype=torch.long)
    dm = init_device_mesh("cpu", mesh, mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_module(tp_models.Llama(**sizes), dm["tp"], plan)
    for (name,) in [*tp_models.LAYERS, ("",)]:
        fully_shard(model.get_submodule(name), mesh=dm["dp"], mp_policy=policy)
    with _tp_collectives(dtypes=True) as real:
        model(ids).sum().backward()
    with torch.device("meta"):
        meta = tp_models.Llama(**sizes)
    report = fsdpviz.analyze(meta, ids, fully_shard=tp_models.LAYERS, parallelize_plan=plan,
                             mesh=("dp", mesh[0], "tp", mesh[1]), mp_policy=policy,
                             progress=False)  # fmt: skip
    predicted = [[e.kind, e.nbytes, e.dtype] for e in report.iterations[0] if e.tensor_parallel]
    assert predicted == real
    linears = ("wv", "wk", "wq") if prepared == "attention" else ("w3", "w1")
    # noted for its memory alone: torch saves a share of the input, fsdpviz the gathered one
    noted = [w.message for w in report.warnings if w.code == "tp_implicit_redistribution"]
    assert len(noted) == len(linears) * 2
    assert all("(planned). Its memory is not exact" in m for m in noted)
    assert not any("batch of one" in m for m in noted)  # (a batch of one's is planned)
    back = [(e.kind, e.module) for e in report.iterations[0]
            if e.tensor_parallel and e.phase == "backward"
            and e.module.startswith(f"layers.1.{prepared}")]  # fmt: skip
    assert back[-len(linears) - 1 :] == [
        *(("tp_all_gather", f"layers.1.{prepared}.{w}") for w in linears),
        ("tp_all_reduce", f"layers.1.{prepared}"),
    ]


@pytest.mark.parametrize(
    ("prepared", "dim", "hidden", "seq", "mp", "moved"),
    [("feed_forward", 8, 16, 6, False, "input"), ("attention", 8, 16, 6, True, "input"),
     ("attention", 8, 16, 12, True, "weight"), ("feed_forward", 256, 512, 256, False, "grad"),
     ("feed_forward", 512, 64, 64, False, "weight-then-grad")],
    ids=["input-gathered-uneven", "input-gathered-bf16", "weight-gathered-bf16",
         "grad-all-to-all", "weight-gathered-grad-all-to-all"],
)  # fmt: skip
def test_a_batch_of_ones_multiply_follows_dtensors_cost_model(
    fake_pg: int, prepared: str, dim: int, hidden: int, seq: int, mp: bool, moved: str
) -> None:
    """A batch of one's input sharded on the sequence by a ``PrepareModuleInput`` and left
    to column-wise linears views 2-D as ``Shard(0)``, and DTensor picks each ``mm``'s
    strategy by its cost model (``redistribute_cost``): where the input is the smaller it
    gathers it in both passes (as a larger batch's ``_StridedShard`` input; a sequence the
    tp ranks do not divide padded), its gradient ``Partial()``, which the prepared input's
    ``Redistribute.backward`` all-reduces; where the weight is the smaller it
    gathers the weight in forward (the product stays sequence-sharded, the style's output
    moves it to ``Shard(-1)`` by an all-to-all, and back in backward), its gradient needs
    nothing moved and comes back ``Partial()``, which FSDP2's post-backward
    (``_get_grad_inner_tensor``) reduce-scatters to the weight's shard; for larger
    activations the backward moves the output's gradient by an all-to-all instead of
    gathering an operand. fsdpviz planned the style's collectives (an all-gather of the
    input, a reduce-scatter of its gradient) and warned; a gathered weight is a multiply's
    temporary. Every collective equals DTensor's,
    kind, bytes and dtype, in order (on CPU DTensor's all-to-all falls back to an
    all-gather of the same bytes); nothing is noted: the gathered input is its multiply's
    temporary, the saved input a rank's share, as torch keeps them (its memory compared at
    every event in ``test_cost_tp_every_event.py``, for even sequences of the feed-forward)."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module

    plan = tp_models.plain_plan()
    plan[f"layers.*.{prepared}"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=False
    )
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if mp else MixedPrecisionPolicy()
    sizes = {"vocab": 32, "dim": dim, "n_heads": 4, "hidden": hidden}
    ids = torch.zeros(1, seq, dtype=torch.long)
    dm = init_device_mesh("cpu", (1, 4), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_module(tp_models.Llama(**sizes), dm["tp"], plan)
    for (name,) in [*tp_models.LAYERS, ("",)]:
        fully_shard(model.get_submodule(name), mesh=dm["dp"], mp_policy=policy)
    with _tp_collectives(dtypes=True) as real:
        model(ids).sum().backward()
    with torch.device("meta"):
        meta = tp_models.Llama(**sizes)
    report = fsdpviz.analyze(meta, ids, fully_shard=tp_models.LAYERS, parallelize_plan=plan,
                             mesh=("dp", 1, "tp", 4), mp_policy=policy,
                             progress=False)  # fmt: skip
    events = [e for e in report.iterations[0] if e.tensor_parallel]
    on_cpu = {"tp_all_to_all": "tp_all_gather"}
    assert [[on_cpu.get(e.kind, e.kind), e.nbytes, e.dtype] for e in events] == real
    linears = ("wq", "wk", "wv") if prepared == "attention" else ("w1", "w3")
    noted = [w.message for w in report.warnings if w.code == "tp_implicit_redistribution"]
    assert not noted  # each strategy planned as DTensor runs it, its memory too
    size = 2 if mp else 4
    first_linear = f"layers.0.{prepared}.{linears[0]}"
    first = [(e.kind, e.nbytes) for e in events
             if e.phase == "forward" and e.module == first_linear]  # fmt: skip
    out = dim if prepared == "attention" else hidden
    if moved in ("input", "grad"):  # the input gathered, the product Shard(-1) as the style's
        assert first == [("tp_all_gather", -(-seq // 4) * 4 * dim * size)]
    else:  # the weight gathered, the product moved from the sequence by the style's output
        assert first == [("tp_all_gather", out * dim * size),
                         ("tp_all_to_all", seq * out * size)]  # fmt: skip
    # the weights' Partial() gradients reduce-scattered in post-backward, in FSDP's order
    scattered = [(e.module, e.nbytes) for e in events
                 if e.kind == "tp_reduce_scatter" and e.hook == "post_backward"]  # fmt: skip
    assert scattered == [
        (f"layers.{n}.{prepared}.{w}.weight", out * dim * size)
        for n in (1, 0) for w in linears if moved != "input"
    ]  # fmt: skip
    # a replay (no new trace) reduce-scatters them too, as the trace's last iteration did
    from fsdpviz.replan import replay

    again = replay(report, reshard_after_forward=False).iterations[0]
    tp_events = [(e.kind, e.module, e.nbytes, e.dtype) for e in again if e.tensor_parallel]
    assert tp_events == [(e.kind, e.module, e.nbytes, e.dtype) for e in events]


@pytest.mark.parametrize(
    ("hidden", "seq"), [(64, 64), (256, 128)], ids=["input-grad", "weight-grad"]
)
def test_a_batch_of_ones_multiply_is_costed_as_on_a_gpu_node(
    fake_pg: int, hidden: int, seq: int
) -> None:
    """DTensor picks a batch of one's ``mm`` strategies by ``redistribute_cost``, which
    costs a tp group of up to ``num_devices_per_host`` devices within a host
    (``MeshTopoInfo.build_from_mesh``): on a GPU job's nodes of 8, a tp group of 4 is;
    on this machine (one CPU a host) it is not, and for these sizes the two pick other
    strategies (``input-grad``: across hosts the input's gradient moves the output's
    gradient by an all-to-all into a ``Partial()`` product, within one it gathers the
    weight; ``weight-grad``: the weight's gradient the same way, within one it gathers the
    input). fsdpviz asked torch on a CPU mesh and planned the run across hosts; it plans
    the GPU job's, every collective equal to DTensor's with the GPU node's topology, and
    says that the choice rests on it."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module

    plan = tp_models.plain_plan()
    plan["layers.*.feed_forward"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=False
    )
    sizes = {"vocab": 32, "dim": 128, "n_heads": 4, "hidden": hidden}
    ids = torch.zeros(1, seq, dtype=torch.long)
    dm = init_device_mesh("cpu", (1, 4), mesh_dim_names=("dp", "tp"))
    real = {}
    for per_host in (8, None):
        torch.manual_seed(0)
        model = parallelize_module(tp_models.Llama(**sizes), dm["tp"], plan)
        for (name,) in [*tp_models.LAYERS, ("",)]:
            fully_shard(model.get_submodule(name), mesh=dm["dp"])
        with _tp_collectives(dtypes=True, per_host=per_host) as seen:
            model(ids).sum().backward()
        real[per_host] = seen
    assert real[8] != real[None]
    with torch.device("meta"):
        meta = tp_models.Llama(**sizes)
    report = fsdpviz.analyze(meta, ids, fully_shard=tp_models.LAYERS, parallelize_plan=plan,
                             mesh=("dp", 1, "tp", 4), progress=False)  # fmt: skip
    on_cpu = {"tp_all_to_all": "tp_all_gather"}
    events = [e for e in report.iterations[0] if e.tensor_parallel]
    assert [[on_cpu.get(e.kind, e.kind), e.nbytes, e.dtype] for e in events] == real[8]
    assumed = [w.message for w in report.warnings if w.code == "tp_topology_assumed"]
    assert {m.split()[5] for m in assumed} == {
        f"layers.{n}.feed_forward.{w}" for n in (0, 1) for w in ("w1", "w3")
    }
    assert all("tp group of 4 costed within one node" in m for m in assumed)


def _batch_one_collectives(hidden: int, seq: int, per_host: int | None) -> list[list[Any]]:
    """The collectives DTensor issues for a batch of one's sequence-sharded feed-forward
    input (tp 4) with its cost model weighing hosts of ``per_host`` devices."""
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    dm = init_device_mesh("cpu", (1, 4), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    sizes = {"vocab": 32, "dim": 128, "n_heads": 4, "hidden": hidden}
    model = parallelize_module(tp_models.Llama(**sizes), dm["tp"], _sequence_sharded_plan())
    for (name,) in [*tp_models.LAYERS, ("",)]:
        fully_shard(model.get_submodule(name), mesh=dm["dp"])
    with _tp_collectives(dtypes=True, per_host=per_host) as seen:
        model(torch.zeros(1, seq, dtype=torch.long)).sum().backward()
    return seen


def _sequence_sharded_plan() -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    plan = tp_models.plain_plan()
    plan["layers.*.feed_forward"] = PrepareModuleInput(
        input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=False
    )
    return plan


@pytest.mark.parametrize("per_node", [2, 4])
def test_a_batch_of_ones_multiply_is_costed_on_the_machines_nodes(
    fake_pg: int, per_node: int
) -> None:
    """DTensor's cost model reads the host's devices (``num_devices_per_host``:
    ``torch.cuda.device_count()``): on nodes of 2 GPUs a tp group of 4 is costed across
    hosts and the input's gradient moves the output's gradient by an all-to-all into a
    ``Partial()`` product; on nodes of 4 it is costed within one and gathers the weight.
    ``analyze(..., machine=...)`` plans the machine's nodes (fsdpviz planned nodes of 8
    whatever the machine), without the warning that assumes them, and states the nodes the
    strategies were picked for; a report planned for the other side of ``tp <= 4`` is not
    costed there silently (a timeline note; tune's ``on_machine`` refuses it)."""
    from fsdpviz.cost import machine, timeline

    real = _batch_one_collectives(64, 64, per_node)
    assert real != _batch_one_collectives(64, 64, 8 if per_node == 2 else 2)
    with torch.device("meta"):
        meta = tp_models.Llama(vocab=32, dim=128, n_heads=4, hidden=64)
    nodes = machine("h100", gpus_per_node=per_node)
    plan = _sequence_sharded_plan()
    report = fsdpviz.analyze(meta, torch.zeros(1, 64, dtype=torch.long),
                             fully_shard=tp_models.LAYERS, parallelize_plan=plan,
                             mesh=("dp", 1, "tp", 4), progress=False, machine=nodes)  # fmt: skip
    on_cpu = {"tp_all_to_all": "tp_all_gather"}
    events = [e for e in report.iterations[0] if e.tensor_parallel]
    assert [[on_cpu.get(e.kind, e.kind), e.nbytes, e.dtype] for e in events] == real
    assert not [w for w in report.warnings if w.code == "tp_topology_assumed"]
    assert report.config.tp_strategy_gpus_per_node == per_node
    back = fsdpviz.Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert back.config.tp_strategy_gpus_per_node == per_node
    other = machine("h100", gpus_per_node={2: 4, 4: 2}[per_node])  # across tp <= 4
    same = machine("h200", gpus_per_node={2: 3, 4: 16}[per_node])
    moved = [n for n in timeline(report, other).notes if "DTensor's mm strategies" in n]
    assert len(moved) == 1 and f"nodes of {other.gpus_per_node} torch costs" in moved[0]
    assert not [n for n in timeline(report, same).notes if "DTensor's mm strategies" in n]
    from fsdpviz.tuning.retune import holds_on_machine, on_machine

    assert not holds_on_machine(report, other) and holds_on_machine(report, same)
    with pytest.raises(fsdpviz.ConfigError, match="plan again with"):
        on_machine(report, other)
    assert on_machine(report, same).config.machine == same.to_dict()


@pytest.mark.parametrize("variant", ["local-output", "declared-shard"])
def test_a_gradient_comes_back_in_the_layout_torchs_redistribution_gives(
    fake_pg: int, variant: str
) -> None:
    """The attention's replicated input with the gradient coming back in another layout
    than the column-wise linears' partial sum. ``local-output``: its
    ``PrepareModuleInput(use_local_output=True)`` hands the projections a plain tensor,
    each makes it a DTensor again (``DTensor.from_local``), whose backward all-reduces its
    partial gradient, and the gradient reaches the prepared input replicated, through
    ``to_local()``: nothing to reduce-scatter. ``declared-shard``: the projections declare
    ``input_layouts=Shard(1)``, so each redistributes the replicated DTensor it gets
    (``input_layouts != desired_input_layouts``), moving nothing forward, but its
    ``Redistribute.backward`` takes the gradient back to ``Replicate()``: an all-reduce each,
    and again nothing to reduce-scatter. fsdpviz read ``use_local_output`` of no
    ``PrepareModuleInput`` and took every gradient back as the style's (one reduce-scatter
    per attention, no all-reduce). Every collective equals DTensor's, kind and bytes."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput

    plan = tp_models.dtensor_plan()
    if variant == "local-output":
        plan["layers.*.attention"] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
            use_local_output=True,
        )  # fmt: skip
    else:
        for w in "qkv":
            plan[f"layers.*.attention.w{w}"] = ColwiseParallel(input_layouts=Shard(1))
    real, report = _small_llama_tp(plan, TP_MESH)
    assert _predicted_tp_collectives(report) == real
    activation = 2 * 8 * 8 * 4  # batch x sequence x dim, float32
    back = [(e.kind, e.module) for e in report.iterations[0]
            if e.tensor_parallel and e.phase == "backward" and e.unit == "layers.1"]  # fmt: skip
    projections = {m for k, m in back if k == "tp_all_reduce" and ".attention.w" in m}
    assert projections == {f"layers.1.attention.w{x}" for x in "qkv"}
    assert ("tp_reduce_scatter", "layers.1.attention") not in back
    assert ["tp_all_reduce", activation] in real


@pytest.mark.parametrize("local_input", [False, True])
def test_prepare_module_input_output_prepares_its_inputs_as_prepare_module_input(
    fake_pg: int, local_input: bool
) -> None:
    """The attention's ``PrepareModuleInputOutput``: its input gathered from the sequence
    and, with ``use_local_input=False`` (torch's default), left a replicated DTensor, whose
    projections' partial gradients add up and are reduce-scattered once, by its
    ``Redistribute.backward``; its output (``wo``'s sequence-sharded DTensor) kept,
    a plain tensor again. fsdpviz took the style for none that prepares inputs and its
    input for a plain tensor (an all-reduce per projection, then the reduce-scatter); the
    input's ``use_local_input`` was read from the output's ``use_local_output``. With
    ``use_local_input=True`` each projection makes the plain input a DTensor again and
    all-reduces its own partial gradient, and the gradient reaches the style replicated.
    Every collective equals DTensor's, kind and bytes."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput, RowwiseParallel

    plan = tp_models.whole_plan()
    plan["layers.*.attention.wo"] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    plan["layers.*.attention"] = PrepareModuleInputOutput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
        use_local_input=local_input, output_layouts=(Shard(1),),
        desired_output_layouts=(Shard(1),), use_local_output=True,
    )  # fmt: skip
    real, report = _small_llama_tp(plan, TP_MESH)
    assert _predicted_tp_collectives(report) == real
    back = [(e.kind, e.module) for e in report.iterations[0]
            if e.tensor_parallel and e.phase == "backward" and e.unit == "layers.1"]  # fmt: skip
    projections = [m for k, m in back if k == "tp_all_reduce" and ".attention.w" in m]
    assert len(projections) == (3 if local_input else 0)
    assert (("tp_reduce_scatter", "layers.1.attention") in back) is not local_input
    # read back from the hooks of a model parallelised on meta (the style's two halves)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", TP_MESH, mesh_dim_names=("dp", "tp"))
    with torch.device("meta"):
        meta = parallelize_module(
            tp_models.Llama(vocab=32, dim=8, n_heads=2, hidden=16), mesh["tp"], plan
        )
    for (name,) in [*tp_models.LAYERS, ("",)]:
        fully_shard(meta.get_submodule(name), mesh=mesh["dp"])
    applied = fsdpviz.analyze(meta, torch.zeros(2, 8, dtype=torch.long), progress=False)
    assert _predicted_tp_collectives(applied) == real


class _ReshardedLinear(torch.nn.Module):
    """:class:`_Resharded` with a row-wise linear after the all-to-all, taking its
    feature-sharded DTensor as it is (``input_layouts=Shard(2)``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.emb, self.mix = torch.nn.Embedding(32, dim), torch.nn.Identity()
        self.proj = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.mix(self.emb(ids)))


@pytest.mark.parametrize("seq", [32, 30])
def test_a_linear_after_an_uneven_all_to_all_is_refused_as_torch_fails(
    fake_pg: int, seq: int
) -> None:
    """A sequence of 30 going from ``Shard(1)`` to ``Shard(2)`` over 4 tp ranks, into a
    row-wise linear that takes it as it is: DTensor pads the sequence to 32 for the
    all-to-all and narrows each rank's tensor back to 30 rows
    (``Shard._unpad_for_new_shard_dim``), which leaves it non-contiguous, and the linear's
    multiply views it flat: torch fails (on every backend: the unpadding is DTensor's, not
    the collective's). fsdpviz planned it; now it refuses it, saying why and what to
    change. A sequence of 32 runs in both."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    def plan() -> dict[str, Any]:
        return {
            "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                   use_local_output=False),
            "mix": PrepareModuleInput(input_layouts=(Shard(1),),
                                      desired_input_layouts=(Shard(2),), use_local_output=False),
            "proj": RowwiseParallel(input_layouts=Shard(2), output_layouts=Shard(1)),
        }  # fmt: skip

    ids = torch.zeros(2, seq, dtype=torch.long)
    mesh = init_device_mesh("cpu", (1, 4), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(_ReshardedLinear(8), mesh["tp"], plan())
    with torch.device("meta"):
        meta = _ReshardedLinear(8)

    def predicted() -> fsdpviz.Report:
        return fsdpviz.analyze(meta, ids, fully_shard=[], mesh=("dp", 1, "tp", 4),
                               parallelize_plan=plan(), progress=False)  # fmt: skip

    if seq % 4 == 0:
        model(ids)
        assert any(e.kind == "tp_all_to_all" for e in predicted().iterations[0])
        return
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        model(ids)
    refused = r"proj \(RowwiseParallel\) takes the DTensor the all-to-all of mix \(Shard\(1\) "
    with pytest.raises(fsdpviz.ConfigError, match=refused + r"-> Shard\(2\)\).*dim 1 \(30\).*32"):
        predicted()


def test_a_plain_tensor_taken_in_another_layout_is_refused_as_torch_fails(fake_pg: int) -> None:
    """The attention's ``PrepareModuleInput`` hands its projections a plain tensor
    (``use_local_output=True``), each rank's replicated input, which the projections
    declare sequence-sharded (``ColwiseParallel(input_layouts=Shard(1))``):
    ``DTensor.from_local`` takes it for what the layout says, a sequence twice as long, and
    torch fails in the multiply. fsdpviz planned an all-gather of it; now it refuses it,
    naming the style that returned the tensor and the layout to declare."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput

    plan = tp_models.dtensor_plan()
    plan["layers.*.attention"] = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
    )
    for w in "qkv":
        plan[f"layers.*.attention.w{w}"] = ColwiseParallel(input_layouts=Shard(1))
    sizes = {"vocab": 32, "dim": 16, "n_heads": 4, "hidden": 16}
    ids = torch.zeros(2, 6, dtype=torch.long)
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="a and b must have same reduction dim"):
        _real_tp_collectives(tp_models.Llama(**sizes), plan, ids, TP_MESH)
    with torch.device("meta"):
        meta = tp_models.Llama(**sizes)
    refused = (r"layers\.0\.attention\.wq \(ColwiseParallel\) takes a plain tensor as Shard\(1\), "
               r"but it is a rank's part of a Replicate\(\) tensor \(what layers\.0\.attention "
               r"\(PrepareModuleInput\) returns.*input_layouts=\(Replicate\(\),\)")  # fmt: skip
    with pytest.raises(fsdpviz.ConfigError, match=refused):
        fsdpviz.analyze(meta, ids, fully_shard=tp_models.LAYERS, mesh=("dp", 2, "tp", 2),
                        parallelize_plan=plan, progress=False)  # fmt: skip


def test_a_replicated_dtensor_meeting_a_sharded_one_gets_its_gradient_sharded(
    fake_pg: int,
) -> None:
    """The attention's output left a replicated DTensor (``RowwiseParallel(output_layouts=
    Replicate(), use_local_output=False)``: its partial sum all-reduced) while the residual
    stream is sequence-sharded: the residual add's sharding propagation chunks the
    replicated operand (no collective) and its result is sharded, so the gradient comes
    back to the all-reduce sharded on the sequence, and its ``Redistribute.backward``
    all-gathers it (fsdpviz took it back replicated: no collective, one all-gather per
    block fewer than DTensor's). Every collective equals DTensor's, kind and bytes."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import RowwiseParallel

    plan = tp_models.dtensor_plan()
    plan["layers.*.attention.wo"] = RowwiseParallel(
        output_layouts=Replicate(), use_local_output=False
    )
    real, report = _small_llama_tp(plan, TP_MESH)
    assert _predicted_tp_collectives(report) == real
    back = [(e.kind, e.module) for e in report.iterations[0]
            if e.tensor_parallel and e.phase == "backward"]  # fmt: skip
    assert [m for k, m in back if m.endswith("attention.wo") and k == "tp_all_gather"] == [
        "layers.1.attention.wo", "layers.0.attention.wo"
    ]  # fmt: skip


@pytest.mark.parametrize("local", [True, False], ids=["local-replicated", "dtensor"])
def test_a_replicated_local_output_added_to_a_sequence_shard_broadcasts(
    fake_pg: int, local: bool
) -> None:
    """torchtitan's plan with the attention's output gathered back by
    ``PrepareModuleInputOutput(desired_output_layouts=Replicate(), use_local_output=True)``
    on a sequence of 4 over tp 4: the residual stream is the embedding's ``to_local()``
    part, one position a rank ``(3, 1, 16)``, and the attention hands back the whole
    sequence ``(3, 4, 16)``. torch adds the local tensors and broadcasts silently, the
    feed-forward's ``SequenceParallel`` norm takes the ``(3, 4, 16)`` sum as a rank's part
    (``DTensor.from_local``) of a ``(3, 16, 16)`` DTensor, and every collective after it
    moves 4 times the model's bytes (the feed-forward's input all-gathered in 3072 bytes,
    the model's 768). fsdpviz traces whole tensors and planned the model as meant without
    a word; it warns, naming both styles and the broadcast. The residual stream and the
    attention's output kept DTensors (:func:`tp_models.dtensor_plan`,
    ``use_local_output=False``), the sum is DTensor's, moves the model's bytes, and nothing
    is said."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput, RowwiseParallel

    plan = tp_models.whole_plan() if local else tp_models.dtensor_plan()
    plan["layers.*.attention.wo"] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    plan["layers.*.attention"] = PrepareModuleInputOutput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
        output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),),
        use_local_output=local,
    )  # fmt: skip
    from gloo_worker import _tp_collectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    # one block: a second takes the (3, 4, 16) sum as its part and fails to add the
    # attention's (3, 16, 16) to it (RuntimeError: the size of tensor a (4) must match...)
    sizes = {"vocab": 32, "dim": 16, "n_heads": 4, "hidden": 16, "layers": 1}
    ids = torch.zeros(3, 4, dtype=torch.long)
    torch.manual_seed(0)
    dm = init_device_mesh("cpu", (1, 4), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(tp_models.Llama(**sizes), dm["tp"], plan)
    for name in ("layers.0", ""):
        fully_shard(model.get_submodule(name), mesh=dm["dp"])
    with _tp_collectives() as real:
        model(ids).sum().backward()
    with torch.device("meta"):
        meta = tp_models.Llama(**sizes)
    report = fsdpviz.analyze(meta, ids, fully_shard=[("layers.0",)], parallelize_plan=plan,
                             mesh=("dp", 1, "tp", 4), progress=False)  # fmt: skip
    events = [e for e in report.iterations[0] if e.tensor_parallel]
    gathered = [e.nbytes for e in events
                if e.module == "layers.0.feed_forward" and e.phase == "forward"]  # fmt: skip
    assert gathered == [3 * 4 * 16 * 4]  # the model's sequence, as planned
    planned = _predicted_tp_collectives(report)
    assert len(real) == len(planned)
    ratio = {r[1] / p[1] for r, p in zip(real, planned, strict=True)}
    broadcast = [w.message for w in report.warnings if w.code == "tp_local_broadcast"]
    if not local:
        assert real == planned and not broadcast
        return
    assert ratio >= {1.0, 4.0}  # the attention's own as planned, those after it 4 times
    at = [e.module for e in events].index("layers.0.feed_forward")
    assert planned[at] == ["tp_all_gather", 768] and real[at] == ["tp_all_gather", 3072]
    assert len(broadcast) == 1
    assert "tok_embeddings (RowwiseParallel) returns (a rank's part of a tensor in Shard(1): " \
        "(3, 1, 16))" in broadcast[0]  # fmt: skip
    assert "layers.0.attention (PrepareModuleInputOutput) returns (Replicate(): (3, 4, 16))" \
        in broadcast[0]  # fmt: skip
    assert "broadcasts dim 1 silently" in broadcast[0]
    assert "computes something other than intended" in broadcast[0]
