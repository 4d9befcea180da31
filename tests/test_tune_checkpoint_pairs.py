"""fsdpviz.tune with every 2nd block checkpointed derived from the traces without
checkpointing and with each block (fsdpviz.tuning.checkpoint_pairs): every candidate as the
search that traces each checkpointing choice makes it, with fewer traces."""

from __future__ import annotations

import multiprocessing
import types
from typing import Any

import pytest

import fsdpviz
from fsdpviz.examples import DecoderLayer, ExampleConfig, example_inputs, example_model
from fsdpviz.replan.batch_replay import BatchCapture
from fsdpviz.replan.checkpoint_replay import CheckpointCapture
from fsdpviz.schema.checkpointing import CheckpointEvery
from fsdpviz.tuning import Tuning
from fsdpviz.tuning.checkpoint_pairs import CheckpointPairs
from fsdpviz.tuning.retune import StoredTrace
from fsdpviz.tuning.space import Choice, TuneKwargs

CONFIG = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=256, num_heads=4)


def _tune(exhaustive: bool = True, workers: int = 1) -> Tuning:
    """Exhaustive, or staged under a budget none of the micro-batch of 4 fits without
    checkpointing (the staged search climbs from none to every 2nd block there)."""
    return fsdpviz.tune(
        example_model(CONFIG),
        example_inputs(CONFIG, batch=4, seq=32),
        world_size=8,
        fully_shard=[DecoderLayer],
        knobs=("micro_batch", "activation_checkpointing", "reshard_after_forward"),
        exhaustive=exhaustive,
        memory_budget=None if exhaustive else 7_100_000,
        progress=False,
        workers=workers,
    )


def _candidates(t: Tuning) -> list[tuple[Any, ...]]:
    """Each candidate's configuration, costs and plan: its report whole, but how it was made
    (a derived trace is made with its siblings' resharding, then replayed)."""
    out = []
    for c in t.candidates:
        report = c.report.to_dict()
        report["config"].pop("replayed", None)
        out.append((sorted(c.knobs.items()), c.tokens_per_s, c.peak_bytes, c.reserved_bytes,
                    c.fits, c.memory_bytes, report))  # fmt: skip
    return out


def _traced_each(exhaustive: bool) -> Tuning:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CheckpointPairs, "derive", lambda self, *args: None)
        return _tune(exhaustive)


@pytest.mark.parametrize("exhaustive", [True, False])
def test_every_2nd_block_derived_is_the_traced_one(exhaustive: bool) -> None:
    traced_each = _traced_each(exhaustive)
    derived = _tune(exhaustive)
    labels = {c.knobs["activation_checkpointing"] for c in derived.candidates}
    assert "every 2nd DecoderLayer" in labels
    assert traced_each.checkpoint_derived == 0 < derived.checkpoint_derived
    assert derived.traces < traced_each.traces
    assert derived.traces + derived.checkpoint_derived == traced_each.traces
    assert "derived from traces without checkpointing and with each block" in str(derived)
    assert derived.to_dict()["checkpoint_derived"] == derived.checkpoint_derived
    made = [c for c in derived.candidates if c.derived]
    assert {c.derived for c in made} == {"traces without checkpointing and with each block"}
    assert {c.knobs["activation_checkpointing"] for c in made} == {"every 2nd DecoderLayer"}
    assert 0 < len(made) <= derived.checkpoint_derived and all(c.traced for c in made)
    assert _candidates(derived) == _candidates(traced_each)
    assert derived.best is not None and traced_each.best is not None
    assert derived.best.knobs == traced_each.best.knobs


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork start method"
)
def test_workers_give_the_same_search() -> None:
    traced_each = _traced_each(False)
    derived = _tune(False, workers=2)
    assert derived.traces < traced_each.traces
    assert _candidates(derived) == _candidates(traced_each)


def _llama_tune(layers: int, every: int | None = None, batch: int = 2) -> Tuning:
    """Hugging Face's Llama of ``layers`` decoder layers, the user's checkpointing every
    ``every``-th layer (None: none), tuned exhaustively over checkpointing (and the
    micro-batch where ``batch`` is more than 2)."""
    from hf_models import llama_model
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    # use_cache=False: the configuration as given keys the same traces as the rest
    model = llama_model(layers, use_cache=False)
    ids = example_inputs(ExampleConfig(vocab_size=96), batch=batch, seq=12)
    knobs = (
        ("micro_batch", "activation_checkpointing") if batch > 2 else ("activation_checkpointing",)
    )
    ac = None if every is None else CheckpointEvery([LlamaDecoderLayer], every)
    return fsdpviz.tune(
        model, ids, world_size=8, fully_shard=[LlamaDecoderLayer],
        activation_checkpointing=ac, knobs=knobs, exhaustive=True, progress=False, workers=1,
    )  # fmt: skip


@pytest.mark.parametrize("layers", [4, 3])
def test_hugging_face_llama_derived_as_traced(layers: int) -> None:
    """Hugging Face's Llama: each checkpoint holds the decoder layer's keyword inputs
    (``position_ids``) into the first checkpointed layer's backward (see
    test_checkpoint_replay). Every 2nd of 4 layers (the last checkpointed) is derived, and
    every 2nd of 3 (the last not: the stretch in which the trace without checkpointing
    lets go of them taken from the checkpointed trace), each as traced."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CheckpointPairs, "derive", lambda self, *args: None)
        traced_each = _llama_tune(layers)
    tuned = _llama_tune(layers)
    made = {c.knobs["activation_checkpointing"] for c in tuned.candidates if c.derived}
    assert made == {"every 2nd LlamaDecoderLayer"} and tuned.checkpoint_derived == 1
    assert tuned.traces + tuned.checkpoint_derived == traced_each.traces
    assert _candidates(tuned) == _candidates(traced_each)


def test_each_pair_captured_once() -> None:
    """The user's every 3rd of 4 layers beside tune's every 2nd, on each micro-batch: each
    pair's capture is made once for both and let go once asked for each it derives, each
    derived as the search that traces each makes it."""
    from fsdpviz.tuning import checkpoint_pairs

    made: list[tuple[fsdpviz.Report, fsdpviz.Report]] = []
    capture = checkpoint_pairs.checkpoint_capture

    def counted(none: fsdpviz.Report, full: fsdpviz.Report) -> CheckpointCapture | None:
        made.append((none, full))
        return capture(none, full)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CheckpointPairs, "derive", lambda self, *args: None)
        traced_each = _llama_tune(4, 3, batch=4)
    searches: list[CheckpointPairs] = []
    init = CheckpointPairs.__init__

    def kept(self: CheckpointPairs, *args: Any) -> None:
        init(self, *args)
        searches.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint_pairs, "checkpoint_capture", counted)
        mp.setattr(CheckpointPairs, "__init__", kept)
        tuned = _llama_tune(4, 3, batch=4)
    # each capture let go once no n is left to ask of it (the user's every 3rd of 4 samples
    # traced before its siblings: its pair asked for every 2nd alone)
    assert len(searches) == 1 and searches[0]._captures == {}

    def samples(c: Any) -> str:  # (the micro-batch's samples: its trace key's)
        return str(c.knobs["micro_batch"].split(" x ")[0])

    sizes = {samples(c) for c in tuned.candidates}
    assert len(sizes) == 3 and len(made) == len(sizes)  # one capture per micro-batch
    assert len({(id(a), id(b)) for a, b in made}) == len(made)
    derived = {
        (samples(c), c.knobs["activation_checkpointing"]) for c in tuned.candidates if c.derived
    }
    # (every 3rd of 4 samples: the configuration as given, traced first)
    assert derived == {
        (b, f"every {x} LlamaDecoderLayer") for b in sizes for x in ("2nd", "3rd")
    } - {("4", "every 3rd LlamaDecoderLayer")}
    assert tuned.traces + tuned.checkpoint_derived == traced_each.traces
    assert _candidates(tuned) == _candidates(traced_each)


def test_a_family_without_a_capture_leaves_the_others_derived() -> None:
    """FSDP1, the user's every 3rd of the example's 4 layers beside tune's every 2nd, on
    each unit choice and forward prefetch (the search's outer knobs). Forward prefetch
    runs the next layer's all-gather inside a layer's stretches: those pairs give no
    capture, their every n-th layer traced as asked; the next units' without prefetch
    still derive (their sibling with each layer traced ahead), each candidate as the search
    that traces each makes it."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    def tune() -> Tuning:
        return fsdpviz.tune(
            example_model(CONFIG), example_inputs(CONFIG, batch=2, seq=32), world_size=8,
            auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
            activation_checkpointing=CheckpointEvery([DecoderLayer], 3),
            knobs=("wrap", "forward_prefetch", "activation_checkpointing"), exhaustive=True,
            progress=False, workers=1,
        )  # fmt: skip

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CheckpointPairs, "derive", lambda self, *args: None)
        traced_each = tune()
    tuned = tune()
    first, second = list(dict.fromkeys(c.knobs["wrap"] for c in tuned.candidates))[:2]
    derived = {
        (c.knobs["wrap"], c.knobs["forward_prefetch"], c.knobs["activation_checkpointing"])
        for c in tuned.candidates
        if c.derived
    }
    assert derived == {
        (first, "False", "every 2nd DecoderLayer"),  # (every 3rd: the configuration as given)
        (second, "False", "every 2nd DecoderLayer"),
        (second, "False", "every 3rd DecoderLayer"),
    }
    assert tuned.traces + tuned.checkpoint_derived == traced_each.traces
    assert _candidates(tuned) == _candidates(traced_each)


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork start method"
)
@pytest.mark.parametrize("first", ["", "none each", "none"], ids=["together", "pair", "one"])
def test_workers_leave_the_keys_a_pair_derives_to_the_search(first: str) -> None:
    """Forked workers trace a checkpoint pair's siblings, not the key the search then derives
    from them (as the search does in this process, tracing the sibling missing first): the
    exhaustive search with its configurations traced ahead by workers, side by side
    (``together``), or after the siblings (``pair``) or after those without checkpointing
    (``one``: the workers trace each block's sibling in place of every 2nd block's key),
    makes the traces and derivations, and the very candidates, the search makes without
    workers."""
    import itertools

    from fsdpviz.tuning.space import KNOBS, REPLAYED
    from fsdpviz.tuning.stages import StagedSearch

    def ahead(self: StagedSearch) -> None:
        traced = [k for k in KNOBS if k in self.space.choices and k not in REPLAYED[self.api]]
        configs = [
            {**self.space.user, **dict(zip(traced, combo, strict=True))}
            for combo in itertools.product(*(self.space.choices[k] for k in traced))
        ]
        label = {"none": "none", "each": "each DecoderLayer"}
        before = [c for c in configs if c["activation_checkpointing"].label in
                  [label[w] for w in first.split()]]  # fmt: skip
        for c in before:
            self.evaluate_key(c)
        every = [c for c in configs if "every" in c["activation_checkpointing"].label]
        assert every and bool(before) == bool(first)
        self.prefetch(every if first == "none" else configs)
        exhaustive(self)

    exhaustive = StagedSearch._exhaustive
    in_process = _tune(True, workers=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StagedSearch, "_exhaustive", ahead)
        forked = _tune(True, workers=2)
    assert in_process.checkpoint_derived > 0
    assert (forked.traces, forked.checkpoint_derived) == (
        in_process.traces, in_process.checkpoint_derived,
    )  # fmt: skip
    # (in another order where the siblings came first)
    assert sorted(_candidates(forked)) == sorted(_candidates(in_process))
    derived = [sorted((sorted(c.knobs.items()), c.derived) for c in t.candidates)
               for t in (forked, in_process)]  # fmt: skip
    assert derived[0] == derived[1]


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork start method"
)
@pytest.mark.parametrize("source", ["earlier search", "micro-batch family"])
def test_workers_leave_a_key_whose_missing_sibling_is_not_traced(source: str) -> None:
    """A checkpoint pair's sibling the search takes without tracing it: from an earlier
    search (``Tuning.retune``: the first search traced no checkpointing alone) or derived
    from its micro-batch family (none checkpointed traced at 12 samples, as given, and 4;
    the workers given the configurations of 6 samples, every 2nd block's family's first
    there). The workers leave every 2nd block's key to the search, which derives it from the
    pair, as the search without workers does: the same traces, derivations and candidates
    (each derived from what the search in the same order without workers derives it from;
    the candidates those of the exhaustive search too)."""
    import itertools

    from fsdpviz.tuning.space import KNOBS, REPLAYED
    from fsdpviz.tuning.stages import StagedSearch

    knobs = ("micro_batch", "activation_checkpointing", "reshard_after_forward")
    model, family = example_model(CONFIG), source == "micro-batch family"

    def before(c: dict[str, Any]) -> bool:
        label = c["activation_checkpointing"].label
        return family and (
            label == "each DecoderLayer" or (label == "none" and c["micro_batch"].samples == 4)
        )

    def ahead(self: StagedSearch) -> None:
        traced = [k for k in KNOBS if k in self.space.choices and k not in REPLAYED[self.api]]
        configs = [
            {**self.space.user, **dict(zip(traced, combo, strict=True))}
            for combo in itertools.product(*(self.space.choices[k] for k in traced))
        ]
        for c in filter(before, configs):
            self.evaluate_key(c)
        self.prefetch([c for c in configs if not family or c["micro_batch"].samples == 6])
        exhaustive(self)

    def tune(workers: int) -> Tuning:
        if not family:
            first = fsdpviz.tune(
                model, example_inputs(CONFIG, batch=4, seq=32), world_size=8,
                fully_shard=[DecoderLayer], knobs=knobs[::2], exhaustive=True,
                progress=False, workers=1,
            )  # fmt: skip
            return first.retune(knobs=knobs, workers=workers)
        return fsdpviz.tune(
            model, example_inputs(CONFIG, batch=12, seq=32), world_size=8,
            fully_shard=[DecoderLayer], knobs=knobs, exhaustive=True, progress=False,
            workers=workers,
        )  # fmt: skip

    made: list[tuple[BatchCapture, int]] = []  # each batch a family's capture made
    at = BatchCapture.at

    def counted(self: BatchCapture, samples: int) -> fsdpviz.Report | None:
        made.append((self, samples))
        return at(self, samples)

    exhaustive = StagedSearch._exhaustive
    plain = tune(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StagedSearch, "_exhaustive", ahead)
        mp.setattr(BatchCapture, "at", counted)
        forked, in_process = tune(2), tune(1)  # (in the same order without workers)
    # a batch asked ahead (whether the family derives it) is made once, for the search too
    assert made or not family
    assert len({(id(capture), b) for capture, b in made}) == len(made)
    assert sorted(_candidates(in_process)) == sorted(_candidates(plain))
    assert in_process.checkpoint_derived > 0
    counts = [(t.traces, t.checkpoint_derived, t.derived, t.reused) for t in (forked, in_process)]
    assert counts[0] == counts[1]
    assert (forked.reused > 0) != family and (forked.derived > 0) == family
    assert sorted(_candidates(forked)) == sorted(_candidates(in_process))
    derived = [sorted((sorted(c.knobs.items()), c.derived) for c in t.candidates)
               for t in (forked, in_process)]  # fmt: skip
    assert derived[0] == derived[1]


class _Search:
    """A search of checkpointing and micro-batch (each a trace key of its labels) that
    traces nothing: a trace stands for itself (the pairs' capture made by a stand-in)."""

    def __init__(self) -> None:
        self.traces: dict[tuple[Any, ...], StoredTrace] = {}

    def trace_key(self, config: dict[str, Choice], any_batch: bool = False) -> tuple[Any, ...]:
        mb = None if any_batch else config["micro_batch"].label
        return (config["activation_checkpointing"].label, mb)

    def traced_changes(self, config: dict[str, Choice]) -> TuneKwargs:
        return TuneKwargs()

    def trace_of(self, key: tuple[Any, ...]) -> StoredTrace | None:
        return self.traces.get(key)

    def trace(self, key: tuple[Any, ...], config: dict[str, Choice]) -> None:
        self.traces[key] = StoredTrace(fsdpviz.Report.__new__(fsdpviz.Report), TuneKwargs())

    def ahead(self, key: tuple[Any, ...], config: dict[str, Choice]) -> bool:
        return True

    def untraced(self, key: tuple[Any, ...], config: dict[str, Choice]) -> TuneKwargs | None:
        return None

    def wanted(self, key: tuple[Any, ...], config: dict[str, Choice]) -> bool:
        return True


class _Capture:
    """A capture that derives every ``n``-th block but the 3rd (its plan: no profile)."""

    def derives(self, n: int) -> bool:
        return n != 3

    def every(self, n: int) -> Any:
        return types.SimpleNamespace(profile=None, n=n)


def test_a_refused_n_leaves_the_others_derived() -> None:
    """Every 3rd block refused on the first micro-batch (its sibling with each block traced
    ahead): every 2nd is still derived on the next, its sibling traced ahead, and every 3rd
    not; each pair's capture made once for both."""
    from fsdpviz.tuning import checkpoint_pairs

    knob = "activation_checkpointing"
    none, every2, every3, each = (
        Choice(knob, label, TuneKwargs(activation_checkpointing=spec))
        for label, spec in [
            ("none", None),
            ("every 2nd", CheckpointEvery([DecoderLayer], 2)),
            ("every 3rd", CheckpointEvery([DecoderLayer], 3)),
            ("each", [DecoderLayer]),
        ]
    )
    search = _Search()
    pairs = CheckpointPairs(search, [none, every2, every3, each])
    made: list[Any] = []

    def capture(*traces: Any) -> _Capture:
        made.append(traces)
        return _Capture()

    def derive(ac: Choice, mb: str) -> Any:
        config = {knob: ac, "micro_batch": Choice("micro_batch", mb)}
        key = search.trace_key(config)
        if key in search.traces:
            return "traced"
        derived = pairs.derive(key, config, search.trace)
        if derived is None:
            search.trace(key, config)
            return "traced"
        return derived[0].n

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint_pairs, "checkpoint_capture", capture)
        asked = [
            (none, "a"),
            (every3, "a"),
            (none, "b"),
            (every2, "b"),
            (every3, "b"),
            (every2, "a"),
        ]
        got = [derive(ac, mb) for ac, mb in asked]
    assert got == ["traced", "traced", "traced", 2, "traced", 2]
    assert ("each", "b") in search.traces and len(made) == 2
