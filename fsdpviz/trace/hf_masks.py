"""Hugging Face transformers' attention-mask decisions, answered on the meta device.

Before it builds a mask, ``transformers.masking_utils`` reads values: whether the position
ids pack several sequences in one row (``find_packed_sequence_indices``, called in training,
without a cache: the ``use_cache=False`` of every training loop), and whether a 2D
``attention_mask`` pads any token. Meta tensors hold no values, so a meta trace stopped
there (``Tensor.item() cannot be called on meta tensors``). While fsdpviz traces on meta,
:func:`answered_mask_checks` gives transformers the answer a device would compute, from
what fsdpviz knows of the values, so the same mask (or none) is built and nothing measured
changes:

- position ids the model numbers itself (none given): one sequence per row, as the
  ``arange`` they come from says, so no packed-sequence mask;
- position ids given: from their smallest and largest value (fsdpviz keeps both of an
  integer input) when those decide it (rows that cannot count through their length pack
  sequences); otherwise the trace stops and says what to pass;
- an ``attention_mask`` with no zero (every token attended, the smallest and largest value
  say so) masks as no mask does: transformers skips it, as it does on a device; so does a
  mask of ones the model builds itself where none is given (BART's decoder:
  ``torch.ones(batch, length)``), which fsdpviz sees made.

The patch is undone when the step ends, however it ends, and only applies where
transformers is already imported.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from fsdpviz.trace.copy import index_range


class MaskValuesUnknown(RuntimeError):
    """transformers asked for values of a meta tensor that fsdpviz cannot answer."""


def _argument(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """The model's argument ``name`` as given (by keyword, or by position)."""
    if name in kwargs:
        return kwargs[name]
    try:
        names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return None
    position = names.index(name) if name in names else len(args)
    return args[position] if position < len(args) else None


def _comes_from(t: Any, given: Any) -> bool:
    """``t`` is ``given`` or a view of it (transformers expands position ids per row)."""
    while isinstance(t, torch.Tensor):
        if t is given:
            return True
        t = t._base
    return False


def _packed(
    original: Callable[[torch.Tensor], Any], given: Any
) -> Callable[[torch.Tensor], torch.Tensor | None]:
    def find_packed_sequence_indices(position_ids: torch.Tensor) -> torch.Tensor | None:
        if position_ids.device.type != "meta":
            return original(position_ids)  # type: ignore[no-any-return]
        if given is None:
            return None  # numbered by the model: an arange per row, one sequence each
        length = position_ids.shape[-1]
        if length <= 1:
            return None  # one token per row is one sequence
        known = index_range(given) if _comes_from(position_ids, given) else None
        if known is not None and known[2] - known[1] < length - 1:
            # no row counts through its length: every row packs sequences
            first = position_ids[:, :1] - 1
            diff = torch.diff(position_ids, prepend=first, dim=-1)
            return (diff != 1).cumsum(-1)
        told = (
            f"their smallest and largest value ({known[1]} and {known[2]}) over rows of "
            f"{length} do not tell"
            if known is not None
            else "fsdpviz does not know their values"
        )
        raise MaskValuesUnknown(
            "transformers reads the values of position_ids to tell whether a row packs several "
            f"sequences, and {told}"
        )

    return find_packed_sequence_indices


def _without_padding(mask: Any) -> bool:
    """The user's 2D attention mask attends every token (no zero in it)."""
    known = index_range(mask)
    if known is None:
        return False
    _, lo, hi = known
    return lo > 0 or hi < 0


def _ones(original: Callable[..., torch.Tensor], made: set[int]) -> Callable[..., torch.Tensor]:
    """``torch.ones`` that notes the meta tensors it makes (``id`` in ``made``, while alive):
    masks of ones a model builds where none is given."""

    def ones(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = original(*args, **kwargs)
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            key = id(t)
            made.add(key)
            weakref.finalize(t, made.discard, key)
        return t

    return ones


def _preprocess(
    original: Callable[..., Any], given_mask: Any, ones: set[int] | None = None
) -> Callable[..., Any]:
    signature = inspect.signature(original)
    cache_name = "cache" if "cache" in signature.parameters else "past_key_values"

    def preprocess(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        given = bound.arguments
        mask, embeds = given.get("attention_mask"), given.get("inputs_embeds")
        if (
            mask is not None
            and ((mask is given_mask and _without_padding(mask)) or id(mask) in (ones or ()))
            and mask.device.type == "meta"
            and mask.dim() == 2
            and given.get(cache_name) is None
            and isinstance(embeds, torch.Tensor)
            and mask.shape[-1] == embeds.shape[1]
        ):
            # No token is padding: the mask transformers would build masks nothing, so it
            # builds none (and, given a mask, it does not look for packed sequences).
            given["attention_mask"] = None
            if "position_ids" in given:
                given["position_ids"] = None
            return original(*bound.args, **bound.kwargs)
        return original(*args, **kwargs)

    return preprocess


@contextmanager
def answered_mask_checks(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[None]:
    """Within the block, transformers' mask code answers its value checks on meta tensors
    (see the module docstring); ``args`` and ``kwargs`` are the step's (meta) inputs."""
    masking = sys.modules.get("transformers.masking_utils")
    names = ("find_packed_sequence_indices", "_preprocess_mask_arguments")
    if masking is None or not all(callable(getattr(masking, n, None)) for n in names):
        yield
        return
    originals = {n: getattr(masking, n) for n in names}
    made: set[int] = set()
    masking.find_packed_sequence_indices = _packed(  # type: ignore[attr-defined]
        originals["find_packed_sequence_indices"], _argument(model, args, kwargs, "position_ids")
    )
    masking._preprocess_mask_arguments = _preprocess(  # type: ignore[attr-defined]
        originals["_preprocess_mask_arguments"],
        _argument(model, args, kwargs, "attention_mask"),
        made,
    )
    torch_ones = torch.ones
    torch.ones = _ones(torch_ones, made)
    try:
        yield
    finally:
        torch.ones = torch_ones
        for name, fn in originals.items():
            setattr(masking, name, fn)
