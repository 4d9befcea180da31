"""Whose FSDP a plan follows: a torch release, and what its FSDP does where releases differ.

fsdpviz ports FSDP's runtime. Between torch 2.6 and 2.14 FSDP1's runtime did not change
in what fsdpviz models; FSDP2's did, and :class:`TorchFSDP` says how, one flag per
behaviour, each true from the release that introduced it ([Note: FSDP2 across releases]
below). A plan follows the installed torch (:func:`installed`) unless ``analyze`` is given
``torch_version="2.8"`` (:func:`torch_fsdp`): a laptop with a new torch planning for a
cluster pinned to an older one.

[Note: FSDP2 across releases] (read from ``torch/distributed/fsdp/_fully_shard`` of each
release 2.6.0 ... 2.14.1; checked against real runs on gloo with 2.8.0 and 2.13.0):

- 2.7: ``fully_shard(ignored_params=...)``; the root's final callback runs the
  post-backward of every group not in ``POST_BACKWARD`` (2.6: of every group that is
  still unsharded).
- 2.8: ``reshard_after_forward=None`` is the default: True for every group but the root
  (2.6 and 2.7: True for all, and lazy init keeps the root unsharded after forward even
  when True was passed explicitly).
- 2.9: on one rank a group's unshard copies its shard (no all-gather is issued).
- 2.10: a post-forward inside backward (activation checkpointing's recompute) neither
  reshards nor records its post-forward index.
- 2.11: a pre-forward inside backward unshards a group a post-backward already resharded.
- 2.12: the tensors FSDP2 hooks (the post-backward node on a group's inputs, the
  pre-backward hook on its outputs) are found by ``collect_grad_tensors``, which also
  enters dataclasses; before, by ``tree_flatten``, which enters only pytree nodes.
- 2.13: a grouped ``fully_shard([a, b])`` runs its pre-forward hook for every member and
  its post-forward when all members ran, at most once per pass; the root's post-forward
  completes a group some of whose members did not run (before: the pre-forward ran for
  the first member only, the post-forward when the last member ran, again on every later
  call, and a group with a member that did not run was never completed: FSDP2 warned at
  the end of backward); a recompute casts inputs and outputs as a forward does; FSDP2
  warns when a group returns a view.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from fsdpviz.errors import ConfigError

__all__ = ["NEWEST", "OLDEST", "TorchFSDP", "installed", "torch_fsdp"]

OLDEST = (2, 6)
"""The oldest torch release ``torch_version=`` plans (fsdpviz installs with torch 2.8 and
newer: the FSDP2 of 2.6 and 2.7 does not run on a CPU, so no real run checks it in CI)."""
NEWEST = (2, 14)
"""The newest torch release fsdpviz plans and records."""


@dataclass(frozen=True)
class TorchFSDP:
    """The FSDP of one torch release, as fsdpviz plans it.

    Attributes:
        version: the release, as ``torch.__version__`` writes it without a local build tag
            (``"2.8.0"``), or as ``torch_version=`` gave it (``"2.8"``).
        installed: whether it is the torch this process runs.
        ignored_params: ``fully_shard`` takes ``ignored_params`` (2.7).
        final_callback_by_state: the final callback runs the post-backward of groups not in
            ``POST_BACKWARD`` (2.7); before, of groups still unsharded.
        auto_reshard_after_forward: ``reshard_after_forward=None`` (the default) keeps only
            the root unsharded after forward (2.8); before, the root always stays unsharded.
        one_rank_copies: one rank's unshard copies its shard, with no all-gather (2.9).
        post_forward_in_backward_skips: a post-forward during backward neither reshards nor
            records an index (2.10).
        recompute_unshards: a pre-forward during backward unshards a resharded group (2.11).
        hooks_enter_dataclasses: FSDP2's hooks find tensors inside dataclasses (2.12).
        grouped_per_member: grouped calls run their hooks per member, complete once per
            pass, and the root completes a partly run group (2.13).
        recompute_casts: a recompute casts inputs and outputs by ``mp_policy`` (2.13).
        warns_view_output: FSDP2 warns when a group returns a view (2.13).
    """

    version: str
    installed: bool = False
    ignored_params: bool = True
    final_callback_by_state: bool = True
    auto_reshard_after_forward: bool = True
    one_rank_copies: bool = True
    post_forward_in_backward_skips: bool = True
    recompute_unshards: bool = True
    hooks_enter_dataclasses: bool = True
    grouped_per_member: bool = True
    recompute_casts: bool = True
    warns_view_output: bool = True

    @property
    def release(self) -> tuple[int, int]:
        """``(major, minor)``: ``(2, 8)``."""
        return _release(self.version)

    @property
    def name(self) -> str:
        """How texts name it: ``"torch 2.8.0"``."""
        return f"torch {self.version}"

    @classmethod
    def of(cls, version: str, installed: bool = False) -> TorchFSDP:
        """The FSDP of release ``version`` (``"2.8"``, ``"2.8.0"``, ``"2.8.0+cu128"``)."""
        clean = _clean(version)
        r = _release(clean)
        return cls(
            version=clean,
            installed=installed,
            ignored_params=r >= (2, 7),
            final_callback_by_state=r >= (2, 7),
            auto_reshard_after_forward=r >= (2, 8),
            one_rank_copies=r >= (2, 9),
            post_forward_in_backward_skips=r >= (2, 10),
            recompute_unshards=r >= (2, 11),
            hooks_enter_dataclasses=r >= (2, 12),
            grouped_per_member=r >= (2, 13),
            recompute_casts=r >= (2, 13),
            warns_view_output=r >= (2, 13),
        )

    def replace(self, **changes: Any) -> TorchFSDP:
        return dataclasses.replace(self, **changes)


def _clean(version: str) -> str:
    """``"2.8.0+cu128"`` -> ``"2.8.0"``; ``"2.10.0a0+git1234"`` -> ``"2.10.0a0"``."""
    return str(version).split("+", 1)[0].strip()


def _release(version: str) -> tuple[int, int]:
    match = re.match(r"^(\d+)\.(\d+)", version)
    if match is None:
        raise ConfigError(
            f"torch_version={version!r} is not a torch release; give one like '2.8' or '2.8.0'"
        )
    return int(match.group(1)), int(match.group(2))


def _range() -> str:
    return f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"


@cache
def installed() -> TorchFSDP:
    """The FSDP of the torch this process imported."""
    return TorchFSDP.of(torch.__version__, installed=True)


def torch_fsdp(version: str | None = None) -> TorchFSDP:
    """The FSDP a plan follows: the installed torch's, or release ``version``'s.

    Example::

        torch_fsdp()          # the installed torch: TorchFSDP(version='2.13.0', ...)
        torch_fsdp("2.8")     # torch 2.8's FSDP, whatever torch is installed
    """
    if version is None:
        return installed()
    if not isinstance(version, str):
        raise ConfigError(
            f"torch_version must be a string such as '2.8', got {type(version).__name__}"
        )
    rules = TorchFSDP.of(version)
    if not OLDEST <= rules.release <= NEWEST:
        raise ConfigError(
            f"torch_version={version!r}: fsdpviz plans the FSDP of torch {_range()}; "
            "give a release in that range"
        )
    return rules.replace(installed=rules.release == installed().release)


# ----------------------------------------------------------------- FSDP2's hooked tensors
def grad_tensors(obj: Any, rules: TorchFSDP) -> tuple[torch.Tensor, ...]:
    """The tensors that require grad in ``obj`` (a module's ``(args, kwargs)`` or output),
    found as FSDP2 of ``rules`` finds them for its hooks."""
    if not rules.hooks_enter_dataclasses:
        return tuple(t for t in tree_leaves(obj) if _requires_grad(t))
    found: list[torch.Tensor] = []
    _collect(obj, found, 0)
    return tuple(found)


def replace_grad_tensors(obj: Any, tensors: tuple[torch.Tensor, ...], rules: TorchFSDP) -> Any:
    """``obj`` with the tensors :func:`grad_tensors` found replaced by ``tensors``, in order."""
    if not rules.hooks_enter_dataclasses:
        leaves, spec = tree_flatten(obj)
        it = iter(tensors)
        return tree_unflatten([next(it) if _requires_grad(t) else t for t in leaves], spec)
    return _replace(obj, iter(tensors), 0)


def _requires_grad(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor) and obj.requires_grad


def _is_namedtuple(obj: Any) -> bool:
    fields = getattr(type(obj), "_fields", None)
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and isinstance(fields, tuple)


def _is_dataclass(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


# torch >= 2.12's collect_grad_tensors / replace_grad_tensors (torch.distributed.fsdp.
# _common_utils), here so that a plan for such a release can be made on an older torch:
# namedtuples, dataclasses, dicts, lists and tuples are entered, in that order of checks.
_MAX_DEPTH = 128


def _collect(obj: Any, out: list[torch.Tensor], depth: int) -> None:
    if depth >= _MAX_DEPTH:
        raise RecursionError("a module's inputs or outputs nest too deep (a reference cycle?)")
    if _requires_grad(obj):
        out.append(obj)
    elif _is_namedtuple(obj):
        for item in obj:
            _collect(item, out, depth + 1)
    elif _is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _collect(getattr(obj, f.name), out, depth + 1)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect(v, out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _collect(item, out, depth + 1)


def _replace(obj: Any, it: Any, depth: int) -> Any:
    if depth >= _MAX_DEPTH:
        raise RecursionError("a module's inputs or outputs nest too deep (a reference cycle?)")
    if _requires_grad(obj):
        return next(it)
    if _is_namedtuple(obj):
        items = [_replace(x, it, depth + 1) for x in obj]
        return (
            type(obj)(*items) if any(a is not b for a, b in zip(items, obj, strict=True)) else obj
        )
    if _is_dataclass(obj):
        changes = {}
        for f in dataclasses.fields(obj):
            old = getattr(obj, f.name)
            new = _replace(old, it, depth + 1)
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(obj, **changes) if changes else obj
    if isinstance(obj, dict):
        values = {k: _replace(v, it, depth + 1) for k, v in obj.items()}
        if all(values[k] is v for k, v in obj.items()):
            return obj
        return values if type(obj) is dict else type(obj)(values)
    if isinstance(obj, (list, tuple)):
        items = [_replace(x, it, depth + 1) for x in obj]
        if all(a is b for a, b in zip(items, obj, strict=True)):
            return obj
        try:
            return type(obj)(items)
        except TypeError:
            return list(items) if isinstance(obj, list) else tuple(items)
    return obj
