"""Run torch's ``FSDPMemTracker`` on real ``fully_shard``.

``tracked(build, ...)`` builds the model under ``FakeTensorMode`` on the CPU (or, with
``real=True``, as real CPU tensors, on the gloo ranks of :func:`spawn_gloo`), applies
``fully_shard`` to each block (a list of modules is one group) then the root, and
measures one forward+backward with ``FSDPMemTracker``. The step holds the model output
until backward returns (``out = model(x); loss(out).backward()``), like fsdpviz's trace.
With ``optimizer="adam"`` or ``"adamw"`` a first step runs before tracking, so the
tracked step is the steady state. With ``accumulate=N`` a step is ``N`` micro-steps, the
first ``N - 1`` after ``set_requires_gradient_sync(False)`` (with ``sync_each``, none: each
reduces its gradients); the tracker follows every
micro-step of one optimizer step (its module statistics reset between them: it follows one
iteration at a time), the peak is the step's and each module's peaks the most over its
micro-steps. With ``step=True`` the tracker follows ``optimizer.step()`` after them on its own,
its peak starting afresh (``Tracked.step_peak``). ``after_step(model)`` runs after the
first step, before tracking (torchao's ``precompute_float8_dynamic_scale_for_fsdp``).

On gloo, ``gloo_reduce_scatter=False`` (the default) hides the copy of its input that
gloo makes while a reduce-scatter completes (``work.wait()``), which NCCL does not make:
the tracker still sees the reduce-scatter and names its input "Reduce Scatter". Every
collective returns once gloo's worker thread has let go of its tensors, so each storage
dies where the program drops it and the measurement is the same on every run.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
import warnings
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from pipeline_memory import _NoModules
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

# FSDPMemTracker category -> the fsdpviz categories it is compared with. Two
# differences are in how the two tools name memory, not in how much there is:
# - "Activation" is every live tensor the forward allocated; fsdpviz splits it
#   into "activations" (saved for backward) and "forward_temp" (the model output
#   the training loop holds, tensors in use).
# - FSDPMemTracker calls a parameter gradient "Temp" until the unit's
#   post-backward runs, then "Unsharded Grad"; fsdpviz calls it "unsharded_grads"
#   from the moment autograd accumulates it and the gradients of activations
#   "backward_temp". Their sums are compared.
MAPPING: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sharded params": (("Sharded Param",), ("sharded_params",)),
    "unsharded params": (("Unsharded Param",), ("unsharded_params",)),
    "all-gather buffers": (("All Gather",), ("all_gather",)),
    "reduce-scatter buffers": (("Reduce Scatter",), ("reduce_scatter",)),
    "sharded grads": (("Sharded Grad",), ("sharded_grads",)),
    "forward tensors": (("Activation",), ("activations", "forward_temp")),
    "backward tensors": (("Temp", "Unsharded Grad"), ("backward_temp", "unsharded_grads")),
    "optimizer state": (("OptState",), ("optimizer",)),
    "inputs": (("Inputs",), ("inputs",)),
    "buffers": (("Buffer",), ("buffers",)),
}


@dataclass
class Tracked:
    peak: dict[str, int]  # FSDPMemTracker category -> bytes at the global peak
    modules: dict[str, dict[str, int]]  # module FQN -> {"forward", "backward"} peak bytes
    tracker: Any = field(default=None, repr=False)  # None once read back from a file
    after_forward: dict[str, int] = field(default_factory=dict)  # category -> bytes
    all_gathers: int = 0  # all-gathers FSDP issued in the tracked step
    # gloo_reduce_scatter: the bytes gloo allocated while each reduce-scatter completed
    reduce_scatter_copies: list[int] = field(default_factory=list)
    # step=True: category -> bytes at the peak of optimizer.step() (tracked on its own)
    step_peak: dict[str, int] = field(default_factory=dict)
    after_backward: dict[str, int] = field(default_factory=dict)  # category -> bytes


def tracked(
    build: Callable[[], nn.Module],
    inputs: Callable[[], dict[str, Any]],
    blocks: Callable[[nn.Module], list[nn.Module] | list[list[nn.Module]]],
    world_size: int,
    loss: Callable[[Any], torch.Tensor],
    optimizer: bool | str = False,
    mesh_shape: tuple[int, int] | None = None,
    parallelize: Callable[[nn.Module, Any], object] | None = None,
    around: Callable[[], AbstractContextManager[object]] = nullcontext,
    real: bool = False,
    gloo_reduce_scatter: bool = False,
    accumulate: int = 1,
    step: bool = False,
    reduce_each: bool = False,
    sync_each: bool = False,
    after_step: Callable[[nn.Module], object] | None = None,
    every_storage: bool = False,
    follow_modules: bool = True,
    **fully_shard_kwargs: Any,
) -> Tracked:
    """``build``'s model sharded (``blocks``, then the root) and run on ``inputs`` under
    torch's ``FSDPMemTracker``. ``follow_modules=False``: the tracker follows no module's
    window (its module peaks are not measured), so no hook of torch's ``ModTracker`` keeps
    a tensor alive that the program lets go of (:class:`_NoModuleHooks`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if mesh_shape is None:
        mesh = init_device_mesh("cpu", (world_size,))
    elif parallelize is not None:  # FSDP x TP: parallelize on tp, fully_shard on dp_shard
        both = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp_shard", "tp"))
        mesh = both["dp_shard"]
    else:  # HSDP: replicate over the first dimension, shard over the second
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp_replicate", "dp_shard"))
    # allow_non_fake_inputs: fully_shard(reshard_after_forward=int) builds a mesh from real tensors.
    # FSDP x TP runs on real CPU tensors (the models are small): DTensor computes each output's
    # placement on fake tensors of the global shape, under the fake mode that is active, and
    # FSDPMemTracker entered inside a fake mode counts those as allocations; outside one it
    # skips them (torch's comment in MemTracker.__torch_dispatch__).
    fake = FakeTensorMode(allow_non_fake_inputs=True) if parallelize is None else nullcontext()
    if real:
        fake = nullcontext()
        torch.manual_seed(0)
    with fake:
        model = build()
        if parallelize is not None:
            parallelize(model, both["tp"])
        # the dp x tp mesh fully_shard joins is computed from real tensors (nonzero on a fake
        # tensor has no fixed shape); the parameters stay fake
        with unset_fake_temporarily():
            for block in blocks(model):
                fully_shard(block, mesh=mesh, **fully_shard_kwargs)
            fully_shard(model, mesh=mesh, **fully_shard_kwargs)
        copies: list[int] = []
        if real:
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    comm = _GlooReduceScatter(copies) if gloo_reduce_scatter else _NoCopy()
                    module.set_custom_reduce_scatter(comm)
                    module.set_custom_all_gather(_SyncAllGather())
        batch = inputs()
        opt = _optimizer(model, optimizer)
        if opt is not None:
            for k in range(accumulate):
                _sync(model, sync_each or k == accumulate - 1, accumulate, reduce_each)
                loss(model(**batch)).backward()
            opt.step()
            opt.zero_grad()
            if after_step is not None:
                after_step(model)
            copies.clear()
        tracker = FSDPMemTracker(model, opt)
        if not follow_modules:
            tracker._mod_tracker = _NoModuleHooks(model)
        # see _post_backward_letting_go
        tracker._fsdp_param_group_post_backward = functools.partial(  # type: ignore[method-assign]
            _post_backward_letting_go, tracker
        )
        if every_storage:  # see _track_every_storage
            tracker._track = functools.partial(_track_every_storage, tracker)  # type: ignore[method-assign]
        tracker.track_inputs((batch,))
        modules: dict[str, dict[str, int]] = {}
        after_forward: dict[Any, int] = {}
        after_backward: dict[Any, int] = {}
        with tracker, around(), count_all_gathers() as gathers:
            for k in range(accumulate):
                _sync(model, sync_each or k == accumulate - 1, accumulate, reduce_each)
                out = model(**batch)
                if k == 0:
                    after_forward = next(iter(tracker.get_tracker_snapshot().values()))
                loss(out).backward()
                if k == accumulate - 1:
                    after_backward = next(iter(tracker.get_tracker_snapshot().values()))
                del out
                _module_peaks(tracker, modules)
                tracker.reset_mod_stats()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
        step_peak: dict[Any, int] = {}
        if step and opt is not None:  # tracked again: the tracker's peak starts afresh
            with tracker:
                opt.step()
                step_peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
                opt.zero_grad()
    return Tracked(
        _categories(peak), modules, tracker, _categories(after_forward), gathers.count, copies,
        _categories(step_peak), _categories(after_backward),
    )  # fmt: skip


class _NoModuleHooks(_NoModules):
    """``FSDPMemTracker``'s module tracker without module hooks: it names FSDP's modules as
    ``ModTracker`` does (the root's class name, then the path), follows no module's window.
    The gradient hook ``ModTracker`` puts on a module's inputs that require grad keeps their
    autograd nodes in its closure, so some tensors live longer than the program keeps
    them: a leaf input with its gradient (transformers' ``enable_input_require_grads``
    makes the frozen embedding's output one) past the micro-step; the identity matrix
    peft's DoRA passes through ``lora_A`` (saved by its node), until the garbage collector
    runs."""

    # FSDPMemTracker refuses a module's second forward when "Global" is its only other
    # parent (a new iteration, it takes it); a name no module has lets a layer run twice
    parents = frozenset({"Global", ""})

    def __init__(self, root: nn.Module) -> None:
        prefix = type(root).__name__
        self._names = {m: f"{prefix}.{n}" if n else prefix for n, m in root.named_modules()}

    def get_known_fqn(self, mod: nn.Module) -> str | None:
        return self._names.get(mod)


def _post_backward_letting_go(
    tracker: Any, fsdp_mod: Any, post_backward: Callable[..., Any]
) -> Callable[..., None]:
    """``FSDPMemTracker._fsdp_param_group_post_backward`` without its stray reference.
    Torch's wrapper names each parameter's unsharded gradient ``Unsharded Grad`` in a loop
    whose variable keeps the last parameter's gradient alive through the whole
    ``FSDPParamGroup.post_backward`` it wraps. Where post-backward frees that gradient before
    reducing (the last micro-step after ones without gradient sync, reducing in a dtype other
    than the parameters': ``accumulate_unsharded_grad_if_needed`` adds it into the
    reduce-dtype accumulated gradient and drops it), the tracker counted it beside the
    reduce-scatter input, a gradient the training loop no longer holds; everywhere else
    ``foreach_reduce``'s own loop variable holds it as long (the gradients it reduces). This
    wrapper names the gradients the same way and snapshots the same moments, its loop
    variable let go before the wrapped post-backward runs."""
    from torch.distributed._tools.fsdp2_mem_tracker import (
        _FSDPModState,
        _FSDPRefType,
        _FSDPState,
    )

    @functools.wraps(post_backward)
    def inner(*args: Any, **kwargs: Any) -> None:
        group = fsdp_mod._get_fsdp_state()._fsdp_param_group
        for fsdp_param in group.fsdp_params if group else []:
            grad = fsdp_param._unsharded_param.grad
            if grad is not None:
                tracker._update_and_maybe_create_winfos(
                    grad, _FSDPRefType.UNSHARDED_GRAD, update_existing=True
                )
            del grad  # torch's wrapper keeps it
        snapshots = tracker.memory_tracking[fsdp_mod].snapshots
        snapshots.setdefault(_FSDPModState.BEF_POST_BW, []).append(tracker.get_tracker_snapshot())
        tracker._fsdp_state = _FSDPState.POST_BW
        post_backward(*args, **kwargs)
        for fsdp_param in group.fsdp_params if group else []:
            if fsdp_param.sharded_param.grad is not None:
                tracker._update_and_maybe_create_winfos(
                    fsdp_param.sharded_param.grad, _FSDPRefType.SHARDED_GRAD
                )
        snapshots.setdefault(_FSDPModState.AFT_POST_BW, []).append(tracker.get_tracker_snapshot())

    return inner


def _track_every_storage(tracker: Any, reftype: Any, t: torch.Tensor) -> None:
    """``MemTracker._track`` counting every storage of ``t``: torch's returns at the first
    storage it tracks already, so a tensor subclass of several storages, one of them seen
    before, goes uncounted when its set of storages happens to list that one first (a set
    of storages orders them by address: at random). torchao's float8 tensor-parallel
    styles make such tensors: an all-gathered float8 activation shares its scale with the
    rank's cast part it was gathered from (``tracked(..., every_storage=True)``)."""
    from torch.distributed._tools.common_utils import get_untyped_storages
    from torch.distributed._tools.mem_tracker import _UpdateType, _WeakRefInfo

    for st in get_untyped_storages(t):
        winfo, _ = tracker._WINFO.get(st, (None, None))
        if winfo is not None:
            if winfo.size != st.size():
                old = winfo.mem_consumed
                winfo.update_mem_consumed(st)
                tracker._update_snap(_UpdateType.SIZE, winfo, old_mem_consumed=old)
            continue
        winfo, w_st = _WeakRefInfo.create_winfo(st, t.device, reftype, tracker._delete_callback)
        tracker._WINFO[st] = (winfo, w_st)
        if winfo.mem_consumed > 0:
            tracker._update_snap(_UpdateType.ADD, winfo)


def _sync(model: nn.Module, sync: bool, accumulate: int, reduce_each: bool = False) -> None:
    """The micro-steps before the last: no gradient sync, or with ``reduce_each`` (HSDP)
    reduce-scattered without the all-reduce across the replicas."""
    if accumulate > 1 and reduce_each:
        model.set_requires_all_reduce(sync)  # type: ignore[operator]
    elif accumulate > 1:
        model.set_requires_gradient_sync(sync)  # type: ignore[operator]


def _module_peaks(tracker: Any, modules: dict[str, dict[str, int]]) -> None:
    """Each module's forward and backward peak of the iteration the tracker followed, the
    most with what ``modules`` holds (0 for a backward that did not run: no gradient
    reached the module)."""
    for stats in tracker.memory_tracking.values():
        fqn = stats.mod_fqn.partition(".")[2]  # drop the root class name
        by_state = {state.value: snaps for state, snaps in stats.snapshots.items()}
        slot = modules.setdefault(fqn, {"forward": 0, "backward": 0})
        for phase, name in (("forward", "Forward"), ("backward", "Backward")):
            snaps = by_state.get(f"Peak {name}", [])
            most = max((next(iter(s.values()))["Total"] for s in snaps), default=0)
            slot[phase] = max(slot[phase], most)


def _categories(snapshot: dict[Any, int]) -> dict[str, int]:
    return {str(getattr(k, "value", k)): int(v) for k, v in snapshot.items()}


def _optimizer(model: nn.Module, name: bool | str) -> torch.optim.Optimizer | None:
    """``"adam"`` or ``"adamw"``, ending in ``_foreach``, ``_fused`` or ``_for_loop`` for that
    implementation (else torch's default: on a CPU, for-loop)."""
    if not name:
        return None
    name = str(name)
    kind = {
        "_foreach": {"foreach": True},
        "_fused": {"fused": True},
        "_for_loop": {"foreach": False},
    }
    options = next((v for k, v in kind.items() if name.endswith(k)), {})
    cls = torch.optim.AdamW if name.startswith("adamw") else torch.optim.Adam
    return cls(model.parameters(), lr=1e-3, **options)  # type: ignore[arg-type]


def count_all_gathers() -> _CountAllGathers:
    """A mode counting FSDP's all-gathers in its block (``with count_all_gathers() as c:``)."""
    return _CountAllGathers()


class _CountAllGathers(TorchDispatchMode):  # type: ignore[misc]
    """Counts FSDP's all-gathers (``c10d._allgather_base_``) in the block."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.c10d._allgather_base_.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


# gloo runs a collective on a worker thread, which lets go of the work's tensors only after
# the main thread has seen it done: a storage FSDP (or gloo) frees then may die a moment
# later, while the main thread runs on, and the tracker count it there. Each collective
# below waits until gloo has let go, so every storage dies where the program drops it.
_RELEASE_S = 60.0


def _wait_released(alive: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _RELEASE_S
    while alive():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gloo's worker thread still holds {what} after {_RELEASE_S} s")
        time.sleep(0.0005)


def _uses(t: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


class _SyncAllGather(DefaultAllGather):  # type: ignore[misc]
    """FSDP2's all-gather as it issues it (``async_op=False``: done when it returns), returning
    once gloo has let go of the output."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> Any:
        if async_op:  # an explicit unshard(async_op=True): as FSDP does it
            return super().__call__(output_tensor, input_tensor, group, async_op)
        uses = _uses(output_tensor)
        work = dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=True)
        work.wait()
        del work
        _wait_released(lambda: _uses(output_tensor) > uses, "an all-gather output")
        return None


class _NoCopy(DefaultReduceScatter):  # type: ignore[misc]
    """FSDP2's reduce-scatter, without the copy of its input gloo makes in ``work.wait()``
    (no tracker sees what runs there, nor the copy, made inside the collective)."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        work = dist.reduce_scatter_single(
            output=output_tensor, input=input_tensor, group=group, op=op, async_op=True
        )
        with _disable_current_modes():
            work.wait()
        return None


class _GlooReduceScatter(DefaultReduceScatter):  # type: ignore[misc]
    """FSDP2's reduce-scatter on gloo as it is, noting the bytes of the storages that the
    operators run in ``work.wait()`` return (the tracker sees and counts them: gloo's copy of
    the input), and returning once they are freed."""

    def __init__(self, copies: list[int]) -> None:
        self.copies = copies

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        work = dist.reduce_scatter_single(
            output=output_tensor, input=input_tensor, group=group, op=op, async_op=True
        )
        known = {t.untyped_storage()._cdata for t in (output_tensor, input_tensor)}
        with _NewStorages(known) as new:
            work.wait()
        del work
        self.copies.append(sum(new.seen.values()))
        refs = list(new.refs.values())
        _wait_released(lambda: any(r() is not None for r in refs), "a reduce-scatter's copy")
        return None


class _NewStorages(TorchDispatchMode):  # type: ignore[misc]
    """The storages the operators in the block return, but those in ``known``: their bytes
    (``seen``) and weak references (``refs``)."""

    def __init__(self, known: set[int]) -> None:
        super().__init__()
        self.known = known
        self.seen: dict[int, int] = {}
        self.refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage._cdata not in self.known:
                    self.seen[storage._cdata] = storage.nbytes()
                    self.refs[storage._cdata] = weakref.ref(storage)
        return out


# ---------------------------------------------------------------- gloo ranks
GLOO_WORLD_SIZE = 2


@dataclass(frozen=True)
class GlooCase:
    """One model measured on the gloo ranks (real CPU tensors) and predicted by fsdpviz.

    ``units``: the ``fully_shard`` calls before the root's, as fsdpviz's ``fully_shard=``
    takes them; ``options``: ``fully_shard``'s; ``loss``: from the model's output.
    """

    build: Callable[[], nn.Module]
    inputs: Callable[[], dict[str, Any]]
    units: list[tuple[str, ...]]
    loss: Callable[[Any], torch.Tensor]
    options: dict[str, Any] = field(default_factory=dict)
    optimizer: str | None = None
    gloo_reduce_scatter: bool = False
    accumulate: int = 1  # micro-steps per optimizer step
    step: bool = False  # track optimizer.step() too


def _tokens(vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg)


def _neox() -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=256,
        max_position_embeddings=64,
    )
    return GPTNeoXForCausalLM(cfg)


def _llama8() -> nn.Module:
    """Eight layers of the small Llama: its optimizer step outweighs its activations."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg)


def _few_tokens() -> dict[str, Any]:
    ids = _tokens(256, 1, 4)
    return {"input_ids": ids, "labels": ids}


def _labels_are_ids() -> dict[str, Any]:
    ids = _tokens(256, 2, 16)
    return {"input_ids": ids, "labels": ids}


class ShiftedLM(nn.Module):
    """The example model trained on next tokens: ``tokens`` and ``targets`` are two views of
    one batch (``batch[:, :-1]``, ``batch[:, 1:]``); returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        from fsdpviz.examples import ExampleConfig, ExampleModel

        cfg = ExampleConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4
        )
        self.model = ExampleModel(cfg)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.model(tokens)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class PickedLM(ShiftedLM):
    """:class:`ShiftedLM` trained on three positions, picked with a list index."""

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        picked = self.model(tokens)[:, [3, 7, 11]]
        return nn.functional.cross_entropy(picked.flatten(0, 1), targets[:, :3].flatten())


def _shifted_views() -> dict[str, Any]:
    batch = _tokens(256, 2, 17)
    return {"tokens": batch[:, :-1], "targets": batch[:, 1:]}


def _hf_loss(out: Any) -> torch.Tensor:
    loss: torch.Tensor = out.loss
    return loss


def _itself(out: torch.Tensor) -> torch.Tensor:
    return out


_BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def gloo_cases() -> dict[str, GlooCase]:
    """name -> case; every rank builds the same model from the same seed."""
    llama_units = [("model.layers.0",), ("model.layers.1",), ("lm_head",)]
    llama8_units = [*[(f"model.layers.{i}",) for i in range(8)], ("lm_head",)]
    neox_units = [("gpt_neox.layers.0",), ("gpt_neox.layers.1",), ("lm_head",)]
    shifted_units = [("model.layers.0",), ("model.layers.1",), ("model.lm_head",)]
    return {
        "llama-labels": GlooCase(_llama, _labels_are_ids, llama_units, _hf_loss),
        "shifted-views": GlooCase(ShiftedLM, _shifted_views, shifted_units, _itself),
        "neox-labels": GlooCase(_neox, _labels_are_ids, neox_units, _hf_loss),
        "llama-gloo-reduce-scatter": GlooCase(
            _llama, _labels_are_ids, llama_units, _hf_loss, gloo_reduce_scatter=True
        ),
        "llama-adamw": GlooCase(_llama, _labels_are_ids, llama_units, _hf_loss, optimizer="adamw"),
        "neox-bf16": GlooCase(_neox, _labels_are_ids, neox_units, _hf_loss, {"mp_policy": _BF16}),
        "picked-list-index": GlooCase(PickedLM, _shifted_views, shifted_units, _itself),
        # gradient accumulation: fp32 gradients added into the earlier micro-steps' in place;
        # bf16 gradients kept in the fp32 reduce dtype between micro-steps
        "llama-accumulate": GlooCase(
            _llama, _labels_are_ids, llama_units, _hf_loss, optimizer="adamw", accumulate=3
        ),
        "llama-accumulate-bf16": GlooCase(
            _llama,
            _labels_are_ids,
            llama_units,
            _hf_loss,
            {"mp_policy": _BF16},
            optimizer="adamw",
            accumulate=3,
        ),
        # the optimizer step's temporaries, by implementation (the step is the peak)
        **{
            f"llama8-step-{impl}": GlooCase(
                _llama8,
                _few_tokens,
                llama8_units,
                _hf_loss,
                optimizer=f"adamw_{impl}",
                step=True,
            )
            for impl in ("foreach", "for_loop", "fused")
        },
    }


def _measure(case: GlooCase) -> Tracked:
    modules = [list(names) for names in case.units]

    def blocks(model: nn.Module) -> list[list[nn.Module]]:
        return [[model.get_submodule(n) for n in names] for names in modules]

    return tracked(
        case.build,
        case.inputs,
        blocks,
        GLOO_WORLD_SIZE,
        case.loss,
        optimizer=case.optimizer or False,
        real=True,
        gloo_reduce_scatter=case.gloo_reduce_scatter,
        accumulate=case.accumulate,
        step=case.step,
        **case.options,
    )


def run_rank(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Measure every gloo case on this rank; write ``<case>-rank<rank>.json``."""
    from rank_exit import leave_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        for name, case in gloo_cases().items():
            m = _measure(case)
            data = {k: v for k, v in vars(m).items() if k != "tracker"}
            (Path(out_dir) / f"{name}-rank{rank}.json").write_text(json.dumps(data))
    except BaseException:
        dist.destroy_process_group()
        raise  # torch.multiprocessing.spawn reports it to the parent
    leave_rank()


def spawn_gloo(out: Path) -> Path:
    """Run every gloo case on :data:`GLOO_WORLD_SIZE` gloo ranks; each writes its files to
    ``out``."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    mp.spawn(run_rank, args=(GLOO_WORLD_SIZE, port, str(out)), nprocs=GLOO_WORLD_SIZE, join=True)
    return out


def load_tracked(out: Path, name: str, rank: int) -> Tracked:
    """What rank ``rank`` measured for case ``name``."""
    data = json.loads((out / f"{name}-rank{rank}.json").read_text())
    return Tracked(**data)
