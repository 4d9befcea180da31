"""What :func:`fsdpviz.tune` found: every configuration it evaluated, the fastest that fits,
the frontier of speed against memory, and all of it in words (the best, per knob the best
alternative, why the configuration as given is slow, what would fit).

A :class:`Candidate` is one configuration: its choice per knob, the :func:`fsdpviz.analyze`
keywords and the micro-batch that give its plan (``fsdpviz.analyze(model, c.inputs,
**c.kwargs)`` is ``c.report``), and what the memory and time models say of it. A
:class:`Tuning` holds them all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack, cast

from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.slow_causes import Slowdown, slowdowns
from fsdpviz.errors import ConfigError
from fsdpviz.schema.extensions import save_method, show_method
from fsdpviz.schema.keywords import MimeBundleKwargs, TuneSaveKwargs, TuneShowKwargs
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.report import Report
from fsdpviz.schema.rows import Scalar
from fsdpviz.schema.tables import dataframe
from fsdpviz.schema.timeline import duration_text
from fsdpviz.tuning.code import configuration_code
from fsdpviz.tuning.space import KNOB_NAMES, TuneKwargs

TuneRow = dict[str, Scalar]
"""One configuration as a table row (:meth:`Candidate.row`): its index, its value of each
knob in words (the knobs' names as keys), then its measures."""


class Alternative(TypedDict):
    """One row of :meth:`Tuning.alternatives`."""

    knob: str
    candidate: Candidate
    text: str


class SlowCause(Slowdown):
    """One row of :meth:`Tuning.why_slow`: a :class:`~fsdpviz.cost.slow_causes.Slowdown` and the
    configuration tune found for its knob."""

    prediction: Candidate | None
    predicted: str


class Needs(TypedDict):
    """When nothing fits (:attr:`Tuning.needs`): the lightest configuration's index, the
    ranks it would fit on and its peak there (None where more ranks do not help), or why
    not."""

    candidate: int
    world_size: int | None
    peak_bytes: int | None
    reason: str


class RetuneKwargs(TypedDict, total=False):
    """What :meth:`Tuning.retune` may change, as :func:`fsdpviz.tune` takes it."""

    machine: Machine | str
    world_size: int | Sequence[int] | None
    memory_budget: str | int | None
    optimizer: str | int | None
    tokens_per_step: int | None
    allow: Iterable[str]
    knobs: Iterable[str] | None
    exhaustive: bool
    workers: int | None
    progress: bool | None


class TuningJSON(TypedDict):
    """:meth:`Tuning.to_dict`: what ``tuning.save("x.json")`` writes; ``traces``,
    ``replays``, ``reused``, ``derived`` and ``checkpoint_derived`` count the trace keys as
    :class:`Tuning` does."""

    api: str
    machine: str
    world_sizes: list[int]
    budget: int | None
    best: int | None
    user: int
    frontier: list[int]
    rows: list[TuneRow]
    traces: int
    replays: int
    reused: int
    derived: int
    checkpoint_derived: int
    seconds: float
    notes: list[str]
    needs: Needs | None


@dataclass
class Candidate:
    """One configuration :func:`fsdpviz.tune` evaluated.

    ``knobs``: its value of each knob, in words; ``kwargs`` and ``inputs``:
    ``fsdpviz.analyze(model, c.inputs, **c.kwargs)`` gives ``report`` (``inputs`` is the
    micro-batch: the given inputs cut to ``micro_batch`` samples); ``fits``: its peak and
    the allocator's reserved estimate fit the machine's usable memory (or ``peak_bytes``
    the budget given); ``tokens_per_s``: per GPU, each optimizer step's tokens over its
    modelled time; ``micro_batch`` samples per forward, ``grad_accum`` forwards per optimizer
    step, the gradients reduced after each of them where ``sync_each`` (``report`` is then
    one micro-step's plan, the time and memory models repeat it), else only after the last
    (``no_sync`` / ``set_requires_gradient_sync(False)`` before it: ``report`` holds every
    micro-step); ``user``: the configuration as the user gave it; ``traced``: the model
    ran for this one (else it was replayed from another's trace; in a retune, it ran in the
    search retuned), or ``derived`` says from what its plan was derived instead (``"traces at
    other micro-batches"``, :mod:`fsdpviz.replan.batch_replay`; ``"traces without
    checkpointing and with each block"``, :mod:`fsdpviz.replan.checkpoint_replay`): the plan
    a trace would make, with no trace run.
    """

    knobs: dict[str, str]
    kwargs: TuneKwargs
    inputs: Any
    report: Report
    fits: bool
    peak_bytes: int
    reserved_bytes: int
    usable_bytes: int
    step_s: float
    tokens_per_s: float
    mfu: float
    exposed_comm_s: float
    compute_s: float
    world_size: int
    micro_batch: int
    grad_accum: int
    dominant: str
    sync_each: bool = False  # grad_accum > 1: each micro-step reduces its gradients
    memory_bytes: int = 0  # what must fit: the peak under a budget, else peak or reserved
    traced: bool = False
    user: bool = False
    index: int = 0
    derived: str = ""  # traced: what its plan was derived from instead, if it was

    @property
    def total_tokens_per_s(self) -> float:
        """Tokens per second of the whole job (every data-parallel rank's tokens)."""
        return self.tokens_per_s * self.world_size

    @property
    def label(self) -> str:
        """The configuration in one line: ``"8 ranks · each LlamaDecoderLayer · ..."``."""
        return " · ".join(f"{KNOB_NAMES.get(k, k)} {v}" for k, v in self.knobs.items())

    def row(self) -> TuneRow:
        """This configuration as a table row (JSON)."""
        return {
            "index": self.index,
            **{k: v for k, v in self.knobs.items()},
            "fits": self.fits,
            "peak_bytes": self.peak_bytes,
            "peak_gib": self.peak_bytes / 2**30,
            "reserved_bytes": self.reserved_bytes,
            "memory_bytes": self.memory_bytes,
            "usable_bytes": self.usable_bytes,
            "tokens_per_s": self.tokens_per_s,
            "total_tokens_per_s": self.total_tokens_per_s,
            "step_s": self.step_s,
            "mfu": self.mfu,
            "exposed_comm_s": self.exposed_comm_s,
            "compute_s": self.compute_s,
            "world_size": self.world_size,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "sync_each": self.sync_each,
            "dominant": self.dominant,
            "traced": self.traced,
            "derived": self.derived,
            "user": self.user,
        }

    def code(self, style: str = "python") -> str:
        """The code to run this configuration: ``"python"`` (in torchtitan's order, the
        float8 conversion, ``parallelize_module``, checkpointing and ``compile`` the plan
        has, then the ``fully_shard`` or ``FullyShardedDataParallel`` calls and the
        micro-batch loop; under a pipeline, each stage's and the schedule), ``"torchtitan"``
        (the job TOML's keys) or ``"accelerate"`` (the config YAML's ``fsdp_config``). The
        Python runs as printed in a script that has ``model``, ``batch`` (one rank's samples
        of an optimizer step), ``loss_fn``, ``optimizer`` and the model's classes its comments
        name (a pipeline's: ``split_stage`` too, and no loop: its comment says the steps)."""
        return configuration_code(self, style)

    def verdict(self) -> str:
        """``"71.2 GiB of 78.5 GiB"``: what must fit (:attr:`memory_bytes`) of what may."""
        of = size_text(self.usable_bytes) if self.usable_bytes else "?"
        return f"{size_text(self.memory_bytes)} of {of}"

    def __repr__(self) -> str:
        fit = "fits" if self.fits else "does not fit"
        return (
            f"Candidate({self.label}: {self.tokens_per_s:,.0f} tokens/s per GPU, "
            f"{self.verdict()}, {fit})"
        )


@dataclass
class TuneTable:
    """Every configuration evaluated, one row each (:meth:`Candidate.row`)."""

    rows: list[TuneRow]

    def records(self) -> list[TuneRow]:
        return [dict(r) for r in self.rows]

    def to_pandas(self) -> Any:
        """The rows as a ``pandas.DataFrame`` (needs pandas)."""
        return dataframe(self.records())

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class Tuning:
    """What :func:`fsdpviz.tune` found (see there).

    ``best``: the fitting configuration with the most tokens/s per GPU (None when nothing
    fits); ``user``: the configuration as given; ``candidates``: every configuration
    evaluated, in the order evaluated; ``frontier``: those no other beats in both tokens/s
    and peak memory; ``table``: all as rows; ``notes``: what was pinned and what was not
    tried, and why; ``traces`` / ``replays``: how many configurations ran the model and how
    many were replayed from another's trace; ``reused``: how many traces came from the
    search it retunes (:meth:`retune`); ``derived``: how many trace keys were derived from
    two traces at other micro-batches (:mod:`fsdpviz.replan.batch_replay`), not traced;
    ``checkpoint_derived``: how many trace keys checkpointing every ``n``-th block were derived
    from those without checkpointing and with each block
    (:mod:`fsdpviz.replan.checkpoint_replay`), not traced; ``seconds``: what the search took.
    """

    candidates: list[Candidate]
    user: Candidate
    api: str
    machine: str
    world_sizes: list[int]
    budget: int | None
    traces: int
    replays: int
    seconds: float
    notes: list[str] = field(default_factory=list)
    source: str = ""  # "torchtitan" / "accelerate" when the configuration came from one
    needs: Needs | None = None  # nothing fits: what would (ranks, configuration)
    reused: int = 0  # traces taken from the search retuned
    derived: int = 0  # trace keys derived from two traces at other micro-batches
    checkpoint_derived: int = 0  # every n-th block checkpointed, from none and each block
    # the search again with other arguments, its traces reused (set by tune)
    _retuner: Callable[[RetuneKwargs], Tuning] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self.candidates if c.fits]

    @property
    def best(self) -> Candidate | None:
        """The fitting configuration with the most tokens/s per GPU (ties: the lower peak)."""
        fitting = self.fitting
        if not fitting:
            return None
        return max(fitting, key=lambda c: (round(c.tokens_per_s, 6), -c.memory_bytes))

    def best_for(self, world_size: int) -> Candidate | None:
        """The best fitting configuration on ``world_size`` ranks."""
        fitting = [c for c in self.fitting if c.world_size == world_size]
        if not fitting:
            return None
        return max(fitting, key=lambda c: (round(c.tokens_per_s, 6), -c.memory_bytes))

    @property
    def frontier(self) -> list[Candidate]:
        """The configurations no other beats in both tokens/s and memory (Pareto; memory:
        :attr:`Candidate.memory_bytes`, what must fit), by increasing memory."""
        ordered = sorted(self.candidates, key=lambda c: (c.memory_bytes, -c.tokens_per_s))
        out: list[Candidate] = []
        fastest = -1.0
        for c in ordered:
            if c.tokens_per_s > fastest:
                out.append(c)
                fastest = c.tokens_per_s
        return out

    @property
    def table(self) -> TuneTable:
        return TuneTable([c.row() for c in self.candidates])

    def alternatives(self) -> list[Alternative]:
        """Per knob, the best configuration that differs from :attr:`best` (or, when nothing
        fits, from the lowest peak) in that knob: ``knob``, ``candidate``, ``text``
        (``"checkpointing every 2nd LlamaDecoderLayer instead of each LlamaDecoderLayer:
        +8% tokens/s, 71.2 of 78.5 GiB"``)."""
        return alternatives(self)

    def why_slow(self, candidate: Candidate | None = None) -> list[SlowCause]:
        """Why ``candidate`` (default: the configuration as given) is slow: its step's time
        by cause (:func:`fsdpviz.cost.slowdowns`), each with ``prediction``: the fastest
        configuration evaluated that turns that cause's knob (as few other knobs changed as
        possible; None where none was) and ``predicted`` in words."""
        return why_slow(self, candidate or self.user)

    def summary(self) -> str:
        """The best configuration, why, and per knob what the best alternative changes."""
        return summary(self)

    def retune(self, **changes: Unpack[RetuneKwargs]) -> Tuning:
        """The same search for another ``machine``, ``world_size``, ``memory_budget``,
        ``optimizer``, ``tokens_per_step``, ``allow`` or ``knobs`` (as :func:`fsdpviz.tune`
        takes them; the other arguments as given), the model traced only for trace keys
        this search and the ones it retunes have not traced: a trace does not depend on the
        machine, the budget or the optimizer, and other ranks replay from it. The result is
        what ``fsdpviz.tune`` with those arguments returns, but for how many traces it made
        (``reused``: those it took; a plan replayed from one where tune would trace it says
        so). The model must be as it was (its modules, parameters and buffers).

        Example::

            tuning = fsdpviz.tune(model, {"input_ids": ids}, world_size=64, machine="h100")
            on_h200 = tuning.retune(machine="h200")
            wider = on_h200.retune(world_size=128, memory_budget="60GiB")
        """
        if self._retuner is None:
            raise ConfigError(
                "this tuning holds no traces to retune from (it was not made by fsdpviz.tune "
                "in this process); call fsdpviz.tune with the new arguments"
            )
        return self._retuner(changes)

    def to_dict(self) -> TuningJSON:
        best = self.best
        return {
            "api": self.api,
            "machine": self.machine,
            "world_sizes": list(self.world_sizes),
            "budget": self.budget,
            "best": None if best is None else best.index,
            "user": self.user.index,
            "frontier": [c.index for c in self.frontier],
            "rows": self.table.records(),
            "traces": self.traces,
            "replays": self.replays,
            "reused": self.reused,
            "derived": self.derived,
            "checkpoint_derived": self.checkpoint_derived,
            "seconds": self.seconds,
            "notes": list(self.notes),
            "needs": self.needs,
        }

    def show(self, **kwargs: Unpack[TuneShowKwargs]) -> Any:
        """The frontier as a view: tokens/s against peak memory, the capacity line, the
        user's configuration marked; a click on a point opens that plan's explorer and
        timeline below. Returns a :class:`fsdpviz.widgets.TuneView`."""
        return show_method("tuning")(self, **kwargs)

    def save(self, path: str, **kwargs: Unpack[TuneSaveKwargs]) -> Any:
        """Write the view as a page (``.html``) or the search as JSON (``.json``)."""
        p = Path(path)
        if p.suffix == ".json":
            p.write_text(json.dumps(self.to_dict(), indent=1))
            return p
        return save_method("tuning")(self, p, **kwargs)

    def _repr_mimebundle_(self, **kwargs: Unpack[MimeBundleKwargs]) -> Any:
        """A notebook shows the view (:meth:`show`), which keeps the summary as its text."""
        view = self.show()
        shown = view._repr_mimebundle_(**kwargs)
        if isinstance(shown, tuple):  # (data, metadata), as ipywidgets returns it
            data, meta = shown
            return {**data, "text/plain": self.summary()}, meta
        if isinstance(shown, dict):
            return {**shown, "text/plain": self.summary()}
        return shown

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return self.summary()


# ------------------------------------------------------------------ in words
def _anchor(tuning: Tuning) -> Candidate:
    best = tuning.best
    if best is not None:
        return best
    return min(tuning.candidates, key=lambda c: c.memory_bytes)


def alternatives(tuning: Tuning) -> list[Alternative]:
    """Per knob, the best configuration that differs from the anchor (the best, else the
    lightest) in that knob, as few other knobs changed as possible (fitting ones first,
    then the most tokens/s)."""
    anchor = _anchor(tuning)
    out: list[Alternative] = []
    for knob in anchor.knobs:
        if knob in _FOLLOWING and "pipeline" in anchor.knobs:
            continue  # a pipeline's micro-batch follows its pp degree: the mesh's alternative
        others = [c for c in tuning.candidates if c.knobs.get(knob) != anchor.knobs[knob]]
        if not others:
            continue

        fewest = min(_distance(c, anchor, knob) for c in others)
        near = [c for c in others if _distance(c, anchor, knob) == fewest]
        pick = max(near, key=lambda c: (c.fits, round(c.tokens_per_s, 6), -c.memory_bytes))
        out.append({"knob": knob, "candidate": pick, "text": _change(anchor, pick, knob)})
    return out


def why_slow(tuning: Tuning, c: Candidate) -> list[SlowCause]:
    """See :meth:`fsdpviz.tuning.Tuning.why_slow`."""
    out: list[SlowCause] = []
    checkpointed = c.knobs.get("activation_checkpointing", "none") != "none"
    for row in slowdowns(c.report, checkpointing=checkpointed):
        knob = row["knob"]
        if knob in _FOLLOWING and "pipeline" in c.knobs:
            knob = _FOLLOWING[knob]  # a pipeline's batch per rank changes with its pp degree
        others = [
            o for o in tuning.candidates if knob in o.knobs and o.knobs[knob] != c.knobs.get(knob)
        ]
        pick: Candidate | None = None
        if others:
            fewest = min(_distance(o, c, knob) for o in others)
            near = [o for o in others if _distance(o, c, knob) == fewest]
            pick = max(near, key=lambda o: (o.fits, round(o.tokens_per_s, 6)))
        if pick is not None:
            predicted = f"tune: {_change(c, pick, knob)}"
        elif knob in ("compile", "float8", "cpu_offload"):
            predicted = f"tune tries {knob} with allow=({knob!r},)"
        else:
            predicted = ""
        out.append(cast(SlowCause, row | {"prediction": pick, "predicted": predicted}))
    return out


# Under a pipeline, tune keeps the micro-batch as given and turns the pp degree, which sets
# each pipeline's batch (the global batch kept): the micro-batch follows the mesh.
_FOLLOWING = {"micro_batch": "mesh"}


def _distance(c: Candidate, anchor: Candidate, knob: str) -> int:
    """How many knobs other than ``knob`` differ between ``c`` and ``anchor``."""
    return sum(1 for k, v in c.knobs.items() if k != knob and anchor.knobs.get(k) != v)


def _change(anchor: Candidate, other: Candidate, knob: str) -> str:
    name = KNOB_NAMES.get(knob, knob)
    head = f"{name} {other.knobs[knob]} instead of {anchor.knobs[knob]}"
    also = [
        f"{KNOB_NAMES.get(k, k)} {v}"
        for k, v in other.knobs.items()
        if k != knob and anchor.knobs.get(k) != v
    ]
    if also:
        head += f" (with {', '.join(also)})"
    return f"{head}: {_speed(anchor, other)}, {other.verdict()}" + (
        "" if other.fits else ", does not fit"
    )


def _speed(anchor: Candidate, other: Candidate) -> str:
    if anchor.tokens_per_s <= 0:
        return f"{other.tokens_per_s:,.0f} tokens/s"
    ratio = other.tokens_per_s / anchor.tokens_per_s
    change = ratio - 1
    if abs(change) < 0.0005:
        return "same tokens/s"
    if ratio >= 2:
        return f"{ratio:.1f}x the tokens/s"
    return f"{change:+.0%} tokens/s" if abs(change) >= 0.01 else f"{change:+.1%} tokens/s"


def _config_lines(c: Candidate) -> list[str]:
    return [f"  {KNOB_NAMES.get(k, k)}: {v}" for k, v in c.knobs.items()]


def summary(tuning: Tuning) -> str:
    """The tuning in words (``str(tuning)``)."""
    best = tuning.best
    user = tuning.user
    n = len(tuning.candidates)
    fits = len(tuning.fitting)
    room = (
        f"a budget of {size_text(tuning.budget)} per rank"
        if tuning.budget is not None
        else f"{tuning.machine}'s usable memory"
    )
    sizes = [str(w) for w in tuning.world_sizes]
    ranks = sizes[0] if len(sizes) == 1 else f"{', '.join(sizes[:-1])} or {sizes[-1]}"
    n_reused = tuning.reused
    reused = f", {n_reused} trace{'s' if n_reused > 1 else ''} reused" if n_reused else ""
    if tuning.derived:
        reused += f", {tuning.derived} derived from traces at other micro-batches"
    if tuning.checkpoint_derived:
        reused += (
            f", {tuning.checkpoint_derived} derived from traces without checkpointing and "
            "with each block"
        )
    lines = [
        f"fsdpviz tune · {tuning.api} on {ranks} x {tuning.machine}: {n} configurations "
        f"({tuning.traces} traced{reused}, the rest replayed) in {tuning.seconds:.1f} s; "
        f"{fits} fit {room}."
    ]
    if best is not None:
        lines.append(
            f"Best: {best.tokens_per_s:,.0f} tokens/s per GPU "
            f"({best.total_tokens_per_s:,.0f} on {best.world_size} GPUs), MFU {best.mfu:.1%}, "
            f"step {duration_text(best.step_s)}, {best.verdict()}:"
        )
        lines += _config_lines(best)
        if best is user:
            lines.append("That is the configuration as given.")
        else:
            speed = (
                f"{best.tokens_per_s / user.tokens_per_s:.2f}x the tokens/s"
                if user.tokens_per_s > 0
                else "faster"
            )
            mine = "fits" if user.fits else "does not fit"
            lines.append(
                f"The configuration as given: {user.tokens_per_s:,.0f} tokens/s per GPU, "
                f"{user.verdict()} ({mine}); the best has {speed}."
            )
        if len(tuning.world_sizes) > 1:
            for ws in tuning.world_sizes:
                b = tuning.best_for(ws)
                if b is None:
                    lines.append(f"  on {ws} ranks nothing fits")
                else:
                    lines.append(
                        f"  on {ws} ranks: {b.tokens_per_s:,.0f} tokens/s per GPU, "
                        f"{b.total_tokens_per_s:,.0f} in total"
                    )
    else:
        low = _anchor(tuning)
        lines.append(
            f"Nothing fits. The lightest configuration needs {low.verdict()} (its peak "
            f"{size_text(low.peak_bytes)}, dominated by {low.dominant}), with:"
        )
        lines += _config_lines(low)
        needs = tuning.needs
        if needs and needs.get("world_size"):
            lines.append(
                f"It fits from {needs['world_size']} ranks (peak "
                f"{size_text(cast(int, needs['peak_bytes']))}): the sharded state shrinks with "
                "the ranks."
            )
        elif needs and needs.get("reason"):
            lines.append(f"{needs['reason'][0].upper()}{needs['reason'][1:]}.")
        pinned = [n for n in tuning.notes if n.endswith("(pinned)")]
        if pinned:
            lines.append(
                "Pinned, so not turned: " + "; ".join(p[: -len(" (pinned)")] for p in pinned) + "."
            )
    slow = [r for r in why_slow(tuning, user) if r["seconds"] > 0][:4]
    if slow:
        lines.append(
            f"Why the configuration as given is slow (its step: {duration_text(user.step_s)}):"
        )
        for r in slow:
            lines.append(f"  {r['share']:.0%} {r['text']}")
            if r["predicted"]:
                lines.append(f"      {r['predicted']}")
    alts = alternatives(tuning)
    if alts:
        lines.append("Per knob, the best alternative:")
        lines += [f"  {a['text']}" for a in alts]
    rest = [n for n in tuning.notes if not n.endswith("(pinned)")]
    if rest:
        lines.append("Notes:")
        lines += [f"  {n}" for n in rest]
    return "\n".join(lines)


__all__ = [
    "Candidate", "RetuneKwargs", "TuneTable", "Tuning", "alternatives", "summary", "why_slow",
]  # fmt: skip
