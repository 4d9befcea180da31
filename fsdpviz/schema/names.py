"""How every text names a unit or a module (shared by the data types that write sentences)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import SupportsIndex, overload

# Wrappers that insert a segment into module and parameter names, as FSDP's own
# clean_tensor_name strips them: FSDP1's, activation checkpointing's and torch.compile's.
WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def unwrapped_fqn(fqn: str) -> str:
    """``fqn`` without wrapper segments (``layers.0._checkpoint_wrapped_module.mlp`` ->
    ``layers.0.mlp``): the name the plan gives it."""
    return ".".join(s for s in fqn.split(".") if s and s not in WRAPPER_SEGMENTS)


def some_names(names: Sequence[str], shown: int) -> str:
    """The first ``shown`` of ``names``, joined, and how many more there are:
    ``some_names(["a", "b", "c"], 2)`` -> ``"a, b and 1 more"``."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def unit_label(fqn: str | None) -> str:
    """A unit or module as every text shows it: quoted, ``(root)`` for the root (FQN ``""``).

    ``unit_label("layers.0")`` -> ``"'layers.0'"``; ``unit_label("")`` -> ``"(root)"``;
    ``None`` (no unit) -> ``"?"``; a pipeline stage's root, ``"(root of stage 3)"``, as it is.
    """
    if fqn is None:
        return "?"
    if fqn.startswith("(root"):  # a pipeline stage's root: "(root of stage 3)"
        return fqn
    return "(root)" if fqn == "" else repr(fqn)


class UnitNames(list[str]):
    """Unit FQNs in an order (``report.forward_order``): a plain list of ``str`` (the root
    is ``""``) that prints the root as ``(root)``, as every text names it, and stays one
    when sliced.

    Example::

        report.forward_order[:3]      # [(root), 'layers.0', 'layers.1']
        report.forward_order[0] == "" # True
    """

    def __repr__(self) -> str:
        return "[" + ", ".join(unit_label(n) for n in self) + "]"

    @overload
    def __getitem__(self, i: SupportsIndex) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> UnitNames: ...
    def __getitem__(self, i: SupportsIndex | slice) -> str | UnitNames:
        if isinstance(i, slice):
            return UnitNames(super().__getitem__(i))
        return super().__getitem__(i)
