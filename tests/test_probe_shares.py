"""Which storages the cost probe counts as one rank's tensor-parallel share: a storage is
known by its identity while it lives, never by an ``id`` a later storage may be given once
it is freed (what a trace counts must not depend on where Python's allocator puts things)."""

from __future__ import annotations

import gc
from fractions import Fraction
from typing import Any

import torch
from torch import nn

from fsdpviz.trace.fusion import ModuleScope
from fsdpviz.trace.probe import CostProbe
from fsdpviz.trace.probe_records import CompiledLoss, StorageSet, TPShares
from fsdpviz.trace.tracker import ModuleTracker

TP = 8


def _given_the_id_of(held: Any, old: int, st: torch.UntypedStorage) -> None:
    """As if Python had given ``st`` the ``id`` ``old`` of a freed storage: whatever ``held``
    remembers under ``old`` is now found under ``st``'s ``id`` (made so, not waited for:
    where the allocator puts an object is not something a test can count on)."""
    ref = held._refs.pop(old, None)
    if ref is not None:  # (not forgotten yet: a freed storage's entry waits for forget())
        held._refs[id(st)] = ref


def test_a_storage_made_where_a_freed_share_was_is_whole() -> None:
    # the compiled loss's forward makes a share (a 1/tp slice of a sequence-parallel
    # activation) that its kernels keep inside and the partitioner does not save: dropped
    # when the loss's forward is over, then freed
    probe = CostProbe(ModuleTracker(nn.Linear(4, 4, device="meta")), {}, [], [],
                      tp=TPShares(TP, {}, frozenset()))  # fmt: skip
    scope = ModuleScope("loss", [])
    probe._loss = CompiledLoss(scope)
    scope.enter()
    share = torch.empty(64, 64, device="meta")
    probe._track(share, Fraction(1, TP))
    assert probe.holds_share(share)
    key = id(share.untyped_storage())
    probe._loss.saved.add(key)
    scope.leave(None)
    probe._end_loss()
    del share
    gc.collect()

    # a whole tensor the step makes next, given the freed share's id
    whole = torch.empty(64, 64, device="meta")
    _given_the_id_of(probe._sharded, key, whole.untyped_storage())
    assert not probe.holds_share(whole)
    assert probe.local_bytes(whole) == 64 * 64 * 4  # all of it, not 1/8


def test_storage_set_knows_a_storage_only_while_it_lives() -> None:
    a = torch.empty(8, device="meta")
    shares = StorageSet([a.untyped_storage()])
    assert a.untyped_storage() in shares and len(shares) == 1
    key = id(a.untyped_storage())
    del a
    gc.collect()
    assert len(shares) == 0
    b = torch.empty(8, device="meta")
    _given_the_id_of(shares, key, b.untyped_storage())
    assert b.untyped_storage() not in shares and len(shares) == 0
    # the freed one's weak reference's callback: its dead entry goes, nothing live is dropped
    shares.forget(id(b.untyped_storage()))
    shares.add(b.untyped_storage())
    shares.forget(id(b.untyped_storage()))
    assert b.untyped_storage() in shares and len(shares) == 1
