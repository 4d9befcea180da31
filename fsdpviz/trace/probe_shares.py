"""Tensor parallelism's shares as :class:`~fsdpviz.trace.probe.CostProbe` counts them (see
:mod:`fsdpviz.trace.probe`, ``tp``): which storages one tp rank holds a share of, and the
share of what each operator makes, passed on from its inputs, set by a block
(:meth:`~ShareAccounting.held_as`) or by a tp collective's output buffer
(:meth:`~ShareAccounting.redistributed`). :class:`ShareAccounting` is the part of the probe
that does it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from fsdpviz.trace.operators import op_tensors
from fsdpviz.trace.probe_records import StorageShares, TPShares, local_part, storage_of
from fsdpviz.trace.tracker import ModuleTracker

__all__ = ["ShareAccounting"]

_MM = {torch.ops.aten.mm.default: (0, 1), torch.ops.aten.addmm.default: (1, 2)}


class ShareAccounting:
    """The probe's methods for tensor parallelism's shares (a mixin of
    :class:`~fsdpviz.trace.probe.CostProbe`; what it reads of the probe is declared here)."""

    _tracker: ModuleTracker

    def _shares_setup(self, tp: TPShares | None) -> None:
        """The probe's share state: ``tp``, the plan's shares (None: no tensor parallelism)."""
        self._tp = tp
        self.tp_ranks = tp.size if tp is not None else 1
        self._sharded = StorageShares()  # the storages one rank holds a share of
        self._given = StorageShares()  # ... of the inputs (see inputs_shared)
        # inside redistributed(): (the share one rank holds of the outputs, None: whole)
        self._forced: tuple[Fraction | None] | None = None
        self._held: bool | Fraction | None = None  # inside held_as(): the outputs' layout
        # told of each all-reduce loss_parallel()'s handlers run (tensor parallelism's plan)
        self.on_all_reduce: Callable[[torch.Tensor], None] | None = None
        # [mms to let run, what to do then, the share of what that mm makes]:
        # before_backward_mm
        self._mm_waits: list[list[Any]] = []
        self._mm_made: Fraction | None = None  # ... of the backward mm about to run

    def _step_shares(self) -> None:
        """A step starts: one rank holds shares of the parameters the plan shards and of the
        inputs :meth:`inputs_shared` named."""
        if self._tp is not None:
            self._sharded = StorageShares()
            for p, share in self._tp.sharded_params.items():
                if (st := storage_of(p)) is not None:
                    self._sharded.add(st, share)
            self._sharded.update(self._given)

    @contextmanager
    def redistributed(self, share: Fraction | None) -> Iterator[None]:
        """The operators in this block make a tp collective's output buffer: no kernel, and
        one rank holds ``share`` of it (None: all of it)."""
        before, self._forced = self._forced, (share,)
        try:
            yield
        finally:
            self._forced = before

    @contextmanager
    def held_as(self, sharded: bool | Fraction) -> Iterator[None]:
        """The tensors the operators in this block make: one rank's shares (``True``: the
        share their inputs hold, a ``Fraction``: that share), or whole (``False``)."""
        before, self._held = self._held, sharded
        try:
            yield
        finally:
            self._held = before

    def before_backward_mm(
        self,
        skip: int,
        do: Callable[[], list[torch.Tensor]],
        made: Fraction | None = None,
    ) -> None:
        """Run ``do`` before the backward's ``aten.mm`` after the next ``skip`` of them: a
        multiply's backward (autograd's ``MmBackward0``) runs its two ``mm`` in one node, no
        hook between them. What ``do`` returns (the operands DTensor redistributes for that
        ``mm``) is held until the ``mm``'s product is counted. ``made``: the share one rank
        holds of that product (None: as its operands say, :meth:`_a_share`)."""
        self._mm_waits.append([skip, do, made])

    def _backward_mm(self) -> list[torch.Tensor]:
        """A backward ``aten.mm`` is about to run: what :meth:`before_backward_mm` left for
        it, done; the tensors it made, for the caller to hold while the ``mm`` runs."""
        due = [w for w in self._mm_waits if w[0] == 0]
        for w in self._mm_waits:
            w[0] -= 1
        self._mm_waits = [w for w in self._mm_waits if w[0] >= 0]
        made: list[torch.Tensor] = []
        with self:  # type: ignore[attr-defined]  # (the probe: what ``do`` makes, counted)
            for _, do, _ in due:
                made += do()
        self._mm_made = next((share for *_, share in due if share is not None), None)
        return made

    def _whole(self, t: torch.Tensor) -> Any:
        """An all-reduce of ``t`` (told to :attr:`on_all_reduce`): its new buffer (whole, no
        kernel)."""
        if self.on_all_reduce is not None:
            self.on_all_reduce(t)
        return self.redistributed(None)

    def holds_share(self, t: Any) -> bool:
        """Whether one rank holds a share of tensor ``t`` the step made."""
        return self._is_share(t)

    def share_of(self, t: Any) -> Fraction | None:
        """The share one rank holds of tensor ``t`` the step made, or None (whole)."""
        return self._share(t)

    def inputs_shared(self, shares: list[tuple[torch.Tensor, Fraction]]) -> None:
        """The inputs of the next step that one rank holds a share of, with their shares (a
        pipeline stage's received activations under sequence parallelism)."""
        self._given = StorageShares()
        for t, share in shares:
            if (st := storage_of(t)) is not None:
                self._given.add(st, share)

    def local_bytes(self, tensors: Any) -> int:
        """Bytes of ``tensors`` one rank holds: its share of those the step made sharded
        (a pipeline stage's output under sequence parallelism), the rest whole."""
        total = 0
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                total += local_part(t.numel() * t.element_size(), self._share(t))
        return total

    def _share(self, t: Any) -> Fraction | None:
        """The share one rank holds of ``t``, or None (whole)."""
        if not isinstance(t, torch.Tensor):
            return None
        return self._sharded.share(storage_of(t))

    def _is_share(self, t: Any) -> bool:
        return self._share(t) is not None

    def _inputs_share(self, tensors: Any) -> Fraction | None:
        """The largest share of the tensors in ``tensors`` one rank holds a share of."""
        shares = [s for t in op_tensors(tensors) if (s := self._share(t)) is not None]
        return max(shares, default=None)

    def _made_share(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Fraction | None:
        """The share one rank holds of what ``func`` makes, or None: as :meth:`held_as`
        says, else as :meth:`_a_share` finds."""
        held = self._held
        if held is None:
            return self._a_share(func, args, kwargs)
        if isinstance(held, Fraction):
            return held
        if not held:
            return None
        return self._inputs_share((args, kwargs)) or Fraction(1, self.tp_ranks)

    def _a_share(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Fraction | None:
        """The share one rank holds of what ``func`` makes, or None (see
        :mod:`fsdpviz.trace.probe`'s docstring, ``tp``)."""
        assert self._tp is not None
        stack = self._tracker.stack
        forward = torch._C._current_graph_task_id() == -1
        if forward and stack and stack[-1] in self._tp.whole_outputs:
            return None
        mats = _MM.get(func)
        if not forward and mats is not None and self._mm_made is not None:
            made, self._mm_made = self._mm_made, None  # (before_backward_mm's)
            return made
        product = self._tp.product_shares.get(stack[-1]) if forward and stack else None
        if mats is not None and product is not None:
            return product
        if mats is not None and all(self._is_share(args[i]) for i in mats):
            return None
        return self._inputs_share((args, kwargs))
