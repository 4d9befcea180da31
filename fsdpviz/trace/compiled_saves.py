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

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch._functorch._aot_autograd.utils import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

_CACHE: dict[tuple[Any, ...], PartitionSaves | None] = {}


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
    def bytes(self) -> int:
        """Bytes of the intermediates kept (the inputs are not counted: they exist anyway)."""
        total = 0
        for shape, dtype in self.values:
            n = 1
            for d in shape:
                n *= d
            total += n * dtype.itemsize
        return total


def partitioner_saves(
    fn: Callable[..., Any], inputs: Sequence[torch.Tensor]
) -> PartitionSaves | None:
    """What ``torch.compile`` of ``fn(*inputs)`` keeps for backward, or None when torch
    cannot trace it (then the caller keeps eager autograd's accounting). ``inputs`` are
    tensors (meta or real); those with ``requires_grad`` are differentiated."""
    with _disable_current_modes(), torch.autograd.graph.saved_tensors_hooks(_same, _same):
        try:
            return _partition(fn, inputs)
        except Exception as e:  # anything torch cannot trace is costed eager, and said so
            warnings.warn(
                f"torch could not trace the compiled loss on fake tensors ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else 'no message'}); fsdpviz costs its "
                "memory as eager autograd holds it, which may be more than torch.compile keeps",
                stacklevel=2,
            )
            return None


def _as_is(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    return make_boxed_func(gm)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _partition(fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> PartitionSaves | None:
    # lazy: AOTAutograd and inductor take seconds to import; for compiled regions only
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    metas = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in inputs]
    with torch.no_grad(), _without_module_hooks():
        gm = make_fx(fn)(*metas)
    grads = tuple(bool(t.requires_grad) for t in inputs)
    shapes = tuple((tuple(t.shape), tuple(t.stride()), t.dtype) for t in inputs)
    key = (gm.code, shapes, grads)
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
        gm,
        fw_compiler=forward_graph,
        bw_compiler=_as_is,
        partition_fn=min_cut_rematerialization_partition,
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
    outs = next(iter(fw.graph.find_nodes(op="output"))).args[0]
    kept: list[int] = []
    values: list[tuple[tuple[int, ...], torch.dtype]] = []
    for node in outs[n_out:]:
        if node is None:
            continue
        if node.op == "placeholder":  # an input (a lifted constant is held anyway)
            if placeholders.index(node) < len(inputs):
                kept.append(placeholders.index(node))
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            values.append((tuple(int(d) for d in val.shape), val.dtype))
    saves = PartitionSaves(tuple(sorted(set(kept))), tuple(values))
    return _CACHE.setdefault(key, saves)


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


__all__ = ["PartitionSaves", "partitioner_saves"]
