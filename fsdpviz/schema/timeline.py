"""The time model's result: :class:`Timeline`, when each event starts and ends.

How it is modelled is documented in :mod:`fsdpviz.cost.time`, which computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsdpviz.schema.tables import dataframe


@dataclass
class Timeline:
    """Start and end (seconds from the start of the iteration) of every event.

    ``events``: per event ``index``, ``kind``, ``unit``, ``phase``, ``stream``, ``issued``
    (when the CPU issued it: the CPU clock when its hook ran, after any wait of FSDP1's rate
    limiter; never after ``start``), ``compute_t`` (where the compute stream is at that
    hook: a free takes effect there), ``start``, ``end``, ``bytes`` (sent by this rank) and
    ``exposed`` (compute time lost waiting for it). ``compute``: per stretch of compute
    ``hook``, ``unit`` (the hook call it precedes), ``owner`` (whose forward or backward it
    is: the unit a pre-forward or pre-backward hook opened last and no post hook closed yet,
    ``""`` outside every unit), ``phase``, ``next_event`` (the first event issued at or
    after that hook call), ``start``, ``end``, ``flops``. ``totals``: ``step_s``,
    ``compute_s``, ``comm_s``, ``exposed_comm_s``, ``overlap`` (share of communication
    hidden by compute), ``optimizer_s``, ``all_gather_bytes``, ``reduce_scatter_bytes``, and
    the exposed communication by phase of the collective waited for, ``exposed_forward_s``
    and ``exposed_backward_s`` (their sum is ``exposed_comm_s``); the compute by kind,
    ``matmul_s``, ``attention_s``, ``memory_bound_s``, ``copy_s`` (FSDP2's copy-out),
    ``cpu_bound_s`` (time the GPU waited for the CPU to issue kernels); throughput,
    ``micro_batches``, ``micro_step_s``, ``tokens`` (per step and GPU), ``tokens_per_s``
    (per GPU), ``model_flops`` / ``hardware_flops`` (per step and GPU), ``mfu``, ``hfu`` (0
    when the report has no trace profile). Times, bytes and exposure of ``events``,
    ``compute`` and ``waits`` are those of the micro-step ``iteration`` chose (by default the
    step's last). ``hooks``: per hook
    call ``hook``, ``unit``, ``t`` (when the CPU runs it: the CPU runs ahead of the GPU, by
    the kernels' launch time, and waits only where FSDP makes it), ``compute_t`` (where the
    compute stream is then, in its own order) and ``events`` (the indices it issued).
    ``waits``: every stretch of time the compute stream spends waiting for communication (as
    much as the wait adds), ``start``, ``end``, ``event`` (the collective waited for),
    ``phase`` (its phase), ``tail`` (the final wait for the last collective, after the last
    compute). ``micro_steps``: per micro-step of the optimizer step (one without gradient
    accumulation), ``iteration`` (its index in ``report.iterations``), ``start``, ``end``,
    ``sync`` (whether it reduces gradients) and its own ``compute_s``, ``comm_s``,
    ``exposed_comm_s``, bytes and compute by kind; the ``totals`` are their sums (per
    optimizer step). ``machine["topology"]``: where each mesh dimension's groups sit
    (:class:`fsdpviz.cost.topology.Span`, with ``role`` and ``link``).

    Example::

        tl = fsdpviz.cost.timeline(report, machine("a100", network="roce-100"))
        tl.totals["exposed_comm_s"], tl.summary()
    """

    machine: dict[str, Any]
    events: list[dict[str, Any]]
    compute: list[dict[str, Any]]
    totals: dict[str, float]
    notes: list[str] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)
    micro_steps: list[dict[str, Any]] = field(default_factory=list)

    def records(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.events]

    def arrays(self) -> dict[str, list[float]]:
        """``{"start": [...], "end": [...], "exposed": [...]}`` per event."""
        return {k: [float(r[k]) for r in self.events] for k in ("start", "end", "exposed")}

    def to_pandas(self) -> Any:
        """The records as a ``pandas.DataFrame`` (needs pandas)."""
        return dataframe(self.records())

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": dict(self.machine),
            "events": self.records(),
            "compute": [dict(c) for c in self.compute],
            "totals": dict(self.totals),
            "notes": list(self.notes),
            "hooks": [dict(h) for h in self.hooks],
            "waits": [dict(w) for w in self.waits],
            "micro_steps": [dict(s) for s in self.micro_steps],
        }

    def summary(self) -> str:
        t = self.totals
        d = duration_text
        text = (
            f"step {d(t['step_s'])} on {self.machine['name']}: compute {d(t['compute_s'])}, "
            f"communication {d(t['comm_s'])} of which {d(t['exposed_comm_s'])} exposed "
            f"({t['overlap']:.0%} hidden)"
        )
        if t.get("tokens_per_s", 0.0) > 0:
            text += "\n" + throughput_line(t)
        return text

    def __repr__(self) -> str:
        return f"Timeline({self.summary()})"


def duration_text(seconds: float) -> str:
    """``seconds`` to three significant figures in s, ms or µs: ``"48.8 µs"``, ``"2.45 ms"``."""
    for unit, scale in (("µs", 1e-6), ("ms", 1e-3)):
        text = f"{seconds / scale:.3g}"
        if abs(float(text)) < 1000:
            return f"{text} {unit}"
    return f"{seconds:.3g} s"


def throughput_line(totals: dict[str, float]) -> str:
    """``"5,762 tokens/s per GPU, MFU 33.8%, HFU 41.0%"`` from a timeline's totals."""
    return (
        f"{totals['tokens_per_s']:,.0f} tokens/s per GPU, MFU {totals['mfu']:.1%}, "
        f"HFU {totals['hfu']:.1%}"
    )
