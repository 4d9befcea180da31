"""The time model under pipeline parallelism: every pipeline rank's step, each waiting for
the others' sends.

Each rank's step is timed by :func:`fsdpviz.cost.time.timeline` from its own report (its
compute, FSDP's collectives, its sends and receives in action order); a receive ends when
the neighbouring stage's rank has sent, so the ranks are timed again, each with what the
others' last timing says of their sends and posted receives, until no send moves (the
times only grow, so this ends; at most a pass per hop of the longest chain of dependent
sends). The compute's waits for a receive are the pipeline's *bubbles*
(``totals["bubble_s"]``, each wait in :meth:`Timeline.bubbles`).

The job's timeline (the report of the whole pipeline) holds every rank's events, compute,
waits, hook calls and step work (its optimizer step, and with float8 the scales'
precomputation: ``step_work``), each with its ``rank`` (events indexed as the job report's
iterations: rank by rank). Every rank's step starts at 0, so each keeps the times of its own
timeline (those of its step's last micro-step); each rank steps its optimizer once its own
``schedule.step()`` returns (its last backward, its sends waited for and its gradients
reduced: torch's ``_step_microbatches`` ends with ``perform_reduce_grad``, and nothing waits
for the other ranks), so its step work follows its own last micro-step. The job's
``step_s`` is the slowest rank's (the step ends when every rank is done), ``compute_s``,
``comm_s``, ``exposed_comm_s``, ``bubble_s`` and the bytes the sums over the ranks (GPU
time: ``bubble_s / (pp * step_s)`` is the share of the pipeline's GPU time lost to bubbles;
each rank's own are in its report's timeline), ``tokens_per_s``, ``model_flops`` and
``mfu`` per GPU of the pipeline (each rank is a GPU, and all of them carry the step's
tokens through their stages).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fsdpviz.errors import ConfigError
from fsdpviz.schema.events import Event
from fsdpviz.schema.report import Report
from fsdpviz.schema.rows import ComputeStretch, HookTime, StepWork, TimedEvent, Wait
from fsdpviz.schema.timeline import Timeline

_ACTION = re.compile(r"(\d+)([FBIW])(\d+)")  # a stage's compute on a microbatch
_SUMS = (
    "compute_s", "comm_s", "exposed_comm_s", "bubble_s", "optimizer_s", "exposed_forward_s",
    "exposed_backward_s", "matmul_s", "attention_s", "memory_bound_s", "copy_s", "cpu_bound_s",
    "all_gather_bytes", "reduce_scatter_bytes", "tp_bytes", "pp_bytes",
)  # fmt: skip


@dataclass
class P2PTimes:
    """Pipeline parallelism's sends and receives across the ranks' simulations: when each
    send of a microbatch's activations or gradients ran (``sent``: start, end) and when its
    receive was posted (``posted``), keyed ``(direction "F" or "B", sending stage,
    microbatch)``. A rank's receive ends when the peer's send does; :mod:`fsdpviz.cost.
    pipeline_time` runs the ranks again with what the others did until nothing moves."""

    sent: dict[tuple[str, int, int], tuple[float, float]] = field(default_factory=dict)
    posted: dict[tuple[str, int, int], float] = field(default_factory=dict)
    changed: bool = False
    tapes: dict[tuple[int, int], Any] = field(default_factory=dict)  # each rank's, once

    def send(self, key: tuple[str, int, int], start: float, end: float) -> None:
        if self.sent.get(key) != (start, end):
            self.sent[key] = (start, end)
            self.changed = True

    def post(self, key: tuple[str, int, int], t: float) -> None:
        if self.posted.get(key) != t:
            self.posted[key] = t
            self.changed = True


def p2p_key(e: Event) -> tuple[str, int, int]:
    """The send a ``pp_send`` / ``pp_recv`` event is (or receives): direction, sending stage,
    microbatch."""
    forward = e.phase == "forward"
    stage = int(e.stage or 0)
    if e.kind == "pp_recv":
        stage = stage - 1 if forward else stage + 1
    return ("F" if forward else "B", stage, int(e.microbatch or 0))


def pipeline_timelines(
    report: Report, time_rank: Callable[[Report, P2PTimes], Timeline], cache: bool = False
) -> tuple[Timeline, list[Timeline]]:
    """The job's timeline and each pipeline rank's (``report`` is the job's report, with
    ``report.pipeline.ranks``); ``time_rank(rank_report, p2p)`` times one rank's step given
    the sends known so far (:func:`fsdpviz.cost.time.timeline` with ``p2p=``). ``cache``:
    the timelines are the reports' own (``report.timeline``, each rank's ``timeline``).
    ``fsdpviz.cost.timeline(report)`` of a pipeline's report (or of one of its ranks) goes
    through here.

    Example::

        tl = fsdpviz.cost.timeline(report, "h100")
        tl.totals["bubble_s"], tl.bubbles()[0]["reason"]
        report.pipeline.ranks[0].timeline.totals["step_s"]
    """
    pipe = report.pipeline
    if pipe is None or not pipe.ranks:
        raise ConfigError("the job's report of a pipeline is needed (report.pipeline.ranks)")
    p2p = P2PTimes()
    passes = 4 * (len(pipe.stages) * pipe.microbatches + 2)
    settled = False
    timelines: list[Timeline | None] = [None] * len(pipe.ranks)
    for n in range(passes):
        p2p.changed = False
        # forward sends go down the ranks, gradients up: every other pass runs them upwards
        order = range(len(pipe.ranks)) if n % 2 == 0 else reversed(range(len(pipe.ranks)))
        for r in order:
            timelines[r] = time_rank(pipe.ranks[r], p2p)
        if not p2p.changed and n:
            settled = True
            break
    done = [tl for tl in timelines if tl is not None]
    for rank, tl in zip(pipe.ranks, done, strict=True):
        tl.events = [replace(r, rank=rank.config.pp_rank) for r in tl.events]
        tl.waits = [replace(w, rank=rank.config.pp_rank) for w in tl.waits]
        _label_compute(tl, p2p.tapes.get((id(rank), _index(rank, tl))))
        if cache:
            rank.__dict__["timeline"] = tl  # Report.timeline's cached value: this one
    job = _job(report, done)
    if not settled:
        job.notes.append(f"the pipeline's sends had not settled after {passes} passes")
    if cache:
        report.__dict__["timeline"] = job
    return job, done


def _index(rank: Report, tl: Timeline) -> int:
    return tl.micro_steps[-1].iteration if tl.micro_steps else len(rank.iterations) - 1


def _label_compute(tl: Timeline, tape: Any) -> None:
    """Each stretch of compute with the action it is part of (``action``, ``stage``,
    ``microbatch``): the one whose start (a ``pipeline`` call naming it) came last."""
    if tape is None:
        return
    marks: list[tuple[int, str]] = [
        (k, c.arg)
        for k, c in enumerate(tape.calls)
        if c.hook == "pipeline" and isinstance(c.arg, str) and _ACTION.fullmatch(c.arg)
    ]
    starts = [k for k, _ in marks]
    labelled = []
    for rec in tl.compute:
        at = bisect.bisect_right(starts, rec.index) - 1
        if at >= 0:
            action = marks[at][1]
            match = _ACTION.fullmatch(action)
            assert match is not None
            rec = replace(rec, action=action, stage=int(match[1]), microbatch=int(match[3]))
        labelled.append(rec)
    tl.compute = labelled


def _job(report: Report, timelines: list[Timeline]) -> Timeline:
    pipe = report.pipeline
    assert pipe is not None
    events: list[TimedEvent] = []
    compute: list[ComputeStretch] = []
    hooks: list[HookTime] = []
    waits: list[Wait] = []
    work: list[StepWork] = []
    for r, tl in enumerate(timelines):
        offset = len(events)
        events += [replace(e, index=e.index + offset) for e in tl.events]
        compute += [replace(c, rank=r) for c in tl.compute]
        hooks += [replace(h, rank=r, events=tuple(i + offset for i in h.events)) for h in tl.hooks]
        waits += [replace(w, event=w.event + offset) for w in tl.waits]
        # each rank's optimizer step after its own schedule.step() (no barrier between the
        # ranks' steps), in its own time as its events are
        work += [replace(w, rank=r) for w in tl.step_work]
    n = len(timelines)
    slowest = max(timelines, key=lambda tl: tl.totals["step_s"])
    totals = dict(slowest.totals)
    for key in _SUMS:
        totals[key] = sum(tl.totals.get(key, 0.0) for tl in timelines)
    step = slowest.totals["step_s"]
    totals["step_s"] = step
    totals["pp_ranks"] = float(n)
    comm, exposed = totals["comm_s"], totals["exposed_comm_s"]
    totals["overlap"] = max(0.0, 1.0 - exposed / comm) if comm > 0 else 1.0
    # every rank carries the step's tokens through its stages; each rank is one GPU
    tokens = slowest.totals["tokens"]
    totals["tokens"] = tokens
    totals["tokens_per_s"] = tokens / step / n if step > 0 else 0.0
    for key in ("model_flops", "hardware_flops"):
        totals[key] = sum(tl.totals[key] for tl in timelines) / n
    for key, flops in (("mfu", "model_flops"), ("hfu", "hardware_flops")):
        own = slowest.totals[key] * step / slowest.totals[flops] if slowest.totals[flops] else 0
        totals[key] = totals[flops] / step * own if step > 0 and own else 0.0
    notes = list(dict.fromkeys(note for tl in timelines for note in tl.notes))
    return Timeline(
        slowest.machine, events, compute, totals, notes, hooks, waits, slowest.micro_steps, work
    )
