"""Reading torch's flight recorder dumps: one file per rank, pickle or JSON, as torch writes them.

With ``TORCH_FR_BUFFER_SIZE=N`` (``TORCH_NCCL_TRACE_BUFFER_SIZE`` before torch 2.6) every
rank keeps its last ``N`` collectives in a ring buffer. NCCL writes it on a timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT=1``) to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (default
``/tmp/nccl_trace_rank_<rank>``); on any backend ``torch._C._distributed_c10d._dump_fr_trace()``
returns the same pickle and ``_dump_fr_trace_json()`` a JSON form without stacks. A dump is
``{"version", "pg_config", "pg_status", "entries"}``; each entry (torch's
``FlightRecorder::getCollectiveTrace``) holds ``record_id`` (the rank's running count of
recorded operations), ``process_group`` ``(name, desc)``, ``collective_seq_id`` (the
collective's number in its process group, from 1), ``profiling_name`` (``"nccl:all_reduce"``),
``input_sizes``/``output_sizes``/``*_dtypes``, ``state`` (``scheduled`` | ``started`` |
``completed``; gloo leaves every entry ``scheduled``), ``time_created_ns`` (wall clock),
``time_discovered_{started,completed}_ns``, ``duration_ms`` (NCCL with timing enabled),
``timeout_ms``, ``is_p2p``, ``retired`` and ``frames`` (the Python stack, innermost first).

The file name carries the rank (``prefix<rank>``, as torch's ``fr_trace`` reads it). gloo's
dumps in torch 2.13 name the default group ``""`` in ``pg_config`` and may list no ranks for
it, so the members of a group are also read from the entries: a rank that has entries on a
group is one of its members.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fsdpviz.schema.events import Hook
from fsdpviz.schema.memory import size_text

__all__ = [
    "Collective", "DumpError", "Frame", "GroupInfo", "RankDump", "Role", "infer_groups",
    "read_dump", "read_dumps",
]  # fmt: skip

Role = Literal["shard", "replicate", "tp"]
"""What a process group is to FSDP: its own (shard) group, hybrid sharding's replicate
group, or the tensor-parallel group."""

_SUFFIXES = (".json", ".pkl", ".pickle", ".bin", ".dump")
_RANK = re.compile(r"^(.*?)(\d+)$")

# profiling name -> what the collective is, in fsdpviz's words
_KINDS = {
    "all_gather": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather_base": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_v": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "ALLGATHER_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_v": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "REDUCE_SCATTER_coalesced": "reduce_scatter",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
}
# the torch.distributed function innermost in the stack, when the backend records another op
# (gloo runs reduce_scatter_tensor as an all-reduce of the whole input)
_API_KINDS = {
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "_all_gather_base": "all_gather",
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
}
_DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
}  # fmt: skip

# FSDP's functions in a collective's stack -> the hook that issued it (FSDP1: _runtime_utils,
# FSDP2: _fsdp_state / _fsdp_param_group); the innermost one found names the hook
_HOOKS: dict[str, Hook] = {
    "_pre_forward_unshard": "pre_forward",
    "_pre_forward": "pre_forward",
    "pre_forward": "pre_forward",
    "_post_forward": "post_forward",
    "post_forward": "post_forward",
    "_pre_backward_hook": "pre_backward",
    "_pre_backward": "pre_backward",
    "pre_backward": "pre_backward",
    "_post_backward_hook": "post_backward",
    "post_backward": "post_backward",
    "_post_backward_final_callback": "final_callback",
    "_root_post_backward_final_callback": "final_callback",
}
_FINAL = ("_post_backward_final_callback", "_root_post_backward_final_callback")
_PREFETCH = ("_prefetch_handle", "_prefetch_unshard")
_TORCH_PARTS = ("/torch/", "\\torch\\", "/site-packages/", "\\site-packages\\", "/lib/python")


@dataclass(frozen=True)
class Frame:
    """One Python frame of the stack that issued a collective."""

    name: str
    filename: str
    line: int

    def __str__(self) -> str:
        return f"{Path(self.filename).name}:{self.line} ({self.name})"


@dataclass(frozen=True)
class Collective:
    """One collective a rank's flight recorder kept.

    ``seq`` is its number in its process group (``collective_seq_id``; for a send or
    receive, ``p2p_seq_id``); the same ``seq`` of the same ``group`` on two ranks is one
    collective when the ranks agree. ``op`` is what the backend recorded
    (``"_reduce_scatter_base"``), ``kind`` what it is (``"all_gather"``,
    ``"reduce_scatter"``, ``"all_reduce"``, else ``op``): gloo runs a reduce-scatter as an
    all-reduce of the whole input, which its stack tells. ``t`` is when it was issued
    (seconds since the epoch, the rank's wall clock), ``started``/``completed`` when the
    recorder saw it start and finish (``None``: not seen; gloo records neither),
    ``elapsed`` the seconds between them (to the nanosecond) and ``duration`` the device
    time NCCL measured (seconds). ``hook`` and ``prefetch`` are read
    from FSDP's functions in the stack (``None``: not issued by FSDP, or no stack).
    """

    rank: int
    record_id: int
    seq: int
    op: str
    kind: str
    backend: str
    group: str
    group_desc: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    state: str
    t: float
    started: float | None = None
    completed: float | None = None
    duration: float | None = None
    timeout: float | None = None
    elapsed: float | None = None  # from its recorded start (else issue) to its end, seconds
    is_p2p: bool = False
    frames: tuple[Frame, ...] = ()
    hook: Hook | None = None
    prefetch: bool = False

    @property
    def numel(self) -> int:
        """Elements of the whole tensor: an all-gather's output, a reduce-scatter's input."""
        return max(_numel(self.input_sizes), _numel(self.output_sizes))

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor (:attr:`numel` in its dtype)."""
        big = self.output_sizes if _numel(self.output_sizes) >= _numel(self.input_sizes) else None
        dtypes = self.output_dtypes if big is not None else self.input_dtypes
        sizes = big if big is not None else self.input_sizes
        return (
            sum(math.prod(s) * _DTYPE_BYTES.get(d, 4) for s, d in zip(sizes, dtypes, strict=False))
            or self.numel * 4
        )

    @property
    def phase(self) -> str | None:
        """``forward`` or ``backward`` (from the hook), ``None`` when not FSDP's."""
        if self.hook is None:
            return None
        return "forward" if self.hook in ("pre_forward", "post_forward") else "backward"

    @property
    def fsdp(self) -> bool:
        """Whether FSDP issued it (one of its hooks is in the stack)."""
        return self.hook is not None

    @property
    def caller(self) -> Frame | None:
        """The innermost frame outside torch and the standard library: the user's code."""
        for f in self.frames:
            if not any(p in f.filename for p in _TORCH_PARTS) and not f.filename.startswith("<"):
                return f
        return None

    def signature(self) -> tuple[Any, ...]:
        """What must agree across ranks for one collective, as torch's ``fr_trace`` checks it:
        the op, the input and output sizes and the dtypes."""
        return (self.op, self.input_sizes, self.output_sizes, self.input_dtypes,
                self.output_dtypes)  # fmt: skip

    def how(self) -> str:
        """The FSDP hook in words: ``pre_backward prefetch``; ``""`` when not FSDP's."""
        if self.hook is None:
            return ""
        return f"{self.hook} prefetch" if self.prefetch else self.hook

    def describe(self) -> str:
        """``all_gather #12 (288 B, pre_forward)``: what a rank did, in one line."""
        what = f"{self.kind} #{self.seq} ({size_text(self.nbytes)}"
        how = self.how()
        return what + (f", {how})" if how else ")")


@dataclass
class RankDump:
    """One rank's dump as read: its collectives, the groups it names, what was wrong."""

    rank: int
    path: Path
    version: str
    collectives: list[Collective]
    pg_config: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    backend: str = ""


def read_dumps(folder: Path) -> tuple[dict[int, RankDump], list[str], set[int]]:
    """Every dump in ``folder`` by rank, notes on the files that could not be read, and the
    ranks named by a dump's file, read or not.

    Dumps share a file name prefix (``nccl_trace_rank_``); the prefix most readable files
    have wins, so a folder like ``/tmp`` holding other files ending in digits still reads.
    """
    by_prefix: dict[str, dict[int, list[Path]]] = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        named = _split(path)
        if named is not None:
            prefix, rank = named
            by_prefix.setdefault(prefix, {}).setdefault(rank, []).append(path)
    best: tuple[dict[int, RankDump], list[str], set[int]] = ({}, [], set())
    for files in by_prefix.values():
        dumps, notes = _read_ranks(files)
        if (len(dumps), -len(notes)) > (len(best[0]), -len(best[1])):
            best = dumps, notes, set(files)
    return best


def _read_ranks(found: dict[int, list[Path]]) -> tuple[dict[int, RankDump], list[str]]:
    notes: list[str] = []
    dumps: dict[int, RankDump] = {}
    for rank, paths in sorted(found.items()):
        # a pickle and its JSON twin: the pickle holds the stacks
        paths.sort(key=lambda p: (p.suffix.lower() == ".json", p.name))
        errors = []
        for path in paths:
            try:
                dumps[rank] = read_dump(path, rank)
                break
            except DumpError as exc:
                errors.append(f"{path.name}: {exc}")
        if rank not in dumps:
            notes.append(f"rank {rank}'s dump could not be read ({'; '.join(errors)})")
    return dumps, notes


def rank_of(path: Path) -> int | None:
    """The rank a dump's file name ends with (``nccl_trace_rank_3`` -> 3), else ``None``."""
    named = _split(path)
    return named[1] if named is not None else None


def _split(path: Path) -> tuple[str, int] | None:
    """``(prefix, rank)`` of a dump's file name: ``rank3.json`` -> ``("rank", 3)``."""
    name = path.name
    for suffix in _SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    m = _RANK.match(name)
    return (m.group(1), int(m.group(2))) if m else None


class DumpError(ValueError):
    """A file is not a readable flight recorder dump."""


class _PlainUnpickler(pickle.Unpickler):
    """Dumps hold dicts, lists, tuples, strings and numbers only: nothing else is loaded."""

    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(f"it names {module}.{name}, which a flight recorder dump never holds")


def read_dump(path: Path, rank: int) -> RankDump:
    """One rank's dump, pickle or JSON; :class:`DumpError` says why it cannot be read."""
    data = path.read_bytes()
    if not data:
        raise DumpError("the file is empty (the rank died while writing it?)")
    raw: Any
    if data[:1] in (b"{", b"["):
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise DumpError(f"cut short or damaged JSON ({exc})") from None
    else:
        try:
            raw = _PlainUnpickler(io.BytesIO(data)).load()
        except DumpError:
            raise
        except Exception as exc:
            raise DumpError(
                f"not a whole pickle ({type(exc).__name__}: {exc}); it was cut short or is "
                "not a flight recorder dump"
            ) from None
    if not isinstance(raw, Mapping) or "entries" not in raw:
        raise DumpError("it holds no 'entries': not a flight recorder dump")
    entries = raw.get("entries") or []
    collectives = []
    stacks = _Stacks()  # lives while ``raw`` does: frames are keyed by their dicts' ids
    for e in entries:
        try:
            collectives.append(_collective(e, rank, stacks))
        except (KeyError, TypeError, ValueError) as exc:
            raise DumpError(f"an entry lacks what torch writes ({exc!r})") from None
    collectives.sort(key=lambda c: c.record_id)
    backends = [c.backend for c in collectives]
    return RankDump(
        rank=rank,
        path=path,
        version=str(raw.get("version", "")),
        collectives=collectives,
        pg_config=_pg_config(raw.get("pg_config") or {}),
        backend=max(set(backends), key=backends.count) if backends else "",
    )


class _Stacks:
    """Stacks and what they say, read once: a dump holds each distinct frame once, shared by
    the entries whose stacks pass through it (thousands of entries, a few dozen stacks)."""

    def __init__(self) -> None:
        self.frames: dict[int, Frame] = {}
        self.stacks: dict[tuple[int, ...], tuple[tuple[Frame, ...], str | None, Hook | None,
                                                 bool]] = {}  # fmt: skip

    def of(self, raw: Any) -> tuple[tuple[Frame, ...], str | None, Hook | None, bool]:
        """The stack, the torch.distributed function at its top, FSDP's hook, prefetch."""
        if not raw:
            return (), None, None, False
        key = tuple(map(id, raw))
        known = self.stacks.get(key)
        if known is None:
            frames = tuple(self._frame(f) for f in raw)
            api = None
            if _in_torch(frames[0], "distributed/distributed_c10d.py"):
                api = frames[0].name
            known = (frames, api, *_hook(frames))
            self.stacks[key] = known
        return known

    def _frame(self, f: Mapping[str, Any]) -> Frame:
        frame = self.frames.get(id(f))
        if frame is None:
            frame = Frame(str(f.get("name", "")), str(f.get("filename", "")),
                          int(f.get("line", 0) or 0))  # fmt: skip
            self.frames[id(f)] = frame
        return frame


def _collective(e: Mapping[str, Any], rank: int, stacks: _Stacks) -> Collective:
    backend, _, name = str(e["profiling_name"]).partition(":")
    op = name.split(" ")[0] if name else backend
    frames, api, hook, prefetch = stacks.of(e.get("frames"))
    kind = _KINDS.get(op, op)
    if api is not None:
        kind = _API_KINDS.get(api, kind)
    pg = e.get("process_group") or ("", "")
    is_p2p = bool(e.get("is_p2p", False))
    seq = int(e.get("p2p_seq_id", 0) if is_p2p else e["collective_seq_id"])
    timeout = e.get("timeout_ms")
    duration = e.get("duration_ms")
    created, began, ended = (
        e.get(k) for k in ("time_created_ns", "time_discovered_started_ns",
                           "time_discovered_completed_ns")
    )  # fmt: skip
    elapsed = None
    if isinstance(ended, int) and ended > 0:
        start = began if isinstance(began, int) and began > 0 else int(created or 0)
        elapsed = max(ended - start, 0) / 1e9
    return Collective(
        rank=rank,
        record_id=int(e["record_id"]),
        seq=seq,
        op=op,
        kind=kind,
        backend=backend,
        group=str(pg[0]),
        group_desc=str(pg[1]) if len(pg) > 1 else "",
        input_sizes=_sizes(e.get("input_sizes")),
        output_sizes=_sizes(e.get("output_sizes")),
        input_dtypes=tuple(str(d) for d in e.get("input_dtypes") or ()),
        output_dtypes=tuple(str(d) for d in e.get("output_dtypes") or ()),
        state=str(e.get("state", "scheduled")),
        t=int(e["time_created_ns"]) / 1e9,
        started=_seconds(e.get("time_discovered_started_ns")),
        completed=_seconds(e.get("time_discovered_completed_ns")),
        duration=float(duration) / 1e3 if isinstance(duration, int | float) else None,
        timeout=float(timeout) / 1e3 if isinstance(timeout, int | float) and timeout else None,
        elapsed=elapsed,
        is_p2p=is_p2p,
        frames=frames,
        hook=hook,
        prefetch=prefetch,
    )


def _hook(frames: Sequence[Frame]) -> tuple[Hook | None, bool]:
    fsdp = [f.name for f in frames if _in_torch(f, "distributed/fsdp/")]
    prefetch = any(n in _PREFETCH for n in fsdp)
    if any(n in _FINAL for n in fsdp):
        return "final_callback", prefetch
    return next((_HOOKS[n] for n in fsdp if n in _HOOKS), None), prefetch


def _in_torch(frame: Frame, part: str) -> bool:
    return "torch/" + part in frame.filename.replace("\\", "/")


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    if not value:
        return ()
    return tuple(tuple(s) if all(type(d) is int for d in s) else tuple(map(int, s))
                 for s in value)  # fmt: skip


def _seconds(ns: Any) -> float | None:
    return int(ns) / 1e9 if isinstance(ns, int) and ns > 0 else None


def _numel(sizes: Iterable[Sequence[int]]) -> int:
    return sum(math.prod(s) for s in sizes)


def _pg_config(raw: Mapping[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{group name: (desc, ranks)}`` from a dump's ``pg_config`` (ranks as torch writes
    them, ``"[0, 1]"``); an entry without a name or ranks says nothing and is left out."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for key, info in raw.items():
        if not isinstance(info, Mapping):
            continue
        name = str(info.get("name", key))
        ranks_text = info.get("ranks", "[]")
        try:
            ranks = tuple(int(r) for r in json.loads(str(ranks_text)))
        except (ValueError, TypeError):
            ranks = ()
        if name and ranks:
            out[name] = (str(info.get("desc", "")), ranks)
    return out


@dataclass(frozen=True)
class GroupInfo:
    """A process group the dumps name: its ``name`` (``"0"`` for the default group), the
    ``desc`` torch gave it (``"default_pg"``, ``"mesh_shard"``), its member ``ranks``
    (``listed``: as the dumps' ``pg_config`` lists them; otherwise the ranks whose dumps
    have entries on it), its ``size`` and its ``role`` for FSDP (``"shard"``: FSDP's own group,
    ``"replicate"``: hybrid sharding's all-reduce across shard groups, ``"tp"``: tensor
    parallelism; ``None``: not known)."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    listed: bool
    role: Role | None = None
    size: int = 0  # ranks in it: listed, else read from an all-gather's output shape

    @property
    def unseen(self) -> int:
        """Members whose dumps are not here (their ranks unknown when not ``listed``)."""
        return max(self.size - len(self.ranks), 0)

    def label(self) -> str:
        """How the text names it: ``the default group``, ``group 3 ('mesh_shard')``."""
        if self.desc == "default_pg" or (self.name == "0" and not self.desc):
            return "the default group"
        if self.desc and self.desc != "undefined":
            return f"group {self.name} ({self.desc!r})"
        return f"group {self.name}"

    def dimension(self) -> str:
        """The mesh dimension it is, in words (``HSDP's shard dimension``), or ``""``."""
        return {
            "shard": "FSDP's shard group",
            "replicate": "HSDP's replicate dimension (all-reduce across shard groups)",
            "tp": "the tensor-parallel dimension",
        }.get(self.role or "", "")


def infer_groups(dumps: Mapping[int, RankDump]) -> dict[str, GroupInfo]:
    """Every process group the dumps use, with its members: as ``pg_config`` lists them
    where a dump does (NCCL), else the ranks that have entries on it (gloo in torch 2.13
    writes ``pg_config`` without the group's name or ranks)."""
    seen: dict[str, tuple[str, set[int]]] = {}
    for d in dumps.values():
        for c in d.collectives:
            desc, users = seen.setdefault(c.group, (c.group_desc, set()))
            users.add(d.rank)
    listed: dict[str, tuple[int, ...]] = {}
    for d in dumps.values():
        for name, (_, ranks) in d.pg_config.items():
            if name in seen and d.rank in ranks:
                listed.setdefault(name, ranks)
    sizes: dict[str, int] = {}
    for d in dumps.values():
        for c in d.collectives:
            if c.kind == "all_gather" and c.input_sizes and c.output_sizes:
                ins, outs = _numel(c.input_sizes[:1]), _numel(c.output_sizes[:1])
                if ins and outs % ins == 0:
                    sizes.setdefault(c.group, outs // ins)
    groups = {}
    for name, (desc, users) in seen.items():
        members = listed.get(name)
        ranks = tuple(sorted(members or users))
        size = len(ranks) if members else max(len(ranks), sizes.get(name, 0))
        groups[name] = GroupInfo(name, desc, ranks, listed=members is not None, size=size)
    return groups
