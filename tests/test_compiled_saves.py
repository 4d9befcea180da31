"""What a compiled loss holds between forward and backward: torch's own partitioner
(``min_cut_rematerialization_partition`` with Inductor's decompositions) read on fake
tensors, against the compiled function run for real on the CPU (its graphs run as Python,
no C++ compiler), and the memory model of a model whose loss is compiled."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._functorch._aot_autograd.utils import make_boxed_func
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.decomposition import select_decomp_table
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz.trace.compiled_saves import partitioner_saves

ROWS, SEQ, VOCAB = 2, 64, 1000


def _cross_entropy(labels: torch.Tensor) -> Any:
    def loss(pred: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    return loss


def test_partitioner_saves_what_the_compiled_loss_keeps_at_run_time() -> None:
    labels = torch.randint(0, VOCAB, (ROWS, SEQ))
    logits = torch.randn(ROWS, SEQ, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    compiled = aot_function(
        lambda pred, target: _cross_entropy(target)(pred),
        fw_compiler=lambda gm, _: make_boxed_func(gm),
        bw_compiler=lambda gm, _: make_boxed_func(gm),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=select_decomp_table(),
    )
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        kept[id(st)] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compiled(logits, labels)
    held_inputs = {id(logits.untyped_storage()), id(labels.untyped_storage())}
    intermediates = sum(n for key, n in kept.items() if key not in held_inputs)
    loss.backward()
    assert logits.grad is not None

    meta_labels = labels.to("meta")
    meta_logits = torch.empty(ROWS, SEQ, VOCAB, dtype=torch.bfloat16, device="meta")
    saves = partitioner_saves(_cross_entropy(meta_labels), [meta_logits.requires_grad_()])
    assert saves is not None
    assert saves.inputs == (0,)  # the bf16 logits, not an fp32 copy or the log-softmax
    assert id(logits.untyped_storage()) in kept
    assert saves.bytes == intermediates
    assert saves.bytes < ROWS * SEQ * 4 * 4  # a few fp32 numbers per row, no logit-sized one


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 64)
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(2))
        self.out = nn.Linear(64, VOCAB * 8, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for layer in self.layers:
            h = layer(h)
        out: torch.Tensor = self.out(h)
        return out


@pytest.mark.parametrize("plan", ["fully_shard", "auto_wrap_policy"])
def test_a_compiled_loss_holds_no_logit_sized_float32(plan: str) -> None:
    with torch.device("meta"):
        model = _Head().to(torch.bfloat16)
    ids = torch.zeros(ROWS, SEQ * 8, dtype=torch.long)
    labels = torch.zeros(ROWS, SEQ * 8, dtype=torch.long, device="meta")
    wrap: dict[str, Any] = (
        {"fully_shard": [nn.Linear]}
        if plan == "fully_shard"
        else {"auto_wrap_policy": ModuleWrapPolicy({nn.Linear})}
    )
    eager_loss = _cross_entropy(labels)
    runs = {
        c: fsdpviz.analyze(
            model,
            ids,
            world_size=8,
            loss=torch.compile(eager_loss) if c else eager_loss,
            compile=c,
            progress=False,
            **wrap,
        ).memory.peak
        for c in (False, True)
    }
    eager, compiled = runs[False], runs[True]
    fp32 = ROWS * SEQ * 8 * VOCAB * 8 * 4  # one float32 logit-sized tensor
    # eager: the peak is in the loss's backward, over two float32 gradients of the logits
    assert eager["breakdown"]["backward_temp"] >= 2 * fp32
    # compiled: the log-softmax is not kept (the bf16 logits are, for the backward), and no
    # float32 gradient is written out, only the bf16 one
    e, c = eager["breakdown"], compiled["breakdown"]
    assert c["activations"] == e["activations"] - fp32 + fp32 // 2
    assert c["forward_temp"] == e["forward_temp"] - fp32 // 2
    assert c["backward_temp"] < fp32
    assert compiled["bytes"] < eager["bytes"] - 2 * fp32


def test_a_compiled_model_with_an_eager_loss_holds_what_eager_autograd_saves() -> None:
    """``torch.compile(model)`` compiles the model's forward, not the loss called after it."""
    with torch.device("meta"):
        model = _Head().to(torch.bfloat16)
    ids = torch.zeros(ROWS, SEQ, dtype=torch.long)
    labels = torch.zeros(ROWS, SEQ, dtype=torch.long, device="meta")
    peaks = [
        fsdpviz.analyze(
            model,
            ids,
            world_size=8,
            loss=_cross_entropy(labels),
            fully_shard=[nn.Linear],
            compile=c,
            progress=False,
        ).memory.peak
        for c in (False, True)
    ]
    assert peaks[0] == peaks[1]


def test_reading_a_compiled_loss_runs_no_hook_of_the_modules_it_calls() -> None:
    """The loss's graph is captured apart from the step: a module it calls (here a head with
    a forward hook) is called once per step, as with the loss eager."""
    with torch.device("meta"):
        model = _Head().to(torch.bfloat16)
        scale = nn.Linear(VOCAB * 8, 1, bias=False).to(torch.bfloat16)
    calls: list[int] = []
    handle = scale.register_forward_hook(lambda *_: calls.append(1))

    def loss(out: torch.Tensor) -> torch.Tensor:
        scaled: torch.Tensor = scale(out)
        return scaled.float().square().mean()

    ids = torch.zeros(ROWS, SEQ, dtype=torch.long)
    counts = []
    try:
        for fn in (loss, torch.compile(loss)):
            calls.clear()
            fsdpviz.analyze(
                model, ids, world_size=8, loss=fn, fully_shard=[nn.Linear], progress=False
            )
            counts.append(len(calls))
    finally:
        handle.remove()
    assert counts[0] == counts[1] > 0


def test_a_compiled_loss_is_fused_in_time_beside_compiled_blocks() -> None:
    """``compile=[Block]`` with ``torch.compile(loss_fn)``: the loss's memory-bound kernels are
    fused too, as Inductor compiles it."""
    with torch.device("meta"):
        model = _Head().to(torch.bfloat16)
    ids = torch.zeros(ROWS, SEQ, dtype=torch.long)
    labels = torch.zeros(ROWS, SEQ, dtype=torch.long, device="meta")
    eager_loss = _cross_entropy(labels)
    totals = [
        fsdpviz.analyze(
            model,
            ids,
            world_size=8,
            loss=fn,
            fully_shard=[nn.Linear],
            compile=[nn.Linear],
            progress=False,
        ).timeline.totals
        for fn in (eager_loss, torch.compile(eager_loss))
    ]
    assert totals[1]["memory_bound_s"] < totals[0]["memory_bound_s"]
    assert totals[1]["matmul_s"] == pytest.approx(totals[0]["matmul_s"])


def test_a_compiled_loss_torch_cannot_trace_is_costed_eager_and_said_so() -> None:
    """A loss with data-dependent Python (``.item()``) cannot be traced on fake tensors:
    its memory is costed as eager autograd holds it, and a warning says so."""
    x = torch.randn(4, 8, requires_grad=True, device="meta")

    def loss(t: torch.Tensor) -> torch.Tensor:
        return t.sum() * t.sum().item()

    with pytest.warns(UserWarning, match="could not trace the compiled loss"):
        assert partitioner_saves(loss, [x]) is None
