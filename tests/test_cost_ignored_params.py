"""Anchor: the parameters FSDP does not manage (FSDP2's ``ignored_params``, FSDP1's
``ignored_modules``) in the memory model, against torch's ``MemTracker`` on real FSDP (fake
process group, 4 ranks, on the CPU), as ``test_cost_fsdp1_memtracker.py`` measures.

FSDP leaves them whole on every rank, in their own dtype; autograd gives them whole
gradients, which FSDP neither reduces nor frees (they stay in ``.grad`` to the optimizer
step, and under gradient accumulation each micro-step's is added into them in place); the
optimizer keeps whole states for them, and its step's temporaries are of them too. A step
(its micro-steps) runs, the optimizer steps, then one more step is tracked, and the
optimizer step after it on its own: both peaks equal the memory model's to the byte.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from test_cost_fsdp1_memtracker import _MemRefType, _Tracker
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.cost.memory import memory_model
from fsdpviz.examples import DecoderLayer, ExampleConfig, ExampleModel
from fsdpviz.schema.memory import CATEGORIES
from fsdpviz.schema.report import IgnoredParam

# a 1001-word vocabulary: the embedding, whole, outweighs a layer's shard
CONFIG = ExampleConfig(
    hidden_size=60, intermediate_size=170, num_layers=2, num_heads=4, vocab_size=1001
)
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
EMBED = "embed_tokens.weight"
DOWN = "layers.1.mlp.down_proj.weight"


def _ids() -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.sum()


def _fsdp2(
    model: nn.Module, ignored: list[str], **kwargs: Any
) -> tuple[nn.Module, Callable[[int, int], Any]]:
    mesh = init_device_mesh("cpu", (4,))
    params = {model.get_parameter(n) for n in ignored}
    for layer in model.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=mesh, ignored_params=params, **kwargs)
    fully_shard(model, mesh=mesh, ignored_params=params, **kwargs)

    def sync(k: int, micro_steps: int) -> Any:
        model.set_requires_gradient_sync(k == micro_steps - 1)  # type: ignore[operator]
        return nullcontext()

    return model, sync


def _fsdp1(model: nn.Module, ignored: list[str], **kwargs: Any) -> tuple[nn.Module, Any]:
    fsdp = FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
        device_id=torch.device("cpu"),
        **_ignored_by_fsdp1(model, ignored),
        **kwargs,
    )
    return fsdp, lambda k, n: fsdp.no_sync() if k < n - 1 else nullcontext()


def _ignored_by_fsdp1(model: nn.Module, names: list[str]) -> dict[str, list[Any]]:
    """``ignored_states`` where ``names`` are parameters', else ``ignored_modules``."""
    params = dict(model.named_parameters())
    if all(n in params for n in names):
        return {"ignored_states": [params[n] for n in names]}
    return {"ignored_modules": [model.get_submodule(n) for n in names]}


def _measured(
    api: str, ignored: list[str], optimizer: str | None, micro_steps: int, **kwargs: Any
) -> tuple[int, int]:
    """The peak of a steady step, and of the optimizer step after it (AdamW, ``"for_loop"``
    or ``"foreach"``, less its 4-byte step counters). FSDP2's foreach update cannot mix its
    DTensors with the ignored plain tensors: those are a param group of their own."""
    torch.manual_seed(0)
    ids = _ids()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if api == "FSDP2":
            model, sync = _fsdp2(ExampleModel(CONFIG), ignored, **kwargs)
        else:
            model, sync = _fsdp1(ExampleModel(CONFIG), ignored, **kwargs)
        whole = {id(model.get_parameter(n)) for n in ignored} if api == "FSDP2" else set()
        groups = [
            {"params": [p for p in model.parameters() if (id(p) in whole) == own]}
            for own in (False, True)
        ]
        opt = None
        if optimizer is not None:
            groups = [g for g in groups if g["params"]]
            opt = torch.optim.AdamW(groups, lr=1e-3, foreach=optimizer == "foreach")

        def step(tracker: _Tracker | None = None) -> None:
            for k in range(micro_steps):
                with sync(k, micro_steps):
                    out = model(ids)
                    _loss(out).backward()
                    del out
                if tracker is not None:
                    tracker.reset_mod_stats()

        step()
        if opt is not None:
            opt.step()
        model.zero_grad(set_to_none=True)
        tracker = _Tracker()
        tracker.track_external(model, *([opt] if opt is not None else []), ids)
        for module in model.modules():
            if isinstance(module, FSDP) and module._handle is not None:
                buffer = module._handle.flat_param._full_param_padded  # type: ignore[attr-defined]
                tracker._update_and_maybe_create_winfos(buffer, _MemRefType.OTH)
        with tracker:
            step(tracker)
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
        after = 0
        if opt is not None:
            with tracker:
                opt.step()
                after = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
            counters = 4 * sum("step" in state for state in opt.state.values())
            peak, after = peak - counters, after - counters
    return int(peak), int(after)


def _report(api: str, ignored: list[str], micro_steps: int, **kwargs: Any) -> fsdpviz.Report:
    with torch.device("meta"):
        model = ExampleModel(CONFIG)
    if api == "FSDP2":
        kwargs["fully_shard"] = ["layers.0", "layers.1"]
        kwargs["ignored_params"] = {model.get_parameter(n) for n in ignored}
    else:
        kwargs["auto_wrap_policy"] = ModuleWrapPolicy({DecoderLayer})
        kwargs.update(_ignored_by_fsdp1(model, ignored))
    if micro_steps > 1:
        kwargs["grad_accum"] = micro_steps
    return fsdpviz.analyze(model, {"input_ids": _ids()}, world_size=4, loss=_loss, **kwargs)


CASES: dict[str, tuple[str, list[str], str | None, int, dict[str, Any]]] = {
    # the for-loop update's largest parameter is the whole embedding
    "fsdp2_for_loop": ("FSDP2", [EMBED], "for_loop", 1, {}),
    # the ignored parameters' foreach update is a param group's of its own
    "fsdp2_foreach": ("FSDP2", [EMBED, DOWN], "foreach", 1, {}),
    # each micro-step's gradient added into the one before, in place
    "fsdp2_accumulated": ("FSDP2", [EMBED, DOWN], None, 2, {}),
    # bf16 layers: the ignored embedding stays float32, and so does its gradient
    "fsdp2_bf16_accumulated": ("FSDP2", [EMBED], "for_loop", 2, {"mp_policy": BF16}),
    "fsdp1_for_loop": ("FSDP1", ["embed_tokens"], "for_loop", 1, {}),
    "fsdp1_foreach": ("FSDP1", ["layers.1.mlp", "embed_tokens"], "foreach", 1, {}),
    "fsdp1_no_sync": ("FSDP1", ["embed_tokens"], None, 2, {}),
    "fsdp1_orig_params": ("FSDP1", ["embed_tokens"], "for_loop", 1, {"use_orig_params": True}),
    # ignored_states: a parameter of a unit's module, stepped after the unit's FlatParameter
    "fsdp1_states": ("FSDP1", [DOWN, EMBED], "for_loop", 1, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_peaks_equal_the_memtracker_peaks(fake_pg: int, case: str) -> None:
    api, ignored, optimizer, micro_steps, kwargs = CASES[case]
    assert fake_pg == 4
    peak, after = _measured(api, ignored, optimizer, micro_steps, **kwargs)
    report = _report(api, ignored, micro_steps, **kwargs)
    name = None if optimizer is None else f"adamw_{optimizer}"
    steady = range(micro_steps, 2 * micro_steps)  # the second optimizer step's micro-steps
    mems = [memory_model(report, optimizer=name, iteration=i) for i in steady]
    stepping = "during the optimizer step after"
    moments = [m for mem in mems for m in mem.moments]
    assert peak == max(sum(m.bytes) for m in moments if m.where != stepping)
    last = mems[-1].moments[-1]
    assert (last.where == stepping) == (optimizer is not None)
    if optimizer is not None:
        assert after == sum(last.bytes)


def test_the_report_states_them(fake_pg: int) -> None:
    """``Report.ignored_params``: each parameter's FQN, shape, dtype and bytes, in the JSON
    (left out where there is none); the memory summary names them and their categories."""
    report = _report("FSDP2", [EMBED], 1)
    assert report.ignored_params == [IgnoredParam(EMBED, [1001, 60], "float32", 240240, True)]
    again = fsdpviz.Report.from_json(report.to_json())
    assert again.ignored_params == report.ignored_params
    assert report.memory.config["ignored"] == {EMBED: 240240}
    assert f"{EMBED} (235 KiB)" in report.memory.summary()
    assert f"not managed by FSDP, whole on every rank: {EMBED} (235 KiB)" in report.summary()
    plain = _report("FSDP1", [], 1)
    assert "ignored_params" not in plain.to_dict() and plain.ignored_params == []
    assert "not managed by FSDP" not in plain.memory.summary()
    fsdp1 = _report("FSDP1", ["layers.1.mlp"], 1)
    assert [p.fqn for p in fsdp1.ignored_params] == [
        f"layers.1.mlp.{n}_proj.weight" for n in ("gate", "up", "down")
    ]


@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
def test_unmeasured_gradients_are_there_by_the_end(fake_pg: int, api: str) -> None:
    """Without a trace profile each unit's gradient appears at its reduction; those FSDP
    does not manage by the final callback, whole, through the optimizer step."""
    ignored = ["embed_tokens"] if api == "FSDP1" else [EMBED]
    report = _report(api, ignored, 1, profile=False)
    assert report.profile is None
    mem = memory_model(report, optimizer="adamw", iteration=1)
    step = dict(zip(CATEGORIES, mem.moments[-1].bytes, strict=True))
    assert mem.moments[-1].where == "during the optimizer step after"
    assert step["unsharded_grads"] == 240240


def test_tensor_parallel_share(fake_pg: int) -> None:
    """FSDP x TP: a parameter FSDP does not manage that a tp style distributes is a DTensor
    of which each rank holds its chunk: ``IgnoredParam`` states the rank's share, as
    ``to_local()`` has it (a row-wise embedding, a column-wise output, a replicated norm)."""
    import tp_models
    from torch.distributed.tensor.parallel import parallelize_module

    plan = tp_models.whole_plan()
    names = ("tok_embeddings.weight", "norm.weight", "output.weight")

    def build() -> nn.Module:
        return tp_models.Llama(vocab=1001, dim=64, n_heads=4, hidden=170, layers=2)

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    real = parallelize_module(build(), mesh["tp"], plan)
    local = {n: real.get_parameter(n).to_local() for n in names}  # type: ignore[operator]
    with torch.device("meta"):
        model = build()
    report = fsdpviz.analyze(
        model, torch.zeros(1, 8, dtype=torch.long), fully_shard=[("layers.0",), ("layers.1",)],
        mesh=("dp_shard", 2, "tp", 2), parallelize_plan=plan, loss=lambda o: o.float().sum(),
        ignored_params={model.get_parameter(n) for n in names},
    )  # fmt: skip
    stated = {q.fqn: (q.shape, q.bytes) for q in report.ignored_params}
    assert stated == {n: (list(t.shape), t.numel() * t.element_size()) for n, t in local.items()}
    assert stated["output.weight"][0] == [501, 64]  # the first rank's half of 1001 rows


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_fused", "sgd_momentum"])
@pytest.mark.parametrize("api", ["FSDP1", "FSDP2"])
def test_the_optimizer_step_time_updates_them(fake_pg: int, api: str, optimizer: str) -> None:
    """The time model's optimizer step passes over the parameters FSDP does not manage too,
    whole, by the shards' rule (``OptimizerSpec.passes`` over each element's bytes, in its
    own dtype) at the device's bandwidth; before, it stepped the shards only (the ignored
    embedding's 240,240 B left out)."""
    from fsdpviz.cost import machine, timeline
    from fsdpviz.cost.optimizers import optimizer_spec
    from fsdpviz.cost.sizes import itemsize

    ignored = ["embed_tokens"] if api == "FSDP1" else [EMBED]
    report = _report(api, ignored, 1, machine="h100")
    assert sum(p.bytes for p in report.ignored_params) == 240240
    passes = optimizer_spec(optimizer).passes()
    shards = sum(u.trainable[1] * itemsize(u.dtype) for u in report.units)
    seconds = (shards + 240240) * passes / (machine("h100").hbm_gbps * 1e9)
    got = timeline(report, optimizer=optimizer).totals["optimizer_s"]
    assert got == pytest.approx(seconds, rel=1e-12)


def _steps(plan: str | None, ignored: list[str]) -> str:
    """Real FSDP2 (fake process group, 4 ranks; ``plan``: tp_models' plan on a 2 x 2 mesh)
    with ``ignored`` left to autograd, one step of torch's foreach AdamW over all the
    parameters in one param group: "" where it steps, else its error."""
    import tp_models
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    model = tp_models.Llama(vocab=32, dim=16, n_heads=2, hidden=32, layers=2)
    if plan is None:
        mesh = init_device_mesh("cpu", (4,))
    else:
        both = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
        styles = tp_models.whole_plan() if plan == "sequence_parallel" else tp_models.plain_plan()
        parallelize_module(model, both["tp"], styles)
        mesh = both["dp_shard"]
    params = {model.get_parameter(n) for n in ignored}
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh, ignored_params=params)
    fully_shard(model, mesh=mesh, ignored_params=params)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    model(torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))).sum().backward()
    try:
        optim.step()
    except RuntimeError as e:
        return str(e)
    return ""


@pytest.mark.parametrize(
    ("plan", "ignored"),
    [
        (None, ["tok_embeddings.weight"]),
        ("plain", ["norm.weight"]),  # a norm the plan does not distribute: a plain tensor
        ("sequence_parallel", ["tok_embeddings.weight", "norm.weight"]),  # both DTensors
    ],
)
def test_a_foreach_step_of_one_group_with_them(
    fake_pg: int, plan: str | None, ignored: list[str]
) -> None:
    """FSDP2 leaves its ``ignored_params`` plain tensors (under tensor parallelism, DTensors
    of the tp mesh where a style distributes them): torch's foreach AdamW over one param group
    of them and FSDP2's DTensors raises at its first step (``aten._foreach_mul_.Scalar got
    mixed torch.Tensor and DTensor``, DTensor's dispatch). fsdpviz says so where torch raises
    (``ignored_params_foreach_mix``, with the fix: a param group of their own or
    ``foreach=False``), and not where it steps (DTensors of two meshes mix)."""
    import tp_models

    error = _steps(plan, ignored)
    with torch.device("meta"):
        model = tp_models.Llama(vocab=32, dim=16, n_heads=2, hidden=32, layers=2)
    if plan is None:
        ranks: dict[str, Any] = {"world_size": 4}
    else:
        styles = tp_models.whole_plan() if plan == "sequence_parallel" else tp_models.plain_plan()
        ranks = {"mesh": ("dp_shard", 2, "tp", 2), "parallelize_plan": styles}
    report = fsdpviz.analyze(
        model, torch.zeros(2, 8, dtype=torch.long), fully_shard=[("layers.0",), ("layers.1",)],
        ignored_params={model.get_parameter(n) for n in ignored}, loss=_loss, **ranks,
    )  # fmt: skip
    said = [w for w in report.warnings if w.code == "ignored_params_foreach_mix"]
    assert bool(said) == bool(error), (error, said)
    if error:
        assert "got mixed torch.Tensor and DTensor" in error
        assert ignored[0] in said[0].message and "foreach=False" in said[0].message


def test_no_foreach_warning_for_frozen_or_fsdp1(fake_pg: int) -> None:
    """Frozen parameters left out (the optimizer skips them: no gradient), and FSDP1, whose
    parameters are plain tensors all: no ``ignored_params_foreach_mix``."""
    with torch.device("meta"):
        model = ExampleModel(CONFIG)
    model.get_parameter(EMBED).requires_grad_(False)
    frozen = fsdpviz.analyze(
        model, {"input_ids": _ids()}, world_size=4, loss=_loss,
        fully_shard=["layers.0", "layers.1"], ignored_params={model.get_parameter(EMBED)},
    )  # fmt: skip
    fsdp1 = _report("FSDP1", ["embed_tokens"], 1)
    fsdp2 = _report("FSDP2", [EMBED], 1)
    codes = [[w.code for w in r.warnings] for r in (frozen, fsdp1, fsdp2)]
    assert ["ignored_params_foreach_mix" in c for c in codes] == [False, False, True]
