"""A record's JSON by its fields (fsdpviz.schema.serial): keys in the fields' order, those
declared so left out where unset, values read back coerced, an older file's missing keys
defaulted; and the schema's rows, events and units as their JSON has always been."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from fsdpviz.schema.events import Event, ModuleEvent
from fsdpviz.schema.report import FsdpWarning, Unit
from fsdpviz.schema.rows import ComputeStretch, HookTime, MicroStep, TimedEvent, Wait
from fsdpviz.schema.serial import OMIT_EMPTY, OMIT_NONE, Record, each, key


@dataclass(frozen=True)
class Inner(Record):
    n: int = field(metadata=key(read=int))


@dataclass(frozen=True)
class Outer(Record):
    name: str
    shape: tuple[int, ...] = field(metadata=key(read=lambda s: tuple(int(i) for i in s)))
    inner: list[Inner] = field(default_factory=list, metadata=key(read=each(Inner.from_dict)))
    stage: int | None = field(default=None, metadata=OMIT_NONE)
    action: str | None = field(default=None, metadata=key(beside="stage"))
    notes: list[str] = field(default_factory=list, metadata=OMIT_EMPTY)
    label: str = field(default="", metadata=key(missing="older"))
    cache: dict[str, int] = field(default_factory=dict, metadata=key(saved=False))


def test_keys_follow_the_fields_and_unset_ones_are_left_out() -> None:
    o = Outer("a", (2, 3), [Inner(1)], cache={"x": 1})
    assert o.to_dict() == {"name": "a", "shape": [2, 3], "inner": [{"n": 1}], "label": ""}
    assert list(o.to_dict()) == ["name", "shape", "inner", "label"]
    staged = Outer("a", (), stage=0, notes=["n"])
    # action is written where stage is, even unset
    assert staged.to_dict() == {
        "name": "a", "shape": [], "inner": [], "stage": 0, "action": None, "notes": ["n"],
        "label": "",
    }  # fmt: skip


def test_read_back_coerced_and_defaulted() -> None:
    o = Outer("a", (2, 3), [Inner(1)], stage=1, action="1F0", notes=["n"], label="x")
    assert Outer.from_dict(o.to_dict()) == o
    older = Outer.from_dict({"name": "a", "shape": [2.0], "inner": [{"n": 4.0}]})
    assert older == Outer("a", (2,), [Inner(4)], label="older")
    assert isinstance(older.shape[0], int) and isinstance(older.inner[0].n, int)
    with pytest.raises(KeyError, match="shape"):
        Outer.from_dict({"name": "a"})


def test_rows_write_their_keys_as_before() -> None:
    e = TimedEvent(0, "all_gather", "u", "forward", "unshard", 0.0, 0.0, 0.0, 1.0, 8.0, 0.5,
                   None, None, None, False, 0.0, "", -1, stage=1)  # fmt: skip
    d = e.to_dict()
    assert list(d)[-3:] == ["stage", "microbatch", "action"] and d["microbatch"] is None
    assert "bubble" not in d and "rank" not in d
    assert TimedEvent.from_dict(d) == e
    c = ComputeStretch("pre_forward", "u", 0, 1.0, 3.0, 0.0, "forward", "u", 0)
    older = {k: v for k, v in c.to_dict().items() if k != "duration"}
    assert ComputeStretch.from_dict(older).duration == 2.0  # end - start
    h = HookTime("pre_forward", "u", 0.0, 0.0, (1, 2))
    assert h.to_dict()["events"] == [1, 2] and HookTime.from_dict(h.to_dict()) == h
    w = Wait(0.0, 1.0, 3, "forward", True)
    assert "bubble" not in w and Wait(0.0, 1.0, 3, "forward", True, bubble=True)["bubble"]
    sums = {k: 1.0 for k in ("compute_s", "comm_s", "exposed_comm_s", "all_gather_bytes",
                             "reduce_scatter_bytes")}  # fmt: skip
    step = MicroStep.from_dict({"iteration": 0, "start": 0.0, "end": 1.0, "sync": True, **sums})
    assert step.tp_bytes == 0.0 and list(step.sums())[:5] == list(sums)


def test_events_units_and_warnings() -> None:
    e = Event("all_gather", "u", "forward", prefetch=True, hook="pre_forward", hook_unit="v")
    assert Event.from_dict(e.to_dict()) == e
    assert Event.from_dict({"kind": "free", "unit": "u", "phase": "forward"}).prefetch is False
    assert ModuleEvent.from_dict({"kind": "forward_enter", "module": "m", "t": 1}).t == 1.0
    u = Unit("m", "Linear", ["w"], numel=4, itemsize=2)
    d = u.to_dict()
    assert "frozen_params" not in d and "trainable_numel" not in d
    assert (d["bytes"], list(d)[-2:]) == (8, ["bytes", "sharded_bytes"])
    assert Unit.from_dict(json.loads(json.dumps(d))) == u
    w = FsdpWarning("c", "m", frees=0)
    assert w.to_dict() == {"code": "c", "message": "m", "units": []}
