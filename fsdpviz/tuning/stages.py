"""The search of ``fsdpviz.tune`` over the evaluations of one space, in stages (each trace
key once):

1. the user's configuration as given;
2. the usual units (one per block) in the standard precision (bf16 parameters, float32
   reduction, unless pinned), for each micro-batch from the largest: checkpointing from
   the lightest, stopping at the first that fits (heavier checkpointing only recomputes
   more); a smaller micro-batch tries only checkpointing lighter than what fitted the larger
   one, and not at all once the larger micro-batch was as fast without fitting (more
   micro-steps only add collectives) as the fastest fit found;
3. the other wrap plans (and FSDP1's forward prefetch) at the best trace key;
4. what ``allow=`` permits (compile, float8) at the best trace key;
5. when nothing fits: CPU offload, and how many ranks the lightest configuration needs.

``exhaustive=True`` evaluates every combination instead (slow: one trace per key).
"""

from __future__ import annotations

import itertools
from typing import Any

from torch import nn

from fsdpviz.cost.hardware import Machine
from fsdpviz.errors import FsdpvizError
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.replan.hook_replay import replay
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.mesh import ParallelDims
from fsdpviz.tuning.choices import SpaceBuilder
from fsdpviz.tuning.evaluation import Config, Evaluations
from fsdpviz.tuning.float8_styles import FLOAT8_TP
from fsdpviz.tuning.result import Candidate, Needs
from fsdpviz.tuning.retune import StoredTrace
from fsdpviz.tuning.space import KNOBS, NO_PIPELINE, REPLAYED, Choice, TuneKwargs, pinned_knobs

__all__ = ["StagedSearch"]


def c_usable(c: Candidate) -> int:
    """The memory a candidate may use (the machine's usable memory, or the budget)."""
    return c.usable_bytes


class StagedSearch(Evaluations):
    """The staged search (see the module docstring) over the evaluations of one space."""

    def __init__(
        self,
        model: nn.Module,
        inputs: Any,
        api: str,
        user_kwargs: TuneKwargs,
        fixed: dict[str, Any],
        allowed: set[str],
        turned: set[str],
        world_sizes: list[int],
        machine: Machine,
        machine_arg: Machine | str,
        tokens_per_step: int | None,
        optimizer: str | int | None,
        budget: int | None,
        progress: bool | None,
        source: str = "",
        workers: int = 1,
        earlier: dict[tuple[Any, ...], StoredTrace] | None = None,
    ) -> None:
        builder = SpaceBuilder(model, inputs, api, machine, world_sizes, allowed, fixed, source)
        pinned = pinned_knobs(list(fixed), api) | (set(KNOBS) - turned)
        space = builder.build(user_kwargs, pinned, tokens_per_step)
        super().__init__(model, inputs, space, machine_arg, optimizer, budget, workers, earlier)
        self.notes = builder.notes + self.notes
        self.machine = machine
        self.allowed = allowed
        self.world_sizes = world_sizes
        self.needs: Needs | None = None
        self._source = source
        self._tp_why = builder.tp_why
        self._tp_standard = builder.tp_standard
        self._progress = progress
        self.user: Candidate = None  # type: ignore[assignment]

    def run(self, exhaustive: bool) -> None:
        # at use: in a notebook tqdm.auto loads ipywidgets, and a search may show no bar
        from tqdm.auto import tqdm

        enabled = self._progress
        self.bar = (
            None
            if enabled is False
            else tqdm(desc="fsdpviz tune", unit="config", delay=0 if enabled else 1.0, leave=False)
        )
        try:
            if not exhaustive:
                self.prefetch([self._first_lightest()], user=dict(self.space.user))
            user = self.evaluate(dict(self.space.user), user=True)
            assert user is not None
            self.user = user
            self.evaluate_key(dict(self.space.user))
            if exhaustive:
                self._exhaustive()
            else:
                self._staged()
            self._needs()
        finally:
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    def _exhaustive(self) -> None:
        traced = [k for k in KNOBS if k in self.space.choices and k not in REPLAYED[self.api]]
        for combo in itertools.product(*(self.space.choices[k] for k in traced)):
            config = {**self.space.user, **dict(zip(traced, combo, strict=True))}
            self.evaluate_key(config)

    def _start(self) -> Config:
        sp = self.space
        config = dict(sp.user)
        for knob in ("wrap", "precision", "activation_checkpointing", "micro_batch"):
            if knob not in sp.pinned:
                config[knob] = sp.choices[knob][0]
        for knob in ("cpu_offload", "compile", "float8", "forward_prefetch"):
            if knob in sp.choices and knob not in sp.pinned:
                config[knob] = sp.user[knob]
        return config

    def _staged(self) -> None:
        for ws in self.world_sizes:
            self._stages(ws)
        sp = self.space
        if "cpu_offload" in sp.pinned:
            return
        offload = sp.choices["cpu_offload"][-1]
        best = self._best_traced(self._start())
        if self._fastest_fit() is None:  # CPU offload: the last resort
            lightest = min(self.candidates, key=lambda c: c.memory_bytes)
            config = self._config_of(lightest)
            if config is not None and config["cpu_offload"].label != offload.label:
                self.evaluate_key({**config, "cpu_offload": offload})
        elif "cpu_offload" in self.allowed and best["cpu_offload"].label != offload.label:
            self.evaluate_key({**best, "cpu_offload": offload})

    def _stages(self, ws: int) -> None:
        """The search on ``ws`` ranks (the meshes of other world sizes come with each trace,
        replayed)."""
        sp = self.space
        start = self._start()
        user_tp = sp.user["mesh"].parallel_dims.tp
        mine = self._user_tp_meshes(ws)
        if not mine:
            return
        start["mesh"] = mine[0]
        self._climb(start, ws)
        if sp.pipelined:  # the other schedules and pp degrees, each climbed
            pairs = self._pipeline_pairs(start)
            self.prefetch([self._lightest({**start, **pair}) for pair in pairs])
            for pair in pairs:
                self._climb({**start, **pair}, ws)
            if RESHARD.name not in sp.pinned:  # traced, as nothing replays there
                best = self._best_traced(start, ws)
                raf = [
                    {**best, RESHARD.name: c}
                    for c in sp.choices[RESHARD.name]
                    if c.label != best[RESHARD.name].label
                ]
                self.prefetch(raf)
                for config in raf:
                    self.evaluate_key(config)
        if self._state_too_big(ws):
            note = (
                f"on {ws} ranks the sharded parameters, gradients and optimizer state alone "
                "exceed the memory: no units, checkpointing or tensor parallelism can fit it"
            )
            self.notes.append(note)
            return
        # the other wrap plans: at the best trace key, or climbing each where the usual
        # units fit nowhere; then FSDP1's forward prefetch and what allow= permits
        if "wrap" not in sp.pinned:
            fitted = self._fastest_fit(ws) is not None
            best = self._best_traced(start, ws)
            others = [c for c in sp.choices["wrap"] if c.label != start["wrap"].label]
            if len(others) > 1:
                others = [c for c in others if c.label != "the root alone"]
            if fitted and self._units_cannot_matter(best, ws):
                others = []
            if fitted:
                self.prefetch([{**best, "wrap": choice} for choice in others])
            else:
                self.prefetch([self._lightest({**start, "wrap": choice}) for choice in others])
            for choice in others:
                if fitted:
                    self.evaluate_key({**best, "wrap": choice})
                else:
                    self._climb({**start, "wrap": choice}, ws)
        best = self._best_traced(start, ws)
        for knob in ("forward_prefetch", "compile", "float8"):
            if knob not in sp.choices or knob in sp.pinned:
                continue
            # torchao's float8 TP styles beside the user's plan: the same job off TP meshes
            tp = best["mesh"].parallel_dims.tp > 1
            tried = [
                c
                for c in sp.choices[knob]
                if c.label != best[knob].label and (tp or not c.label.endswith(FLOAT8_TP))
            ]
            self.prefetch([{**best, knob: c} for c in tried])
            for choice in tried:
                self.evaluate_key({**best, knob: choice})
            best = self._best_traced(best, ws)
        # tensor parallelism: where nothing fits without it, or the user plans with it
        tp_meshes = [  # FSDP x TP: each evaluation replays HSDP x TP beside it (_variants)
            m
            for m in sp.choices["mesh"]
            if m.parallel_dims.world_size == ws
            and m.parallel_dims.tp not in (1, user_tp)
            and not m.parallel_dims.hsdp
        ]
        if user_tp > 1:  # and plain data parallelism, against the user's tensor parallelism
            tp_meshes[:0] = [
                m for m in sp.choices["mesh"] if m.parallel_dims == ParallelDims.filled(ws)
            ]
        if "mesh" not in sp.pinned and (self._fastest_fit(ws) is None or user_tp > 1):
            if not tp_meshes and self._fastest_fit(ws) is None and self._tp_why:
                note = f"tensor parallelism not tried: {self._tp_why}"
                if note not in self.notes:
                    self.notes.append(note)
            ordered = sorted(tp_meshes, key=lambda m: m.parallel_dims.tp)
            self.prefetch([self._lightest(self.on_mesh(best, mesh)) for mesh in ordered])
            for mesh in ordered:
                self._climb(self.on_mesh(best, mesh), ws)
            if self._tp_standard and any(c.report.config.tp_world_size for c in self.candidates):
                note = (
                    "tensor parallelism with the model's own plan "
                    f"({'torchtitan' if self._source == 'torchtitan' else 'its config'}'s)"
                )
                if note not in self.notes:
                    self.notes.append(note)
        self._float8_tp_stage(ws)
        self._tp_resharding_stage(ws)

    def _float8_tp_stage(self, ws: int) -> None:
        """torchao's float8 TP styles beside the user's plan (the float8 choices named
        :data:`FLOAT8_TP`) at each tensor-parallel mesh's fastest configuration on ``ws``
        ranks, where its float8 recipe has such a twin: the float8 stage tries them only
        at a tensor-parallel best (elsewhere they are the same job)."""
        sp = self.space
        if "float8" not in sp.choices or "float8" in sp.pinned:
            return
        twins = {c.label: c for c in sp.choices["float8"] if c.label.endswith(FLOAT8_TP)}
        if not twins:
            return
        fastest: dict[str, tuple[Candidate, Config]] = {}
        for c in self.candidates:
            config = self._config_of(c)
            if config is None or c.world_size != ws or config["mesh"].parallel_dims.tp == 1:
                continue
            label = config["mesh"].label
            if label not in fastest or c.tokens_per_s > fastest[label][0].tokens_per_s:
                fastest[label] = (c, config)
        for _, config in fastest.values():
            twin = twins.get(f"{config['float8'].label}, {FLOAT8_TP}")
            if twin is not None:
                self.evaluate_key({**config, "float8": twin})

    def _tp_resharding_stage(self, ws: int) -> None:
        """Each tensor-parallel mesh's fastest fit on ``ws`` ranks under FSDP2's other
        resharding choices there (replayed: the tp degree kept; a replay at each
        configuration of the climb would cost as much as its traces)."""
        sp = self.space
        if self.api != "FSDP2" or RESHARD.name in sp.pinned or sp.pipelined:
            return
        fastest: dict[str, tuple[Candidate, Config]] = {}
        for c in self.candidates:
            config = self._config_of(c)
            if config is None or not c.fits or c.world_size != ws:
                continue
            mesh = config["mesh"]
            if mesh.parallel_dims.tp == 1 or mesh.traced:
                continue
            if mesh.label not in fastest or c.tokens_per_s > fastest[mesh.label][0].tokens_per_s:
                fastest[mesh.label] = (c, config)
        for _, config in fastest.values():
            for choice in self._tp_resharding():
                if choice.label != config[RESHARD.name].label:
                    self.evaluate_key({**config, RESHARD.name: choice})

    def _pipeline_pairs(self, start: Config) -> list[Config]:
        """A pipeline job's other (mesh, schedule) pairs: the other schedules on its mesh,
        then each schedule on each other pp degree that takes it (pp 1: no pipeline)."""
        sp = self.space
        schedules = sp.choices["pipeline"]
        out: list[Config] = []
        for mesh in sp.choices["mesh"]:
            if mesh.pp == 1:
                out.append({"mesh": mesh, "pipeline": Choice("pipeline", NO_PIPELINE)})
                continue
            for choice in schedules:
                same = mesh.label == start["mesh"].label and choice.label == start["pipeline"].label
                if not same and (mesh.label, choice.label) not in sp.refused:
                    out.append({"mesh": mesh, "pipeline": choice})
        return out

    def _units_cannot_matter(self, best: Config, ws: int) -> bool:
        """Whether no other wrap plan can beat the best on ``ws`` ranks: units change the
        communication and the unsharded parameters and gradients, not the compute; so not
        where the best's step waits for communication less than 1% of it, and the lighter
        checkpointing at its micro-batch needs more memory than the units of the best could
        give back (three times its largest unit unsharded: its parameters, a prefetched
        unit's, its gradients)."""
        fastest = self._fastest_fit(ws)
        if fastest is None or fastest.exposed_comm_s > 0.01 * fastest.step_s:
            return False
        acs = self.space.choices["activation_checkpointing"]
        mine = (
            acs.index(best["activation_checkpointing"])
            if best["activation_checkpointing"] in acs
            else 0
        )
        largest = max((u.bytes for u in fastest.report.units), default=0)
        for ac in acs[:mine]:
            lighter = [
                c
                for c in self.candidates
                if c.world_size == ws
                and c.knobs["activation_checkpointing"] == ac.label
                and c.micro_batch == fastest.micro_batch
                and c.knobs["precision"] == fastest.knobs["precision"]
            ]
            if not lighter or min(c.memory_bytes for c in lighter) - 3 * largest <= c_usable(
                fastest
            ):
                return False
        self.notes.append(
            f"the other wrap plans were not evaluated on {ws} ranks: the best waits "
            f"{fastest.exposed_comm_s / fastest.step_s:.1%} of its step for communication, and "
            "no lighter checkpointing could fit with the memory other units would give back"
        )
        return True

    def _state_too_big(self, ws: int) -> bool:
        """Whether, on ``ws`` ranks, what every rank holds of the sharded state (parameters,
        gradients and optimizer state: the whole state over the ranks, whatever the mesh)
        is already more than the memory, in the lightest configuration evaluated."""
        if self._fastest_fit(ws) is not None:
            return False
        mine = [c for c in self.candidates if c.world_size == ws and not c.user]
        if not mine:
            return False
        keys = ("sharded_params", "sharded_grads", "optimizer")

        def state(c: Candidate) -> int:
            mem = self._memory(c.report)
            return sum(int(mem.peak.get("breakdown", {}).get(k, 0)) for k in keys)

        least = min(mine, key=state)
        return state(least) > least.usable_bytes

    def _lightest(self, start: Config) -> Config:
        """``start`` at its first lightest: the largest micro-batch, the most checkpointing."""
        sp = self.space
        return {
            **start,
            "micro_batch": sp.choices["micro_batch"][0],
            "activation_checkpointing": sp.choices["activation_checkpointing"][-1],
        }

    def _first_lightest(self) -> Config:
        """The first configuration the staged search evaluates after the user's."""
        start = self._start()
        mine = self._user_tp_meshes(self.world_sizes[0])
        if mine:
            start["mesh"] = mine[0]
        return self._lightest(start)

    def _user_tp_meshes(self, ws: int) -> list[Choice]:
        """The meshes on ``ws`` ranks of the user's tensor-parallel degree."""
        tp = self.space.user["mesh"].parallel_dims.tp
        return [
            m
            for m in self.space.choices["mesh"]
            if m.parallel_dims.world_size == ws and m.parallel_dims.tp == tp
        ]

    def _climb(self, start: Config, ws: int) -> None:
        """From the lightest configurations (the most checkpointing; if they do not fit on
        ``ws`` ranks, nothing with the other knobs of ``start`` does) to the fastest: each
        micro-batch from the largest, checkpointing from the lightest until one fits on
        ``ws`` ranks."""
        sp = self.space
        acs = sp.choices["activation_checkpointing"]
        # one per size: each evaluation gives both ways to accumulate (see _variants)
        mbs = [c for c in sp.choices["micro_batch"] if not c.steps] or sp.choices["micro_batch"]

        def fits(found: list[Candidate]) -> bool:
            return any(c.fits and c.world_size == ws for c in found)

        # The least memory is at the most checkpointing, and at the largest micro-batch (no
        # accumulation: no unsharded gradients kept between micro-steps) or the smallest
        # (the fewest activations): if neither fits, nothing with these knobs does.
        heaviest = acs[-1]
        if not any(
            fits(
                self.evaluate_key(
                    {**start, "micro_batch": mb, "activation_checkpointing": heaviest}
                )
            )
            for mb in dict.fromkeys([mbs[0], mbs[-1]])
        ):
            return
        lightest_fit: int | None = None
        fastest_at: dict[int, float] = {}  # checkpointing index -> fastest at a larger mb
        for mb in mbs:
            limit = len(acs) if lightest_fit is None else lightest_fit
            fitted = None
            for i, ac in enumerate(acs[:limit]):
                fastest = self._fastest_fit(ws)
                bound = fastest_at.get(i)
                if fastest is not None and bound is not None and bound <= fastest.tokens_per_s:
                    continue  # a smaller micro-batch is no faster than this one was
                found = self.evaluate_key(
                    {**start, "micro_batch": mb, "activation_checkpointing": ac}
                )
                mine = [c for c in found if c.world_size == ws]
                if mine:
                    fastest_at[i] = max(c.tokens_per_s for c in mine)
                if fits(found):
                    fitted = i
                    break
            if fitted is not None:
                lightest_fit = fitted if lightest_fit is None else min(lightest_fit, fitted)
            if lightest_fit == 0:
                break

    def _best_traced(self, fallback: Config, world_size: int | None = None) -> Config:
        """The configuration of the fastest fit so far on ``world_size`` ranks (any: None),
        else of the lowest peak."""
        best = self._fastest_fit(world_size)
        pool = [c for c in self.candidates if world_size is None or c.world_size == world_size]
        if best is None and pool:
            best = min(pool, key=lambda c: c.memory_bytes)
        if best is None:
            return fallback
        return self._config_of(best) or fallback

    def _needs(self) -> None:
        """When nothing fits: how many ranks the lowest peak needs to fit (its sharded state
        shrinks with them), or why more ranks do not help."""
        if self._fastest_fit() is not None or not self.candidates:
            return
        lightest = min(self.candidates, key=lambda c: c.memory_bytes)
        needs: Needs = {
            "candidate": lightest.index, "world_size": None, "peak_bytes": None, "reason": ""
        }  # fmt: skip
        self.needs = needs
        report = lightest.report
        if report.config.tp_world_size or report.config.mesh is not None:
            needs["reason"] = "how many ranks would fit is not worked out for a 2-D mesh"
            return
        ws, low = lightest.world_size, lightest.peak_bytes
        while ws < 1 << 16:
            ws *= 2
            changes: TuneKwargs = {"world_size": ws}
            if report.config.api == "FSDP2":
                changes["mesh"] = None
            try:
                other = replay(report, **changes)
            except FsdpvizError as e:
                needs["reason"] = str(e).splitlines()[0]
                return
            mem = self._memory(other, lightest.grad_accum if lightest.sync_each else 0)
            peak = int(mem.peak["bytes"])
            if mem.fits if self.budget is None else peak <= self.budget:
                needs.update({"world_size": ws, "peak_bytes": peak})
                return
            if peak >= low:  # the sharded state no longer shrinks what the peak holds
                break
            low = peak
        breakdown = lightest.report.memory.peak.get("breakdown", {})
        per_rank = sum(
            v
            for k, v in breakdown.items()
            if k not in ("sharded_params", "sharded_grads", "optimizer")
        )
        needs["reason"] = (
            f"more ranks do not make it fit: {size_text(per_rank)} of its peak (activations, "
            "unsharded parameters and gradients, buffers) does not shrink with the ranks; "
            "a smaller micro-batch or sequence, or more checkpointing, would"
        )
