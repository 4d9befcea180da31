"""How every text names a unit, a module or a parameter (shared by the data types that write
sentences).

Names with wrapper segments. ``CheckpointWrapper`` (``_checkpoint_wrapped_module``),
``torch.compile``'s ``OptimizedModule`` (``_orig_mod``) and FSDP1 (``_fsdp_wrapped_module``)
each put a segment into the FQNs ``named_modules()`` and ``named_parameters()`` print; the
state dict torch's distributed checkpoint saves (``get_model_state_dict``; FSDP1's full
state dict, ``clean_tensor_name``) leaves them out, and so does ``CheckpointWrapper``'s own
``state_dict()`` its segment. A report names them per API as follows, a prediction, a plan
of a model already sharded and a recording alike:

- FSDP2 (``fully_shard`` adds no segment): a unit and each of its parameters (``Unit.params``
  and every table keyed by them: shared, frozen, unused, dtypes, shards, tp placements, the
  keys of ``param_first_use``) are named without wrapper segments, as that state dict keys
  them (:func:`group_names`, :func:`param_names`): ``blocks.0`` and ``blocks.0.ln.weight``
  for the block inside ``blocks.0``'s checkpoint wrapper. Names that would then collide
  keep their segments. The modules (``Report.modules``, ``module_order``) keep the FQNs the
  model's ``named_modules()`` prints, wrapper and wrapped module each its own.
- FSDP1: FSDP's own segment is left out and the others kept, as FSDP1's
  ``named_parameters()`` prints them inside ``summon_full_params`` (and as the model handed
  to ``FullyShardedDataParallel`` names them): a unit wrapping the block inside a
  checkpoint wrapper is ``blocks.0._checkpoint_wrapped_module``, its parameters
  ``blocks.0._checkpoint_wrapped_module.ln.weight``.

``compare`` matches parameters by :func:`unwrapped_fqn` whatever the API, and
:meth:`Report.unit` finds a unit by either spelling of its module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import SupportsIndex, overload

# Wrappers that insert a segment into module and parameter names, as FSDP's own
# clean_tensor_name strips them: FSDP1's, activation checkpointing's and torch.compile's.
WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def unwrapped_fqn(fqn: str) -> str:
    """``fqn`` without wrapper segments (``layers.0._checkpoint_wrapped_module.mlp`` ->
    ``layers.0.mlp``): the name a recording gives a parameter, and compare matches by."""
    return ".".join(s for s in fqn.split(".") if s and s not in WRAPPER_SEGMENTS)


def param_names(fqns: Iterable[str]) -> dict[str, str]:
    """Each parameter FQN -> the name an FSDP2 unit lists it under: without wrapper
    segments, unless another FQN of ``fqns`` would then share it (both keep theirs).

    ``param_names(["a._checkpoint_wrapped_module.w", "b"])`` ->
    ``{"a._checkpoint_wrapped_module.w": "a.w", "b": "b"}``
    """
    given = list(dict.fromkeys(fqns))
    taken = Counter(unwrapped_fqn(f) for f in given)
    return {f: n if taken[(n := unwrapped_fqn(f))] == 1 else f for f in given}


def group_names(calls: Sequence[Sequence[str]]) -> list[str]:
    """The name of each ``fully_shard`` call's unit, given its modules' FQNs in module
    order: those FQNs without wrapper segments, joined (``"embed_tokens, lm_head"``), the
    same for a plan and a recording of a model whose blocks a ``CheckpointWrapper`` holds;
    calls that would then share a name (one on a wrapper and one on the module it holds)
    keep their segments.

    ``group_names([["layers.0._checkpoint_wrapped_module"], ["a", "b"]])`` ->
    ``["layers.0", "a, b"]``
    """
    plain = [", ".join(unwrapped_fqn(f) for f in call) for call in calls]
    taken = Counter(plain)
    return [n if taken[n] == 1 else ", ".join(call) for n, call in zip(plain, calls, strict=True)]


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
