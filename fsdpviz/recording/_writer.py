"""Per-rank recording files: what survives a crash, and how it is read back.

A recording directory holds, for each rank ``r``:

``rank{r}.json``
    The header: format, rank, world size, FSDP flavour, units, forward order,
    wall-clock start. Replaced atomically (temporary file, then ``os.replace``),
    so it is always either the old or the new version.
``rank{r}.jsonl``
    One JSON line per iteration, appended with a single ``write`` to an
    ``O_APPEND`` file when the iteration ends. A process killed at any moment
    leaves every finished line intact; a line cut short by a dying writer has
    no newline and is skipped when reading. (Nothing is ``fsync``-ed, which
    would cost milliseconds per write: a process crash loses nothing written,
    an operating-system crash may.)

Each line: ``{"iteration", "complete", "events", "module_events"}``; ``events``
and ``module_events`` use the dict forms of :mod:`fsdpviz.schema.report`.
``complete`` is false for the events left over when the recording ended
between two iterations (a forward with no backward after it). A line for the
iteration of the line before it is that iteration again, amended (an event of the
optimizer step after it, as torchao's ``precompute_float8_dynamic_scale_for_fsdp``
all-reduce): it replaces that line when read back.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "fsdpviz-recording"
FORMAT_VERSION = 1
_RANK_FILE = re.compile(r"rank(\d+)\.json")


def header_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank{rank}.json"


def iterations_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank{rank}.jsonl"


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` so that readers see the old or the new content, never a mix."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(raw)
    os.replace(tmp, path)


class RankWriter:
    """Writes one rank's header and iteration lines into ``out_dir``."""

    def __init__(self, out_dir: Path, rank: int) -> None:
        self.out_dir = out_dir
        self.rank = rank
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            header_path(out_dir, rank).unlink(missing_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
            self._fd: int | None = os.open(iterations_path(out_dir, rank), flags, 0o644)
        except OSError as e:
            raise OSError(
                f"fsdpviz cannot write its recording of rank {rank} into {str(out_dir)!r}: {e}; "
                "pass out_dir=... a directory every rank can write to"
            ) from e

    def header(self, header: dict[str, Any]) -> None:
        write_atomic(header_path(self.out_dir, self.rank), json.dumps(header, indent=1))

    def iteration(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            raise RuntimeError("this RankWriter is closed")
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class RankFiles:
    """One rank's files as read back."""

    header: dict[str, Any]
    iterations: list[dict[str, Any]] = field(default_factory=list)
    torn_line: bool = False

    @property
    def complete_iterations(self) -> int:
        """Iterations that ended at FSDP's final callback (not cut short by the end or a crash)."""
        return sum(1 for it in self.iterations if it.get("complete"))


def recorded_ranks(out_dir: Path) -> list[int]:
    """Ranks that have a header in ``out_dir``, in order."""
    found = (_RANK_FILE.fullmatch(p.name) for p in out_dir.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def is_recording(folder: Path) -> bool:
    """Whether ``folder`` holds a run :func:`fsdpviz.record` wrote (a rank's header names
    the format; JSON flight recorder dumps may be called ``rank0.json`` too)."""
    for rank in recorded_ranks(folder):
        try:
            header = json.loads(header_path(folder, rank).read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(header, dict) and header.get("format") == FORMAT:
            return True
    return False


def read_rank(out_dir: Path, rank: int) -> RankFiles:
    """Read rank ``rank``'s header and every complete iteration line."""
    header = json.loads(header_path(out_dir, rank).read_text())
    if header.get("format") != FORMAT or header.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{header_path(out_dir, rank)} is not an fsdpviz recording of format version "
            f"{FORMAT_VERSION}; record the run again with this fsdpviz"
        )
    files = RankFiles(header)
    path = iterations_path(out_dir, rank)
    raw = path.read_bytes() if path.exists() else b""
    lines = raw.split(b"\n")
    files.torn_line = lines[-1] != b""
    for line in lines[:-1]:
        record = json.loads(line)
        amends = files.iterations and files.iterations[-1].get("iteration") == record.get(
            "iteration"
        )
        if amends:
            files.iterations[-1] = record
        else:
            files.iterations.append(record)
    return files


def read_all(out_dir: Path, rank: int) -> tuple[str, bytes]:
    """Rank ``rank``'s header text and iteration bytes, to ship them to another rank."""
    path = iterations_path(out_dir, rank)
    return header_path(out_dir, rank).read_text(), path.read_bytes() if path.exists() else b""


def write_all(out_dir: Path, rank: int, header: str, lines: bytes) -> None:
    """Store what :func:`read_all` returned (on the rank that gathers)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(iterations_path(out_dir, rank), lines)
    write_atomic(header_path(out_dir, rank), header)
