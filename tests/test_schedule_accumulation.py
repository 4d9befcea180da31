"""Gradient accumulation planned by ``analyze(..., grad_accum=N)``: the options, the
micro-steps a report holds, ``replay`` of another accumulation, and the time model stepping
through every micro-step (``tests/test_conformance_accumulation.py`` holds the schedule to
real FSDP on gloo)."""

from __future__ import annotations

import pytest
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.cost import timeline
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.replan import replay

CONFIG = ExampleConfig(hidden_size=512, intermediate_size=1024, num_layers=4, num_heads=8)
POLICY = ModuleWrapPolicy({DecoderLayer})


def _report(**kwargs: object) -> fsdpviz.Report:
    ids = example_inputs(CONFIG, batch=2, seq=256)
    return fsdpviz.analyze(example_model(CONFIG), ids, world_size=64, progress=False, **kwargs)


def _untimed(report: fsdpviz.Report) -> list[list[dict[str, object]]]:
    return [[e.to_dict() for e in it] for it in report.iterations]


@pytest.mark.parametrize(
    "options",
    [
        {"auto_wrap_policy": POLICY},
        {"auto_wrap_policy": POLICY, "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP},
        {"fully_shard": [DecoderLayer]},
    ],
    ids=["full-shard", "grad-op", "fsdp2"],
)
def test_micro_steps_are_planned_replayed_and_timed(options: dict[str, object]) -> None:
    base = _report(**options)
    acc = _report(grad_accum=4, **options)
    assert acc.config["grad_accum"] == 4 and "grad_accum" not in base.config
    assert len(acc.iterations) == 8
    assert "steady step, micro-step 4/4 (synced)" in acc.summary()
    # the synced micro-step of the steady step is the plain steady iteration, except that
    # SHARD_GRAD_OP's parameters are still unsharded from the no_sync micro-steps before it
    last, steady = _untimed(acc)[-1], _untimed(base)[-1]
    if options.get("sharding_strategy") == ShardingStrategy.SHARD_GRAD_OP:
        assert last == [e for e in steady if e["kind"] != "all_gather"]
    else:
        assert last == steady
    # replaying the traced report with grad_accum gives the same micro-steps
    assert _untimed(replay(base, grad_accum=4)) == _untimed(acc)
    assert _untimed(replay(acc, grad_accum=1)) == _untimed(base)
    # the time model steps through the step's four micro-steps, the last one synced
    tl = acc.timeline
    assert [s["sync"] for s in tl.micro_steps] == [False, False, False, True]
    assert [s["iteration"] for s in tl.micro_steps] == [4, 5, 6, 7]
    t = tl.totals
    assert t["step_s"] == pytest.approx(tl.micro_steps[-1]["end"] + t["optimizer_s"])
    assert t["micro_batches"] == 4 and t["tokens"] == 4 * base.timeline.totals["tokens"]
    assert t["tokens_per_s"] == pytest.approx(t["tokens"] / t["step_s"])
    # one micro-step reduces: a quarter of the reduce-scatter bytes of syncing every one
    every = timeline(base, grad_accum=4).totals
    assert t["reduce_scatter_bytes"] == pytest.approx(every["reduce_scatter_bytes"] / 4)
    assert t["step_s"] < every["step_s"]
    quiet, synced = tl.micro_steps[0], tl.micro_steps[-1]
    assert quiet["reduce_scatter_bytes"] == 0 and synced["reduce_scatter_bytes"] > 0
    if options.get("sharding_strategy") == ShardingStrategy.SHARD_GRAD_OP:
        # only the step's first micro-step all-gathers (in forward)
        assert [s["all_gather_bytes"] > 0 for s in tl.micro_steps] == [True, False, False, False]
    else:
        assert t["all_gather_bytes"] == pytest.approx(every["all_gather_bytes"])
    with pytest.raises(fsdpviz.ConfigError, match="planned with grad_accum=4"):
        timeline(acc, grad_accum=2)
    assert timeline(acc, grad_accum=4).totals["step_s"] == pytest.approx(t["step_s"])
    # the first optimizer step
    assert [s["iteration"] for s in timeline(acc, iteration=1).micro_steps] == [0, 1, 2, 3]


def test_accumulation_options_say_what_to_pass() -> None:
    with pytest.raises(fsdpviz.ConfigError, match="grad_accum must be a positive int"):
        _report(auto_wrap_policy=POLICY, grad_accum=0)
    with pytest.raises(fsdpviz.ConfigError, match=r"'no_sync'.*pass grad_accum=N"):
        _report(auto_wrap_policy=POLICY, no_sync=True)
    with pytest.raises(fsdpviz.ConfigError, match=r"'requires_gradient_sync'.*grad_accum=N"):
        _report(fully_shard=[DecoderLayer], requires_gradient_sync=False)
    with pytest.raises(fsdpviz.ConfigError, match="grad_accum must be a positive int"):
        replay(_report(auto_wrap_policy=POLICY), grad_accum=-1)
    # FSDP2 kept gathered after every backward: the next step's forward finds the groups
    # gathered and computes with the parameters from before the optimizer step
    said = r"micro-steps before the last do.*before the optimizer step\): pass grad_accum=N"
    with pytest.raises(fsdpviz.ConfigError, match=said):
        _report(fully_shard=[DecoderLayer], reshard_after_backward=False)
    with pytest.raises(fsdpviz.ConfigError, match=r"last one\): pass grad_accum=N"):
        _report(fully_shard=[DecoderLayer], mesh=(2, 32), requires_all_reduce=False)


@pytest.mark.parametrize(
    "options",
    [
        {"auto_wrap_policy": POLICY},
        {"auto_wrap_policy": POLICY, "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP},
        {"fully_shard": [DecoderLayer]},
    ],
    ids=["full-shard", "grad-op", "fsdp2"],
)
def test_memory_carries_unreduced_gradients_across_micro_steps(options: dict[str, object]) -> None:
    """Without gradient sync every unit's unsharded gradient stays until the synced
    micro-step reduces it (and SHARD_GRAD_OP's parameters stay unsharded): a micro-step after
    the first starts with them, and the synced one peaks above an iteration that syncs."""
    from fsdpviz.cost import memory_lane, memory_model
    from fsdpviz.cost.memory import micro_step_memory

    base = _report(**options)
    acc = _report(grad_accum=4, **options)
    grads = sum(
        u.padded_numel if options.get("fully_shard") is None else u.numel for u in acc.units
    )
    first, *later = (memory_model(acc, iteration=i) for i in range(4, 8))
    assert first.peak["bytes"] == base.memory.peak["bytes"]  # after a synced step: as usual
    lane = memory_lane(acc, iteration=None)
    for i, mem in zip(range(5, 8), later, strict=True):
        start = next(k for k, it in enumerate(lane.iteration) if it == i)
        assert lane.bytes["unsharded_grads"][start] >= grads * 4 * 0.99  # fp32 gradients
        assert mem.peak["bytes"] > base.memory.peak["bytes"]
        if options.get("sharding_strategy") == ShardingStrategy.SHARD_GRAD_OP:
            unsharded = sum(u.padded_numel * 4 for u in acc.units)
            assert lane.bytes["unsharded_params"][start] == unsharded
    assert acc.memory.peak["bytes"] == later[-1].peak["bytes"]
    # the micro-steps walked once give what memory_model gives each of them
    each = micro_step_memory(acc, iteration=7)
    assert [m.to_dict() for m in each] == [m.to_dict() for m in (first, *later)]
    assert [m.to_dict() for m in micro_step_memory(acc, iteration=5)] == [
        m.to_dict() for m in (first, later[0])
    ]
