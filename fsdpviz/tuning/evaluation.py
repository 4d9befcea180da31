"""Evaluating configurations for :func:`fsdpviz.tune`: each trace key traced once (in this
process, or side by side in forked workers), every other choice replayed from it, each
configuration costed once by the memory and time models. Of the keys that differ in the
micro-batch alone, two are traced and the others derived from them
(:mod:`fsdpviz.replan.batch_replay`); a key that checkpoints every ``n``-th block is
derived from its keys without checkpointing and with each block
(:mod:`fsdpviz.tuning.checkpoint_pairs`); each traced where that is not exact."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import time
from collections.abc import Mapping
from typing import Any

from torch import nn

from fsdpviz.api.predict import analyze
from fsdpviz.cost.fit import check_fit
from fsdpviz.cost.hardware import Machine
from fsdpviz.cost.memory import memory_model
from fsdpviz.cost.time import timeline
from fsdpviz.errors import ConfigError, FsdpvizError
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.replan.hook_replay import replay
from fsdpviz.replan.precision_replay import (
    PRECISION_OPTION,
    replays_precision,
    same_precision,
    traced_precision,
)
from fsdpviz.schema.report import Report
from fsdpviz.trace.probe_records import recording_moments
from fsdpviz.tuning.batch_families import BatchFamilies
from fsdpviz.tuning.checkpoint_pairs import CheckpointPairs
from fsdpviz.tuning.float8_styles import FLOAT8_TP
from fsdpviz.tuning.result import Candidate
from fsdpviz.tuning.retune import StoredTrace, holds_on_machine, on_machine, same_changes
from fsdpviz.tuning.space import (
    KNOBS,
    REPLAYED,
    Choice,
    Space,
    TuneKwargs,
    keeps_a_cache,
    micro_batch_inputs,
    micro_batch_label,
    precision_kwargs,
    reshard_given,
)

__all__ = ["Config", "Evaluations"]

Config = dict[str, Choice]
# what a trace key's plan was derived from (Candidate.derived)
FROM_BATCH_FAMILY = "traces at other micro-batches"
FROM_CHECKPOINT_PAIR = "traces without checkpointing and with each block"


class Evaluations:
    """The configurations of one search evaluated so far (``candidates``), the traces they
    came from, and how many (``trace_count``, ``replay_count``; ``reused_count``: traces
    taken from ``earlier``, an earlier search's, see :mod:`fsdpviz.tuning.retune`;
    ``derived_from``: the trace keys derived instead, each from what: two traces at other
    micro-batches, ``FROM_BATCH_FAMILY``, or, every ``n``-th block checkpointed, those without
    checkpointing and with each block, ``FROM_CHECKPOINT_PAIR``)."""

    def __init__(
        self,
        model: nn.Module,
        inputs: Any,
        space: Space,
        machine_arg: Machine | str,
        optimizer: str | int | None,
        budget: int | None,
        workers: int,
        earlier: Mapping[tuple[Any, ...], StoredTrace] | None = None,
    ) -> None:
        self.model = model
        self.inputs = inputs
        self.space = space
        self.api = space.api
        self.machine_arg = machine_arg
        self.optimizer = optimizer
        self.budget = budget
        self.candidates: list[Candidate] = []
        self.trace_count = 0
        self.replay_count = 0
        self.reused_count = 0
        # trace keys derived rather than traced: what from (Candidate.derived)
        self.derived_from: dict[tuple[Any, ...], str] = {}
        self._batches = BatchFamilies()  # traces that differ in the micro-batch alone
        # every n-th block from none and each
        pairs = [] if space.pipelined else space.choices["activation_checkpointing"]
        self._checkpoints = CheckpointPairs(self, pairs)
        self.earlier: dict[tuple[Any, ...], StoredTrace] = dict(earlier or {})
        self.made: dict[tuple[Any, ...], StoredTrace] = {}  # this search's traces
        self.notes: list[str] = []
        self._workers = abs(workers)
        self._auto_workers = workers < 0  # chosen by tune: only where traces are slow
        self._prefetched: set[tuple[Any, ...]] = set()  # traces made by workers, not yet used
        self._trace_seconds: list[float] = []
        self._traces: dict[tuple[Any, ...], Report | None] = {}
        self._seen: dict[tuple[str, ...], Candidate | None] = {}
        self._configs: dict[int, Config] = {}  # candidate index -> its configuration
        self._inputs: dict[tuple[int, bool], Any] = {}
        self._cache_off = keeps_a_cache(model, inputs)
        if self._cache_off:
            self.notes.append(
                "use_cache=False in the inputs of every configuration but the one as given: "
                "training never reads Hugging Face's key/value cache, and a checkpointed layer "
                "would append to it again when recomputed (gradient_checkpointing_enable sets "
                "it so)"
            )
        self.bar: Any = None

    def trace_key(self, config: Config, any_batch: bool = False) -> tuple[Any, ...]:
        """What the trace of ``config`` depends on: the knobs a replay cannot change (and the
        mesh's tensor-parallel degree: its data-parallel dimensions replay; a mesh a replay
        cannot apply; every knob, under a pipeline). ``any_batch``: with ``None`` for its
        micro-batch's samples."""
        mesh = config["mesh"]
        # a tp mesh's trace is that of its tp degree: a replay changes its dp dimensions
        out: list[Any] = [mesh.label if mesh.traced else f"tp {mesh.parallel_dims.tp}"]
        if self._traces_accum(config):
            out.append(config["micro_batch"].label)
        for knob in KNOBS:
            c = config.get(knob)
            if c is None or (knob in REPLAYED[self.api] and not self.space.pipelined):
                continue
            if knob == "precision" and not self.space.pipelined:
                out.append(self._traced_precision(c))
                continue
            if knob == "micro_batch":
                out.append(None if any_batch else c.samples)
                continue
            out.append(c.label)
        return tuple(out)

    def _traced_precision(self, choice: Choice) -> Any:
        """What of a precision choice the trace depends on: all but its reduce dtype, which
        a replay changes (:mod:`fsdpviz.replan.precision_replay`); a policy FSDP refuses
        keys a trace of its own, which says why."""
        try:
            return traced_precision(self.api, choice.kwargs.get(PRECISION_OPTION[self.api]))
        except FsdpvizError:
            return choice.label

    def _float8_on_mesh(self, config: Config) -> Config:
        """``config`` with torchao's float8 TP styles tried beside the user's plan (a
        float8 choice named :data:`FLOAT8_TP`) as their plain twin off a tensor-parallel
        mesh: the same job there, under one name."""
        f8, mesh = config.get("float8"), config.get("mesh")
        if (
            f8 is None
            or mesh is None
            or mesh.parallel_dims.tp > 1
            or not f8.label.endswith(FLOAT8_TP)
        ):
            return config
        plain = f8.label.removesuffix(f", {FLOAT8_TP}")
        twin = next((c for c in self.space.choices["float8"] if c.label == plain), None)
        return config if twin is None else {**config, "float8": twin}

    def _traces_accum(self, config: Config) -> bool:
        """Whether the micro-steps of gradient accumulation are traced, not replayed: FSDP1
        with forward prefetch (its steady state depends on the first micro-step's sync), and
        tensor parallelism inside a pipeline (a replay keeps no pipeline). Under tensor
        parallelism alone they replay (each micro-step issues the parallel styles'
        collectives, as the trace recorded them)."""
        if config["mesh"].parallel_dims.tp > 1 and self.space.pipelined:
            return True
        prefetch = config.get("forward_prefetch")
        return prefetch is not None and bool(prefetch.kwargs.get("forward_prefetch"))

    def _replay_changes(self, config: Config) -> TuneKwargs:
        changes: TuneKwargs = {}
        for knob in REPLAYED[self.api]:
            c = config.get(knob)
            if c is None or (knob == "mesh" and c.traced):
                continue
            kw = c.kwargs.copy()
            kw.pop("parallelize_plan", None)  # the trace's: a replay keeps its tp degree
            if knob == "mesh" and self.api == "FSDP2" and "world_size" in kw:
                kw["mesh"] = None
            changes.update(kw)
        if self.api == "FSDP1" and not changes.get("shard_group_size", True):
            del changes["shard_group_size"]
        changes["grad_accum"] = int(config["micro_batch"].kwargs.get("grad_accum", 1))
        return changes

    def _micro_inputs(self, samples: int, user: bool = False) -> Any:
        """The inputs of a micro-batch of ``samples``; a Hugging Face model's without its
        key/value cache (``use_cache=False``, as ``gradient_checkpointing_enable`` sets it:
        training never reads the cache, and a recomputed layer would append to it again),
        except in the configuration as given."""
        key = (samples, user)
        if key not in self._inputs:
            inputs = micro_batch_inputs(self.inputs, self.space.batch, samples or self.space.batch)
            if not user and self._cache_off:
                inputs = {**inputs, "use_cache": False}
            self._inputs[key] = inputs
        return self._inputs[key]

    def evaluate(self, config: Config, user: bool = False) -> Candidate | None:
        """The candidate of ``config`` (None when FSDP refuses it); each once."""
        config = self._float8_on_mesh(config)
        labels = tuple(config[k].label for k in KNOBS if k in config)
        if labels in self._seen:
            found = self._seen[labels]
            if found is not None and user:
                found.user = True
            return found
        self._seen[labels] = None
        key = (*self.trace_key(config), user and self._cache_off)
        kwargs = self.space.kwargs(config)
        inputs = self._micro_inputs(_samples(config), user and self._cache_off)
        traced = False
        try:
            if key in self._prefetched:
                self._prefetched.discard(key)
                traced = True
            traced = self._trace(key, config, inputs, kwargs, not user) or traced
            base = self._traces[key]
            if base is None:
                return None
            option = PRECISION_OPTION[self.api]
            policy = kwargs.get(option)
            own = same_precision(base, policy)
            if not own and not replays_precision(base, policy):
                # a precision the trace's plan cannot replay (units whose own precision
                # the report does not say): a trace of its own
                key = (*key, config["precision"].label)
                traced = self._trace(key, config, inputs, kwargs, False) or traced
                base, own = self._traces[key], True
                if base is None:
                    return None
            changes = self._replay_changes(config)
            if not own:
                changes.update(precision_kwargs(self.api, kwargs))
            if traced and own and changes["grad_accum"] == base.config.grad_accum:
                report = base
            else:
                report = replay(base, **changes)
                self.replay_count += not traced
        except FsdpvizError as e:
            if user:
                raise ConfigError(f"the configuration as given cannot be planned: {e}") from e
            self.notes.append(f"not evaluated ({', '.join(labels)}): {str(e).splitlines()[0]}")
            return None
        candidate = self._candidate(config, kwargs, inputs, report, traced, user)
        if traced:
            candidate.derived = self.derived_from.get(key, "")
        self._seen[labels] = candidate
        self._configs[candidate.index] = dict(config)
        return candidate

    def _trace(
        self,
        key: tuple[Any, ...],
        config: Config,
        inputs: Any,
        kwargs: TuneKwargs,
        align: bool = True,
    ) -> bool:
        """Trace ``key`` with ``config`` unless it is traced (or an earlier search's trace
        of it is taken: see :meth:`_reusable`), or derive it from two of its micro-batch
        family (``align``: traced with the family's lead's replayed knobs where that gives
        it a capture); whether ``config``'s plan is that trace."""
        if key in self._traces:
            return False
        same = self._reusable(key, config)
        if same is not None:
            self._traces[key] = self._reuse(key)
            return same
        family, samples = self._batch_family(key, config)
        # every n-th block checkpointed, from its siblings' traces (checkpoint_pairs)
        checkpointed = self._checkpoints.derive(
            key, config, lambda k, c: self._trace(k, c, inputs, self.space.kwargs(c), align)
        )
        if checkpointed is not None:
            self._traces[key] = checkpointed[0]
            self.made[key] = StoredTrace(*checkpointed)
            self.derived_from[key] = FROM_CHECKPOINT_PAIR
            return same_changes(checkpointed[1], self.traced_changes(config))
        if family is None:
            made = self._analyze(inputs, self._trace_kwargs(config, kwargs))
            self._traces[key] = made
            if made is not None:
                self.made[key] = StoredTrace(made, self.traced_changes(config))
            return True
        own = self.traced_changes(config)
        derived = self._batches.derived(family, samples)
        if derived is not None:
            made, changes = derived
            self.derived_from[key] = FROM_BATCH_FAMILY
        else:
            lead = self._batches.lead(family, samples) if align else None
            made_for, made = config, None
            if lead is not None:
                made_for = self._aligned(config, lead)
                try:
                    kw = self._trace_kwargs(made_for, self.space.kwargs(made_for))
                    made = self._analyze(inputs, kw, True)
                except FsdpvizError:  # FSDP refuses the lead's values here: its own trace
                    made_for = config
            if made_for is config:
                made = self._analyze(inputs, self._trace_kwargs(config, kwargs), True)
            changes = self.traced_changes(made_for)
            if made is not None:
                self._batches.traced(family, changes, made_for, samples, made)
        self._traces[key] = made
        if made is not None:
            self.made[key] = StoredTrace(made, changes)
        return same_changes(changes, own)

    def _batch_family(
        self, key: tuple[Any, ...], config: Config
    ) -> tuple[tuple[Any, ...] | None, int]:
        """``config``'s family of traces that differ in the micro-batch alone (its trace key
        but the micro-batch: see :mod:`fsdpviz.tuning.batch_families`) and the samples of its
        micro-batch; None where the micro-batch is not derived (a pipeline's, traced
        micro-steps)."""
        samples = _samples(config) or self.space.batch
        if self.space.pipelined or self._traces_accum(config) or samples < 1:
            return None, samples
        free = self.trace_key(config, any_batch=True)
        return (*free, *key[len(free) :]), samples

    def _aligned(self, config: Config, lead: Config) -> Config:
        """``config`` with ``lead``'s values of the replayed knobs (its trace then pairs
        with the lead's: see :mod:`fsdpviz.tuning.batch_families`)."""
        return {**config, **{k: lead[k] for k in REPLAYED[self.api] if k in lead}}

    def traced_changes(self, config: Config) -> TuneKwargs:
        """The keywords ``config``'s trace is made with that its trace key leaves out: the
        replayed knobs' and the precision policy's (its reduce dtype replays)."""
        out = self._replay_changes(config)
        del out["grad_accum"]
        out.update(precision_kwargs(self.api, self.space.kwargs(config)))
        return out

    def _reusable(self, key: tuple[Any, ...], config: Config) -> bool | None:
        """Whether an earlier search's trace of ``key`` is ``config``'s own trace (True:
        made with its replayed knobs), one it replays from (False), or neither (None: none,
        or a pipeline's, which does not replay; or one whose tensor parallelism's mm
        strategies were picked for other nodes than this machine's: :func:`on_machine`)."""
        stored = self.earlier.get(key)
        if stored is None or not holds_on_machine(stored.report, self.machine_arg):
            return None
        if same_changes(stored.changes, self.traced_changes(config)):
            return True
        report = stored.report
        return None if report.pipeline is not None or report.profile is None else False

    def _stored(self, key: tuple[Any, ...]) -> StoredTrace | None:
        return self.made.get(key) or self.earlier.get(key)

    def _reuse(self, key: tuple[Any, ...]) -> Report:
        """The earlier trace of ``key`` (see :meth:`_reusable`) on this search's machine."""
        self.reused_count += 1
        if self.bar is not None:
            self.bar.set_postfix_str(self._counts(), refresh=False)
        return on_machine(self.earlier[key].report, self.machine_arg)

    def _counts(self) -> str:
        reused = f", {self.reused_count} reused" if self.reused_count else ""
        count = len(self.derived_from)
        derived = f", {count} derived" if count else ""
        return f"{self.trace_count} traces{reused}{derived}"

    def _trace_kwargs(self, config: Config, kwargs: TuneKwargs) -> TuneKwargs:
        """The analyze keywords of ``config``'s trace (its accumulation is replayed)."""
        out = kwargs.copy()
        if not self._traces_accum(config):
            out.pop("grad_accum", None)
        return out

    def prefetch(self, configs: list[Config], user: Config | None = None) -> None:
        """Trace the configurations' keys not traced yet (and ``user``'s, the configuration
        as given) side by side in worker processes (forked: they have the model), for
        :meth:`evaluate` to use (a key a checkpoint pair derives left to it: see
        ``left_to_derive``); a trace failing in a worker is made again here when evaluated,
        so the errors and every number are this process's."""
        todo: dict[tuple[Any, ...], tuple[Config, bool]] = {}
        pairs = [(c, False) for c in configs] + ([(user, True)] if user is not None else [])
        for config, mine in pairs:
            config = self._float8_on_mesh(config)
            key = (*self.trace_key(config), mine and self._cache_off)
            if key not in todo and self.wanted(key, config):
                todo[key] = (config, mine)
        todo = self._checkpoints.left_to_derive(todo)
        if self._workers < 2 or len(todo) < 2 or (self._auto_workers and not self._slow_traces()):
            return
        jobs = [
            (
                self._micro_inputs(_samples(c), mine and self._cache_off),
                self._trace_kwargs(c, self.space.kwargs(c)),
                self._batch_family(key, c)[0] is not None,
            )
            for key, (c, mine) in todo.items()
        ]
        global _FORKED
        _FORKED = (self, jobs)
        try:
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(min(self._workers, len(jobs))) as pool:
                results = pool.map(_trace_job, range(len(jobs)), chunksize=1)
        except (OSError, ValueError, RuntimeError):
            return  # no workers here: each is traced when evaluated
        finally:
            _FORKED = None
        for (key, (config, _)), result in zip(todo.items(), results, strict=True):
            if result is not None:
                family, samples = self._batch_family(key, config)
                if family is not None:
                    changes = self.traced_changes(config)
                    self._batches.traced(family, changes, config, samples, result)
                self._traces[key] = result
                self.made[key] = StoredTrace(result, self.traced_changes(config))
                self._prefetched.add(key)
                self.trace_count += 1

    def trace_of(self, key: tuple[Any, ...]) -> StoredTrace | None:
        """This search's trace of ``key`` (taken from an earlier search's, or its own) and
        the keywords it is made with; None: none."""
        report, found = self._traces.get(key), self._stored(key)
        return None if report is None or found is None else StoredTrace(report, found.changes)

    def ahead(self, key: tuple[Any, ...], config: Config) -> bool:
        """Whether a checkpoint pair's sibling is traced ahead for ``key``: not where its
        micro-batch family derives it."""
        family, samples = self._batch_family(key, config)
        return family is None or self._batches.derivable(family, samples) is None

    def untraced(self, key: tuple[Any, ...], config: Config) -> TuneKwargs | None:
        """The keywords of the trace :meth:`_trace` takes for ``key`` without tracing it (an
        earlier search's, or derived from its micro-batch family); None: it traces it."""
        if self._reusable(key, config) is not None:
            return self.earlier[key].changes.copy()
        family, samples = self._batch_family(key, config)
        return None if family is None else self._batches.derivable(family, samples)

    def wanted(self, key: tuple[Any, ...], config: Config) -> bool:
        """Whether workers trace ``key``: not traced, reused, or left to its micro-batch family."""
        if key in self._traces or self._reusable(key, config) is not None:
            return False
        family, samples = self._batch_family(key, config)
        return family is None or self._batches.wanted(family, samples)

    def _slow_traces(self) -> bool:
        """Whether traces take long enough for workers to pay for their start (a second):
        as measured, or, before any, for a model of a billion parameters or more."""
        if self._trace_seconds:
            return sorted(self._trace_seconds)[len(self._trace_seconds) // 2] >= 1.0
        return sum(p.numel() for p in self.model.parameters()) >= 10**9

    def _analyze(self, inputs: Any, kwargs: TuneKwargs, moments: bool = False) -> Report | None:
        """A trace (``moments``: keeping its moments, for a capture of its micro-batch)."""
        self.trace_count += 1
        if self.bar is not None:
            self.bar.set_postfix_str(self._counts(), refresh=False)
        started = time.perf_counter()
        with recording_moments() if moments else contextlib.nullcontext():
            report = analyze(self.model, inputs, progress=False, machine=self.machine_arg, **kwargs)
        self._trace_seconds.append(time.perf_counter() - started)
        return report

    def _candidate(
        self,
        config: Config,
        kwargs: TuneKwargs,
        inputs: Any,
        report: Report,
        traced: bool,
        user: bool,
    ) -> Candidate:
        check_fit(report)
        mb = config["micro_batch"]
        mem = self._memory(report, mb.steps)
        tl = timeline(report, optimizer=self.optimizer, grad_accum=mb.steps or None)
        peak = int(mem.peak["bytes"])
        reserved = int(mem.reserved.get("bytes", 0))
        fits = mem.fits if self.budget is None else peak <= self.budget
        usable = mem.usable if self.budget is None else self.budget
        t = tl.totals
        knobs = {k: config[k].label for k in _SHOWN if k in config}
        samples = _samples(config)
        if samples and samples != mb.samples:  # a pipeline's batch at another pp degree
            knobs["micro_batch"] = micro_batch_label(samples, mb.micro_steps) + (
                ", each reduced" if mb.steps else ""
            )
        c = Candidate(
            knobs=knobs,
            kwargs=kwargs,
            inputs=inputs,
            report=report,
            fits=bool(fits),
            peak_bytes=peak,
            reserved_bytes=reserved,
            usable_bytes=int(usable),
            step_s=float(t["step_s"]),
            tokens_per_s=float(t["tokens_per_s"]),
            mfu=float(t["mfu"]),
            exposed_comm_s=float(t["exposed_comm_s"]),
            compute_s=float(t["compute_s"]),
            world_size=report.config.ranks,
            micro_batch=samples or self.space.batch,
            grad_accum=mb.micro_steps,
            sync_each=mb.steps > 1,
            dominant=str(mem.peak.get("dominant", "")),
            memory_bytes=peak if self.budget is not None else max(peak, reserved),
            traced=traced,
            user=user,
            index=len(self.candidates),
        )
        self.candidates.append(c)
        if self.bar is not None:
            self.bar.update(1)
        return c

    def _variants(self, config: Config) -> list[Config]:
        """``config`` under every choice of the replayed knobs (with tensor parallelism its
        mesh's other data-parallel layout alone, HSDP x TP or FSDP x TP of the same degree:
        the stages turn the tp degree, and its resharding at each tensor-parallel mesh's
        fastest),
        and its accumulation both ways (the gradients reduced after the last micro-step, or
        after each: one plan's, replayed with tensor parallelism too)."""
        mb = config["micro_batch"]
        ways = [
            c
            for c in self.space.choices["micro_batch"]
            if c.samples == mb.samples and c.micro_steps == mb.micro_steps
        ]
        configs = [{**config, "micro_batch": c} for c in ways] or [config]
        return [v for c in configs for v in self._replayed_variants(c)]

    def _replayed_variants(self, config: Config) -> list[Config]:
        """``config`` under every choice of the replayed knobs."""
        replayed = sorted(REPLAYED[self.api])
        mine = config["mesh"]
        if self.space.pipelined:  # a pipeline is never replayed: each is traced
            return [config]
        if mine.parallel_dims.tp > 1:  # its data-parallel layouts alone (see _variants)
            if mine.traced:
                return [config]
            ws, tp = mine.parallel_dims.world_size, mine.parallel_dims.tp
            layouts = [
                m
                for m in self.space.choices["mesh"]
                if m.parallel_dims.world_size == ws and m.parallel_dims.tp == tp and not m.traced
            ]
            return [{**config, "mesh": m} for m in layouts] or [config]
        options = []
        for knob in replayed:
            values = self.space.choices[knob]
            if knob == "mesh":
                plain = [c for c in values if c.parallel_dims.tp == 1 and not c.traced]
                values = [mine] if mine.traced else plain
            options.append(values)
        return [
            {**config, **dict(zip(replayed, combo, strict=True))}
            for combo in itertools.product(*options)
        ]

    def _tp_resharding(self) -> list[Choice]:
        """FSDP2's resharding choices on the tensor-parallel ``mesh``: no resharding to a node
        (an int), which FSDP2 refuses for the groups holding tensor-parallel DTensors
        (``FSDPParam.to_sharded_post_forward`` raises ``NotImplementedError``). The
        configuration as given keeps its own."""
        mine = self.space.user[RESHARD.name]
        out: list[Choice] = []
        for c in self.space.choices[RESHARD.name]:
            value = reshard_given(c.kwargs)
            if c == mine or isinstance(value, bool) or not isinstance(value, int):
                out.append(c)
        return out

    def on_mesh(self, config: Config, mesh: Choice) -> Config:
        """``config`` on ``mesh``, with the resharding as given where its own is not a
        choice there (to a node: another number of ranks on a tensor-parallel mesh)."""
        out = {**config, "mesh": mesh}
        if RESHARD.name in config and self.api == "FSDP2":
            tp = mesh.parallel_dims.tp > 1 and not mesh.traced
            offered = self._tp_resharding() if tp else self.space.choices[RESHARD.name]
            if config[RESHARD.name] not in offered:
                out[RESHARD.name] = self.space.user[RESHARD.name]
        return out

    def evaluate_key(self, config: Config) -> list[Candidate]:
        """``config`` (traced once) and every choice of the replayed knobs (replayed)."""
        out = []
        for variant in [config, *self._variants(config)]:
            c = self.evaluate(variant)
            if c is not None and c not in out:
                out.append(c)
        return out

    def _memory(self, report: Report, steps: int = 0) -> Any:
        """The memory model of ``report`` for this search's optimizer (``steps``: micro-steps
        of it per optimizer step, each reducing its gradients)."""
        if self.optimizer == "adamw" and steps <= 1:
            return report.memory
        return memory_model(report, optimizer=self.optimizer, grad_accum=steps or None)

    def _fastest_fit(self, world_size: int | None = None) -> Candidate | None:
        fitting = [
            c
            for c in self.candidates
            if c.fits and (world_size is None or c.world_size == world_size)
        ]
        return max(fitting, key=lambda c: c.tokens_per_s) if fitting else None

    def _config_of(self, c: Candidate) -> Config | None:
        return self._configs.get(c.index)


_SHOWN = (
    "mesh", "wrap", RESHARD.name, "backward_prefetch", "forward_prefetch",
    "activation_checkpointing", "precision", "micro_batch", "cpu_offload", "compile", "float8",
    "pipeline",
)  # fmt: skip


_FORKED: tuple[Evaluations, list[tuple[Any, TuneKwargs, bool]]] | None = None
"""What a forked worker traces: the evaluations (the model with them) and the jobs."""


def _trace_job(index: int) -> Report | None:
    """In a worker: trace job ``index`` (None where it fails: the parent traces it again)."""
    assert _FORKED is not None
    search, jobs = _FORKED
    inputs, kwargs, moments = jobs[index]
    try:
        with recording_moments() if moments else contextlib.nullcontext():
            return analyze(
                search.model, inputs, progress=False, machine=search.machine_arg, **kwargs
            )
    except Exception:
        return None


def _samples(config: Config) -> int:
    """The samples per forward of ``config`` (0: the inputs as given): a pipeline job's at
    its pp degree (one pipeline's batch), else its micro-batch's."""
    mesh = config.get("mesh")
    return (mesh.samples if mesh is not None else 0) or config["micro_batch"].samples
