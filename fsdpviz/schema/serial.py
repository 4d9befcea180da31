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
from typing import Any, Literal, NamedTuple, Self, TypeVar, cast

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
    scalar: bool  # annotated as a str, int, float or bool (or None): written as it is


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
    scalar = {t.strip() for t in str(f.type).split("|")} <= _SCALARS
    return _Key(f.name, spec.get("omit"), spec.get("beside"), spec.get("write"), spec.get("read"),
                missing, factory, scalar)  # fmt: skip


_SCALARS = {"str", "int", "float", "bool", "None"}


def record_dict(record: object) -> dict[str, Any]:
    """``record``'s fields as a dict, as they are declared (see the module docstring)."""
    cls = type(record)
    writer = _WRITERS.get(cls)
    if writer is None:
        writer = _WRITERS[cls] = _writer(_keys(cls))
    return writer(record)


_Writer = Callable[[object], dict[str, Any]]
_WRITERS: dict[type, _Writer] = {}


def _writer(keys: tuple[_Key, ...]) -> _Writer:
    """A function writing a record of these keys, its source made once per class (as
    :mod:`dataclasses` makes ``__init__``): a row is written as fast as written out by hand
    (the views read rows as mappings, a key at a time)."""
    names: dict[str, Any] = {"plain": plain, "nested": _NESTED}
    literal: list[str] = []  # the keys always written, up to the first that may not be
    lines: list[str] = []
    for i, k in enumerate(keys):
        if k.write is not None:
            names[f"w{i}"] = k.write
            value = f"w{i}(r.{k.name})"
        elif k.scalar:
            value = f"r.{k.name}"
        else:
            value = f"plain(r.{k.name}) if isinstance(r.{k.name}, nested) else r.{k.name}"
        test = [f"r.{k.beside} is not None"] if k.beside is not None else []
        if k.omit is not None:
            test.append(f"r.{k.name} is not None" if k.omit == "none" else f"r.{k.name}")
        if not test and not lines:
            literal.append(f"{k.name!r}: {value}")
        elif test:
            lines += [f"    if {' and '.join(test)}:", f"        d[{k.name!r}] = {value}"]
        else:
            lines.append(f"    d[{k.name!r}] = {value}")
    source = ["def write(r):", f"    d = {{{', '.join(literal)}}}", *lines, "    return d"]
    exec("\n".join(source), names)  # the source names fields alone
    return cast(_Writer, names["write"])


def record_from(cls: type[T], d: Mapping[str, Any], **given: Any) -> T:
    """A ``cls`` back from :func:`record_dict`'s output (or an older file's); ``given``:
    fields worked out by the caller (an older file's key from others)."""
    if not given:
        reader = _READERS.get(cls)
        if reader is None:
            reader = _READERS[cls] = _reader(cls, _keys(cls))
        return cast(T, reader(d))
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


_READERS: dict[type, Callable[[Mapping[str, Any]], Any]] = {}


def _reader(cls: type, keys: tuple[_Key, ...]) -> Callable[[Mapping[str, Any]], Any]:
    """A function reading a ``cls`` back, made once per class as :func:`_writer` is: each
    key read (``read``), else the field's ``missing`` or a new default, else ``KeyError``."""
    names: dict[str, Any] = {"cls": cls}
    args = []
    for i, k in enumerate(keys):
        got = f"d[{k.name!r}]"
        if k.read is not None:
            names[f"r{i}"] = k.read
            got = f"r{i}({got})"
        if k.factory is not None:
            names[f"f{i}"] = k.factory
            got = f"{got} if {k.name!r} in d else f{i}()"
        elif k.missing is not MISSING:
            names[f"m{i}"] = k.missing
            got = f"{got} if {k.name!r} in d else m{i}"
        args.append(f"{k.name}=({got})")
    exec(f"def read(d):\n    return cls({', '.join(args)})", names)  # field names alone
    return cast(Callable[[Mapping[str, Any]], Any], names["read"])


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
