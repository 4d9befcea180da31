"""Anchor: FSDP2 with tensor parallelism, the events and the memory at every event against
real torch on the fake process group's 4 ranks (dp_shard 2 x tp 2), float32 and bf16.

``tp_models.Llama`` (two blocks, dim 64) under torchtitan's plan (sequence parallel), and
with a weightless normalisation at the start of each attention, which takes the
replicated DTensor its ``PrepareModuleInput`` (``use_local_output=False``) gathers:
``F.layer_norm`` (its backward's strategies all-reduce the column-wise projections'
``Partial()`` gradient) and ``F.rms_norm`` (arithmetic on the CPU: the ``Partial()``
gradient passes, reduce-scattered where it goes back); a bf16 ``layer_norm``'s statistics
are float32 on a GPU, as the plan holds them, bf16 on the CPU, whose kernels run as a GPU's
for it (:func:`_gpu_layer_norm`). The real model runs a step (its buffers made), then
another under torch's ``MemTracker``: FSDP's events as its recorder
sees them, tensor parallelism's as DTensor issues its functional collectives (kind and
bytes), each with the bytes in use as it is settled (an FSDP event as in
``test_cost_fsdp2_every_event``, the reduce-scatter at the post-backward's return,
``foreach_reduce``'s loop's last gradient let go; a tp collective as it is issued, its
input made, its output not yet) and the most since the event before. The plan's steady
step holds the same events, in order, its memory model the same two figures at each, and
the step's peak torch's.

Between two events torch holds what no event shows, each planned: a row-wise embedding's
masked indices beside its lookup's output, and their mask until the output's
reduce-scatter (``_MaskPartial``); a partial gradient's all-reduced copy beside it, in the
post-backward (``FSDPParam._get_grad_inner_tensor``) and in ``layer_norm``'s backward,
whose dispatch holds the partial one until the operator has run.

The embedding in a call of its own with ``set_unshard_in_backward(False)``: gathered in
forward only, the same events and bytes. A group whose backward reads its DTensor
parameters is refused with it, as torch fails on it.

Each block under torchtitan's per-operator selective checkpointing: its policy saves the
row-parallel linears' reduce-scatters, which the recomputation takes back.

A batch of one on 4 tp ranks, each feed-forward's sequence-sharded input left to its
column-wise linears: DTensor's ``mm`` strategies leave their weights' gradients
``Partial()``, whole on the rank until FSDP's post-backward reduce-scatters each to its
chunk. The CPU runs DTensor's all-to-all as an all-gather and a chunk; the run compared
runs it as a GPU does instead (``_dtensor::shard_dim_alltoall``'s kernel, its buffers made
by the same ATen operators), and the CPU's fallback is compared apart. Other shapes make
DTensor's strategies gather the input in forward, or move the output's gradient by an
all-to-all for the input's gradient or the weight's.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
import tp_models
from every_event import EventLog, fsdp2_events, planned_step
from gloo_worker import _FUNCOL, devices_per_host
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, SequenceParallel

import fsdpviz
from fsdpviz.schedule.tp_mm_strategy import GPUS_PER_NODE
from fsdpviz.schema.checkpointing import SelectiveCheckpoint

SIZES = {"vocab": 64, "dim": 64, "n_heads": 2, "hidden": 128, "layers": 2}
BATCH_ONE = {**SIZES, "n_heads": 4}  # on 4 tp ranks
BATCH_ONE_SEQ = 256  # DTensor gathers the weight, the smaller operand, in forward
UNEVEN_SEQ = 254  # chunked 64, 64, 64, 62 over the 4 tp ranks
Seen = list[tuple[Any, ...]]  # (kind, unit or bytes, bytes in use after it, most since before)
Step = tuple[Seen, int]  # the steady step's events and its peak


class _NormedAttention(tp_models.Attention):
    def __init__(self, dim: int, n_heads: int, norm: str) -> None:
        super().__init__(dim, n_heads)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (x.shape[-1],)
        return super().forward(F.layer_norm(x, shape) if self.norm == "layer" else
                               F.rms_norm(x, shape))  # fmt: skip


def _build(norm: str, batch_one: int = 0, sizes: dict[str, int] | None = None) -> tp_models.Llama:
    """``batch_one``: the batch of one's model (a sequence of that length; ``sizes``, other
    sizes than :data:`BATCH_ONE`)."""
    model = tp_models.Llama(**(sizes or (BATCH_ONE if batch_one else SIZES)))
    if norm != "none":
        for block in model.layers.values():
            block.attention = _NormedAttention(SIZES["dim"], SIZES["n_heads"], norm)
    return model


def _plan(norm: str) -> dict[str, Any]:
    plan = tp_models.whole_plan()
    if norm != "none":  # the attention takes the gathered DTensor as it is
        plan["layers.*.attention"] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
            use_local_output=False,
        )  # fmt: skip
    return plan


def _batch_one_plan(seq: int) -> dict[str, Any]:
    """torchtitan's plan with each feed-forward's sequence-sharded input left to its
    column-wise linears (its declared layouts equal: no redistribution); for a sequence
    the tp ranks do not divide, with the residual stream kept a DTensor
    (:func:`tp_models.dtensor_plan`), which runs it."""
    plan = tp_models.dtensor_plan() if seq % 4 else tp_models.whole_plan()
    plan["layers.*.feed_forward"] = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=False
    )
    return plan


def _absorbed_plan(seq: int) -> dict[str, Any]:
    """:func:`_batch_one_plan` with each ``ffn_norm``'s output a plain tensor, which the
    feed-forward's ``PrepareModuleInput`` makes a DTensor (``from_local``): a ``Partial()``
    gradient of its input comes back to it, which reduce-scatters it to ``Shard(1)``."""
    plan = _batch_one_plan(seq)
    plan["layers.*.ffn_norm"] = SequenceParallel(use_local_output=True)
    return plan


def _ids(batch_one: int = 0) -> torch.Tensor:
    shape = (1, batch_one) if batch_one else (2, 8)
    return torch.randint(0, SIZES["vocab"], shape, generator=torch.Generator().manual_seed(0))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def _measured(
    norm: str,
    mp: Any,
    batch_one: int = 0,
    nccl: bool = False,
    unshard_embedding: bool = True,
    shape: tuple[Any, dict[str, int] | None] = (_batch_one_plan, None),
    selective: bool = False,
    tp: int = 4,
) -> Step:
    """``batch_one``: a batch of one of that sequence length, dp_shard 1 x tp 4 (``tp`` 2:
    dp_shard 2), :func:`_batch_one_plan`, DTensor's cost model weighing the tp group as on
    a GPU node of 8, as the plan does; ``nccl``: DTensor's all-to-all as a GPU runs it
    (:func:`_nccl_all_to_all`). ``unshard_embedding`` False: the embedding in a
    ``fully_shard`` call of its own, whose ``set_unshard_in_backward(False)`` is called.
    ``shape``: the batch of one's plan (a function of the sequence) and sizes; ``selective``:
    each block under torchtitan's per-operator selective checkpointing."""
    import torch.distributed._functional_collectives as funcol
    from test_cost_memtracker import _torchtitan_sac
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    planned, sizes = shape
    dims = (4 // tp, tp) if batch_one else (2, 2)
    mesh = init_device_mesh("cpu", dims, mesh_dim_names=("dp_shard", "tp"))
    torch.manual_seed(0)
    model = _build(norm, batch_one, sizes)
    parallelize_module(model, mesh["tp"], planned(batch_one) if batch_one else _plan(norm))
    options = {"mp_policy": mp} if mp is not None else {}
    for (name,) in _calls(unshard_embedding):
        if selective and name.startswith("layers."):
            _torchtitan_sac(model.get_submodule(name))
        fully_shard(model.get_submodule(name), mesh=mesh["dp_shard"], **options)
    fully_shard(model, mesh=mesh["dp_shard"], **options)
    if not unshard_embedding:
        model.tok_embeddings.set_unshard_in_backward(False)  # type: ignore[operator]
    ids = _ids(batch_one)

    def logged(name: str, log: EventLog) -> Any:
        original = getattr(funcol, name)

        def collective(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            entry = [_FUNCOL[name], None, None, None]
            log.seen.append(entry)
            log.settle(entry)  # as it is issued: its input made, its output not yet
            out = original(t, *args, **kwargs)
            whole = out if _FUNCOL[name] == "tp_all_gather" else t  # the whole tensor's bytes
            entry[1] = whole.numel() * whole.element_size()
            return out

        return collective

    per_host = GPUS_PER_NODE if batch_one else None
    with (
        devices_per_host(per_host),
        fsdp2_events(model, ids, hsdp=False) as log,
        ExitStack() as patches,
    ):
        for name in _FUNCOL:
            patches.enter_context(patch.object(funcol, name, logged(name, log)))
        if nccl:
            patches.enter_context(_nccl_all_to_all(log))
        for step in range(2):
            if step == 1:
                log.restart()
            out = model(ids)  # held through backward, as a training loop holds it
            _loss(out).backward()
            del out
            for p in model.parameters():
                p.grad = None
        return log.step_end()


def _nccl_all_to_all(log: EventLog) -> Any:
    """DTensor's all-to-all as a GPU runs it, not the CPU's all-gather and chunk: the
    kernel of ``torch.ops._dtensor.shard_dim_alltoall`` (``Functional.cpp``) step by step in
    ATen operators, so the tracker sees its buffers (the op's own kernel hides them from a
    dispatch mode): the chunks along ``shard_dim`` moved to the front and made contiguous
    (a copy unless they are already), the receiving buffer (``empty_like``; the fake process
    group moves nothing into it), moved back along ``gather_dim`` and made contiguous (a copy
    unless it is), viewed in the output's shape. Reported as issued."""
    from torch.distributed.tensor import placement_types

    def all_to_all(
        t: torch.Tensor, gather_dim: int, shard_dim: int, mesh: Any, mesh_dim: int
    ) -> Any:
        n = mesh.size(mesh_dim)
        entry = ["tp_all_to_all", t.numel() * t.element_size() * n, None, None]
        log.seen.append(entry)
        log.settle(entry)
        split = [*t.shape[:shard_dim], n, t.shape[shard_dim] // n, *t.shape[shard_dim + 1 :]]
        sent = t.view(split).movedim(shard_dim, 0).contiguous()  # held until it returns
        received = torch.empty_like(sent)
        shape = list(t.shape)
        shape[shard_dim] //= n
        shape[gather_dim] *= n
        return received.movedim(0, gather_dim).contiguous().view(shape)

    return patch.object(placement_types, "shard_dim_alltoall", all_to_all)


@contextmanager
def _gpu_layer_norm() -> Iterator[None]:
    """The CPU's ``native_layer_norm`` and its backward as a GPU runs them while it is
    open: its statistics (``mean``, ``rstd``) in float32 for a bf16 input, as CUDA's
    ``layer_norm_cuda`` makes them (the accumulate type), where the CPU's kernel keeps them
    in the input's dtype (``layer_norm_cpu``: 64 B less a block that saves them here). The
    kernels are replaced by the same arithmetic in float32, whose temporaries no dispatch
    mode sees, as a kernel's; the operators' outputs are what the tracker counts."""
    from torch.library import Library

    def forward(x: Any, shape: list[int], weight: Any, bias: Any, eps: float) -> Any:
        dims = tuple(range(x.dim() - len(shape), x.dim()))
        x32 = x.float()
        mean = x32.mean(dims, keepdim=True)
        rstd = (x32.var(dims, unbiased=False, keepdim=True) + eps).rsqrt()
        out = (x32 - mean) * rstd
        out = out * weight if weight is not None else out
        return (out + bias if bias is not None else out).to(x.dtype), mean, rstd

    def backward(
        g: Any, x: Any, shape: list[int], mean: Any, rstd: Any, weight: Any, bias: Any,
        mask: list[bool],
    ) -> Any:  # fmt: skip
        dims, lead = tuple(range(x.dim() - len(shape), x.dim())), tuple(range(x.dim() - len(shape)))
        g32, xhat = g.float(), (x.float() - mean) * rstd
        gx = g32 * weight if weight is not None else g32
        gx = rstd * (gx - gx.mean(dims, True) - xhat * (gx * xhat).mean(dims, True))
        gw = (g32 * xhat).sum(lead).to(weight.dtype) if weight is not None and mask[1] else None
        gb = g32.sum(lead).to(bias.dtype) if bias is not None and mask[2] else None
        return gx.to(x.dtype) if mask[0] else None, gw, gb

    lib = Library("aten", "IMPL")
    with warnings.catch_warnings():  # (torch warns of the kernels it overrides)
        warnings.simplefilter("ignore")
        lib.impl("native_layer_norm", forward, "CPU")
        lib.impl("native_layer_norm_backward", backward, "CPU")
    try:
        yield
    finally:
        lib._destroy()


def _calls(unshard_embedding: bool) -> list[tuple[str, ...]]:
    """The ``fully_shard`` calls before the root's: the blocks' (and, where the embedding
    is not unsharded in backward, the embedding's first)."""
    return tp_models.LAYERS if unshard_embedding else [("tok_embeddings",), *tp_models.LAYERS]


def _planned(
    norm: str,
    mp: Any,
    batch_one: int = 0,
    unshard_embedding: bool = True,
    shape: tuple[Any, dict[str, int] | None] = (_batch_one_plan, None),
    selective: bool = False,
    tp: int = 4,
) -> tuple[Seen, int, list[Any]]:
    """The plan's steady step (as :func:`_measured`'s), its peak, each event's hook and
    module."""
    planned, sizes = shape
    with torch.device("meta"):
        model = _build(norm, batch_one, sizes)
    options: dict[str, Any] = {"mp_policy": mp} if mp is not None else {}
    if not unshard_embedding:
        options["unshard_in_backward"] = {"tok_embeddings": False}
    if selective:
        options["activation_checkpointing"] = SelectiveCheckpoint([tp_models.TransformerBlock])
    report = fsdpviz.analyze(
        model, _ids(batch_one), fully_shard=_calls(unshard_embedding),
        mesh=("dp_shard", 4 // tp, "tp", tp) if batch_one else ("dp_shard", 2, "tp", 2),
        parallelize_plan=planned(batch_one) if batch_one else _plan(norm), loss=_loss,
        progress=False, **options,
    )  # fmt: skip
    seen, peak, events = planned_step(report, lambda e: e.tensor_parallel)
    return seen, peak, [(e.hook, e.module) for e in events]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("norm", ["none", "layer", "rms"])
def test_tensor_parallel_events_and_memory_at_every_event(
    fake_pg: int, norm: str, precision: str
) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert fake_pg == 4
    mp = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if precision == "bf16" else None
    with _gpu_layer_norm() if norm == "layer" and precision == "bf16" else nullcontext():
        real, real_peak = _measured(norm, mp)
    mine, peak, _ = _planned(norm, mp)
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tensor_parallel_selective_checkpointing_at_every_event(
    fake_pg: int, precision: str
) -> None:
    """Each block under torchtitan's per-operator selective checkpointing, whose policy
    saves ``_c10d_functional.reduce_scatter_tensor``'s outputs: each row-parallel linear's
    reduce-scatter (``wo``'s, ``w2``'s) is kept from its forward to its block's
    recomputation, which takes it back (the collective's function called again, nothing
    reduced or made). Every row agrees, both figures, and the peak (before, the plan made
    each again in the recomputation: 2,048 B low per reduce-scatter at fp32 from its forward
    on, 1,024 B at bf16; the peak as low)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert fake_pg == 4
    mp = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if precision == "bf16" else None
    real, real_peak = _measured("none", mp, selective=True)
    mine, peak, _ = _planned("none", mp, selective=True)
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


def _batch_one(
    seq: int = BATCH_ONE_SEQ, shape: tuple[Any, dict[str, int] | None] = (_batch_one_plan, None)
) -> tuple[Step, tuple[Seen, int, list[Any]]]:
    """The batch of one measured, DTensor's all-to-all as a GPU runs it
    (:func:`_nccl_all_to_all`), and planned, DTensor's strategies asked afresh (the plan's
    first multiply asks them as it is traced); ``shape``: its plan and sizes."""
    from fsdpviz.schedule.tp_mm_strategy import mm_choice

    mm_choice.cache_clear()
    return (
        _measured("none", None, seq, nccl=True, shape=shape),
        _planned("none", None, seq, shape=shape),
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tensor_parallel_embedding_not_unsharded_in_backward_at_every_event(
    fake_pg: int, precision: str
) -> None:
    """The row-wise embedding (a ``Shard(0)`` DTensor weight) in a call of its own, with
    ``set_unshard_in_backward(False)``: torch gathers it in forward only (its backward
    makes the weight's gradient from the masked indices), and the plan holds the same
    events and bytes at each."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert fake_pg == 4
    mp = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if precision == "bf16" else None
    real, real_peak = _measured("none", mp, unshard_embedding=False)
    mine, peak, _ = _planned("none", mp, unshard_embedding=False)
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    assert [e[1] for e in mine if e[0] == "all_gather"].count("tok_embeddings") == 1
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


def test_tensor_parallel_batch_of_one_partial_weight_gradients(fake_pg: int) -> None:
    """A batch of one on 4 tp ranks whose feed-forward input is left sequence-sharded to
    its column-wise linears: DTensor's ``mm`` strategies (costed as on a GPU node of 8)
    gather each weight in forward and leave ``w1``'s and ``w3``'s gradients ``Partial()``,
    whole on the rank (the weight's global shape: 32,768 B against a chunk's 8,192 B) from
    their multiply to their block's post-backward, which reduce-scatters each to its
    ``Shard(0)`` chunk beside it (``FSDPParam._get_grad_inner_tensor``) and lets go of the
    whole one.

    In forward the weight's transpose, a rank's chunk, is copied contiguous before its
    all-gather (``Shard._maybe_pad_tensor``: 8,192 B held as it is issued) and its gathered
    chunks put in place by ``torch.cat`` (``all_gather_single``); the product keeps the
    input's sequence sharding, a rank's share (32,768 B, not the whole 131,072 B).

    Every row agrees, both figures, and the peak:

    - the input's gradient of each multiply, whose ``mm`` gathers the weight again, keeps
      the sequence sharding: a rank's share (16,384 B), not the whole (65,536 B: 49,152 B
      more from ``w3``'s multiply to the sum with ``w1``'s, and the sum whole too), and the
      gathered weight is held until that ``mm`` has made it (16,384 B more at its peak);
    - each all-to-all holds the kernel's buffers until it returns: the rank's chunks moved
      to the front and made contiguous, the receiving buffer, and that moved back and made
      contiguous, one of them a view at a batch of one (a share more at its peak than the
      result alone: 24,576 B and 32,768 B more in the rows after, forward and backward);
    - the first multiply asks DTensor's cost model its strategies outside the traced step
      (before, the meta tensors it asked on were counted: 114,944 B more since the row
      before)."""
    assert fake_pg == 4
    (real, real_peak), (mine, peak, tags) = _batch_one()
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    scattered = [e[:2] for e, (hook, _) in zip(mine, tags, strict=True)
                 if hook == "post_backward" and e[0] == "tp_reduce_scatter"]  # fmt: skip
    whole = BATCH_ONE["hidden"] * BATCH_ONE["dim"] * 4
    assert scattered == [("tp_reduce_scatter", whole)] * 4  # each block's w3, w1
    assert sum(e[0] == "tp_all_to_all" for e in mine) == 8  # each w1, w3: forward, backward
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


def test_tensor_parallel_batch_of_one_uneven_sequence(fake_pg: int) -> None:
    """The batch of one with a sequence the 4 tp ranks do not divide (254: chunks of 64,
    64, 64, 62; the residual stream a DTensor, which runs it), DTensor's all-to-all as a GPU
    runs it. DTensor pads the sequence to chunks as large as the first rank's, whose own
    chunk needs none. Every row agrees, both figures, and the peak:

    - a reduce-scatter onto the sequence (the embedding's, each row-wise linear's) holds,
      as it is issued, the short chunk padded (16,384 B) and the chunks' ``torch.cat``, the
      padded whole (65,536 B), which ``Shard._reduce_shard_tensor`` makes before it calls
      the functional collective (before, the plan made them after: 81,920 B low there);
    - an all-to-all off the sequence (forward) gathers it padded, 256 rows: its result is a
      ``narrow`` of that buffer (``_unpad_for_new_shard_dim``), which holds all of it (256 B
      more than 254 rows, each ``w1``'s and ``w3``'s until its backward);
    - an all-to-all onto the sequence (backward) pads the rank's tensor first
      (``_pad_for_new_shard_dim``: a copy, 32,768 B held as it is issued), and the kernel's
      buffers are as large."""
    assert fake_pg == 4
    (real, real_peak), (mine, peak, _) = _batch_one(UNEVEN_SEQ)
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    assert ("tp_all_to_all", BATCH_ONE_SEQ * BATCH_ONE["hidden"] * 4) in [e[:2] for e in mine]
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


def _reduced_plan(modules: tuple[str, ...]) -> Any:
    """:func:`tp_models.dtensor_plan` (any sequence runs) with the input of each block's
    ``modules`` left sequence-sharded to their column-wise linears by a
    ``PrepareModuleInput`` that names ``Shard(1)`` two ways (``Shard(-2)``): as the declared
    layouts differ, torch calls ``DTensor.redistribute``, which moves nothing in forward
    (the placements equal once normalised) and, in backward, takes the linears'
    ``Partial()`` input gradient back to ``Shard(1)``, a reduce-scatter."""

    def plan(seq: int) -> dict[str, Any]:
        planned = tp_models.dtensor_plan()
        for name in modules:
            planned[f"layers.*.{name}"] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Shard(-2),),
                use_local_output=False,
            )  # fmt: skip
        return planned

    return plan


@pytest.mark.parametrize(
    ("seq", "modules", "precision", "tp"),
    [
        (UNEVEN_SEQ // 4, ("feed_forward",), "fp32", 4),
        (UNEVEN_SEQ // 4, ("attention", "feed_forward"), "fp32", 4),
        (UNEVEN_SEQ // 4, ("attention", "feed_forward"), "bf16", 4),
        (UNEVEN_SEQ // 4 + 1, ("attention", "feed_forward"), "bf16", 4),
        (UNEVEN_SEQ // 4, ("attention", "feed_forward"), "bf16", 2),
    ],
)
def test_tensor_parallel_batch_of_one_input_gathered_at_every_event(
    fake_pg: int, seq: int, modules: tuple[str, ...], precision: str, tp: int
) -> None:
    """A batch of one whose column-wise linears (the feed-forward's, and the attention's
    projections) take the sequence-sharded input as it is, on a sequence short enough that
    DTensor's ``mm`` strategies gather the input in forward (the product ``Shard(1)``, the
    input's gradient ``Partial()``, reduce-scattered by :func:`_reduced_plan`'s
    redistribution), in float32 and bf16 (``MixedPrecisionPolicy``), on a sequence the 4
    tp ranks divide (64) and one they do not (63: chunks of 16, 16, 16, 15), and on 2 tp
    ranks (dp_shard 2: chunks of 32 and 31). Every row agrees, both figures, and the
    peak:

    - the product is the weight's chunk of its features (``Shard(1)``: 16 of an attention
      projection's 64, 32 of ``w1``'s 128), not a chunk of the sequence (16 of 63 rows:
      before, the plan counted the larger of its operands' shares, in float32 64 B more a
      projection and 128 B more each feed-forward product, 1,544 B more from the second
      block's forward to its backward, the step's peak 260 B high);
    - the input gathered for each multiply (in forward, and again for the weight's
      gradient) is padded to 64 rows, which ``_maybe_unpad_tensor``'s ``narrow`` keeps
      (before: 63 rows, 256 B low at the peak while the multiply ran)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from fsdpviz.schedule.tp_mm_strategy import mm_choice

    assert fake_pg == 4
    mp = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if precision == "bf16" else None
    shape = (_reduced_plan(modules), BATCH_ONE)
    mm_choice.cache_clear()
    real, real_peak = _measured("none", mp, seq, nccl=True, shape=shape, tp=tp)
    mine, peak, tags = _planned("none", mp, seq, shape=shape, tp=tp)
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    itemsize = 2 if precision == "bf16" else 4
    gathered = -(-seq // tp) * tp * BATCH_ONE["dim"] * itemsize  # the input, padded
    back = next(i for i, (_, m) in enumerate(tags) if m == "output")
    w1 = [e[:2] for i, (e, (_, m)) in enumerate(zip(mine, tags, strict=True))
          if (m or "").endswith(".w1") and i < back]  # fmt: skip
    assert w1 == [("tp_all_gather", gathered)] * BATCH_ONE["layers"]
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


def _uneven_features_plan(seq: int) -> dict[str, Any]:
    """:func:`_reduced_plan`'s feed-forward with ``w1``'s and ``w3``'s outputs kept
    DTensors (``use_local_output=False``), which know their global shape: features the tp
    ranks do not divide run (a plain tensor's ``from_local`` in ``w2`` would take them as
    even and fail)."""
    plan = _reduced_plan(("feed_forward",))(seq)
    for name in ("w1", "w3"):
        plan[f"layers.*.feed_forward.{name}"] = ColwiseParallel(use_local_output=False)
    return plan


@pytest.mark.parametrize(("seq", "dim"), [(128, 512), (127, 512), (UNEVEN_SEQ // 4, 64)])
def test_tensor_parallel_batch_of_one_uneven_features_at_every_event(
    fake_pg: int, seq: int, dim: int
) -> None:
    """A batch of one whose feed-forward has 254 features (chunks of 64, 64, 64, 62 over
    the 4 tp ranks). At ``dim`` 512 DTensor's strategies multiply as in the weight-gradient
    all-to-all case of :data:`STRATEGIES`: the output's gradient's transpose moved by an
    all-to-all off the features for ``w1``'s and ``w3``'s weight gradients, left
    ``Partial()``; at 64, as in the input-gathered case, the weight gradients a rank's
    chunk. Every row agrees, both figures, and the peak:

    - the transpose is copied contiguous before its all-to-all (the first rank's chunk of
      the features is never padded: ``Shard._pad_for_new_shard_dim`` makes it contiguous
      all the same; before, the plan made no copy: 32,768 B low as each is issued, on a
      sequence of 128, which needs no padding; on 127 the padding is that copy);
    - each ``Partial()`` weight gradient's reduce-scatter in its post-backward moves 256
      rows, padded (before: 254, 520,192 B for 524,288 B), and holds, as it is issued, the
      short chunk padded and the chunks' ``torch.cat`` (``Shard._reduce_shard_tensor``:
      before, not modelled, 655,360 B low there and in the peak after);
    - a weight gradient the multiply makes as a chunk is the first rank's, 64 of the 254
      rows (before: a quarter of them, 128 B low at the peak of each backward multiply)."""
    from fsdpviz.schedule.tp_mm_strategy import mm_choice

    assert fake_pg == 4
    shape = (_uneven_features_plan, {**BATCH_ONE, "dim": dim, "hidden": 254})
    mm_choice.cache_clear()
    real, real_peak = _measured("none", None, seq, nccl=True, shape=shape)
    mine, peak, tags = _planned("none", None, seq, shape=shape)
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    scattered = [e[:2] for e, (hook, _) in zip(mine, tags, strict=True)
                 if hook == "post_backward" and e[0] == "tp_reduce_scatter"]  # fmt: skip
    partial = dim == 512  # each block's w1, w3: their gradients Partial(), all-to-alls
    assert scattered == [("tp_reduce_scatter", 256 * dim * 4)] * 4 * partial
    assert sum(e[0] == "tp_all_to_all" for e in mine) == 4 * partial
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


def test_tensor_parallel_batch_of_one_unreduced_partial_gradient_is_noted(fake_pg: int) -> None:
    """:func:`_batch_one_plan` on a short sequence the tp ranks do not divide (63): each
    ``w1``'s and ``w3``'s multiply gathers its input and gives its gradient back
    ``Partial()`` to the norm's operators that made the DTensor, which no style's
    redistribution takes back. Torch's backward reduces it there by the operators' sharding
    propagation: reduce-scatters, and the norm's statistics (63 rows, padded to 64)
    all-gathered, which the plan leaves out, and its warning says so in those words; the
    forward agrees at every row."""
    assert fake_pg == 4
    seq = UNEVEN_SEQ // 4
    (real, _), (mine, _, tags) = _batch_one(seq, (_batch_one_plan, None))
    back = next(i for i, (_, m) in enumerate(tags) if m == "output")
    assert real[:back] == mine[:back]
    stats = ("tp_all_gather", 64 * 4)
    assert stats in [e[:2] for e in real[back:]] and stats not in [e[:2] for e in mine]
    scatters = [sum(e[0] == "tp_reduce_scatter" for e in x[back:]) for x in (real, mine)]
    assert scatters[0] > scatters[1]
    with torch.device("meta"):
        model = _build("none", seq)
    report = fsdpviz.analyze(
        model, _ids(seq), fully_shard=tp_models.LAYERS, mesh=("dp_shard", 1, "tp", 4),
        parallelize_plan=_batch_one_plan(seq), loss=_loss, progress=False,
    )  # fmt: skip
    noted = {w.message.split(" (")[0].removeprefix("tensor parallelism: "): w.message
             for w in report.warnings if w.code == "tp_implicit_redistribution"}  # fmt: skip
    assert sorted(noted) == [f"layers.{n}.feed_forward.{w}" for n in (0, 1) for w in ("w1", "w3")]
    said = ("gives its gradient back Partial()", "a reduce-scatter or an all-reduce",
            "statistics gathered", "fsdpviz does not plan, nor their buffers")  # fmt: skip
    assert all(all(s in m for s in said) for m in noted.values())


# DTensor's mm strategies for other shapes of a batch of one (costed as on a GPU node of 8),
# each feed-forward's input gradient reduce-scattered by its PrepareModuleInput
# (:func:`_absorbed_plan`): (sequence, sizes, the collectives w1's and w3's backward
# multiplies issue, of the output's gradient or the saved input)
STRATEGIES: dict[str, tuple[int, dict[str, int], list[str]]] = {
    # forward: the input gathered (the product Shard(-1)); backward: the saved input gathered
    # again for the weight's gradient (Shard(0), the weight's chunk), none for the input's
    "input-gathered": (16, BATCH_ONE, ["tp_all_gather"]),
    # forward: the weight gathered; backward: the output's gradient moved by an all-to-all
    # for the input's gradient (Partial()), none for the weight's (Partial())
    "input-gradient-all-to-all": (64, {**BATCH_ONE, "dim": 512, "hidden": 64}, ["tp_all_to_all"]),
    # forward: the input gathered; backward: the output's gradient's transpose moved by an
    # all-to-all for the weight's gradient (Partial()), none for the input's
    "weight-gradient-all-to-all": (
        128,
        {**BATCH_ONE, "dim": 512, "hidden": 256},
        ["tp_all_to_all"],
    ),
}


@pytest.mark.parametrize("case", list(STRATEGIES))
def test_tensor_parallel_batch_of_one_other_strategies_at_every_event(
    fake_pg: int, case: str
) -> None:
    """Every row agrees, both figures, and the peak, where DTensor's strategies move other
    operands than :func:`test_tensor_parallel_batch_of_one_partial_weight_gradients`'s:

    - the input gathered in forward is a temporary of its multiply (the saved input stays a
      rank's share), and the weight's gradient a chunk (before, the plan held the input
      gathered, whole, to backward: 4,096 B more a multiply, 14,336 B more from the second
      block's, and 24,576 B more at the weight's gradient, planned whole);
    - the backward multiply for the weight's gradient holds its moved operand until it has
      made its product (before: let go at once), reported as it is issued;
    - an all-to-all a strategy chooses makes the kernel's buffers, and its operand, a
      transpose, is copied contiguous first (``Shard._pad_for_new_shard_dim``: 32,768 B
      more as it is issued, which the plan left out before)."""
    assert fake_pg == 4
    seq, sizes, moved = STRATEGIES[case]
    (real, real_peak), (mine, peak, tags) = _batch_one(seq, (_absorbed_plan, sizes))
    assert [e[:2] for e in real] == [e[:2] for e in mine]
    back = next(i for i, (_, m) in enumerate(tags) if m == "output")  # backward after it
    issued = sorted({e[0] for i, (e, (_, m)) in enumerate(zip(mine, tags, strict=True))
                     if i > back and (m or "").endswith((".w1", ".w3"))})  # fmt: skip
    assert issued == moved
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(real, mine, strict=True)) if a != b]
    assert not differ, (len(mine), differ)
    assert peak == real_peak


def test_tensor_parallel_batch_of_one_on_the_cpu_fallback(fake_pg: int) -> None:
    """The same step with DTensor's all-to-all as the CPU runs it (``shard_dim_alltoall``'s
    fallback: an all-gather, then a rank's chunk made contiguous), which a GPU's does not:
    the events agree (an all-to-all read as its fallback's all-gather, of the same bytes),
    and the bytes in use at every row but the backward's weight all-gathers of ``w1`` and
    ``w3``, where torch holds 98,304 B more at each: the chunk of the output's gradient
    along the sequence of a batch of one is contiguous, so ``contiguous()`` keeps it a view
    of the whole gathered gradient (131,072 B) where the kernel leaves a share (32,768 B),
    from the all-to-all to the ``mm`` after that all-gather. The plan is a GPU's."""
    assert fake_pg == 4
    (real, real_peak), (mine, peak, tags) = (
        _measured("none", None, BATCH_ONE_SEQ),
        _planned("none", None, BATCH_ONE_SEQ),
    )
    on_cpu = {"tp_all_to_all": "tp_all_gather"}
    assert [e[:2] for e in real] == [(on_cpu.get(e[0], e[0]), e[1]) for e in mine]
    back = next(i for i, (_, m) in enumerate(tags) if m == "output")  # backward after it
    grad = BATCH_ONE_SEQ * BATCH_ONE["hidden"] * 4  # the output's gradient, whole
    view = grad - grad // fake_pg  # the fallback's view of it, less the kernel's share
    held = [real[i][2] - mine[i][2] for i, (_, m) in enumerate(tags)
            if real[i][2] != mine[i][2]]  # fmt: skip
    gathers = [i for i, (_, m) in enumerate(tags) if i > back and mine[i][0] == "tp_all_gather"
               and (m or "").endswith((".w1", ".w3"))]  # fmt: skip
    assert held == [view] * 4 and len(gathers) == 4, held
    assert all(real[i][2] - mine[i][2] == view for i in gathers)
    assert peak == real_peak


def _parallelized(mesh: Any, own: str) -> tp_models.Llama:
    """:class:`tp_models.Llama` under torchtitan's plan, ``own`` in a ``fully_shard`` call
    of its own (its ``set_unshard_in_backward(False)`` called), each block, then the root."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    model = _build("none")
    parallelize_module(model, mesh["tp"], tp_models.whole_plan())
    for name in (own, *(n for (n,) in tp_models.LAYERS)):
        fully_shard(model.get_submodule(name), mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    model.get_submodule(own).set_unshard_in_backward(False)  # type: ignore[operator]
    return model


@pytest.mark.parametrize("own", ["output", "layers.0.feed_forward.w2", "norm"])
def test_tensor_parallel_group_read_in_backward_not_unsharded_is_refused(
    fake_pg: int, own: str
) -> None:
    """``set_unshard_in_backward(False)`` on a group whose backward reads its DTensor
    parameters (the column-wise output projection's ``Shard(0)`` weight, a row-wise
    ``w2``'s ``Shard(1)``, a sequence-parallel norm's ``Replicate()`` weight): torch frees
    them after forward and fails in backward, which reads them (the projections:
    ``RuntimeError: setStorage: ... out of bounds for storage of size 0``; the norm's
    ``rms_norm`` backward on the CPU reads it unchecked and crashes the process, so it is
    not run here). fsdpviz refuses each, by the keyword and on the model
    ``parallelize_module`` and ``fully_shard`` were applied to (its DTensor parameters read
    back) alike; the embedding's backward reads none and is planned."""
    from torch.distributed.device_mesh import init_device_mesh

    assert fake_pg == 4
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    if own != "norm":
        torch.manual_seed(0)
        real = _parallelized(mesh, own)
        with pytest.raises(RuntimeError, match="out of bounds for storage of size 0"):
            _loss(real(_ids())).backward()
    said = f"unshard_in_backward=False for '{own}', whose backward reads its parameters"
    with torch.device("meta"):
        model = _build("none")
    with pytest.raises(fsdpviz.FSDPConfigError, match=said):
        fsdpviz.analyze(
            model, _ids(), fully_shard=[(own,), *tp_models.LAYERS], mesh=("dp_shard", 2, "tp", 2),
            parallelize_plan=tp_models.whole_plan(), loss=_loss, progress=False,
            unshard_in_backward={own: False},
        )  # fmt: skip
    with torch.device("meta"):
        applied = _parallelized(mesh, own)
    with pytest.raises(fsdpviz.FSDPConfigError, match=said):
        fsdpviz.analyze(applied, _ids(), loss=_loss, progress=False)
    with torch.device("meta"):
        applied = _parallelized(mesh, "tok_embeddings")
    report = fsdpviz.analyze(applied, _ids(), loss=_loss, progress=False)
    assert report.config.unshard_in_backward == {"tok_embeddings": False}
