"""Every ``n``-th block checkpointed, from two traces: :func:`checkpoint_capture`.

``CheckpointEvery([Block], n)`` checkpoints the ``n``-th, ``2n``-th, ... of the modules
``[Block]`` picks (the outermost, in module order:
:func:`fsdpviz.trace.checkpointing.checkpointed_modules`). Each block then runs as it runs
in one of two traces of the same job: the one with no checkpointing, or the one with every
block checkpointed (``activation_checkpointing=[Block]``). What a trace measures between two
FSDP hook calls (a stretch, :class:`~fsdpviz.schema.profile.StepProfile`) belongs to the
block whose forward or backward runs there (from its ``pre_forward`` to the hook after its
``post_forward``, from its ``pre_backward`` to the hook after its ``post_backward``: what
runs between, as the model's loop letting go of the block's input, is the block's too), or
to none (the embedding, the gaps before blocks). Under FSDP2 a block whose inputs need no
gradient (the first, where it takes the raw input) has no post-backward hook (none is
registered on its inputs) and no hook call after its backward but the root's final callback,
which runs its post-backward (``_root_post_backward_final_callback``): its backward is from
its ``pre_backward`` to that callback, the same hook calls in both traces. So a block's
stretches are taken from the trace where it has the plan's choice, the others from the one
without checkpointing: their FLOPs (a checkpointed block's backward runs its forward again),
kernels, gradients. What a stretch holds counts every block whose forward is done and
backward not begun: its absolute counters (``activations``, ``forward_temp``,
``backward_temp``, the peaks and the parts of them: ``peak``, ``peak_activations``,
``peak_forward_temp``, ``peak_in_place``, ``param_views_freed``; each moment's) are shifted
by what those blocks hold in the plan against what they hold in the stretch's trace. What a
block holds differently is its ``delta``: how much more the trace without checkpointing
holds of each (activations, forward and backward temporaries) across the block's forward
(both traces where it begins and where it ends). A checkpointed block saves its positional
inputs alone (``_CheckpointFrame.save_inputs`` in ``torch/utils/checkpoint.py``), and its
modules run twice (``ModuleInfo.calls``): each block's module records are taken from its
trace too (``modules``, ``profile.modules``), and the config states how many blocks are
checkpointed.

Exact or nothing: :func:`checkpoint_capture` returns None where that is not what
``analyze`` makes, and where the two traces cannot show it is:

- the traces differ in anything but the above: their events (tensor parallelism's
  collectives, which a checkpointed block's recomputation issues again in backward), hook
  calls, warnings (but ``out_of_memory``, checked anew by
  :func:`~fsdpviz.cost.fit.check_fit`), the module order, or the config but its
  ``activation_checkpointing``;
- the checkpointing is not whole blocks of named classes (``SelectiveCheckpoint``: per
  operator; the model's own checkpoint wrappers), or a block is not one unit's forward and
  backward, each run once per iteration (a wrap plan grouping blocks into one unit: a
  stretch would hold two blocks' compute, each from another trace);
- a pipeline (each stage traced on its own), a compiled job (``compile=``: torch's
  partitioner decides what a compiled region saves by the bytes of its values, and fuses
  across the region's boundary), float8 (the scales a forward saves are freed by the
  backward nodes, kept per stretch);
- what the traces hold is not the sum of what the blocks hold, and the keyword inputs the
  checkpoints' frames alone keep (below): at the end of a stretch no block owns, and at the
  end of each block's backward (a block lets go of all it held), the difference between
  the traces must be the ``delta`` of the blocks then holding their saves, less those
  keyword inputs where the checkpointed trace alone holds them, and the capture must give
  both traces back (``every(1)`` the checkpointed one, no block the other).

Keyword inputs. ``torch.utils.checkpoint``'s non-reentrant ``recompute_fn`` closes over the
region's keywords (``fn(*args, **kwargs)``), held with the frame
(``_CheckpointFrame.recompute_fn``) until the last tensor the region saved in forward is
released in its backward. Hugging Face's Llama passes ``position_embeddings`` (cos, sin)
and ``position_ids`` to each decoder layer so, the same tensors to each. Cos and sin each
layer's attention saves too: without checkpointing the first block saves them (from
``forward_temp`` to ``activations``, in its ``delta``) and its backward lets go of them
last, in the plan as in both traces (the first block is checkpointed only with ``n = 1``,
the checkpointed trace itself). ``position_ids`` no block saves: the trace without
checkpointing lets go of it as the model's forward returns, inside the last block's
stretches (its ``delta`` less it, as measured); the checkpointed trace as the first
block's frame lets go, in its backward; the plan as the first checkpointed block's frame
lets go. Those bytes (``forward_temp``, the same each time) are what the end of the last
block's backward differs by beyond the deltas. The trace records where each frame let go
(``StepProfile.frames_released``, :func:`fsdpviz.trace.checkpointing.frames_released`: the
stretch, its peaks then, its moments so far), so the first checkpointed block's stretch
there is exact: its end that much lower, a peak reached after the frame let go that much
lower where it is still the peak, else the peak as it was when the frame let go.
Where the last block is not checkpointed but some block is (every 3rd of 4 blocks), the
trace without checkpointing lets go of those bytes in the last block's last forward
stretch (from its ``post_forward`` to the next hook call: no block's compute, the model's
forward returning), at a moment it does not record, where the plan holds them on. That
stretch is taken from the checkpointed trace, which holds them through it as the plan
does: what runs there is the same in both traces, the blocks' saves aside, so the plan
holds the deltas of the blocks it does not checkpoint (the last one's too) more than that
trace at every moment of it. The capture checks that the stretch agrees (its FLOPs,
kernels, gradients; its end and peak in the trace without checkpointing as that trace's
and the deltas, less the keyword inputs at the end, less at most them at the peak); where
it does not, :meth:`CheckpointCapture.derives` is False for such ``n`` (``every``
refuses). A capture whose checkpointed trace did not record the releases (a report read
back from JSON) is refused where keyword inputs are kept.

The moments a trace keeps (:func:`~fsdpviz.trace.probe_records.recording_moments`) are
carried, each stretch's from its trace, its activations and temporaries shifted as the
stretch's counters are, where both traces kept theirs; else the plan keeps none (as a trace
made without them).

Two traces cannot prove that a block holds the same whatever its neighbours' choice: a
block whose forward saved its own output (its last operator saving what it returns), which
the next block checkpointed saves again as its input, would be counted twice. None of
GPT-2's, Llama's or torchtitan's blocks does (each ends with a residual add).

Example::

    none = fsdpviz.analyze(model, ids, fully_shard=[Block])
    full = fsdpviz.analyze(model, ids, fully_shard=[Block], activation_checkpointing=[Block])
    capture = checkpoint_capture(none, full)
    report = capture.every(2) if capture is not None else None   # CheckpointEvery([Block], 2)
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from fsdpviz.cost.fit import FIT_CODES, check_fit
from fsdpviz.errors import ConfigError
from fsdpviz.schema.profile import StretchMoments
from fsdpviz.schema.report import Report

__all__ = ["CheckpointCapture", "checkpoint_capture"]

_STRETCH_FIELDS = (
    "flops_forward", "flops_backward", "activations", "forward_temp", "backward_temp", "peak",
    "peak_activations", "peak_forward_temp", "peak_grads", "grads", "kernels",
    "peak_in_place", "scales_freed", "param_views_freed",
)  # fmt: skip
"""A step profile's fields with one entry per stretch (taken from the stretch's trace)."""

_HELD = ("activations", "forward_temp", "backward_temp")
"""What a stretch holds at its end: the counters a block's choice shifts."""

_UNSHIFTED = ("flops_forward", "flops_backward", "grads", "peak_grads", "kernels", "scales_freed")
"""The stretch fields a block's choice leaves alone where the block's compute is not in the
stretch (the last block's last forward stretch: :meth:`CheckpointCapture._borrowed`)."""


class _NotExact(Exception):
    """The two traces do not give the plan exactly."""


@dataclasses.dataclass(frozen=True)
class _Block:
    """One block: its module and, per iteration, the stretches it owns, each span ``(a, b)``
    the stretches ``a + 1`` to ``b``: from its ``pre_forward`` to the hook after its
    ``post_forward``, and from its ``pre_backward`` to the hook after its ``post_backward``
    (what runs between, as the loop letting go of the block's input, is the block's too)."""

    fqn: str
    forward: list[tuple[int, int]]  # per iteration
    backward: list[tuple[int, int]]

    def owns(self, step: int, k: int) -> bool:
        (f0, f1), (b0, b1) = self.forward[step], self.backward[step]
        return f0 < k <= f1 or b0 < k <= b1

    def holding(self, step: int, k: int) -> bool:
        """Whether its forward's saves are all held through stretch ``k`` (done, and its
        backward not begun)."""
        return self.forward[step][1] < k <= self.backward[step][0]

    def inside(self, name: str) -> bool:
        return name == self.fqn or name.startswith(self.fqn + ".")


class CheckpointCapture:
    """Plans that checkpoint every ``n``-th block, from two traces (see the module's
    docstring): :meth:`every`. Made by :func:`checkpoint_capture`."""

    def __init__(self, none: Report, full: Report) -> None:
        if none.pipeline is not None or none.profile is None or full.profile is None:
            raise _NotExact("a pipeline's, or no profile")
        self._reports = (none, full)
        self._dicts = (_unfitted(none), _unfitted(full))
        d0, d1 = self._dicts
        ac = full.config.activation_checkpointing
        if none.config.activation_checkpointing is not None or ac is None or ac["mode"] != "full":
            raise _NotExact("not one trace without checkpointing, one of whole blocks")
        c0, c1 = dict(d0["config"]), dict(d1["config"])
        c1.pop("activation_checkpointing")
        if c0 != c1 or none.config.compile or none.config.float8:
            raise _NotExact("the configs differ, or a compiled or float8 job")
        for key in d0:
            if key not in ("config", "modules", "profile") and d0[key] != d1[key]:
                raise _NotExact(f"the traces' {key} differ")
        names = [m["fqn"] for m in d0["modules"]]
        if names != [m["fqn"] for m in d1["modules"]]:
            raise _NotExact("other modules")
        self._blocks = self._find_blocks(full, set(ac["classes"]), int(ac["modules"]))
        p0, p1 = d0["profile"], d1["profile"]
        for f in ("input_bytes", "buffer_bytes", "flop_ops", "tokens", "tp_ranks", "kernels_tp"):
            if p0[f] != p1[f]:
                raise _NotExact(f"the profiles' {f} differ")
        s0, s1 = none.profile.iterations, full.profile.iterations
        if len(s0) != len(s1):
            raise _NotExact("other iterations")
        # the moments carried where both traces kept theirs
        self._moments = all(any(m is not None for m in s.moments) for s in (*s0, *s1))
        # delta: what a block holds more without checkpointing (activations, forward and
        # backward temporaries), per iteration; kept: the keyword inputs' bytes the frames
        # alone keep, and released: where each block's frame let go (its stretch, the
        # stretch's peaks then, its moments so far), per iteration (where any is kept)
        self._delta: list[list[tuple[int, int, int]]] = []
        self._kept: list[int] = []
        self._released: list[list[tuple[int, tuple[int, ...], int | None]]] = []
        self._borrows = True  # the kept keyword inputs' release stretch borrowed: _borrowed
        for step, (it0, it1) in enumerate(zip(p0["iterations"], p1["iterations"], strict=True)):
            if it0["hooks"] != it1["hooks"] or it0["event_hook"] != it1["event_hook"]:
                raise _NotExact("other hook calls")
            held0, held1 = (list(zip(*(it[f] for f in _HELD), strict=True)) for it in (it0, it1))
            diff = [_minus(x, y) for x, y in zip(held0, held1, strict=True)]
            deltas = []
            for b in self._blocks:
                f0, f1 = b.forward[step]
                deltas.append(_minus(diff[f1], diff[f0]))
            self._delta.append(deltas)
            self._kept.append(0)
            self._released.append([])
            if self._differences(step, diff) != {}:
                self._keywords_kept(step, full.profile.iterations[step].frames_released, diff)
        everything = set(range(len(self._blocks)))
        if self._dict(everything) != d1 or self._dict(set()) != d0:
            raise _NotExact("the capture does not give its traces back")

    def _differences(self, step: int, diff: list[tuple[int, int, int]]) -> dict[int, Any]:
        """Where the traces differ by other than the deltas of the blocks then holding their
        saves (between blocks, and at the end of each block's backward: a block's backward
        lets go of all its own), less the keyword inputs the frames alone keep (from the
        forward's end to the first block's release): stretch -> (the difference, that)."""
        deltas, kept = self._delta[step], self._kept[step]
        ends = {b.backward[step][1] for b in self._blocks}
        out: dict[int, Any] = {}
        for k, d in enumerate(diff):
            if k not in ends and any(b.owns(step, k) for b in self._blocks):
                continue
            held = (0, 0, 0)
            for b, x in zip(self._blocks, deltas, strict=True):
                if b.holding(step, k):
                    held = _plus(held, x)
            if kept and self._holds(step, k, 1) and not self._holds(step, k, 0):
                held = _minus(held, (0, kept, 0))
            if tuple(d) != held:
                out[k] = (tuple(d), held)
        return out

    def _keywords_kept(
        self,
        step: int,
        released: list[list[tuple[tuple[int, ...], int | None]]],
        diff: list[Any],
    ) -> None:
        """The keyword inputs the checkpoints' frames alone keep: what the trace without
        checkpointing lets go of as the last block's forward ends (its stretches, as the
        forward returns), and the one with each block in the first block's backward, as its
        frame lets go (see the module's docstring); or :class:`_NotExact`."""
        blocks = self._blocks
        last = blocks[-1]
        if any(x.forward[step] >= y.forward[step] for x, y in itertools.pairwise(blocks)) or any(
            x.backward[step] <= y.backward[step] for x, y in itertools.pairwise(blocks)
        ):
            raise _NotExact("blocks not run in module order, backward in reverse")
        at = [(k, r) for k, rs in enumerate(released) for r in rs]
        if len(at) != len(blocks):
            raise _NotExact("the frames' releases were not recorded")
        for b, (k, (peaks, moment)) in zip(reversed(blocks), at, strict=True):
            if not b.backward[step][0] < k <= b.backward[step][1] or len(peaks) != 10:
                raise _NotExact(f"{b.fqn}'s frame is not let go of in its backward")
            self._released[step].insert(0, (k, tuple(peaks), moment))
        d = self._differences(step, diff).get(last.backward[step][1])
        if d is None or d[0][0] != d[1][0] or d[0][2] != d[1][2] or d[1][1] <= d[0][1]:
            raise _NotExact(
                f"stretch {last.backward[step][1]} holds {d} more without checkpointing"
            )
        kept = d[1][1] - d[0][1]
        self._kept[step] = kept
        self._delta[step][-1] = _plus(self._delta[step][-1], (0, kept, 0))
        wrong = self._differences(step, diff)
        if wrong:
            k, (d, held) = next(iter(wrong.items()))
            raise _NotExact(f"stretch {k} holds {d} more without checkpointing, not {held}")
        self._borrows = self._borrows and self._borrowable(step)

    def _borrowable(self, step: int) -> bool:
        """Whether the stretch in which the trace without checkpointing lets go of the
        keyword inputs (the last block's last forward stretch) is, in that trace, the
        checkpointed trace's with the blocks' saves held and the keyword inputs let go of
        at some moment: the same FLOPs, kernels and gradients, its end the deltas of all
        blocks and less the keyword inputs higher, its peak the deltas higher, less at most
        the keyword inputs (see :meth:`_borrowed`)."""
        k = self._blocks[-1].forward[step][1]
        it0, it1 = (d["profile"]["iterations"][step] for d in self._dicts)
        if any(it0[f][k : k + 1] != it1[f][k : k + 1] for f in _UNSHIFTED):
            return False
        held = sum(sum(x) for x in self._delta[step])
        end0, end1 = (sum(it[f][k] for f in _HELD) for it in (it0, it1))
        peak0, peak1 = int(it0["peak"][k]), int(it1["peak"][k])
        kept = self._kept[step]
        return end0 == end1 + held - kept and peak1 + held - kept <= peak0 <= peak1 + held

    def _holds(self, step: int, k: int, source: int, first: int | None = None) -> bool:
        """Whether the keyword inputs the frames alone keep are held at the end of stretch
        ``k``: with block ``first`` the first checkpointed, until its frame lets go; else in
        trace ``source`` (0: until the forward's end, in the last block's forward stretches;
        1: until the first block's frame lets go)."""
        if first is None and source == 0:
            return k < self._blocks[-1].forward[step][1]
        return k < self._released[step][0 if first is None else first][0]

    def _find_blocks(self, full: Report, classes: set[str], count: int) -> list[_Block]:
        """The modules checkpointed: the outermost of the classes named, in module order
        (as ``checkpointed_modules`` visits them), each one unit's forward and backward."""
        fqns: list[str] = []
        for m in full.modules:
            if (
                m.fqn
                and m.module_class in classes
                and not any(m.fqn.startswith(f + ".") for f in fqns)
            ):
                fqns.append(m.fqn)
        if len(fqns) != count:
            raise _NotExact(f"{len(fqns)} modules of {sorted(classes)}, {count} checkpointed")
        assert full.profile is not None
        blocks = []
        for fqn in fqns:
            forward, backward = [], []
            for step in full.profile.iterations:
                at: dict[str, list[int]] = {}
                for k, (hook, unit, _) in enumerate(step.hooks):
                    if unit == fqn:
                        at.setdefault(hook.removesuffix("_reshard_only"), []).append(k)
                pf, po = at.get("pre_forward", []), at.get("post_forward", [])
                pb, pob = at.get("pre_backward", []), at.get("post_backward", [])
                if not (len(pf) == len(po) == len(pb) == 1 and len(pob) <= 1):
                    raise _NotExact(f"{fqn} is not one unit run once per iteration")
                # (no post_backward: its inputs need no gradient, see _final_callback)
                end = pob[0] + 1 if pob else _final_callback(full, step.hooks, pb[0], fqn)
                if not pf[0] < po[0] < pb[0] < end:
                    raise _NotExact(f"{fqn}'s hook calls are out of order")
                forward.append((pf[0], po[0] + 1))
                backward.append((pb[0], end))
            blocks.append(_Block(fqn, forward, backward))
        for i, it in enumerate(full.profile.iterations):  # no stretch owned by two
            spans = sorted(s for b in blocks for s in (b.forward[i], b.backward[i]))
            if any(x[1] > y[0] for x, y in itertools.pairwise(spans)) or any(
                end > len(it.hooks) for _, end in spans
            ):
                raise _NotExact("blocks nested or interleaved")
        return blocks

    @property
    def blocks(self) -> list[str]:
        """The blocks, in the order ``CheckpointEvery`` counts them."""
        return [b.fqn for b in self._blocks]

    def derives(self, n: int) -> bool:
        """Whether :meth:`every` gives ``n``'s plan exactly: not where the checkpoints'
        frames alone keep keyword inputs, the last block is not checkpointed, but some is,
        and the stretch in which the trace without checkpointing lets go of them does not
        agree with the checkpointed trace's (:meth:`_borrowable`; see the module's
        docstring)."""
        chosen = self._chosen(n)
        last = len(self._blocks) - 1
        return not chosen or not any(self._kept) or last in chosen or self._borrows

    def _borrowed(self, step: int, k: int, chosen: set[int]) -> bool:
        """Whether stretch ``k`` is taken from the checkpointed trace though no checkpointed
        block owns it: the last block's last forward stretch, in which the trace without
        checkpointing lets go of the keyword inputs the plan's frames keep (the last block
        not checkpointed, some block so; see the module's docstring)."""
        last = len(self._blocks) - 1
        return (
            bool(self._kept[step])
            and bool(chosen)
            and last not in chosen
            and k == self._blocks[-1].forward[step][1]
        )

    def _chosen(self, n: int) -> set[int]:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"n must be a positive int, got {n!r}")
        return {i for i in range(len(self._blocks)) if (i + 1) % n == 0}

    def every(self, n: int) -> Report:
        """The report ``analyze`` makes with ``CheckpointEvery([Block], n)``: the ``n``-th,
        ``2n``-th, ... block checkpointed (``n=1``: each). Raises ``ValueError`` where not
        exact (:meth:`derives`)."""
        chosen = self._chosen(n)
        if not self.derives(n):
            raise ValueError(f"every {n}th block's plan is not exact from the two traces")
        d = self._dict(chosen)
        report = Report.from_dict(d)
        none, full = self._reports
        if chosen:
            ac = {**dict(full.config.activation_checkpointing or {}), "modules": len(chosen)}
            report.config = dataclasses.replace(full.config, activation_checkpointing=ac)
        else:
            report.config = none.config
        self._carry_moments(report, chosen)
        check_fit(report)
        return report

    def _source(self, step: int, k: int, chosen: set[int]) -> int:
        """Which trace stretch ``k`` comes from (1: the checkpointed one)."""
        if self._borrowed(step, k, chosen):
            return 1
        for i, b in enumerate(self._blocks):
            if b.owns(step, k):
                return int(i in chosen)
        return 0

    def _shift(
        self, step: int, k: int, source: int, chosen: set[int]
    ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """What the plan holds more than the trace ``source`` (activations, forward and
        backward temporaries) at the end of stretch ``k``, and at its peaks: what the blocks
        holding their saves through it hold (and the last block's, in the stretch
        :meth:`_borrowed` from the checkpointed trace), and the keyword inputs the frames
        alone keep (the first checkpointed block's frame lets go of them in its backward:
        there the peaks shifted as held, :func:`_let_go` lowering those reached after)."""
        out = (0, 0, 0)
        for i, b in enumerate(self._blocks):
            if b.holding(step, k) and (i in chosen) != bool(source):
                d = self._delta[step][i]
                out = _plus(out, d) if source else _minus(out, d)
        if self._borrowed(step, k, chosen):
            out = _plus(out, self._delta[step][-1])
        kept = self._kept[step]
        if not kept:
            return out, out
        first = min(chosen) if chosen else None
        mine = self._holds(step, k, 0, first)
        theirs = self._holds(step, k, source)
        end = _plus(out, (0, kept * (mine - theirs), 0))
        if first is not None and k == self._released[step][first][0]:
            return end, out  # (the peaks before the frame let go, held in both)
        return end, end

    def _dict(self, chosen: set[int]) -> dict[str, Any]:
        """The plan's ``to_dict()`` (without the fit check's warning)."""
        d0, d1 = self._dicts
        out = copy.deepcopy(d0)
        if chosen:
            out["config"] = copy.deepcopy(d1["config"])
            out["config"]["activation_checkpointing"]["modules"] = len(chosen)
        mine = [b for i, b in enumerate(self._blocks) if i in chosen]
        out["modules"] = [
            copy.deepcopy(m1 if any(b.inside(m0["fqn"]) for b in mine) else m0)
            for m0, m1 in zip(d0["modules"], d1["modules"], strict=True)
        ]
        # (a checkpointed block's own entry holds its inputs: no module outside blocks)
        by_name = {
            n: v for n, v in d0["profile"]["modules"].items() if not any(b.inside(n) for b in mine)
        }
        by_name.update(
            {n: v for n, v in d1["profile"]["modules"].items() if any(b.inside(n) for b in mine)}
        )
        out["profile"]["modules"] = {n: dict(by_name[n]) for n in sorted(by_name)}
        for step, it in enumerate(out["profile"]["iterations"]):
            sources = (d0["profile"]["iterations"][step], d1["profile"]["iterations"][step])
            for k in range(len(it["activations"])):
                source = self._source(step, k, chosen)
                end, peak = self._shift(step, k, source, chosen)
                src = sources[source]
                for f in _STRETCH_FIELDS:
                    if k < len(src[f]):
                        it[f][k] = copy.deepcopy(src[f][k])
                _take_unbuffered(it, src, k)
                if end != peak:  # the first checkpointed block's frame lets go in k
                    _let_go(it, k, self._released[step][min(chosen)][1], peak[1] - end[1])
                if any(end) or any(peak):
                    _shifted(it, k, end, peak)
        return out

    def _carry_moments(self, report: Report, chosen: set[int]) -> None:
        """The plan's moments where the traces kept theirs: each from the stretch's trace,
        its activations shifted as the stretch's counters are."""
        assert report.profile is not None
        traces = [r.profile.iterations for r in self._reports if r.profile is not None]
        for step, it in enumerate(report.profile.iterations):
            if not self._moments:
                continue
            kept: list[StretchMoments | None] = []
            for k in range(len(traces[0][step].moments)):
                source = self._source(step, k, chosen)
                m = traces[source][step].moments[k]
                end, peak = self._shift(step, k, source, chosen)
                if m is not None and (any(end) or any(peak)):
                    # (the moments after the first checkpointed frame let go: as its end)
                    after = len(m.moments)
                    if end != peak:
                        after = self._released[step][min(chosen)][2] or 0
                    moments = [
                        (a + sa, f + sf, b + sb, g, x)
                        for j, (a, f, b, g, x) in enumerate(m.moments)
                        for sa, sf, sb in [end if j >= after else peak]
                    ]
                    m = dataclasses.replace(m, moments=moments)
                kept.append(m)
            it.moments = kept


def _shifted(
    it: dict[str, Any], k: int, end: tuple[int, int, int], peak: tuple[int, int, int]
) -> None:
    """Stretch ``k``'s absolute counters, ``end`` bytes more at its end and ``peak`` at its
    peaks (activations, forward and backward temporaries)."""
    for f, x in zip(_HELD, end, strict=True):
        it[f][k] += x
    sa, sf, sb = peak
    it["peak"][k] += sa + sf + sb
    it["peak_activations"][k] += sa
    it["peak_forward_temp"][k] += sf
    if k < len(it["peak_in_place"]):
        p = it["peak_in_place"][k]
        p[0], p[1], p[2] = p[0] + sa + sf + sb, p[1] + sa, p[2] + sf
    unbuffered = (it.get("peak_unbuffered") or {}).get(str(k))
    if unbuffered is not None:
        p = unbuffered
        p[0], p[1], p[2] = p[0] + sa + sf + sb, p[1] + sa, p[2] + sf
    if k < len(it["param_views_freed"]):
        for v in it["param_views_freed"][k].values():
            v[0], v[1], v[2] = v[0] + sa + sf + sb, v[1] + sa, v[2] + sf
            v[4], v[5], v[6] = v[4] + sa + sf + sb, v[5] + sa, v[6] + sf


def _let_go(it: dict[str, Any], k: int, before: tuple[int, ...], kept: int) -> None:
    """Stretch ``k``'s peaks with ``kept`` bytes of forward temporaries let go of when its
    peaks were ``before`` (``peak``, its activations, forward temp and grads,
    ``peak_in_place``, ``peak_unbuffered``): a peak reached after, that much lower, where
    it still is one (the first moment with the most)."""

    def lowered(now: list[int], then: Sequence[int], fwd: int) -> list[int]:
        if now[0] <= then[0]:  # reached by then
            return now
        if now[0] - kept > then[0]:
            return [x - kept if j in (0, fwd) else x for j, x in enumerate(now)]
        return list(then)

    peak = lowered(
        [it["peak"][k], it["peak_activations"][k], it["peak_forward_temp"][k], it["peak_grads"][k]],
        before[:4],
        2,
    )
    it["peak"][k], it["peak_activations"][k], it["peak_forward_temp"][k], it["peak_grads"][k] = peak
    in_place = it["peak_in_place"][k]
    unbuffered = it.get("peak_unbuffered")
    if unbuffered is not None:
        mine = lowered(list(unbuffered.get(str(k), in_place)), before[7:], 2)
    it["peak_in_place"][k] = in_place = lowered(list(in_place), before[4:7], 2)
    if unbuffered is not None:
        unbuffered.pop(str(k), None)
        if mine != in_place:
            unbuffered[str(k)] = mine
    for v in it["param_views_freed"][k].values():
        v[:4] = lowered(v[:4], before[:4], 2)
        v[4:] = lowered(v[4:], before[4:7], 2)


def _take_unbuffered(it: dict[str, Any], src: dict[str, Any], k: int) -> None:
    """Stretch ``k``'s ``peak_unbuffered`` (kept by stretch where it differs from
    ``peak_in_place``) from the stretch's trace ``src``."""
    mine, theirs = it.get("peak_unbuffered"), src.get("peak_unbuffered")
    if mine is None or theirs is None:
        it.pop("peak_unbuffered", None)  # not measured by one of the traces
        return
    if str(k) in theirs:
        mine[str(k)] = list(theirs[str(k)])
    else:
        mine.pop(str(k), None)


def _final_callback(full: Report, hooks: Sequence[Any], after: int, fqn: str) -> int:
    """The index of the final callback that runs the post-backward of ``fqn``, a block whose
    hook calls hold its ``pre_backward`` (at ``after``) and no ``post_backward``: FSDP2's,
    the first after it (see the module's docstring)."""
    if full.config.api != "FSDP2":
        raise _NotExact(f"{fqn} has no post-backward hook call under {full.config.api}")
    for k in range(after + 1, len(hooks)):
        if hooks[k][0] == "final_callback":
            return k
    raise _NotExact(f"{fqn}'s backward has no end")


def _plus(a: Sequence[int], b: Sequence[int]) -> tuple[int, int, int]:
    x, y, z = (p + q for p, q in zip(a, b, strict=True))
    return x, y, z


def _minus(a: Sequence[int], b: Sequence[int]) -> tuple[int, int, int]:
    x, y, z = (p - q for p, q in zip(a, b, strict=True))
    return x, y, z


def checkpoint_capture(none: Report, full: Report) -> CheckpointCapture | None:
    """The capture of two traces of one job, ``none`` without activation checkpointing and
    ``full`` with every block checkpointed (``activation_checkpointing=[Block]``), or None
    where they do not give ``CheckpointEvery([Block], n)``'s plans exactly (see the module's
    docstring): then trace each.

    Example::

        capture = checkpoint_capture(none, full)
        capture.every(2).to_dict() == fsdpviz.analyze(
            model, ids, fully_shard=[Block],
            activation_checkpointing=CheckpointEvery([Block], 2)).to_dict()
    """
    try:
        return CheckpointCapture(none, full)
    except _NotExact:
        return None


def _unfitted(report: Report) -> dict[str, Any]:
    """``report.to_dict()`` without the fit check's warning (made anew for each plan)."""
    d = report.to_dict()
    d["warnings"] = [w for w in d["warnings"] if w.get("code") not in FIT_CODES]
    return d
