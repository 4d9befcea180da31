"""What torch refuses of tensor parallelism on the traced copy, refused as it fails: a
plain tensor a style makes a DTensor, sharded on a dim the tp ranks do not divide
(:func:`refuse_uneven_local`), or in another layout than the one the tensor is a part of
(:func:`refuse_mislabelled_local`), or narrowed by an uneven all-to-all into a linear
(:func:`refuse_narrowed`); :func:`chunks`, the sizes DTensor chunks a dim into.
"""

from __future__ import annotations

import torch
from torch import nn

from fsdpviz.errors import ConfigError
from fsdpviz.plan.tensor_parallel import Layout, TPModule, layout_name


def chunks(n: int, tp: int) -> list[int]:
    """The sizes ``torch.chunk`` (DTensor's ``Shard._split_tensor``) gives ``tp`` ranks of a
    dim of ``n``: ``ceil(n / tp)`` each, the last ones less or none (33 over 4: 9, 9, 9, 6)."""
    first = -(-n // tp)
    return [min(first, max(0, n - i * first)) for i in range(tp)]


def refuse_uneven_local(
    t: torch.Tensor, layout: Layout, tpm: TPModule, tp_size: int, model: nn.Module, is_dtensor: bool
) -> None:
    """Refuse a plain tensor a style takes to be sharded on a dim the tp ranks do not
    divide, as torch fails on it: the style makes it a DTensor with
    ``DTensor.from_local(..., run_check=False)`` and no shape, which computes the global
    shape as the local one times the tp degree (``compute_global_tensor_info``), so the
    first rank's ``torch.chunk`` part (5 of 18) makes a dim of 20, the last one's (3)
    one of 12. The next operator's sharding propagation fails where the shape meets a
    parameter's (``RuntimeError: a and b must have same reduction dim``, ``Sharding
    propagation failed for aten.mm.default``), and a collective over the dim gets a
    different size from each rank (gloo: ``Received data size doesn't match expected
    size``; NCCL hangs or corrupts)."""
    if layout[0] != "shard" or t.dim() == 0 or tp_size == 1:
        return
    d = (layout[1] or 0) % t.dim()
    n, tp = t.shape[d], tp_size
    if n % tp == 0 or is_dtensor:
        # a tensor operators computed from a DTensor is a DTensor of the global shape,
        # which DTensor pads and chunks right
        return
    parts = chunks(n, tp)
    first = parts[0]
    sizes = " or ".join(str(k) for k in (first * tp, n // tp * tp) if k > 0)
    what = f"dim {d} ({n})"
    fails = (
        "the ranks disagree on the tensor's shape, and a collective over the dim gets "
        "a different size from each (gloo: Received data size doesn't match expected "
        "size; NCCL hangs)"
    )
    if d == t.dim() - 1:  # the dim a linear's weight meets: name the weight
        module = model.get_submodule(tpm.fqn)
        for name, p in module.named_parameters(recurse=False):
            if p.dim() > 1 and p.shape[-1] == n:
                fqn = f"{tpm.fqn}.{name}" if tpm.fqn else name
                what = f"dim {d}, the {n} input features of {fqn} {tuple(p.shape)},"
                fails = (
                    f"the input of {first * tp} features meets {fqn}'s {n} (RuntimeError: "
                    "a and b must have same reduction dim ... Sharding propagation failed)"
                )
                break
    elif d == 1:
        what = f"dim 1, the sequence ({n}),"
    raise ConfigError(
        f"tensor parallelism: {tpm.fqn or 'the root'} ({tpm.style}) takes its input "
        f"sharded on {what} which the {tp} tp ranks do not divide: DTensor chunks it "
        f"{parts}, and the style makes each rank's plain tensor a DTensor with "
        f"DTensor.from_local(), which assumes even shards ({first} x {tp} = "
        f"{first * tp} on the first rank, {parts[-1]} x {tp} on the last), so torch "
        f"fails: {fails}. Make the size a multiple of the tp degree ({sizes}; "
        "a sequence padded to it) or choose a tp degree that divides it"
    )


def refuse_mislabelled_local(tpm: TPModule, plain: tuple[Layout, str], declared: Layout) -> None:
    """Refuse a style that takes the plain tensor another style returned (``to_local()``,
    ``use_local_output=True``), a rank's part of a tensor in ``plain``'s layout, as a part
    in another layout: it makes it a DTensor with ``DTensor.from_local(..., input_layouts)``,
    which takes the local tensor for what the layout says and checks nothing, so the
    DTensor's global shape and values are not the tensor's (a replicated tensor declared
    ``Shard(1)``: a sequence ``tp`` times as long). torch fails where the shapes meet
    (``a and b must have same reduction dim``, ``Attempting to broadcast a dimension``), or
    computes on the wrong values."""
    layout, where = plain
    raise ConfigError(
        f"tensor parallelism: {tpm.fqn or 'the root'} ({tpm.style}) takes a plain tensor as "
        f"{layout_name(declared)}, but it is a rank's part of a {layout_name(layout)} tensor "
        f"(what {where} returns with use_local_output=True): DTensor.from_local takes it for "
        "what input_layouts says, checking nothing, so the DTensor's shape and values are "
        "wrong and torch fails where the shapes meet (RuntimeError: a and b must have same "
        "reduction dim, or Attempting to broadcast a dimension) or computes on wrong values. "
        f"Declare input_layouts=({layout_name(layout)},) or keep the tensor a DTensor "
        "(use_local_output=False on the style that returns it)"
    )


def refuse_narrowed(tpm: TPModule, d: int, n: int, where: str, tp: int) -> None:
    """Refuse linear style ``tpm`` taking, as it is, the DTensor the all-to-all of ``where``
    left narrowed from dim ``d`` of ``n``, which the ``tp`` ranks do not divide, as torch
    fails on it (see ``TPEmulation._check_narrowed``)."""
    padded = chunks(n, tp)[0] * tp
    raise ConfigError(
        f"tensor parallelism: {tpm.fqn} ({tpm.style}) takes the DTensor the all-to-all of "
        f"{where} leaves, whose dim {d} ({n}) the {tp} tp ranks do not divide: DTensor "
        f"pads it to {padded} for the all-to-all and narrows each rank's tensor back "
        "(Shard._unpad_for_new_shard_dim), which leaves it non-contiguous, and the "
        "linear's multiply views it flat, so torch fails (RuntimeError: view size is not "
        "compatible with input tensor's size and stride). Make the size a multiple of "
        f"the tp degree ({padded}; a sequence padded to it), or choose a tp degree that "
        "divides it"
    )
