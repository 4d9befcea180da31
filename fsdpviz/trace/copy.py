"""A private copy of the user's model and inputs to trace, so theirs stays untouched."""

from __future__ import annotations

import copy
import functools
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp.wrap import CustomPolicy
from torch.utils._pytree import tree_leaves, tree_map

from fsdpviz.errors import ConfigError


def check_model(model: Any, what: str = "analyze") -> None:
    """Raise a :class:`ConfigError` saying what was passed where a model was expected."""
    if isinstance(model, nn.Module):
        return
    if model is None:
        got = "None (did the function that builds the model return it?)"
    elif isinstance(model, type) and issubclass(model, nn.Module):
        got = f"the class {model.__name__}; pass an instance, e.g. {model.__name__}(config)"
    elif callable(model) and not isinstance(model, type):
        name = getattr(model, "__name__", type(model).__name__)
        got = f"the callable {name!r}; call it and pass the model it returns"
    elif isinstance(model, dict):
        got = (
            "a dict (a state_dict?): the wrap units follow the module tree, so build the "
            "model itself (on the meta device it costs no memory) and pass it"
        )
    elif isinstance(model, str):
        got = f"the string {model!r}; build the model first and pass the module"
    else:
        got = f"a {type(model).__name__}"
    raise ConfigError(
        f"{what} expects the model, a torch.nn.Module, as its first argument; got {got}"
    )


def model_copy(model: nn.Module, device: str = "meta") -> tuple[nn.Module, dict[int, Any]]:
    """Deep-copy ``model`` with parameters and buffers as meta tensors.

    No parameter storage is allocated for a real model: its tensors are
    replaced in the deepcopy memo by meta tensors of the same shape, dtype and
    ``requires_grad``. With ``device="real"`` the tensors are cloned on their
    own device instead (for models that cannot run on meta). Returns the copy
    and ``{id(original): copy}`` for every module, parameter and buffer.
    """
    check_model(model)
    memo: dict[int, Any] = {}
    for p in model.parameters(recurse=True):
        if id(p) not in memo:
            data = p.detach().clone() if device == "real" else _meta_like(p)
            memo[id(p)] = nn.Parameter(data, requires_grad=p.requires_grad)
    for b in model.buffers(recurse=True):
        if id(b) not in memo:
            memo[id(b)] = b.detach().clone() if device == "real" else _meta_like(b)
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


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like(t, device="meta")``; for a contiguous plain tensor by ``torch.empty``,
    torch's C++ kernel, where ``empty_like`` to meta runs its Python reference (tens of
    microseconds a parameter)."""
    if type(t) in (torch.Tensor, nn.Parameter) and t.layout == torch.strided and t.is_contiguous():
        return torch.empty(t.shape, dtype=t.dtype, device="meta")
    return torch.empty_like(t, device="meta")


def _torchs(fn: Any) -> bool:
    """Whether ``fn`` is one of torch's own functions or policy objects (no user code)."""
    return str(getattr(fn, "__module__", "") or type(fn).__module__).startswith("torch.")


def original_modules(model: nn.Module, mapping: dict[int, Any]) -> dict[int, nn.Module]:
    """``id(copy's module) -> the user's module``, from :func:`model_copy`'s ``mapping``."""
    return {id(mapping[id(m)]): m for m in model.modules() if id(m) in mapping}


def original_params(model: nn.Module, mapping: dict[int, Any]) -> dict[int, nn.Parameter]:
    """``id(copy's parameter) -> the user's parameter``, from :func:`model_copy`'s
    ``mapping`` (what ``shard_placement_fn`` is called with, as ``fully_shard`` calls it)."""
    return {id(mapping[id(p)]): p for p in model.parameters() if id(p) in mapping}


def asked_of_originals(value: Any, originals: Mapping[int, nn.Module]) -> Any:
    """``value`` (a wrap policy, a checkpointing predicate, ``fully_shard=``'s callable), asked
    of the user's modules where fsdpviz evaluates it on its copy: ``originals`` maps
    ``id(copy's module)`` to the user's. A predicate that tests identity
    (``CustomPolicy(lambda m: m is model.lm_head)``, as torch's docs write it, or ``m in
    blocks``) then picks the modules it picks in the user's job. Classes, torch's own
    policies and their arguments are kept as they are.

    Example::

        policy = asked_of_originals(CustomPolicy(lambda m: m is model.head), originals)
    """
    if value is None or isinstance(value, type):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(asked_of_originals(v, originals) for v in value)
    if isinstance(value, CustomPolicy):
        return CustomPolicy(asked_of_originals(value._lambda_fn, originals))
    if isinstance(value, functools.partial) and _torchs(value.func):
        keywords = dict(value.keywords)
        if "lambda_fn" in keywords:  # lambda_auto_wrap_policy
            keywords["lambda_fn"] = asked_of_originals(keywords["lambda_fn"], originals)
        if "policies" in keywords:  # _or_policy
            keywords["policies"] = asked_of_originals(keywords["policies"], originals)
        return functools.partial(value.func, *value.args, **keywords)
    if not callable(value) or _torchs(value):
        return value  # a policy object (ModuleWrapPolicy) or one of torch's functions

    def original(x: Any) -> Any:
        return originals.get(id(x), x) if isinstance(x, nn.Module) else x

    @functools.wraps(value)
    def asked(*args: Any, **kwargs: Any) -> Any:
        return value(*map(original, args), **{k: original(v) for k, v in kwargs.items()})

    return asked


# id of the meta copy of an integer input tensor -> (the copy, weakly; input name, smallest
# and largest value of the user's tensor), so an embedding can tell ids past its vocabulary
# (meta tensors hold no values). Keyed by id: tensors compare elementwise.
_INDEX_RANGES: dict[int, tuple[weakref.ref[torch.Tensor], tuple[str, int, int]]] = {}


def index_range(t: Any) -> tuple[str, int, int] | None:
    """For the meta copy of an integer input tensor: its name, smallest and largest value."""
    entry = _INDEX_RANGES.get(id(t))
    return entry[1] if entry is not None and entry[0]() is t else None


def _remember_range(copy: torch.Tensor, info: tuple[str, int, int]) -> None:
    key = id(copy)
    _INDEX_RANGES[key] = (weakref.ref(copy, lambda _: _INDEX_RANGES.pop(key, None)), info)


def inputs_copy(inputs: Any, device: str = "meta") -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Normalise ``inputs`` (dict: kwargs, tuple/list: args, tensor: one arg) onto ``device``.

    Inputs that share memory share it in the copy too: a tensor passed under two names
    (``{"input_ids": ids, "labels": ids}``) is one copy, and views of one tensor are views
    of one copied storage, the span of it they use (``batch[:, :-1]`` and ``batch[:, 1:]``:
    the batch), so the trace counts those bytes once. Example::

        args, kwargs = inputs_copy({"input_ids": ids, "labels": ids})
        kwargs["input_ids"] is kwargs["labels"]      # True
    """
    spans = _spans(inputs)
    tensors: dict[int, torch.Tensor] = {}  # id(user's tensor) -> its copy
    storages: dict[int, torch.UntypedStorage] = {}  # the user's storage -> its copy

    def to_target(x: Any, name: str) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        done = tensors.get(id(x))
        if done is not None:
            return done
        key = _storage_key(x)
        if key is None:  # not a plain strided tensor: a copy of its own
            t = x.detach().clone() if device == "real" else torch.empty_like(x, device="meta")
        else:
            t = _aliased_copy(x, device, storages, key, spans[key])
        if x.is_floating_point() or x.is_complex():
            t.requires_grad_(x.requires_grad)
        elif device != "real" and x.device.type != "meta" and x.numel() and x.dtype != torch.bool:
            _remember_range(t, (name, int(x.min()), int(x.max())))
        tensors[id(x)] = t
        return t

    def named(obj: Any, name: str) -> Any:
        """``tree_map(to_target, obj)`` that knows each leaf's name (``labels``, ``inputs[0]``)."""
        if type(obj) is dict:
            return {k: named(v, f"{name}[{k!r}]" if name else str(k)) for k, v in obj.items()}
        if type(obj) in (list, tuple):
            return type(obj)(named(v, f"{name}[{i}]") for i, v in enumerate(obj))
        return tree_map(lambda x: to_target(x, name), obj)

    if isinstance(inputs, dict):
        return (), named(dict(inputs), "")
    if isinstance(inputs, (tuple, list)):
        return tuple(named(list(inputs), "inputs")), {}
    if isinstance(inputs, torch.Tensor):
        return (to_target(inputs, "inputs"),), {}
    raise ConfigError(
        f"inputs must be a dict (keyword arguments), a tuple (positional arguments) or one "
        f"tensor, got {type(inputs).__name__}"
    )


def _storage_key(x: torch.Tensor) -> int | None:
    """The storage of a plain strided tensor, else None (a subclass, sparse, quantized,
    conjugated: copied alone)."""
    plain = type(x) in (torch.Tensor, nn.Parameter) and x.layout == torch.strided
    if not plain or x.is_quantized or x.is_conj() or x.is_neg():
        return None
    try:
        return int(x.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return None


def _spans(inputs: Any) -> dict[int, tuple[int, int]]:
    """Per storage, the bytes ``[start, end)`` that the input tensors on it use.

    A slice of a large tensor (a batch cut from a dataset) copies the slice, not all of it.
    """
    on: dict[int, list[torch.Tensor]] = {}
    for x in tree_leaves(inputs):
        if isinstance(x, torch.Tensor) and (key := _storage_key(x)) is not None:
            on.setdefault(key, []).append(x)
    spans: dict[int, tuple[int, int]] = {}
    for key, xs in on.items():
        used = [(_offset(x), _extent(x) * x.element_size()) for x in xs if x.numel()]
        start = min((a for a, _ in used), default=0)
        end = max((a + n for a, n in used), default=0)
        if any((_offset(x) - start) % x.element_size() for x in xs):
            start = 0  # tensors of different dtypes on one storage, out of step: from its start
        spans[key] = (start, end)
    return spans


def _offset(x: torch.Tensor) -> int:
    """Where ``x`` starts in its storage, in bytes."""
    return int(x.storage_offset()) * x.element_size()


def _extent(x: torch.Tensor) -> int:
    """Elements of storage that ``x`` reaches from its offset."""
    return 1 + sum((int(n) - 1) * int(s) for n, s in zip(x.size(), x.stride(), strict=True))


def _aliased_copy(
    x: torch.Tensor,
    device: str,
    storages: dict[int, torch.UntypedStorage],
    key: int,
    span: tuple[int, int],
) -> torch.Tensor:
    """``x`` over the copy of the span its storage's inputs use, made once per storage (on
    meta, or a clone of those bytes on their own device)."""
    start, end = span
    target = storages.get(key)
    if target is None:
        if device == "real":
            raw = torch.empty(0, dtype=torch.uint8, device=x.device)
            raw.set_(x.untyped_storage(), start, (end - start,), (1,))
            target = raw.clone().untyped_storage()
        else:
            target = torch.UntypedStorage(end - start, device="meta")  # type: ignore[no-untyped-call]
        storages[key] = target
    size = x.element_size()
    offset = min(max(int(x.storage_offset()) - start // size, 0), (end - start) // size)
    t = torch.empty(0, dtype=x.dtype, device=target.device)
    return t.set_(target, offset, x.size(), x.stride())


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
