"""fsdpviz.tune with micro-batches derived from two traces (fsdpviz.tuning.batch_families):
every candidate as the search that traces each micro-batch makes it, with fewer traces."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import torch
from test_cost_fsdp1_memtracker import _SecondLayerTwice

import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.tuning import Tuning
from fsdpviz.tuning.batch_families import BatchFamilies

CONFIG = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=256, num_heads=4)


def _tune(workers: int = 1) -> Tuning:
    return fsdpviz.tune(
        example_model(CONFIG),
        example_inputs(CONFIG, batch=12, seq=32),
        world_size=8,
        fully_shard=[DecoderLayer],
        knobs=("micro_batch", "activation_checkpointing", "reshard_after_forward"),
        exhaustive=True,
        progress=False,
        workers=workers,
    )


def _candidates(t: Tuning) -> list[tuple[Any, ...]]:
    """Each candidate's configuration, costs and plan: its report whole, but how it was made
    (a micro-batch traced with its family's lead's resharding is this one's replay)."""
    out = []
    for c in t.candidates:
        report = c.report.to_dict()
        report["config"].pop("replayed", None)
        out.append((sorted(c.knobs.items()), c.tokens_per_s, c.peak_bytes, c.reserved_bytes,
                    c.fits, c.memory_bytes, report))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def traced_each() -> Tuning:
    """The search tracing every micro-batch as its configuration asks (no family derives
    one or has one traced with its lead's resharding)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BatchFamilies, "derived", lambda self, key, samples: None)
        mp.setattr(BatchFamilies, "derivable", lambda self, key, samples: None)
        mp.setattr(BatchFamilies, "lead", lambda self, key, samples: None)
        return _tune()


def test_derived_micro_batches_are_the_traced_ones(traced_each: Tuning, tmp_path: Path) -> None:
    derived = _tune()
    assert {c.micro_batch for c in derived.candidates} == {1, 2, 3, 4, 6, 12}
    assert derived.traces < traced_each.traces and traced_each.derived == 0
    assert derived.traces + derived.derived == traced_each.traces
    assert f"{derived.derived} derived from traces at other micro-batches" in str(derived)
    saved = json.loads(derived.save(str(tmp_path / "tuning.json")).read_text())
    assert (saved["traces"], saved["derived"]) == (derived.traces, derived.derived)
    assert saved["traces"] + saved["derived"] == traced_each.to_dict()["traces"]
    assert traced_each.to_dict()["derived"] == 0
    assert _candidates(derived) == _candidates(traced_each)
    assert derived.best is not None and traced_each.best is not None
    assert derived.best.knobs == traced_each.best.knobs
    # each derived key's own candidate says so (its hover too), not "traced"
    made = [c for c in derived.candidates if c.derived == "traces at other micro-batches"]
    assert 0 < len(made) <= derived.derived and all(c.traced for c in made)
    assert all(c.derived != "traces at other micro-batches" for c in traced_each.candidates)
    assert [r["derived"] for r in saved["rows"]] == [c.derived for c in derived.candidates]


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork start method"
)
def test_workers_trace_only_what_the_families_take(traced_each: Tuning) -> None:
    derived = _tune(workers=2)
    assert derived.traces < traced_each.traces
    assert _candidates(derived) == _candidates(traced_each)


def test_a_unit_run_twice_under_fsdp1_bf16_derived() -> None:
    """FSDP1 under parameter mixed precision, a unit run twice: each stretch's peak without
    the gradients autograd holds for the unit's other forward call (``peak_unbuffered``) is
    weighed on the traces' moments too, so its micro-batches derive, as traced."""
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    def tune() -> Tuning:
        with torch.device("meta"):
            model = _SecondLayerTwice(CONFIG)
        return fsdpviz.tune(
            model, example_inputs(CONFIG, batch=12, seq=32), world_size=8,
            auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
            mixed_precision=MixedPrecision(param_dtype=torch.bfloat16),
            knobs=("micro_batch",), exhaustive=True, progress=False, workers=1,
        )  # fmt: skip

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BatchFamilies, "derived", lambda self, key, samples: None)
        mp.setattr(BatchFamilies, "derivable", lambda self, key, samples: None)
        mp.setattr(BatchFamilies, "lead", lambda self, key, samples: None)
        traced_each = tune()
    derived = tune()
    assert any(c.report.profile and any(s.peak_unbuffered for s in c.report.profile.iterations)
               for c in derived.candidates)  # fmt: skip
    assert derived.derived > 0 and derived.traces + derived.derived == traced_each.traces
    assert _candidates(derived) == _candidates(traced_each)
