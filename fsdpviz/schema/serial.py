"""Records written as JSON by their fields, and read back: what the ``to_dict`` and
``from_dict`` of the schema's dataclasses (and the cost model's) do, one key per field in the
order the fields are declared. A class whose JSON holds more than its fields (a derived key,
keys by kind) writes that by hand around :func:`record_dict`, or instead of it.

What varies is declared on the field, ``field(metadata=key(...))``, not written per class:

- ``omit="none"`` leaves the key out where the value is None, ``omit="empty"`` where it is
  falsy (``False``, ``0``, ``[]``, ``{}``); ``beside="stage"`` writes it exactly where field
  ``stage`` is written (the fields of one pipeline action, together);
- ``write``: how the value is written (else as :func:`plain` copies it: lists and tuples as
  lists, dicts as dicts, nested ones alike, a nested record as its ``to_dict()``);
- ``read``: how the value is read back (``int`` where older files wrote ``2.0``; else as
  it is), and ``missing``: the value where a file lacks the key (else the field's default;
  a field with neither needs the key);
- ``saved=False``: neither written nor read (what the JSON never held).

Example::

    @dataclass(frozen=True)
    class Wait(Record):
        start: float
        event: int = field(metadata=key(read=int))
        rank: int | None = field(default=None, metadata=key(omit="none"))

    Wait(0.5, 3).to_dict()  # {"start": 0.5, "event": 3}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, fields
from typing import Any, Literal, NamedTuple, Self, TypeVar

T = TypeVar("T")

_METADATA = "fsdpviz.serial"


class _Key(NamedTuple):
    name: str
    omit: Literal["none", "empty"] | None
    beside: str | None
    write: Callable[[Any], Any] | None  # None: plain
    read: Callable[[Any], Any] | None
    missing: Any  # MISSING: the key is needed
    factory: Callable[[], Any] | None  # the field's default_factory, where missing is its


def key(
    *,
    omit: Literal["none", "empty"] | None = None,
    beside: str | None = None,
    write: Callable[[Any], Any] | None = None,
    read: Callable[[Any], Any] | None = None,
    missing: Any = MISSING,
    saved: bool = True,
) -> dict[str, Any]:
    """How one field is written and read (the module docstring says what each does); the
    ``metadata`` of its ``dataclasses.field``."""
    spec = {"omit": omit, "beside": beside, "write": write, "read": read, "missing": missing}
    return {_METADATA: spec if saved else None}


OMIT_NONE = key(omit="none")
"""A key written only where its value is not None."""
OMIT_EMPTY = key(omit="empty")
"""A key written only where its value is truthy (not ``False``, ``0``, ``[]``, ``{}``)."""


def plain(value: Any) -> Any:
    """``value`` as JSON holds it, copied: lists and tuples as lists, dicts as dicts (their
    values alike), a :class:`Record` as its ``to_dict()``; anything else as it is."""
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Record):
        return value.to_dict()
    return value


def each(read: Callable[[Any], T]) -> Callable[[Iterable[Any]], list[T]]:
    """A list read item by item: ``each(int)`` reads ``[1, 2.0]`` as ``[1, 2]``."""
    return lambda items: [read(item) for item in items]


def by_name(read: Callable[[Any], T]) -> Callable[[Mapping[Any, Any]], dict[str, T]]:
    """A dict read value by value, its keys as strings."""
    return lambda items: {str(k): read(v) for k, v in items.items()}


_KEYS: dict[type, tuple[_Key, ...]] = {}


def _keys(cls: type) -> tuple[_Key, ...]:
    """``cls``'s keys, worked out once per class."""
    keys = _KEYS.get(cls)
    if keys is None:
        keys = _KEYS[cls] = tuple(_key(f) for f in fields(cls) if _saved(f))
    return keys


def _saved(f: Field[Any]) -> bool:
    return f.init and f.metadata.get(_METADATA, {}) is not None


def _key(f: Field[Any]) -> _Key:
    spec = f.metadata.get(_METADATA, {})
    missing = spec.get("missing", MISSING)
    factory: Callable[[], Any] | None = None
    if missing is MISSING and callable(f.default_factory):  # MISSING where none
        factory = f.default_factory
    elif missing is MISSING:
        missing = f.default
    return _Key(f.name, spec.get("omit"), spec.get("beside"), spec.get("write"), spec.get("read"),
                missing, factory)  # fmt: skip


def record_dict(record: object) -> dict[str, Any]:
    """``record``'s fields as a dict, as they are declared (see the module docstring)."""
    d: dict[str, Any] = {}
    for name, omit, beside, write, _, _, _ in _keys(type(record)):
        if beside is not None and getattr(record, beside) is None:
            continue
        value = getattr(record, name)
        if omit is not None and (value is None if omit == "none" else not value):
            continue
        if write is not None:
            value = write(value)
        elif isinstance(value, _NESTED):
            value = plain(value)
        d[name] = value
    return d


def record_from(cls: type[T], d: Mapping[str, Any], **given: Any) -> T:
    """A ``cls`` back from :func:`record_dict`'s output (or an older file's); ``given``:
    fields worked out by the caller (an older file's key from others)."""
    values = dict(given)
    for k in _keys(cls):
        if k.name in values:
            continue
        if k.name in d:
            value = d[k.name]
            values[k.name] = value if k.read is None else k.read(value)
        elif k.factory is not None:
            values[k.name] = k.factory()
        elif k.missing is not MISSING:
            values[k.name] = k.missing
        else:
            raise KeyError(k.name)
    return cls(**values)


class Record:
    """``to_dict`` and ``from_dict`` by the fields of a dataclass (see the module
    docstring)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        return record_from(cls, d)


_NESTED = (list, tuple, dict, Record)  # what plain copies
