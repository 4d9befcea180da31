"""Record what a real pipeline-parallel run (``torch.distributed.pipelining`` over FSDP2
model parts) does on this rank.

A :class:`PipelineRecorder` records FSDP's events as :class:`FSDP2Recorder` does, for every
model part (stage) the rank holds, and tags each with the pipeline action that issued it:
the stage, the microbatch and the action as torch writes it (``0F1``, ``2B0``,
``1UNSHARD``, ``0REDUCE_GRAD``). It also records the actions in the order the schedule runs
them (``actions``, one list per ``schedule.step()``), and the sends and receives of
activations and gradients between stages (events ``pp_send`` / ``pp_recv`` with their
bytes). The events of the first step's shape inference (``PipelineStage`` runs each stage's
forward, and each stage's backward to its inputs, before the first action) carry their
stage and no action.

An iteration is one ``schedule.step()`` (FSDP's final callback runs after every
microbatch's backward there). Multi-stage schedules (``Interleaved1F1B``, ...) run their
lowered action lists, whose order the recorder reads as torch's runtime goes through it;
single-stage ones (``GPipe``, ``1F1B``) call the stage's forward and backward directly, and
the recorder names those calls as the actions they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar

from torch import nn

from fsdpviz.recording._events import patch
from fsdpviz.recording._fsdp2 import FSDP2Recorder
from fsdpviz.schema.events import Event
from fsdpviz.schema.pipeline import Pipeline, Stage, stage_root
from fsdpviz.schema.report import Report

P = ParamSpec("P")
R = TypeVar("R")

_OPS = {  # the stage's p2p ops -> (kind, phase, torch's action name)
    "get_fwd_recv_ops": ("pp_recv", "forward", "RECV_F"),
    "get_fwd_send_ops": ("pp_send", "forward", "SEND_F"),
    "get_bwd_recv_ops": ("pp_recv", "backward", "RECV_B"),
    "get_bwd_send_ops": ("pp_send", "backward", "SEND_B"),
}


def pipeline_stages(schedule: Any) -> list[Any]:
    """The stages a schedule runs on this rank (one for GPipe and 1F1B)."""
    stages = getattr(schedule, "_stages", None)
    return list(stages) if stages is not None else [schedule._stage]


class PipelineRecorder(FSDP2Recorder):
    """Records FSDP2 inside ``torch.distributed.pipelining`` on this rank.

    Example::

        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=4, loss_fn=loss_fn)
        with fsdpviz.PipelineRecorder(schedule) as rec:
            for _ in range(2):
                schedule.step(tokens, target=labels)   # on the first stage's rank
        report = rec.report()   # rec.actions: the actions of each step
    """

    def __init__(self, schedule: Any, *, timestamps: bool = False) -> None:
        # lazy: private torch API, looked up at use
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

        self.schedule = schedule
        self.stages = pipeline_stages(schedule)
        super().__init__([stage.submod for stage in self.stages], timestamps=timestamps)
        # each stage's root (the model's root, "") named as fsdpviz names it: its stage's
        self._roots: dict[int, str] = {}
        for stage in self.stages:
            state = stage.submod._get_fsdp_state()
            name = self._roots[id(stage.submod)] = stage_root(int(stage.stage_index))
            if self._state_names[id(state)] != "":  # a grouped call: named by its members
                continue
            self._state_names[id(state)] = name
            if state._fsdp_param_group is not None:
                self._group_names[id(state._fsdp_param_group)] = name
        # multi-stage schedules run a lowered action list; single-stage ones call the stage
        self._runtime = isinstance(schedule, _PipelineScheduleRuntime)
        self.actions: list[list[str]] = []
        self._actions: list[str] = []
        self._stage: int | None = None
        self._microbatch: int | None = None
        self._action: str | None = None
        self._p2p: dict[int, tuple[str, str, int, int, str, int]] = {}
        self._overlap = False  # inside an OVERLAP_F_B action

    def __enter__(self) -> PipelineRecorder:
        from torch.distributed.pipelining import schedules  # lazy: 0.6 s, for pipelines only

        super().__enter__()
        stack = self._stack
        assert stack is not None  # set by FSDP2Recorder.__enter__
        try:
            name = schedules._get_profiler_function_name
            patch(stack, schedules, "_get_profiler_function_name", self._wrap_name(name))
            patch(stack, schedules, "_batch_p2p", self._wrap_p2p(schedules._batch_p2p))
            _patch_instance(stack, self.schedule, "step", self._wrap_step(self.schedule.step))
            for stage in self.stages:
                self._patch_stage(stack, stage)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    # ---------------------------------------------------------------- context
    def _begin(
        self, stage: int | None, microbatch: int | None, action: str | None, listed: bool = True
    ) -> None:
        """An action starts (or a stage's shape inference, ``action`` None); ``listed``: it
        is one of the step's actions (not one of an ``OVERLAP_F_B``'s)."""
        self._stage, self._microbatch, self._action = stage, microbatch, action
        self._hook = None  # UNSHARD, RESHARD and shape inference's reshard run in no hook
        if action is not None and listed:
            self._actions.append(action)

    @contextmanager
    def _within(
        self, stage: int | None, microbatch: int | None, action: str | None, listed: bool = True
    ) -> Iterator[None]:
        saved = self._stage, self._microbatch, self._action
        self._begin(stage, microbatch, action, listed)
        try:
            yield
        finally:
            self._stage, self._microbatch, self._action = saved

    def _append(self, event: Event) -> int:
        if event.stage is None and self._stage is not None:
            event = replace(
                event, stage=self._stage, microbatch=self._microbatch, action=self._action
            )
        return super()._append(event)

    def _precomputed(self, part: int, tensor: Any) -> Event:
        """A model part's precomputation of float8 scales after the optimizer step: its
        stage's (torchtitan calls it on each model part, in the rank's stage order)."""
        event = super()._precomputed(part, tensor)
        return replace(event, stage=int(self.stages[part].stage_index))

    def _final_callback_ran(self) -> None:
        """Under pipeline parallelism FSDP's final callback ends each microbatch's backward;
        the step ends when ``schedule.step()`` returns."""

    # --------------------------------------------------------------- wrappers
    def _wrap_step(self, original: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(original)
        def step(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return original(*args, **kwargs)
            finally:
                self._stage = self._microbatch = self._action = None
                self.actions.append(self._actions)
                self._actions = []
                self._end_iteration()

        return step

    def _wrap_name(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``_get_profiler_function_name``: the runtime names each action before running it."""

        def name(action: Any) -> Any:
            if action.sub_actions is not None:  # OVERLAP_F_B: the stage names each of its own
                self._begin(None, None, None)
                self._actions.append(str(action))
                self._overlap = True
            else:
                self._begin(action.stage_index, action.microbatch_index, str(action))
                self._overlap = False
            return original(action)

        return name

    def _patch_stage(self, stack: ExitStack, stage: Any) -> None:
        s = stage.stage_index

        def compute(method: str, letter: Callable[..., str]) -> None:
            original = getattr(stage, method)

            @functools.wraps(original)
            def run(mb: int, *args: Any, **kwargs: Any) -> Any:
                if self._runtime and not self._overlap:  # the runtime named the action
                    return original(mb, *args, **kwargs)
                with self._within(s, mb, f"{s}{letter(kwargs)}{mb}", not self._runtime):
                    return original(mb, *args, **kwargs)

            _patch_instance(stack, stage, method, run)

        compute("forward_one_chunk", lambda kw: "F")
        compute("backward_one_chunk", lambda kw: "B" if kw.get("full_backward", True) else "I")
        compute("backward_weight_one_chunk", lambda kw: "W")
        reduce = stage.perform_reduce_grad

        @functools.wraps(reduce)
        def perform_reduce_grad(*args: Any, **kwargs: Any) -> Any:
            if self._runtime:
                return reduce(*args, **kwargs)
            with self._within(s, None, f"{s}REDUCE_GRAD"):
                return reduce(*args, **kwargs)

        _patch_instance(stack, stage, "perform_reduce_grad", perform_reduce_grad)
        for method in ("_prepare_forward_infra", "_prepare_backward_infra",
                       "_post_metadata_inference_cleanup"):  # fmt: skip
            original = getattr(stage, method)

            def inference(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                with self._within(s, None, None):
                    return _original(*args, **kwargs)

            _patch_instance(stack, stage, method, inference)
        for method, (kind, phase, name) in _OPS.items():
            original = getattr(stage, method)

            def ops(mb: int, _original: Any = original, _what: Any = (kind, phase, name)) -> Any:
                result = _original(mb)
                for op in result:
                    nbytes = op.tensor.numel() * op.tensor.element_size()
                    self._p2p[id(op)] = (_what[0], _what[1], s, mb, f"{s}{_what[2]}{mb}", nbytes)
                return result

            _patch_instance(stack, stage, method, ops)

    def _wrap_p2p(
        self, original: Callable[Concatenate[list[Any], P], R]
    ) -> Callable[Concatenate[list[Any], P], R]:
        """``_batch_p2p``: the sends and receives the schedule fires, in order."""

        @functools.wraps(original)
        def batch_p2p(p2p_ops: list[Any], /, *args: P.args, **kwargs: P.kwargs) -> R:
            fired: dict[str, list[Any]] = {}
            for op in p2p_ops:
                tag = self._p2p.pop(id(op), None)
                if tag is None:
                    continue
                if tag[4] in fired:
                    fired[tag[4]][5] += tag[5]
                else:
                    fired[tag[4]] = list(tag)
            for kind, phase, stage, mb, action, nbytes in fired.values():
                if not self._runtime:
                    self._actions.append(action)
                event = Event(kind, "", phase, group="pp", nbytes=nbytes, stage=stage,
                              microbatch=mb, action=action)  # fmt: skip
                self._append(event)
            return original(p2p_ops, *args, **kwargs)

        return batch_p2p

    def report(self, config: dict[str, Any] | None = None) -> Report:
        """The recording as a report, with the pipeline it ran in (``report.pipeline``: this
        rank's stages and the actions of its last step; ``self.actions`` has every step's)."""
        report = super().report(config)
        first = self.stages[0]
        rank = int(first.group_rank)
        units = {
            id(part): [u.module or self._roots[id(part)] for u in FSDP2Recorder(part).units()]
            for part in self.parts
        }
        report.pipeline = Pipeline(
            schedule=type(self.schedule).__name__.removeprefix("Schedule"),
            microbatches=int(self.schedule._n_microbatches),
            pp_size=int(first.group_size),
            stages=[
                Stage(int(st.stage_index), rank, stage_modules(st.submod), units[id(st.submod)])
                for st in self.stages
            ],
            actions={rank: list(self.actions[-1])} if self.actions else {},
            rank=rank,
        )
        return report


def stage_modules(part: nn.Module) -> list[str]:
    """The modules a model part holds, as torchtitan's ``module_fqns_per_model_part`` names
    them: its children, each entry of a ``ModuleDict`` / ``ModuleList`` child (``layers.3``)."""
    out: list[str] = []
    for name, child in part.named_children():
        if isinstance(child, (nn.ModuleDict, nn.ModuleList)):
            out.extend(f"{name}.{key}" for key, _ in child.named_children())
        elif child is not None:
            out.append(name)
    return out


def _patch_instance(stack: ExitStack, owner: Any, name: str, value: Any) -> None:
    """An instance attribute over the class's method, removed on exit."""
    had = name in owner.__dict__
    original = owner.__dict__.get(name)
    setattr(owner, name, value)
    if had:
        stack.callback(setattr, owner, name, original)
    else:
        stack.callback(owner.__dict__.pop, name, None)
