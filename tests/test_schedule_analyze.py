"""Unit tests of ``analyze``: options, errors, and the user's model left untouched."""

from __future__ import annotations

import copy
import functools
import json
import warnings
from typing import Any

import handwritten_models as hm
import pytest
import torch
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    FullyShardedDataParallel,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

import fsdpviz

POLICY = ModuleWrapPolicy({hm.Block})


def _x() -> torch.Tensor:
    return torch.randn(4, 8)


def _fsdp_error(model: nn.Module, **kwargs: Any) -> str:
    with pytest.raises(ValueError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        FullyShardedDataParallel(copy.deepcopy(model), device_id=torch.device("cpu"), **kwargs)
    return str(err.value)


# ----------------------------------------------------------------------- options
@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"auto_wrap": POLICY}, r"unknown option 'auto_wrap'; did you mean 'auto_wrap_policy'\?"),
        ({"backward_prefech": None}, r"did you mean 'backward_prefetch'"),
        ({"process_group": None}, r"not modelled by fsdpviz: pass world_size"),
        ({"device_mesh": None}, r"not modelled by fsdpviz"),
        ({"offload_policy": None}, r"an option of FSDP2's fully_shard.*pass fully_shard=\["),
        (
            {"fully_shard": [hm.Block], "auto_wrap_policy": POLICY},
            r"an option of FSDP1 .*drop fully_shard to plan FSDP1",
        ),
        ({"world_size": 0}, r"world_size must be a positive int"),
        ({"world_size": "8"}, r"world_size must be a positive int"),
        ({"sharding_strategy": 3}, r"ShardingStrategy.FULL_SHARD"),
        ({"backward_prefetch": 3}, r"BackwardPrefetch.BACKWARD_PRE"),
        ({"forward_prefetch": "yes"}, r"forward_prefetch must be True or False"),
        ({"cpu_offload": True}, r"cpu_offload must be a CPUOffload, got bool"),
        ({"mixed_precision": torch.bfloat16}, r"must be a torch.distributed.fsdp.MixedPrecision"),
        ({"trace": "fast"}, r"trace='fast' is not valid"),
        ({"loss": 3}, r"loss must be a callable"),
        ({"shard_group_size": 2}, r"only applies to HYBRID_SHARD"),
        (
            {"sharding_strategy": ShardingStrategy.HYBRID_SHARD, "shard_group_size": 3},
            r"must be a positive divisor of world_size=8",
        ),
    ],
)
def test_bad_options_are_rejected_with_a_message(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(fsdpviz.ConfigError, match=pattern):
        fsdpviz.analyze(hm.Stack(), _x(), **kwargs)


def test_string_options_do_what_fsdp1_does_with_them() -> None:
    """FSDP1 keeps enum options as given: a string prefetches nothing in backward, and a
    string strategy fails in FlatParameter construction (checked against real FSDP1 in
    tests/test_conformance_gloo.py)."""
    report = fsdpviz.analyze(
        hm.Stack(), _x(), auto_wrap_policy=POLICY, backward_prefetch="BACKWARD_POST", world_size=2
    )
    assert report.config["backward_prefetch"] is None
    assert not [e for e in report.iterations[1] if e.prefetch and e.phase == "backward"]
    (warning,) = [w for w in report.warnings if w.code == "string_option"]
    assert "nothing is prefetched in backward" in warning.message
    assert "pass BackwardPrefetch.BACKWARD_POST" in warning.message
    enum = fsdpviz.analyze(
        hm.Stack(), _x(), auto_wrap_policy=POLICY, world_size=2,
        backward_prefetch=BackwardPrefetch.BACKWARD_POST,
    )  # fmt: skip
    assert [e for e in enum.iterations[1] if e.prefetch and e.phase == "backward"]
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"KeyError: 'shard_grad_op'.*pass Shard"):
        fsdpviz.analyze(hm.Stack(), _x(), sharding_strategy="shard_grad_op", world_size=2)
    mp = MixedPrecision(param_dtype="bfloat16")  # type: ignore[arg-type]
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"param_dtype='bfloat16'.*torch.bfloat16"):
        fsdpviz.analyze(hm.Stack(), _x(), mixed_precision=mp)
    # FSDP2: dtypes must be torch.dtype too; reshard_after_forward must be a bool or an int
    policy = MixedPrecisionPolicy(reduce_dtype="float32")  # type: ignore[arg-type]
    with pytest.raises(fsdpviz.FSDPConfigError, match=r"reduce_dtype='float32'.*torch.float32"):
        fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[hm.Block], mp_policy=policy)
    with pytest.raises(fsdpviz.ConfigError, match="reshard_after_forward must be a bool, an int"):
        fsdpviz.analyze(hm.Stack(), _x(), fully_shard=[hm.Block], reshard_after_forward="True")


def test_one_rank_runs_no_shard_as_fsdp1_switches_to_it() -> None:
    report = fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=POLICY, world_size=1)
    assert report.config["sharding_strategy"] == "NO_SHARD"
    assert report.config["sharding_strategy_given"] == "FULL_SHARD"
    assert {u.sharding_strategy for u in report.units} == {"NO_SHARD"}
    assert {e.kind for e in report.iterations[1]} == {"all_reduce"}
    (warning,) = report.warnings
    assert warning.message == (
        "FSDP is switching to use `NO_SHARD` instead of ShardingStrategy.FULL_SHARD since the "
        "world size is 1."
    )
    # a string strategy is harmless on one rank, since FSDP replaces it
    text = fsdpviz.analyze(hm.Stack(), _x(), sharding_strategy="FULL_SHARD", world_size=1)
    assert {w.code for w in text.warnings} == {"string_option", "no_shard_world_size_1"}
    # a replay to more ranks runs the strategy that was asked for
    from fsdpviz.replan import replay

    eight = replay(report, world_size=8)
    fresh = fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=POLICY, world_size=8)
    assert eight.iterations == fresh.iterations and eight.warnings == fresh.warnings
    assert replay(fresh, world_size=1).iterations == report.iterations


def test_hybrid_shard_groups_of_one_rank_never_synchronise() -> None:
    report = fsdpviz.analyze(
        hm.Stack(), _x(), auto_wrap_policy=POLICY, world_size=4,
        sharding_strategy=ShardingStrategy.HYBRID_SHARD, shard_group_size=1,
    )  # fmt: skip
    assert report.config["process_group_size"] == 1
    assert {e.kind for e in report.iterations[1]} == {"all_reduce"}
    assert not [e for e in report.iterations[1] if e.group == "replicate"]
    codes = [w.code for w in report.warnings]
    assert codes == ["no_shard_world_size_1", "hybrid_not_synchronized"]
    assert "never all-reduces across the 4 replicas" in report.warnings[1].message


def test_hybrid_sharding_all_reduces_each_shard_across_replicas() -> None:
    report = fsdpviz.analyze(
        hm.Stack(), _x(), auto_wrap_policy=POLICY, world_size=4,
        sharding_strategy=ShardingStrategy._HYBRID_SHARD_ZERO2, shard_group_size=2,
    )  # fmt: skip
    steady = report.iterations[1]
    for unit in ["", *[f"blocks.{i}" for i in range(4)]]:
        reduced = [(e.kind, e.group) for e in steady if e.unit == unit and e.kind != "free"]
        assert reduced[-2:] == [("reduce_scatter", None), ("all_reduce", "replicate")]
    e = next(e for e in steady if e.group == "replicate")
    assert e.describe() == "all_reduce 'blocks.3' (across replicas, post_backward of 'blocks.3')"
    assert fsdpviz.Event.from_dict(e.to_dict()) == e


def test_missing_wrap_class_is_named_with_the_classes_the_model_has() -> None:
    report = fsdpviz.analyze(
        hm.Stack(), _x(), auto_wrap_policy=ModuleWrapPolicy({nn.TransformerEncoderLayer})
    )
    assert [u.module for u in report.units] == [""]  # as FSDP1: one unit, silently
    (warning,) = report.warnings
    assert warning.code == "wrap_class_missing"
    assert warning.message.startswith(
        "ModuleWrapPolicy names TransformerEncoderLayer, but no module of Stack is an instance "
        "(FSDP1 does not check): the root is the only unit."
    )
    assert warning.message.endswith("with parameters: Block (x4), Linear (x10), LayerNorm (x4)")
    # a policy may name classes a model lacks, as long as one is there
    partial = functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={hm.Block, nn.LSTM}
    )
    report = fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=partial)
    assert len(report.units) == 5 and not report.warnings
    lstm = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.LSTM})
    report = fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=lstm)
    assert report.warnings[0].message.startswith("transformer_auto_wrap_policy names LSTM")


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("hello", "the string 'hello'"),
        (None, "None (did the function"),
        (hm.Stack, "the class Stack; pass an instance"),
        (hm.frozen_stack, "the callable 'frozen_stack'; call it"),
        ({"w": torch.zeros(1)}, "a dict (a state_dict?)"),
    ],
)
def test_not_a_module_says_what_was_expected(model: Any, said: str) -> None:
    with pytest.raises(fsdpviz.ConfigError, match=r"expects the model, a torch\.nn\.Module") as e:
        fsdpviz.analyze(model, _x())
    assert said in str(e.value)
    with pytest.raises(fsdpviz.ConfigError, match=r"^sweep expects the model"):
        fsdpviz.sweep(model, _x(), world_size=[2, 4])


@pytest.mark.parametrize(
    "inputs", [{"x": torch.randn(4, 8)}, (torch.randn(4, 8),), torch.randn(4, 8)]
)
def test_inputs_as_dict_tuple_or_tensor(inputs: Any) -> None:
    class KwModel(hm.Stack):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # named argument for the dict form
            return super().forward(x)

    report = fsdpviz.analyze(KwModel(), inputs, auto_wrap_policy=POLICY)
    assert report.forward_order == ["", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]


def test_bad_inputs_type() -> None:
    with pytest.raises(fsdpviz.ConfigError, match="inputs must be a dict"):
        fsdpviz.analyze(hm.Stack(), "not a tensor")


def test_ignored_module_outside_the_model() -> None:
    with pytest.raises(fsdpviz.ConfigError, match="not part of the model"):
        fsdpviz.analyze(hm.Stack(), _x(), ignored_modules=[nn.Linear(2, 2)])


def test_custom_loss_and_output_without_floats() -> None:
    class IntOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x).argmax(-1)

    with pytest.raises(fsdpviz.ConfigError, match="pass loss=lambda out"):
        fsdpviz.analyze(IntOut(), _x())
    report = fsdpviz.analyze(hm.Stack(), _x(), loss=lambda out: out[:, 0].mean())
    assert [e.kind for e in report.iterations[0]][-1] == "reduce_scatter"


# --------------------------------------------------------- FSDP's own errors
def test_mixed_requires_grad_without_use_orig_params_is_fsdps_error(fake_pg: int) -> None:
    model = hm.Stack()
    model.blocks[1].fc1.weight.requires_grad_(False)
    fsdp_msg = _fsdp_error(model, auto_wrap_policy=POLICY)
    assert "requires_grad=True and False" in fsdp_msg
    with pytest.raises(fsdpviz.FSDPConfigError, match="requires_grad=True and False") as err:
        fsdpviz.analyze(model, _x(), auto_wrap_policy=POLICY)
    assert isinstance(err.value, ValueError)


def test_mixed_requires_grad_with_callable_policy(fake_pg: int) -> None:
    model = hm.Stack()
    model.blocks[1].fc1.weight.requires_grad_(False)
    policy = size_based_auto_wrap_policy
    assert "uniform `requires_grad`" in _fsdp_error(model, auto_wrap_policy=policy)
    with pytest.raises(fsdpviz.FSDPConfigError, match="uniform `requires_grad`"):
        fsdpviz.analyze(model, _x(), auto_wrap_policy=policy)


def test_mixed_dtype_in_one_unit(fake_pg: int) -> None:
    model = hm.Stack()
    model.head.to(torch.float64)
    assert "uniform dtype" in _fsdp_error(model, auto_wrap_policy=POLICY)
    with pytest.raises(fsdpviz.FSDPConfigError, match="uniform dtype"):
        fsdpviz.analyze(model, _x(), auto_wrap_policy=POLICY)


def test_ignored_modules_and_states_together(fake_pg: int) -> None:
    model = hm.WithAux()
    kw = {"ignored_modules": [model.aux], "ignored_states": [model.aux.weight]}
    assert "Cannot pass both" in _fsdp_error(model, **kw)
    with pytest.raises(fsdpviz.FSDPConfigError, match="Cannot pass both"):
        fsdpviz.analyze(model, _x(), **kw)


# ----------------------------------------------------- the model stays as it was
def _snapshot(model: nn.Module) -> dict[str, Any]:
    return {
        "params": {
            n: (p, p.detach().clone(), p.requires_grad, p.grad) for n, p in model.named_parameters()
        },
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
        "training": [m.training for m in model.modules()],
        "hooks": [
            (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for m in model.modules()
        ],
        "modules": list(model.named_modules()),
    }


def _assert_unchanged(model: nn.Module, before: dict[str, Any]) -> None:
    after = _snapshot(model)
    assert after["modules"] == before["modules"]
    assert after["training"] == before["training"]
    assert after["hooks"] == before["hooks"]
    for n, (p, data, rg, grad) in before["params"].items():
        q, qdata, qrg, qgrad = after["params"][n]
        assert q is p and qrg == rg and qgrad is grad
        assert q.shape == data.shape and q.dtype == data.dtype and q.device == data.device
        assert q.is_meta or torch.equal(qdata, data)
    for n, b in before["buffers"].items():
        assert b.is_meta or torch.equal(after["buffers"][n], b)


@pytest.mark.parametrize("trace", ["meta", "real"])
def test_real_model_is_returned_untouched(trace: str) -> None:
    model = hm.WithNorm()
    model.blocks[0].fc1.weight.requires_grad_(False)
    model.eval()
    model.blocks[1].train()
    model.head(torch.randn(2, 16)).sum().backward()  # grads present before analysis
    model.blocks[2].register_forward_hook(lambda *a: None)
    before = _snapshot(model)
    fsdpviz.analyze(model, _x(), auto_wrap_policy=POLICY, use_orig_params=True, trace=trace)
    _assert_unchanged(model, before)


def test_meta_model_untouched_and_nothing_allocated() -> None:
    with torch.device("meta"):
        model = hm.Stack()
    before = _snapshot(model)
    report = fsdpviz.analyze(model, torch.randn(4, 8, device="meta"), auto_wrap_policy=POLICY)
    _assert_unchanged(model, before)
    assert all(p.is_meta for p in model.parameters())
    assert len(report.units) == 5


def test_failure_leaves_no_hooks_and_names_the_module() -> None:
    class DataDependent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if self.gate(x).sum().item() > 0 else x

    class Net(hm.Stack):
        def __init__(self) -> None:
            super().__init__()
            self.router = DataDependent()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.blocks[0](self.inp(x))
            return self.head(self.router(h))

    model = Net()
    before = _snapshot(model)
    with pytest.raises(fsdpviz.TraceError) as err:
        fsdpviz.analyze(model, _x(), auto_wrap_policy=POLICY)
    assert err.value.module == "router"
    assert "module 'router' (DataDependent)" in str(err.value)
    assert "trace='real'" in str(err.value)
    _assert_unchanged(model, before)
    report = fsdpviz.analyze(model, _x(), auto_wrap_policy=POLICY, trace="real")
    assert report.forward_order == ["", "blocks.0"]
    assert any(w.code == "unit_unused_in_forward" for w in report.warnings)


# ------------------------------------------------------------------- the report
def test_report_contract_and_json_round_trip(tmp_path: Any) -> None:
    report = fsdpviz.analyze(
        hm.Tied(),
        torch.randint(0, 32, (2, 6)),
        auto_wrap_policy=POLICY,
        world_size=3,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
    )
    d = report.to_dict()
    json.dumps(d)
    assert {"units", "forward_order", "iterations", "warnings"} <= set(d)
    root = d["units"][0]
    assert root["module"] == "" and root["params"] == ["emb.weight"]
    assert root["shared_params"] == {"head.weight": "emb.weight"}
    assert root["numel"] == 32 * 16 and root["padded_numel"] % 3 == 0
    assert root["sharded_numel"] == root["padded_numel"] // 3
    assert root["bytes"] == root["numel"] * 4
    first, steady = d["iterations"]
    assert all(e["kind"] in {"all_gather", "free", "reduce_scatter"} for e in first + steady)
    assert all(("prefetch" in e) == (e["kind"] == "all_gather") for e in first)
    path = tmp_path / "r.json"
    report.to_json(path)
    again = fsdpviz.load(str(path))
    assert again.to_dict() == d


def test_sizes_with_padding() -> None:
    report = fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=POLICY, world_size=7)
    block = report.unit("blocks.0")
    assert block.numel == 16 * 2 + 16 * 32 + 32 + 32 * 16 + 16
    assert block.sharded_numel == -(-block.numel // 7)
    assert block.padded_numel == block.sharded_numel * 7
    assert block.params == [
        "blocks.0.ln.weight",
        "blocks.0.ln.bias",
        "blocks.0.fc1.weight",
        "blocks.0.fc1.bias",
        "blocks.0.fc2.weight",
        "blocks.0.fc2.bias",
    ]
    with pytest.raises(KeyError, match=r"no wrap unit for module 'blocks\.9'"):
        report.unit("blocks.9")


def test_module_infos_carry_units_and_shapes() -> None:
    report = fsdpviz.analyze(hm.CalledTwice(), _x(), auto_wrap_policy=POLICY)
    mods = {m.fqn: m for m in report.modules}
    assert mods["blocks.1"].calls == 2 and mods["blocks.0"].calls == 1
    assert mods["blocks.1.fc1"].unit == "blocks.1"
    assert mods["blocks.1.fc1"].params == {"weight": [32, 16], "bias": [32]}
    assert mods["inp"].unit == "" and mods["inp"].input_shapes == [[4, 8]]
    assert mods["head"].output_shapes == [[4, 3]]
    assert report.module_order[:3] == ["", "inp", "blocks.0"]


def test_progress_bar_can_be_forced(capsys: Any) -> None:
    fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=POLICY, progress=True)
    assert "fsdpviz trace" in capsys.readouterr().err
    fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=POLICY, progress=False)
    assert capsys.readouterr().err == ""


def test_backward_module_order_and_param_first_use() -> None:
    report = fsdpviz.analyze(hm.Tied(), torch.randint(0, 32, (2, 6)), auto_wrap_policy=POLICY)
    back = report.module_backward_order
    # the root returns head's output tensor: head's gradient is reached first
    assert back[:3] == ["head", "", "blocks.2"]
    assert (
        back.index("blocks.2") < back.index("blocks.1") < back.index("blocks.0") < back.index("emb")
    )
    # the tied weight is first used by the embedding, not the head
    assert report.param_first_use["emb.weight"] == "emb"
    assert "head.weight" not in report.param_first_use
    assert report.param_first_use["blocks.1.fc2.bias"] == "blocks.1.fc2"


def test_already_wrapped_model_is_rejected(fake_pg: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = FullyShardedDataParallel(hm.Stack(), device_id=torch.device("cpu"))
    with pytest.raises(fsdpviz.ConfigError, match=r"already wrapped.*FSDP1Recorder"):
        fsdpviz.analyze(wrapped, _x())


def test_the_root_reads_root_in_the_forward_order() -> None:
    """``report.forward_order`` holds FQNs (the root ``""``) and prints the root as every
    text names it, sliced too."""
    from fsdpviz.examples import example_analysis

    report = example_analysis(world_size=2)
    order = report.forward_order
    assert order[0] == "" and list(order) == [u.module for u in report.units]
    assert repr(order[:2]) == "[(root), 'layers.0']"
    assert repr(order).startswith("[(root), 'layers.0', ")
    assert fsdpviz.Report.from_dict(report.to_dict()).forward_order == order


def test_predicates_meet_the_users_modules() -> None:
    """A predicate that tests module identity (``m is model.head``, ``m in blocks``) is asked
    of the user's modules, not fsdpviz's copy: as a wrap policy (FSDP1), a ``fully_shard``
    callable (FSDP2) and an activation-checkpointing predicate it picks what the classes or
    names of the same modules pick (real FSDP agrees: ``test_conformance_corners.py``)."""
    from torch.distributed.fsdp.wrap import CustomPolicy

    torch.manual_seed(0)
    model, x = hm.Stack(), torch.randn(4, 8)
    blocks = list(model.blocks)

    def same(a: fsdpviz.Report, b: fsdpviz.Report) -> None:
        assert [u.module for u in a.units] == [u.module for u in b.units]
        assert a.iterations == b.iterations
        assert a.timeline.totals["hardware_flops"] == b.timeline.totals["hardware_flops"]

    picked = fsdpviz.analyze(model, x, auto_wrap_policy=CustomPolicy(lambda m: m is model.head))
    assert [u.module for u in picked.units] == ["", "head"]
    keep = {model.blocks[0], model.blocks[2]}
    same(
        fsdpviz.analyze(model, x, fully_shard=lambda n, m: m in keep),
        fsdpviz.analyze(model, x, fully_shard=["blocks.0", "blocks.2"]),
    )
    same(
        fsdpviz.analyze(model, x, fully_shard=[hm.Block],
                        activation_checkpointing=lambda m: m in blocks),
        fsdpviz.analyze(model, x, fully_shard=[hm.Block], activation_checkpointing=[hm.Block]),
    )  # fmt: skip
