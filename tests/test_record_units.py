"""``record`` / ``load`` / ``diff`` / divergence in one process (fake process group) and on
hand-made reports: file format, crash tolerance, hook hygiene, errors and explanations."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import handwritten_models as hm
import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import _flat_param, _runtime_utils
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.modules import module as module_mod

import fsdpviz
from fsdpviz import Event, Report
from fsdpviz.recording._diverge import find_divergence

POLICY = ModuleWrapPolicy({hm.Block})


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))


def _fsdp(model: torch.nn.Module) -> FSDP:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FSDP(copy.deepcopy(model), auto_wrap_policy=POLICY, device_id=torch.device("cpu"))


def _train(model: torch.nn.Module, steps: int) -> None:
    for _ in range(steps):
        model(_x()).sum().backward()


def _record(fake_pg: int, out: Path, steps: int = 3, **kwargs: bool) -> FSDP:
    model = _fsdp(hm.Stack())
    with fsdpviz.record(model, out_dir=out, **kwargs):
        _train(model, steps)
    return model


def _only_rank(path: Path) -> Report:
    run = fsdpviz.load(path)
    assert isinstance(run, fsdpviz.RecordedRun)
    assert len(run.ranks) == 1
    return run.ranks[0]


def test_record_and_load_in_one_process(fake_pg: int, tmp_path: Path) -> None:
    _record(fake_pg, tmp_path)
    run = fsdpviz.load(tmp_path)
    assert isinstance(run, fsdpviz.RecordedRun)
    assert run.notes == [f"ranks {list(range(1, fake_pg))} wrote no recording here"]
    predicted = fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=POLICY, world_size=fake_pg)
    assert fsdpviz.diff(run, predicted).equal
    assert len(run.ranks[0].iterations) == 3 and len(run.ranks[0].module_events) == 3
    assert run.ranks[0].forward_order == predicted.forward_order


def test_hooks_and_patches_do_not_outlive_the_block(fake_pg: int, tmp_path: Path) -> None:
    handle = _flat_param.FlatParamHandle
    before = (
        handle._all_gather_flat_param,
        _runtime_utils._reduce_grad,
        dict(module_mod._global_forward_pre_hooks),
        dict(module_mod._global_forward_hooks),
    )
    model = _fsdp(hm.Stack())
    recorder = fsdpviz.record(model, out_dir=tmp_path / "ok")
    with recorder:
        _train(model, 2)
    with pytest.raises(RuntimeError, match=r"records one block; call fsdpviz.record\(model"):
        recorder.__enter__()
    after = (
        handle._all_gather_flat_param,
        _runtime_utils._reduce_grad,
        dict(module_mod._global_forward_pre_hooks),
        dict(module_mod._global_forward_hooks),
    )
    assert after == before
    with pytest.raises(RuntimeError, match="boom"), fsdpviz.record(model, out_dir=tmp_path / "bad"):
        _train(model, 1)
        model(_x())
        raise RuntimeError("boom")
    assert handle._all_gather_flat_param is before[0]
    assert dict(module_mod._global_forward_pre_hooks) == before[2]
    header = json.loads((tmp_path / "bad" / "rank0.json").read_text())
    assert header["finished"] is False
    report = _only_rank(tmp_path / "bad")
    # the forward that ran before the exception is kept as an unfinished last iteration
    assert len(report.iterations) == 2 and report.config["complete_iterations"] == 1


def test_fsdp1_recorder_adds_times_only_when_asked(fake_pg: int) -> None:
    model = _fsdp(hm.Stack())
    with fsdpviz.FSDP1Recorder(model) as plain:
        _train(model, 1)
    with fsdpviz.FSDP1Recorder(model, timestamps=True) as timed:
        _train(model, 1)
    assert all(e.t is None and e.duration is None for e in plain.iterations[0])
    assert "t" not in plain.report().to_dict()["iterations"][0][0]
    assert all(e.t is not None and e.duration is not None for e in timed.iterations[0])
    assert [e.untimed() for e in timed.iterations[0]] == plain.iterations[0]


def test_record_rejects_models_it_cannot_record(fake_pg: int, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"contains no FullyShardedDataParallel .* Wrap it first"):
        fsdpviz.record(hm.Stack(), out_dir=tmp_path)
    with pytest.raises(TypeError, match="contains no FullyShardedDataParallel"):
        fsdpviz.record(nn.Linear(2, 2), out_dir=tmp_path)


def test_record_fsdp2_in_process(fake_pg: int, tmp_path: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = hm.Stack()
    mesh = init_device_mesh("cpu", (fake_pg,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with fsdpviz.record(model, out_dir=tmp_path) as rec:
        _train(model, 2)
    assert rec.report().config["api"] == "FSDP2"
    run = fsdpviz.load(tmp_path)
    assert isinstance(run, fsdpviz.RecordedRun)
    predicted = fsdpviz.analyze(
        hm.Stack(), torch.randn(4, 8), fully_shard=[hm.Block], world_size=fake_pg
    )
    assert fsdpviz.diff(run, predicted).equal


def test_a_line_cut_short_is_skipped(fake_pg: int, tmp_path: Path) -> None:
    _record(fake_pg, tmp_path)
    lines = tmp_path / "rank0.jsonl"
    with lines.open("ab") as f:
        f.write(b'{"iteration": 3, "complete": true, "events": [{"kind": "all_ga')
    run = fsdpviz.load(tmp_path)
    assert isinstance(run, fsdpviz.RecordedRun)
    assert len(run.ranks[0].iterations) == 3
    assert "rank 0: its last iteration line was cut short and is skipped" in run.notes


def test_modules_false_records_no_module_events(fake_pg: int, tmp_path: Path) -> None:
    _record(fake_pg, tmp_path, modules=False)
    report = _only_rank(tmp_path)
    assert report.module_events == [] and "module_events" not in report.to_dict()
    assert len(report.iterations) == 3


def test_load_reads_report_files_as_before(tmp_path: Path) -> None:
    predicted = fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=POLICY, world_size=2)
    path = tmp_path / "report.json"
    predicted.to_json(path)
    loaded = fsdpviz.load(str(path))
    assert isinstance(loaded, Report) and loaded.to_dict() == predicted.to_dict()
    assert "module_events" not in predicted.to_dict()


def test_directory_errors_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"fsdpviz.record\(model, out_dir=...\)"):
        fsdpviz.RecordedRun.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        fsdpviz.RecordedRun.load(tmp_path / "missing")
    for rank, world_size in ((0, 2), (1, 4)):
        header = {"format": "fsdpviz-recording", "version": 1, "world_size": world_size}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(header))
    with pytest.raises(ValueError, match=r"world sizes \[2, 4\]; record each run into its own"):
        fsdpviz.load(tmp_path)


def test_doctor_and_report_read_a_recording_too(
    fake_pg: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fsdpviz doctor DIR`` of a run fsdpviz.record wrote: where the ranks diverge and, with
    the model, fsdpviz.diff against the prediction; ``fsdpviz report DIR`` writes its page."""
    from fsdpviz.cli import main

    out = tmp_path / "run"
    _record(fake_pg, out)
    (tmp_path / "stack_models.py").write_text(
        "import torch, handwritten_models as hm\n"
        "def build():\n    return hm.Stack(), torch.randn(4, 8)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    run = fsdpviz.load(out)
    assert main(["doctor", str(out), "-o", str(tmp_path / "d.html")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(run.summary() + "\n") and "all ranks agree" in printed
    assert (tmp_path / "d.html").is_file()
    args = ["doctor", str(out), "stack_models:build", "--policy", "transformer:Block",
            "-o", str(tmp_path / "d.html")]  # fmt: skip
    assert main(args) == 0
    predicted = fsdpviz.analyze(hm.Stack(), _x(), auto_wrap_policy=POLICY, world_size=fake_pg)
    assert str(fsdpviz.diff(run, predicted)) in capsys.readouterr().out
    assert main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    assert capsys.readouterr().out.startswith(run.summary() + "\n")
    assert "fsdpviz recording" in (tmp_path / "r.html").read_text()


def test_event_dicts_round_trip_with_and_without_times() -> None:
    plain = Event("all_gather", "blocks.0", "forward", True, "pre_forward", "")
    assert plain.to_dict() == {
        "kind": "all_gather", "unit": "blocks.0", "phase": "forward", "prefetch": True,
        "hook": "pre_forward", "hook_unit": "",
    }  # fmt: skip
    timed = Event("free", "blocks.0", "backward", t=1.5, duration=0.25)
    assert timed.to_dict()["t"] == 1.5 and Event.from_dict(timed.to_dict()) == timed
    assert timed.untimed() == Event("free", "blocks.0", "backward")
    old = Report("prediction", {}, [], [], [[plain]]).to_dict()
    assert "module_events" not in old and Report.from_dict(old).module_events == []


def _report(events: list[Event], rank: int = 0) -> Report:
    return Report("recording", {"rank": rank, "world_size": 2}, [], [], [events])


AG = Event("all_gather", "a", "forward", False, "pre_forward", "a")
AG_B = Event("all_gather", "b", "forward", False, "pre_forward", "b")
FREE = Event("free", "a", "forward", False, "post_forward", "a")


def test_diff_explains_the_first_mismatch() -> None:
    predicted = Report("prediction", {"world_size": 2}, [], [], [[AG, FREE, AG_B]])
    extra = fsdpviz.diff(_report([AG, AG, FREE, AG_B]), predicted)
    first = extra.first()
    assert first is not None and [r.status for r in first.rows].count("extra") == 1
    assert "the run issued all_gather 'a' (pre_forward of 'a'), which the prediction" in str(extra)
    swapped = fsdpviz.diff(_report([AG_B, FREE, AG]), predicted)
    assert not swapped.equal
    missing = fsdpviz.diff(_report([AG, FREE]), predicted)
    assert "the prediction has all_gather 'b' (pre_forward of 'b'), which the run did not" in str(
        missing
    )
    prefetched = Event("all_gather", "b", "forward", True, "pre_forward", "a")
    differs = str(fsdpviz.diff(_report([AG, FREE, prefetched]), predicted))
    assert "(recorded vs predicted: prefetch True vs False; hook_unit 'a' vs 'b')" in differs
    assert ">>   2 all_gather 'b' (prefetch, pre_forward of 'a') | all_gather 'b'" in differs
    wrong_size = Report("prediction", {"world_size": 8}, [], [], [[AG, FREE, AG_B]])
    assert "recorded on world size 2, predicted for 8" in str(
        fsdpviz.diff(_report([AG, FREE, AG_B]), wrong_size)
    )
    only_gathers = fsdpviz.diff(_report([AG, AG_B]), predicted, kinds=["all_gather"])
    assert only_gathers.equal and "kinds compared: all_gather" in str(only_gathers)


def test_divergence_when_a_rank_has_no_event_left() -> None:
    d = find_divergence([_report([AG, FREE], 0), _report([AG], 1)])
    assert d is not None and (d.iteration, d.index) == (0, 1) and d.previous == AG
    assert [r.event for r in d.ranks] == [FREE, None]
    assert "rank 1: nothing (its iteration ended)" in str(d)
    assert find_divergence([_report([AG, FREE], 0), _report([AG, FREE], 1)]) is None
