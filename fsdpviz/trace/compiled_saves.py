"""What a compiled region holds between forward and backward, by torch's own partitioner.

``torch.compile`` runs a region's forward and backward as two graphs that AOTAutograd cuts
from one joint graph with ``min_cut_rematerialization_partition``: the forward graph's
extra outputs are all the backward keeps of it. Tensors eager autograd would save that the
partitioner recomputes in backward are not held, and intermediates inside a fused kernel
are never written out. :func:`partitioner_saves` runs that partition on fake tensors (no
memory, no kernels, no C++ compiler): the region's forward is captured by
``torch.fx.experimental.proxy_tensor.make_fx`` on meta copies of its inputs, then traced
again by ``torch._functorch.aot_autograd.aot_function`` with Inductor's decompositions
(``torch._inductor.decomposition.select_decomp_table``) on fake CPU tensors of the same
shapes (the meta device's autograd cannot trace every loss's backward), and the saved
values are read off the forward graph's outputs. Results are remembered per graph and
shapes: a step's micro-batches run the same region on the same shapes.

Example::

    saves = partitioner_saves(loss_fn, [logits])
    saves.bytes            # what the compiled loss holds for backward, its inputs excluded
    saves.inputs           # which of the inputs it keeps (by index)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch
import torch.fx.traceback as fx_traceback
from torch._functorch._aot_autograd.utils import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

_CACHE: dict[tuple[Any, ...], PartitionSaves | None] = {}
_PARTITIONING = [0]  # partitioner_saves' depth
_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True)
class PartitionSaves:
    """What the partitioner's forward graph saves for backward.

    Attributes:
        inputs: indices of the region's tensor inputs it keeps.
        values: each intermediate it keeps, as ``(shape, dtype)``.
    """

    inputs: tuple[int, ...]
    values: tuple[tuple[tuple[int, ...], torch.dtype], ...]

    @property
    def sized(self) -> list[tuple[int, torch.dtype]]:
        """Each intermediate kept as ``(bytes, dtype)``."""
        return [(math.prod(shape) * dtype.itemsize, dtype) for shape, dtype in self.values]

    @property
    def bytes(self) -> int:
        """Bytes of the intermediates kept (the inputs are not counted: they exist anyway)."""
        return sum(n for n, _ in self.sized)


def partitioner_saves(
    fn: Callable[..., Any],
    inputs: Sequence[torch.Tensor],
    *,
    checkpointed: bool = False,
    what: str = "the compiled loss",
) -> PartitionSaves | None:
    """What ``torch.compile`` of ``fn(*inputs)`` keeps for backward, or None when torch
    cannot trace it (then the caller keeps eager autograd's accounting, and a warning names
    ``what``). ``inputs`` are tensors (meta or real); those with ``requires_grad`` are
    differentiated. ``checkpointed``: ``fn`` runs under activation checkpointing (a
    selective policy or none); its forward is captured with autograd on, so that the
    checkpoint tags each operator with its policy as it does under ``torch.compile``, and
    the partitioner recomputes what the tags say (see :func:`_capture`)."""
    _PARTITIONING[0] += 1
    with _disable_current_modes(), torch.autograd.graph.saved_tensors_hooks(_same, _same):
        try:
            return _partition(fn, inputs, checkpointed)
        except Exception as e:  # anything torch cannot trace is costed eager, and said so
            warnings.warn(
                f"torch could not trace {what} on fake tensors ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else 'no message'}); fsdpviz costs its "
                "memory as eager autograd holds it, which may be more than torch.compile keeps",
                stacklevel=2,
            )
            return None
        finally:
            _PARTITIONING[0] -= 1


def partitioning() -> bool:
    """Whether :func:`partitioner_saves` is tracing a region now: what its operators do is
    the graph's capture on fake tensors, not the step's (context parallelism's ring, run
    again there, issues no collective of the step)."""
    return _PARTITIONING[0] > 0


def _as_is(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    return make_boxed_func(gm)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _partition(
    fn: Callable[..., Any], inputs: Sequence[torch.Tensor], checkpointed: bool
) -> PartitionSaves | None:
    # lazy: AOTAutograd and inductor take seconds to import; for compiled regions only
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    metas = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in inputs]
    grads = tuple(bool(t.requires_grad) for t in inputs)
    gm = _capture(fn, metas, grads, checkpointed)
    shapes = tuple((tuple(t.shape), tuple(t.stride()), t.dtype) for t in inputs)
    tags = tuple(str(n.meta.get("recompute")) for n in gm.graph.nodes)
    key = (gm.code, shapes, grads, tags)
    if key in _CACHE:
        return _CACHE[key]
    if not any(grads):
        return _CACHE.setdefault(key, None)
    n_out = len(tree_leaves(next(iter(gm.graph.find_nodes(op="output"))).args[0]))
    for node in gm.graph.nodes:  # ops that make tensors on meta make them on the CPU
        if node.kwargs.get("device") == torch.device("meta"):
            node.kwargs = {**node.kwargs, "device": torch.device("cpu")}
    constants = _lift_constants(gm)
    captured: list[torch.fx.GraphModule] = []

    def forward_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        captured.append(gm)
        return make_boxed_func(gm)

    compiled = aot_function(
        _run_tagged(gm) if checkpointed else gm,
        fw_compiler=forward_graph,
        bw_compiler=_as_is,
        partition_fn=(
            _as_one_region(min_cut_rematerialization_partition)
            if checkpointed
            else min_cut_rematerialization_partition
        ),
        decompositions=select_decomp_table(),
    )
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [
            torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).requires_grad_(g)
            for t, g in zip(inputs, grads, strict=True)
        ]
        fakes += [torch.empty_strided(c.shape, c.stride(), dtype=c.dtype) for c in constants]
        compiled(*fakes)
    if not captured:
        return _CACHE.setdefault(key, None)
    fw = captured[-1]
    placeholders = list(fw.graph.find_nodes(op="placeholder"))
    # a view of an input (a weight's transpose) keeps the input, not a tensor of its own
    storages = {
        v.untyped_storage()._cdata: i
        for i, p in enumerate(placeholders)
        if isinstance(v := p.meta.get("val"), torch.Tensor)
    }
    outs = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    kept: list[int] = []
    values: list[tuple[tuple[int, ...], torch.dtype]] = []
    for node in outs[n_out:]:
        if node is None:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        held = storages.get(val.untyped_storage()._cdata)
        if held is not None:  # an input (a lifted constant is held anyway)
            if held < len(inputs):
                kept.append(held)
            continue
        values.append((tuple(int(d) for d in val.shape), val.dtype))
    saves = PartitionSaves(tuple(sorted(set(kept))), tuple(values))
    return _CACHE.setdefault(key, saves)


def _capture(
    fn: Callable[..., Any],
    metas: list[torch.Tensor],
    grads: tuple[bool, ...],
    checkpointed: bool,
) -> torch.fx.GraphModule:
    """``fn``'s forward as an aten graph. A checkpointed region is captured with autograd on:
    under a tracer ``torch.utils.checkpoint``'s selective mode writes each operator's policy
    into its node (``meta["recompute"]``, ``meta["ac_graph_id"]``), as it does when Dynamo
    traces the region for ``torch.compile``; the partitioner reads them there."""
    if not checkpointed:
        with torch.no_grad(), _without_module_hooks():
            return make_fx(fn)(*metas)
    for t, g in zip(metas, grads, strict=True):
        t.requires_grad_(g)
    # (the checkpoint writes its tags into fx's current node metadata too: put it back after)
    keep = fx_traceback.has_preserved_node_meta()
    with fx_traceback.preserve_node_meta(keep), torch.enable_grad(), _without_module_hooks():
        return make_fx(fn)(*metas)


def _as_one_region(
    partition: Callable[Concatenate[torch.fx.GraphModule, _P], _R],
) -> Callable[Concatenate[torch.fx.GraphModule, _P], _R]:
    """``partition`` of a joint graph traced from one checkpointed region: its tagged nodes
    numbered as that region (Dynamo numbers each checkpoint call it traces; the capture
    outside Dynamo leaves the number unset)."""

    def run(joint: torch.fx.GraphModule, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        for node in joint.graph.nodes:
            if "ac_graph_id" in node.meta and node.meta["ac_graph_id"] is None:
                node.meta["ac_graph_id"] = 1
        return partition(joint, *args, **kwargs)

    return run


def _run_tagged(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """Run ``gm`` node by node with each node's ``recompute`` tag current, so that the
    operators AOTAutograd traces from it (decomposed, and their backward) carry the tags,
    as ``tag_activation_checkpoint`` runs a checkpointed region under ``torch.compile``."""

    def run(*args: Any) -> Any:
        with fx_traceback.preserve_node_meta():
            return torch.fx.Interpreter(gm).run(*args)

    return run


@contextmanager
def _without_module_hooks() -> Iterator[None]:
    """Modules called by the region run their ``forward`` alone: capturing its graph must not
    fire the hooks of the traced copy (the tracker's, FSDP's emulated ones)."""
    call = torch.nn.Module._call_impl  # (what Module.__call__ runs, under fx's tracer too)

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    torch.nn.Module._call_impl = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module._call_impl = call  # type: ignore[method-assign]


def _lift_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The tensors ``make_fx`` kept as constants (a loss's labels) made inputs, in order."""
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    constants: list[torch.Tensor] = []
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        with gm.graph.inserting_before(first):
            lifted = gm.graph.placeholder(f"constant_{len(constants)}")
        node.replace_all_uses_with(lifted)
        gm.graph.erase_node(node)
        constants.append(value)
    gm.recompile()
    return constants


__all__ = ["PartitionSaves", "partitioner_saves", "partitioning"]
