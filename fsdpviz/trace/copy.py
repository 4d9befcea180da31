"""A private copy of the user's model and inputs to trace, so theirs stays untouched."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from fsdpviz.errors import ConfigError


def model_copy(model: nn.Module, device: str = "meta") -> tuple[nn.Module, dict[int, Any]]:
    """Deep-copy ``model`` with parameters and buffers as meta tensors.

    No parameter storage is allocated for a real model: its tensors are
    replaced in the deepcopy memo by meta tensors of the same shape, dtype and
    ``requires_grad``. With ``device="real"`` the tensors are cloned on their
    own device instead (for models that cannot run on meta). Returns the copy
    and ``{id(original): copy}`` for every module, parameter and buffer.
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    memo: dict[int, Any] = {}
    for p in model.parameters(recurse=True):
        if id(p) not in memo:
            data = p.detach().clone() if device == "real" else torch.empty_like(p, device="meta")
            memo[id(p)] = nn.Parameter(data, requires_grad=p.requires_grad)
    for b in model.buffers(recurse=True):
        if id(b) not in memo:
            memo[id(b)] = (
                b.detach().clone() if device == "real" else torch.empty_like(b, device="meta")
            )
    originals = {id(p): p for p in model.parameters()} | {id(b): b for b in model.buffers()}
    mods = dict(model.named_modules(remove_duplicate=True))
    try:
        dup = copy.deepcopy(model, memo)
    except Exception as e:  # pragma: no cover - depends on user modules
        raise ConfigError(
            f"fsdpviz could not copy the model to trace it ({type(e).__name__}: {e}); "
            "build the model on the meta device (with torch.device('meta'): ...) and pass that"
        ) from e
    mapping: dict[int, Any] = {i: memo[i] for i in originals}
    dup_mods = dict(dup.named_modules(remove_duplicate=True))
    for name, m in mods.items():
        mapping[id(m)] = dup_mods[name]
    return dup, mapping


def inputs_copy(inputs: Any, device: str = "meta") -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Normalise ``inputs`` (dict: kwargs, tuple/list: args, tensor: one arg) onto ``device``."""

    def to_target(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if device == "real":
                return x.detach().clone().requires_grad_(x.requires_grad)
            t = torch.empty_like(x, device="meta")
            return t.requires_grad_(x.requires_grad) if x.is_floating_point() else t
        return x

    if isinstance(inputs, dict):
        return (), tree_map(to_target, dict(inputs))
    if isinstance(inputs, (tuple, list)):
        return tuple(tree_map(to_target, list(inputs))), {}
    if isinstance(inputs, torch.Tensor):
        return (to_target(inputs),), {}
    raise ConfigError(
        f"inputs must be a dict (keyword arguments), a tuple (positional arguments) or one "
        f"tensor, got {type(inputs).__name__}"
    )


def map_objects(objs: Any, mapping: dict[int, Any], what: str) -> Any:
    """Translate the user's modules/parameters (e.g. ``ignored_modules``) to the copy's."""
    if objs is None:
        return None
    out = []
    for o in objs:
        if id(o) not in mapping:
            raise ConfigError(
                f"{what} contains a {type(o).__name__} that is not part of the model; pass "
                "modules/parameters of the model given to analyze"
            )
        out.append(mapping[id(o)])
    return out
