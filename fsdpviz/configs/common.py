"""What a trainer configuration becomes: :func:`fsdpviz.analyze` keyword arguments, and one
line for each setting that does not change the plan or that fsdpviz does not model."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from fsdpviz.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from fsdpviz.api.keywords import AnalyzeKwargs


class ConfigNote(UserWarning):
    """A configuration key that fsdpviz reads but that does not change the plan, or that the
    trainer itself does not apply as written; one warning per key."""


@dataclass(frozen=True)
class TrainerConfig(Mapping[str, Any]):
    """``analyze`` keyword arguments read from a trainer's configuration.

    A mapping, so ``fsdpviz.analyze(model, inputs, **config)`` takes it as it is; ``notes``
    says, one line per key, what fsdpviz read but does not apply (each was also warned
    about as a :class:`ConfigNote`).
    """

    source: str
    kwargs: AnalyzeKwargs
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        kwargs: Mapping[str, object] = self.kwargs
        return kwargs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.kwargs)

    def __len__(self) -> int:
        return len(self.kwargs)

    def __repr__(self) -> str:
        lines = [f"{self.source}:"]
        lines += [f"  {k}={_short(v)}" for k, v in self.kwargs.items()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _short(value: Any) -> str:
    name = getattr(value, "__name__", None)
    if name is not None:
        return str(name)
    if isinstance(value, (set, frozenset, list, tuple)):
        inner = ", ".join(sorted(_short(v) for v in value))
        return "{" + inner + "}" if isinstance(value, (set, frozenset)) else f"[{inner}]"
    return repr(value)


def note(notes: list[str], text: str) -> None:
    """Record ``text`` for the caller and warn about it, once per key."""
    notes.append(text)
    warnings.warn(text, ConfigNote, stacklevel=3)


def check_keys(
    given: Mapping[str, Any], known: set[str], where: str, *, ignored: Mapping[str, str]
) -> list[str]:
    """Unknown keys raise (with a suggestion); keys the plan does not depend on come back as
    notes, one line each, saying why."""
    notes: list[str] = []
    unknown = [k for k in given if k not in known and k not in ignored]
    if unknown:
        lines = []
        for key in unknown:
            tip = did_you_mean(key, sorted(known | set(ignored)))
            lines.append(f"{where}: unknown key {key!r}{tip}")
        raise ConfigError("\n".join(lines))
    for key in given:
        if key in ignored:
            note(notes, f"{where}: {key}={given[key]!r} is not applied: {ignored[key]}")
    return notes


def module_class(model: nn.Module, name: str, where: str) -> type[nn.Module]:
    """The class of the model's modules called ``name`` (as accelerate's
    ``get_module_class_from_name`` finds it)."""
    for m in model.modules():
        if type(m).__name__ == name:
            return type(m)
    names = sorted({type(m).__name__ for m in model.modules()})
    tip = did_you_mean(name, names)
    raise ConfigError(f"{where}: the model has no module of class {name!r}{tip}")
