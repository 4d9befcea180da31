"""How every text names a unit or a module (shared by the data types that write sentences)."""

from __future__ import annotations


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
