"""Anchor: FSDP2 with context parallelism, the events and the memory at every event against
real torch on the fake process group's 4 ranks: dp_shard 2 x cp 2 and dp_shard 1 x cp 4,
FSDP sharding over both (torchtitan's ``dp_shard_cp``), float32 and bf16 (mixed precision),
with and without activation checkpointing of the blocks: full (non-reentrant
``torch.utils.checkpoint``, whose recomputation runs the ring's forward again in backward) and
torchtitan's per-operator selective checkpointing (``create_selective_checkpoint_contexts``,
whose policy saves attention's output: the recomputation takes it, and runs no ring).

``tp_models.Llama`` (two blocks, dim 64, causal ``scaled_dot_product_attention``; a small
feed-forward, so that attention's ring makes each block's forward peak) runs a step inside
torch's ``context_parallel`` (its tokens cut by the default round-robin load balancer,
``_HeadTailLoadBalancer``), then another under torch's ``MemTracker``: FSDP's events as its
recorder sees them (as in ``test_cost_fsdp2_every_event``), and the ring's collectives as
``_templated_ring_attention`` and its backward issue them (``all_gather_single`` of the keys
and values, ``permute_tensor`` of their float32 gradients: kind, bytes, and the process group,
``mesh["cp"]``'s), each settled as it is issued (its input made, its output not yet), with the
most since the event before. The plan's steady step holds the same events, in order, the same
bytes and groups, its memory model the same two figures at each, and the step's peak torch's.

The same for torchtitan's Llama 3 (``fsdpviz.configs.torchtitan_model``): rotary embeddings
from its ``freqs_cis`` buffer, which ``context_parallel`` cuts along its sequence dimension (0)
as it cuts the tokens (torchtitan passes it among the buffers), and grouped-query attention, its
key and value heads repeated per query head before attention (torchtitan's ``repeat_kv``) or
passed as they are with ``enable_gqa`` (its current models'), where the ring gathers and passes
on the fewer heads.

On the CPU, ``scaled_dot_product_attention`` runs ``_scaled_dot_product_flash_attention_for_cpu``,
for which torch's context parallelism has neither a sharding strategy nor a handler
(``NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default
does not have a sharding strategy registered``): :func:`cpu_ring` registers, beside CP's
own handlers, one for it and its backward that calls torch's own ring functions with the
CPU's kernel as their ``op``, as ``_scaled_dot_product_ring_flash_attention`` calls them
with a GPU's. What differs from a GPU: the kernel (the CPU's flash kernel returns the
output and log-sum-exp only, where a GPU's also returns its sequence bounds and random
state, which the ring hands back from its last block) and the kernels' workspace, which no
tracker sees; the ring's code, its collectives and every buffer it makes are torch's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
import tp_models
from every_event import EventLog, fsdp2_events, planned_step
from gloo_worker import _FUNCOL
from torch import nn

import fsdpviz
from fsdpviz.configs.torchtitan_model import (
    Attention,
    LlamaArgs,
    Transformer,
    TransformerBlock,
    _rotate,
)
from fsdpviz.schema.checkpointing import SelectiveCheckpoint

SIZES = {"vocab": 64, "dim": 64, "n_heads": 2, "hidden": 16, "layers": 2}
BATCH, SEQ = 2, 16
# torchtitan's Llama 3, small: 4 query heads of 16, 2 key and value heads (each for two query
# heads: repeated before attention, torchtitan's repeat_kv), a feed-forward of 48
TORCHTITAN: LlamaArgs = {
    "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 64,
    "ffn_dim_multiplier": 0.2, "multiple_of": 16,
}  # fmt: skip
Seen = list[tuple[Any, ...]]  # (kind, unit or bytes, bytes in use after it, most since before)
RING = {"all_gather_single": "cp_all_gather", "permute_tensor": "cp_all_to_all"}


@contextmanager
def cpu_ring() -> Iterator[None]:
    """torch's context parallelism on the CPU's attention kernel: DTensor's dispatch of
    ``_scaled_dot_product_flash_attention_for_cpu`` (and its backward) on the sequence-
    sharded DTensors ``context_parallel`` makes runs ``_templated_ring_attention`` (and
    ``_templated_ring_attention_backward``) over the cp group with that kernel as ``op``,
    its results the local shards of ``Shard(2)`` DTensors, as CP's ``_sdpa_handler`` does
    for a GPU's kernels."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental._context_parallel import _attention as cpa

    aten = torch.ops.aten
    fwd = aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def handler(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        info = DTensor._op_dispatcher.unwrap_to_op_info(op, args, kwargs)
        a = dict(zip((x.name for x in op._schema.arguments), info.local_args, strict=False))
        a.update(info.local_kwargs)
        mesh, group = info.compute_mesh, info.compute_mesh.get_group()
        extra = {k: a[k] for k in ("dropout_p", "scale") if k in a}
        assert a.get("attn_mask") is None
        if op is fwd:
            res = cpa._templated_ring_attention(
                group, 2, fwd, a["query"], a["key"], a["value"],
                is_causal=a.get("is_causal", False), **extra,
            )  # fmt: skip
        else:
            res = cpa._templated_ring_attention_backward(
                group, 2, bwd, a["grad_out"], "grad_out", a["query"], a["key"], a["value"],
                a["out"], a["logsumexp"], a["is_causal"], **extra,
            )  # fmt: skip
        return tuple(DTensor.from_local(t, mesh, [Shard(2)], run_check=False) for t in res)

    with patch.dict(cpa.custom_ops, {fwd: handler, bwd: handler}):
        yield


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def _ids() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, SIZES["vocab"], (BATCH, SEQ), generator=g)


def _model(kind: str, ac: str) -> nn.Module:
    """On the current device: ``"llama"``, :class:`tp_models.Llama` (fully checkpointed by its
    own ``checkpoint`` calls where ``ac`` is ``"full"``), or ``"torchtitan"``, torchtitan's
    Llama 3 (rotary embeddings from its ``freqs_cis`` buffer, grouped-query attention)."""
    if kind == "llama":
        return tp_models.Llama(**SIZES, checkpointed=ac == "full")
    model = Transformer(TORCHTITAN, SEQ)
    if kind == "gqa":
        for block in model.layers.values():
            block.attention.__class__ = _GroupedAttention
    return model


class _GroupedAttention(Attention):
    """torchtitan's grouped-query attention as its current models run it: the key and value
    heads passed to ``scaled_dot_product_attention`` as they are, with ``enable_gqa``."""

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        q, k = _rotate(q, rope), _rotate(k, rope)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=True,
        )  # fmt: skip
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, s, -1))
        return result


def _checkpointing(kind: str, ac: str) -> Any:
    """What ``analyze`` takes for ``ac`` on a ``kind`` model (see :func:`_model`)."""
    block = tp_models.TransformerBlock if kind == "llama" else TransformerBlock
    if ac == "selective":
        return SelectiveCheckpoint([block])
    return [block] if ac == "full" and kind != "llama" else None


def _measured(kind: str, mp: Any, cp: int, ac: str, tp: int = 1) -> tuple[Seen, int, list[str]]:
    """The steady step's events, its peak and the groups of the ring's collectives
    (``"cp"`` where torch issued one over ``mesh["cp"]``'s group) of a ``kind`` model (see
    :func:`_model`); ``ac``: each block under full activation checkpointing (``"full"``),
    torchtitan's per-operator selective checkpointing (``"selective"``) or none
    (``"plain"``). torchtitan's model takes its ``freqs_cis`` cut as the tokens are, as
    torchtitan passes it to ``context_parallel`` (sequence dimension 0). ``tp`` ranks: the
    ``"llama"`` model under torchtitan's tensor-parallel plan on a ``dp_shard x cp x tp``
    mesh, DTensor's collectives over the tp group among the events too (as
    ``test_cost_tp_every_event`` measures them)."""
    import torch.distributed._functional_collectives as funcol
    from test_cost_memtracker import _torchtitan_sac, _whole
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.parallel import parallelize_module

    names = ("dp_shard", "cp", "tp") if tp > 1 else ("dp_shard", "cp")
    dims = (4 // cp // tp, cp, tp) if tp > 1 else (4 // cp, cp)
    mesh = init_device_mesh("cpu", dims, mesh_dim_names=names)
    shard_mesh = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    torch.manual_seed(0)
    model = _model(kind, ac)
    if tp > 1:
        parallelize_module(model, mesh["tp"], tp_models.whole_plan())
    options = {"mp_policy": mp} if mp is not None else {}
    for (name,) in tp_models.LAYERS:
        if ac == "selective":
            _torchtitan_sac(model.get_submodule(name))
        elif ac == "full" and kind != "llama":
            _whole(model.get_submodule(name))
        fully_shard(model.get_submodule(name), mesh=shard_mesh, **options)
    fully_shard(model, mesh=shard_mesh, **options)
    ids = _ids()
    buffers, dims = [ids], [1]
    if kind != "llama":
        buffers.append(model.get_buffer("freqs_cis"))
        dims.append(0)
    groups: list[str] = []
    cp_group = mesh["cp"].get_group()  # not in the step: slicing a mesh makes a tensor

    inside: list[str] = []  # the collective running

    def collectives(name: str, log: EventLog) -> Any:
        original = getattr(funcol, name)

        def collective(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if inside:  # ``permute_tensor`` runs ``all_to_all_single``: one collective
                return original(t, *args, **kwargs)
            group = kwargs.get("group", args[-1] if args else None)
            on_ring = name in RING and group is cp_group
            if on_ring:  # another group's shows as a tp collective among the events
                groups.append("cp")
            entry = [RING[name] if on_ring else _FUNCOL[name], None, None, None]
            log.seen.append(entry)
            log.settle(entry)  # as it is issued: its input made, its output not yet
            inside.append(name)
            try:
                out = original(t, *args, **kwargs)
            finally:
                inside.pop()
            whole = out if entry[0] in ("cp_all_gather", "tp_all_gather") else t
            entry[1] = whole.numel() * whole.element_size()
            return out

        return collective

    with ExitStack() as stack:
        stack.enter_context(cpu_ring())
        stack.enter_context(
            context_parallel(
                mesh["cp"], buffers=buffers, buffer_seq_dims=dims, no_restore_buffers={ids}
            )
        )
        log = stack.enter_context(fsdp2_events(model, ids, hsdp=False))
        for name in {**RING, **(_FUNCOL if tp > 1 else {})}:
            stack.enter_context(patch.object(funcol, name, collectives(name, log)))
        for step in range(2):
            if step == 1:
                log.restart()
                groups.clear()
            out = model(ids)
            _loss(out).backward()
            del out
            for p in model.parameters():
                p.grad = None
        seen, peak = log.step_end()
    return seen, peak, groups


def _planned(kind: str, mp: Any, cp: int, ac: str, tp: int = 1) -> tuple[Seen, int, list[str]]:
    """The plan's steady step (as :func:`_measured`'s), its peak, its ring's groups."""
    with torch.device("meta"):
        model = _model(kind, ac)
    options: dict[str, Any] = {"mp_policy": mp} if mp is not None else {}
    if _checkpointing(kind, ac) is not None:
        options["activation_checkpointing"] = _checkpointing(kind, ac)
    mesh: tuple[Any, ...] = ("dp_shard", 4 // cp // tp, "cp", cp)
    if tp > 1:
        mesh += ("tp", tp)
        options["parallelize_plan"] = tp_models.whole_plan()
    report = fsdpviz.analyze(
        model, _ids(), fully_shard=tp_models.LAYERS, mesh=mesh, loss=_loss, progress=False,
        **options,
    )  # fmt: skip
    seen, peak, events = planned_step(report, lambda e: e.context_parallel or e.tensor_parallel)
    ring = [str(e.group) for e in events if e.context_parallel]
    assert report.config.shard_world_size == 4 // tp  # FSDP shards over dp_shard x cp
    return seen, peak, ring


@pytest.mark.parametrize("ac", ["plain", "full", "selective"])
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_context_parallel_events_and_memory_at_every_event(
    fake_pg: int, precision: str, cp: int, ac: str
) -> None:
    """Every row agrees, both figures, and the peak. Before, with the same events, bytes and
    groups:

    - every row 128 B low at cp 2 (192 B at cp 4): ``context_parallel`` copies a rank's
      share of the tokens into the tensor itself (``resize_``), whose storage keeps the whole
      sequence's bytes, where the plan held a copy of the share alone;
    - the backward's all-gather 12,288 B low at cp 2 (6,144 B at cp 4): torch makes the three
      float32 gradient accumulators before it issues the all-gather;
    - the most before the first all-to-all 8,192 B low (4,096 B at cp 4): the accumulators
      take the strides of the keys and values as autograd saved them, a transposed view's,
      so ``flatten()`` copies each before their ``torch.cat``; and before the others up to
      2,112 B low: torch holds a block's gradients until the next block's are made;
    - each forward's most before its block's reshard 4,288 B high at cp 2 (fp32): torch lets
      the buffer it sends to the all-gather go once it is issued, and the contiguous keys and
      values once the second block takes the gathered ones.

    Checkpointed (the recomputed ring's collectives among the events), before:

    - from the backward's all-gather until its block's gradients are done, 8,192 B low at
      fp32 cp 2 (4,096 B at fp32 cp 4 and bf16 cp 2, 2,048 B at bf16 cp 4): autograd's
      node holds the keys and values it unpacked until the ring's backward returns, where
      the plan let them go once it rebound the names to their contiguous copies (without
      checkpointing the node's saved tensors held them anyway);
    - at bf16 cp 2, each forward's most before its block's reshard 128 B high: torch's
      merger rebinds its names to the merged chunks, so the old log-sum-exp goes before the
      merged output's buffer is made, where the plan held it until the step's end.

    Selective (torchtitan's per-operator policy, which saves attention's output), before:
    from each block's forward until its recomputation (2,112 B at fp32 cp 2, 3,168 B at fp32
    cp 4, 1,088 B at bf16 cp 2, 1,632 B at bf16 cp 4 high per block, the peak 2,112 B high at
    fp32 cp 2): the plan's policy saw each block of the ring as an attention kernel and saved
    every block's output and log-sum-exp, where torch's sees the one attention kernel
    DTensor's dispatch runs the whole ring in, and saves its merged output and log-sum-exp."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert fake_pg == 4
    mp = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if precision == "bf16" else None
    real, real_peak, real_groups = _measured("llama", mp, cp, ac)
    mine, peak, groups = _planned("llama", mp, cp, ac)
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    rings = (2 + cp + (ac == "full")) * SIZES["layers"]  # a recomputed forward: one all-gather
    assert real_groups == groups == ["cp"] * rings
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


@pytest.mark.parametrize("ac", ["plain", "full", "selective"])
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["torchtitan", "gqa"])
def test_torchtitans_llama_under_context_parallelism_at_every_event(
    fake_pg: int, kind: str, precision: str, cp: int, ac: str
) -> None:
    """torchtitan's Llama 3 (rotary embeddings, its ``freqs_cis`` buffer cut along the
    sequence by ``context_parallel``; grouped-query attention, keys and values repeated per
    query head before the ring): every row agrees, both figures, and the peak."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert fake_pg == 4
    mp = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if precision == "bf16" else None
    real, real_peak, real_groups = _measured(kind, mp, cp, ac)
    mine, peak, groups = _planned(kind, mp, cp, ac)
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    rings = (2 + cp + (ac == "full")) * TORCHTITAN["n_layers"]
    assert real_groups == groups == ["cp"] * rings
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


@pytest.mark.parametrize("ac", ["plain", "full", "selective"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_context_and_tensor_parallel_at_every_event(fake_pg: int, precision: str, ac: str) -> None:
    """dp_shard 1 x cp 2 x tp 2, torchtitan's tensor-parallel plan (sequence parallel): the
    ring over the cp group on a tp rank's heads of its share of the sequence, DTensor's
    collectives over the tp group on that share. Every row agrees, both figures, and the
    peak. Before, with the same events and bytes (a rank holds one of the two heads, so its
    keys, values and attention output are contiguous whether their heads dimension is moved
    or not, where the trace's, of both heads, are not):

    - each forward's all-gather 4,096 B high at fp32 (2,048 B at bf16): the plan copied the
      keys and values contiguous, which torch's ``contiguous()`` leaves as they are;
    - from each block's attention to its backward 2,048 B high at fp32 plain (1,024 B at
      bf16): the model's ``reshape`` of the attention's output, moved back, copied it (saved
      by ``wo``), a view on the rank; the peak 2,048 B high at fp32 plain;
    - each backward's first all-to-all's most 4,096 B high (fp32): the float32 accumulators'
      ``flatten()`` copied them, views on the rank.

    Selective, before (with the above fixed): from each row-parallel reduce-scatter (``wo``'s,
    ``w2``'s) to its block's recomputation 2,048 B low at fp32 (1,024 B at bf16; the peak as
    low): torchtitan's policy saves ``_c10d_functional.reduce_scatter_tensor``'s output, which
    the recomputation takes back, where the plan made it again there."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert fake_pg == 4
    mp = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if precision == "bf16" else None
    real, real_peak, real_groups = _measured("llama", mp, 2, ac, tp=2)
    mine, peak, groups = _planned("llama", mp, 2, ac, tp=2)
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    assert real_groups == groups == ["cp"] * (4 + (ac == "full")) * SIZES["layers"]
    assert any(e[0].startswith("tp_") for e in mine)
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak
