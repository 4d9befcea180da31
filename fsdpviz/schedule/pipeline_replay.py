"""A pipeline rank's step: its stages' traced hook calls replayed action by action.

:class:`RankRun` gives each of the rank's stages a fresh :class:`FSDP2Runtime` and runs the
rank's actions (:mod:`fsdpviz.schedule.pipeline_order`) on them with what
``PipelineStage`` does around FSDP2's hooks (see :mod:`fsdpviz.schedule.pipeline`): each
step as its hook calls (:class:`~fsdpviz.schedule.pipeline_profile.Call`), the first
starting with the shape inference.
"""

from __future__ import annotations

from fsdpviz.errors import FSDPConfigError
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.pipeline import PipelineOptions
from fsdpviz.schedule.fsdp2_emulation import fsdp2_runtime
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime, Sharded
from fsdpviz.schedule.pipeline_order import parse_action
from fsdpviz.schedule.pipeline_profile import Call
from fsdpviz.schedule.pipeline_trace import Log, StageTrace
from fsdpviz.schema.events import Event
from fsdpviz.schema.pipeline import stage_root


class RankRun:
    """One pipeline rank's stages, each with its own FSDP2 runtime, run action by action;
    each step as its hook calls (:class:`~fsdpviz.schedule.pipeline_profile.Call`)."""

    def __init__(self, opts: PipelineOptions, traces: list[StageTrace], rank: int) -> None:
        self.opts = opts
        self.traces = traces
        self.stages = opts.stages_of(rank)
        self.runtimes = {
            s: fsdp2_runtime(traces[s].part, traces[s].groups, traces[s].opts) for s in self.stages
        }
        self.unshard_pending: set[int] = set()
        # zero-bubble: the groups of a microbatch's I whose parameters were not unsharded
        # when it began, whose W then computes no gradient (see :meth:`action`)
        self.weightless: dict[tuple[int, int | None], set[str]] = {}
        # groups whose REDUCE_GRAD found no gradient of any microbatch (the last step's):
        # FSDP2 reduce-scatters nothing of them and the optimizer keeps no state for them
        self.never_reduced: set[str] = set()
        self.gradless: set[str] = set()  # groups some microbatch's W gave no gradient so
        self.input_calls: dict[tuple[int, int | None], list[Call]] = {}  # I's, until its W
        self.rank = rank
        self.last_forward: dict[int, str] = {}  # by stage, its latest F action
        # by stage, the groups reducing in another dtype whose parameters hold the .grad a W
        # left: the next W adds into it, unless a backward's post-backward moved it into
        # FSDP2's reduce-dtype copy first (to_accumulated_grad_if_needed)
        self.grad_left: dict[int, set[str]] = {s: set() for s in self.stages}
        self.upcast = {
            g.name
            for s in self.stages
            for g in traces[s].groups
            if g.schema is not None
            and g.schema.reduce_dtype not in (None, g.schema.compute_dtype)
            and g.schema.compute_dtype is not None
        }

    def _replay(self, s: int, log: Log, first: int, part: str, mb: int | None) -> list[Call]:
        """``log`` (the stage trace's hook calls from index ``first``) replayed, call by call."""
        rt = self.runtimes[s]
        calls: list[Call] = []
        for j, (name, i, arg) in enumerate(log):
            rt.replay([(name, i, arg)])
            unit = rt.states[i].group.name if i < len(rt.states) else ""
            calls.append(Call(name, unit, arg, rt.take_events(), s, first + j, mb, part))
        return calls

    def _mark(self, s: int, mb: int | None) -> Call:
        """The end of the stage's forward (the last stage: its loss), a mark of its trace."""
        k = len(self.traces[s].forward)
        return Call("pipeline", "", "forward_end", [], s, k, mb, "F")

    def shape_inference(self) -> list[Call]:
        """``PipelineStage``'s metadata inference in the first step (see the module doc)."""
        calls: list[Call] = []
        for s in self.stages:
            self.runtimes[s].tag = {"stage": s}
            calls += self._replay(s, self.traces[s].forward, 0, "F", None)
            calls.append(self._mark(s, None))
        for s in reversed(self.stages):
            t = self.traces[s]
            if t.inputs_need_grad:  # autograd.grad to the inputs: no parameter gradient
                calls += self._replay(s, _without_grads(t.backward), len(t.forward) + 1, "B", None)
        for s in self.stages:
            self.runtimes[s].reshard_all()
            calls.append(Call("pipeline", "", "RESHARD", self.runtimes[s].take_events(), s))
        return calls

    def step(self, actions: list[str], optimizer: bool = True) -> list[Call]:
        """One ``schedule.step()``; ``optimizer``: the optimizer steps after it (the last
        micro-step of gradient accumulation), and with it torchao's
        ``precompute_float8_dynamic_scale_for_fsdp`` on each model part (torchtitan's
        ``Float8Converter.post_optimizer_hook``), in the rank's stage order: each stage's
        float8 weights' amaxes in one all-reduce over its shard group (see
        :meth:`FSDP2Runtime.optimizer_step`)."""
        calls: list[Call] = []
        for action in actions:
            for sub in parse_action(action):  # OVERLAP_F_B (DualPipeV): its actions in order
                calls += self.action(*sub)
        for s in self.stages if optimizer else ():
            rt = self.runtimes[s]
            rt.tag = {"stage": s}
            rt.optimizer_step()
            events = rt.take_events()
            if events:
                calls.append(Call("pipeline", "", "optimizer_step", events, s))
        return calls

    def action(self, s: int, kind: str, mb: int | None, action: str) -> list[Call]:
        trace = self.traces[s]
        rt = self.runtimes[s]
        rt.tag = {"stage": s, "microbatch": mb, "action": action}
        if kind in ("F", "B", "I", "W") and s in self.unshard_pending:
            self.unshard_pending.discard(s)  # _assert_unsharded waits for the UNSHARD
            rt.wait_all()
        back = len(trace.forward) + 1  # the first backward hook call's mark
        # where the action's compute starts: it waits for what it receives
        start = Call("pipeline", "", action, [], s, None, mb)
        if kind == "F":
            self.last_forward[s] = action
            return [start, *self._replay(s, trace.forward, 0, "F", mb), self._mark(s, mb)]
        if kind in ("B", "I", "W"):
            rt.sync = rt.reshard_after_backward = rt.is_last_backward = False
            if (
                kind == "B"
                or (kind == "I" and s and trace.inputs_need_grad)
                or (kind == "W" and s == 0)
            ):
                self.grad_left[s].clear()  # every group's post-backward runs
            if (kind == "B" or (kind == "W" and s == 0)) and not trace.backward:
                # a frozen stage whose inputs need no gradient: stage_backward finds no
                # output that needs one; the action ends its forward's hold (fwd_cache.pop)
                return [Call("pipeline", "", action, [], s, back, mb, "B")]
            if kind == "B" or (kind == "W" and s == 0):
                return [start, *self._replay(s, trace.backward, back, "B", mb)]
            if kind == "I" and s != 0 and not trace.inputs_need_grad:
                # no input needs a gradient: stage_backward_input runs no autograd (no FSDP
                # hook) and finds no parameter group, then detaches the outputs, which drops
                # the graph; the outputs and their gradients wait in backward_state for W,
                # which computes nothing (see pipeline_trace._lost_to_frozen_inputs)
                return [Call("pipeline", "", action, [], s, None, mb, "I")]
            if kind == "I" and s != 0:
                # stage_backward_input finds the weights (self.submod.parameters()) before
                # autograd runs FSDP's pre-backward: a group resharded after its forward
                # holds its sharded parameters then, which the graph does not use, so the
                # W of this microbatch gives them no gradient
                self.weightless[(s, mb)] = {
                    g.name
                    for st in rt.states
                    for g in st.groups
                    if g.sharded is not Sharded.UNSHARDED
                }
                calls = [start, *self._replay(s, _without_grads(trace.backward), back, "I", mb)]
                self.input_calls[(s, mb)] = calls
                return calls
            if kind == "W" and not trace.inputs_need_grad:  # its I found no parameter group
                return [Call("pipeline", "", action, [], s, None, mb, "W")]
            if kind == "W":  # the weight gradients land outside FSDP's hooks
                lost = self.weightless.pop((s, mb), set())
                self._refuse_resharded_since_input(s, mb, action, lost)
                # the traces of this I and W: the weights it found, the gradients there
                had = {g.name for st in rt.states for g in st.groups if g.accumulated}
                had = (had - self.upcast) | self.grad_left[s]
                key = (frozenset(lost), frozenset(had - lost))
                for c in self.input_calls.pop((s, mb), []):
                    c.split = key
                for state in rt.states:
                    for g in state.groups:
                        grads = _has_grads(trace.backward, g.name, rt)
                        if grads and g.name in lost:
                            self.gradless.add(g.name)
                        g.accumulated = g.accumulated or (grads and g.name not in lost)
                        if grads and g.name not in lost and g.name in self.upcast:
                            self.grad_left[s].add(g.name)
                return [Call("pipeline", "", action, [], s, None, mb, "W", key)]
            return [Call("pipeline", "", action, [], s, None, mb)]  # the first stage's I
        if kind == "REDUCE_GRAD":
            self.grad_left[s].clear()
            for state in rt.states:
                for g in state.groups:
                    if any(p.requires_grad for p in g.group.params):
                        if g.accumulated:
                            self.never_reduced.discard(g.name)
                        else:
                            self.never_reduced.add(g.name)
            rt.reduce_grad()
            return _reduce_calls(rt.take_events(), s, action)
        if kind == "UNSHARD":
            rt.unshard_all()
            self.unshard_pending.add(s)
        elif kind == "RESHARD":
            rt.reshard_all()
        else:  # SEND_F, RECV_F, SEND_B, RECV_B
            forward = kind.endswith("_F")
            if not forward and not self._gradient_between(s, kind == "SEND_B"):
                # the output needs no gradient (a frozen stage's, whose inputs need none):
                # torch's grad_recv_info holds no buffer for it, get_bwd_send_ops sends none
                return [Call("pipeline", "", action, [], s, None, mb)]
            nbytes = trace.output_bytes if forward == kind.startswith("SEND") else trace.input_bytes
            event = Event("pp_send" if kind.startswith("SEND") else "pp_recv", "",
                          "forward" if forward else "backward", group="pp", nbytes=nbytes,
                          stage=s, microbatch=mb, action=action)  # fmt: skip
            return [Call("pipeline", "", action, [event], s, None, mb)]
        return [Call("pipeline", "", action, rt.take_events(), s, None, mb)]

    def _refuse_resharded_since_input(
        self, s: int, mb: int | None, action: str, lost: set[str]
    ) -> None:
        """Torch's ``stage_backward_weight`` maps the weights of the parameter groups its
        ``I`` found (the unsharded parameters the graph used) by ``self.submod.parameters()``
        as they are when ``W`` runs: a group gathered when the ``I`` began and resharded by a
        forward of the stage since (a ``W`` runs no FSDP hook that would gather it again)
        holds its sharded parameters there, and the look-up fails."""
        rt = self.runtimes[s]
        stale = sorted(
            g.name
            for st in rt.states
            for g in st.groups
            if g.name not in lost
            and g.sharded is not Sharded.UNSHARDED
            and _has_grads(self.traces[s].backward, g.name, rt)
        )
        if not stale:
            return
        forward = self.last_forward.get(s, "a forward")
        raise FSDPConfigError(
            f"{self.opts.schedule} on pipeline rank {self.rank}: torch fails at {action}, the "
            f"weight backward (W) of stage {s}'s microbatch {mb}, with KeyError: "
            "<AccumulateGrad ...> in torch.distributed.pipelining._backward."
            "stage_backward_weight (grad_acc_to_weight[grad_acc]): its input backward (I) "
            f"found {', '.join(repr(u) for u in stale)} gathered, and {forward}, a forward "
            f"of the same stage in between, resharded them after it ({RESHARD.name}), "
            "so W looks the weights of I's graph up among the sharded parameters of "
            "submod.parameters(). Where they run under activation checkpointing, W's "
            "recompute fails first, on those sharded parameters (aten.mul.Tensor got mixed "
            "torch.Tensor and DTensor). Keep the stage's parameters gathered across "
            f"microbatches ({RESHARD.code(False)}, torchtitan's default under pipeline "
            "parallelism), or a schedule that runs no forward of a stage between the input "
            "and the weight backward of one microbatch (Interleaved1F1B, ZBVZeroBubble, "
            "DualPipeV; InterleavedZeroBubble with 2 or 4 stages per rank, or with 3 and as "
            "many microbatches as pipeline ranks)"
        )

    def _gradient_between(self, s: int, send: bool) -> bool:
        """Whether a gradient passes between stage ``s`` and the one before it (``send``:
        its inputs need one) or the one after it (its outputs need one)."""
        return self.traces[s].inputs_need_grad if send else self.traces[s].outputs_need_grad


def _reduce_calls(events: list[Event], s: int, action: str) -> list[Call]:
    """``REDUCE_GRAD`` as FSDP runs it: the action's mark (a memory walk sees the last
    backward begin, ``set_is_last_backward(True)``), each group's post-backward, the root's
    final callback."""
    calls: list[Call] = [Call("pipeline", "", action, [], s)]
    for e in events:
        if len(calls) == 1 or calls[-1].unit != e.hook_unit:
            calls.append(Call("post_backward", e.hook_unit or e.unit, False, [], s, part="R"))
        calls[-1].events.append(e)
    return [*calls, Call("final_callback", stage_root(s), {}, [], s, part="R")]


def _without_grads(log: Log) -> Log:
    """A backward's hook calls as ``autograd.grad`` to the inputs makes them: no parameter
    receives a gradient."""
    out: Log = []
    for name, i, flag in log:
        if name == "post_backward":
            flag = False
        elif name == "final_callback":
            flag = dict.fromkeys(flag, False)
        out.append((name, i, flag))
    return out


def _has_grads(log: Log, group: str, rt: FSDP2Runtime) -> bool:
    """Whether the stage's backward gives ``group``'s parameters gradients."""
    index = {st.group.name: i for i, st in enumerate(rt.states)}.get(group)
    for name, i, flag in log:
        if name == "post_backward" and i == index and flag:
            return True
        if name == "final_callback" and flag.get(index):
            return True
    return False


__all__ = ["RankRun"]
