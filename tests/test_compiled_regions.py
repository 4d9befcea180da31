"""What a compiled torchtitan block under per-operator selective activation checkpointing
holds between forward and backward: fsdpviz's prediction against the block compiled by
``torch.compile`` and run for real on the CPU (backend ``aot_eager_decomp_partition``:
Inductor's decompositions and partitioner, its graphs run as aten operators, no C++
compiler), compared in tensor bytes."""

from __future__ import annotations

import weakref
from collections import defaultdict
from typing import Any

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.torch_version import TorchVersion
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import fsdpviz
from fsdpviz.configs.torchtitan_model import Transformer, TransformerBlock
from fsdpviz.schema.checkpointing import SelectiveCheckpoint
from fsdpviz.trace.compiled_regions import PARTITIONED_SINCE

ARGS: Any = {"dim": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256,
             "multiple_of": 256, "ffn_dim_multiplier": 1.3}  # fmt: skip
BATCH, SEQ = 2, 64
_aten = torch.ops.aten
# torchtitan's per-operator policy (torchtitan/distributed/activation_checkpoint.py, 2024)
_SAVE = {
    _aten.mm.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    _aten.max.default,
}


def _policy(meta: dict[str, int]) -> Any:
    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == _aten.mm.default:
            meta[f"{mode}_mm_count"] += 1
        to_save = func in _SAVE and not (
            func == _aten.mm.default and meta[f"{mode}_mm_count"] % 2 == 0
        )
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _context() -> Any:
    return create_selective_checkpoint_contexts(_policy(defaultdict(int)))


def _compiled_block_saves() -> tuple[int, int]:
    """The block as torchtitan trains it (checkpoint-wrapped, then compiled), run on real
    bf16 tensors: the bytes its compiled backward keeps (inputs and weights left out), and
    its output's."""
    torch.manual_seed(0)
    block = TransformerBlock(0, ARGS).to(torch.bfloat16)
    wrapped = checkpoint_wrapper(block, context_fn=_context, preserve_rng_state=False)
    compiled = torch.compile(wrapped, backend="aot_eager_decomp_partition", fullgraph=True)
    model = Transformer(ARGS, SEQ)
    rope = model.get_buffer("freqs_cis")
    x = torch.randn(BATCH, SEQ, ARGS["dim"], dtype=torch.bfloat16, requires_grad=True)
    out = compiled(x, rope)
    node = out.grad_fn
    assert node is not None and type(node).__name__ == "CompiledFunctionBackward"
    outside = {t.untyped_storage().data_ptr() for t in (x, rope, *block.parameters())}
    kept = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in node.saved_tensors
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in outside
    }
    out.sum().backward()  # it runs
    assert x.grad is not None
    return sum(kept.values()), out.untyped_storage().nbytes()


def _held_by_first_block(compile: bool | list[type]) -> int:
    """What fsdpviz's memory timeline holds more after the first block's forward than before
    it (activations and forward temporaries: what the block keeps for backward, and its
    output)."""
    with torch.device("meta"):
        model = Transformer(ARGS, SEQ)
    report = fsdpviz.analyze(
        model,
        torch.zeros(BATCH, SEQ, dtype=torch.long),
        world_size=2,
        fully_shard=[TransformerBlock],
        activation_checkpointing=SelectiveCheckpoint([TransformerBlock]),
        compile=compile,
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        progress=False,
    )
    events = {(e.hook, e.unit, e.phase): e for e in report.memory.events}
    before = events["pre_forward", "layers.0", "forward"]
    after = events["post_forward", "layers.0", "forward"]
    return (after.activations + after.forward_temp) - (before.activations + before.forward_temp)


@pytest.mark.skipif(
    TorchVersion(torch.__version__) < PARTITIONED_SINCE,
    reason="before PARTITIONED_SINCE a compiled selective block keeps eager's count",
)
@pytest.mark.parametrize("compile", [[TransformerBlock], True], ids=["blocks", "model"])
def test_a_compiled_selective_block_holds_what_torch_compile_keeps(
    compile: list[type] | bool,
) -> None:
    """Each block compiled (torchtitan's ``[compile] components = ["model"]``) or the whole
    model (``compile=True``: Dynamo traces each selective checkpoint whole too)."""
    real, output = _compiled_block_saves()
    compiled = _held_by_first_block(compile=compile) - output
    eager = _held_by_first_block(compile=False) - output
    assert compiled == real
    # eager selective checkpointing also keeps the down projection's output (the policy
    # saves it; no backward reads it): one bf16 hidden state per token
    assert eager - compiled == BATCH * SEQ * ARGS["dim"] * 2


def test_a_torch_before_the_partitioned_release_keeps_eagers_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the capture would lose the policy's tags (torch 2.8), a compiled selective
    block is counted as eager autograd holds it, not by a partition that keeps more."""
    from fsdpviz.trace import compiled_regions

    monkeypatch.setattr(compiled_regions, "PARTITIONED_SINCE", "99.0")
    assert _held_by_first_block(compile=[TransformerBlock]) == _held_by_first_block(compile=False)


@pytest.mark.skipif(
    TorchVersion(torch.__version__) < PARTITIONED_SINCE,
    reason="before PARTITIONED_SINCE no partition runs",
)
def test_identical_blocks_are_partitioned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's two identical blocks run the same operators on the same shapes: torch's
    partitioner runs for the first only, the second holds the same."""
    from fsdpviz.trace import compiled_regions

    calls: list[int] = []
    partition = compiled_regions.partitioner_saves

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return partition(*args, **kwargs)

    monkeypatch.setattr(compiled_regions, "partitioner_saves", counting)
    monkeypatch.setattr(compiled_regions, "_SAVES", {})
    _held_by_first_block(compile=[TransformerBlock])
    assert len(calls) == 1


def test_a_region_does_not_uncount_a_storage_given_a_freed_ones_id() -> None:
    """A storage the compiled region made and freed again leaves its ``id`` to whatever Python
    makes next: when the region's forward returns, the storage counted under that ``id`` now
    is not the region's and keeps its bytes."""
    from types import SimpleNamespace

    from fsdpviz.trace.compiled_regions import CompiledRegion, _hold_saves
    from fsdpviz.trace.compiled_saves import PartitionSaves
    from fsdpviz.trace.probe_records import ACT

    freed = torch.empty(16, device="meta").untyped_storage()
    region = CompiledRegion()
    region.made.append((64, torch.float32, weakref.ref(freed)))
    del freed
    other = torch.empty(16, device="meta").untyped_storage()  # perhaps at the freed one's id
    rec = [64, ACT, weakref.ref(other)]
    host = SimpleNamespace(_live={id(other): rec}, live=[0] * 8)
    host.live[ACT] = 64
    _hold_saves(host, region, PartitionSaves((), ()), [], None)
    assert rec[0] == 64 and host.live[ACT] == 64
    # the region's own storage, which the partitioner does not keep, stops counting
    made = torch.empty(16, device="meta").untyped_storage()
    region.made = [(64, torch.float32, weakref.ref(made))]
    mine = [64, ACT, weakref.ref(made)]
    host._live = {id(made): mine}
    _hold_saves(host, region, PartitionSaves((), ()), [], None)
    assert mine[0] == 0 and host.live[ACT] == 0


def test_a_regions_saves_are_matched_in_the_order_its_storages_were_made() -> None:
    """Of two storages of one size and dtype, where the partitioner keeps one of that size,
    the first made is the one kept, whatever their ``id``s: the match does not depend on
    where Python's allocator put them."""
    from types import SimpleNamespace

    from fsdpviz.trace.compiled_regions import CompiledRegion, _hold_saves
    from fsdpviz.trace.compiled_saves import PartitionSaves
    from fsdpviz.trace.probe_records import ACT

    first = torch.empty(16, device="meta").untyped_storage()
    second = torch.empty(16, device="meta").untyped_storage()
    for order in ((first, second), (second, first)):
        region = CompiledRegion()
        recs = {}
        for st in order:
            region.made.append((64, torch.float32, weakref.ref(st)))
            recs[id(st)] = [64, ACT, weakref.ref(st)]
        host = SimpleNamespace(_live=dict(recs), live=[0] * 8)
        host.live[ACT] = 128
        keeps = PartitionSaves((), (((16,), torch.float32),))
        _hold_saves(host, region, keeps, [], None)
        assert recs[id(order[0])][0] == 64 and recs[id(order[1])][0] == 0
        assert host.live[ACT] == 64
