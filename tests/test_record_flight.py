"""Torch flight recorder dumps of real FSDP jobs that hang on purpose (gloo, CPU), diagnosed.

The jobs (``flight_job.py``) run once per session, all at once (about a minute on two
cores, most of it waiting for gloo's timeouts): a healthy run, a rank that skips a unit's
forward, a rank that runs one more iteration, a rank whose batch has another shape (FSDP1
and FSDP2), HSDP on a 2 x 2 mesh, a ring buffer too small for the run. Each diagnosis is
checked against what the job did and against torch's own ``fr_trace`` analyzer.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from flight_job import SCENARIOS, UNITS, Adapter, Block, Model, inputs

import fsdpviz
from fsdpviz import Diagnosis, FlightRecorderRun
from fsdpviz.views import timeline_data

JOB = Path(__file__).with_name("flight_job.py")
pytestmark = pytest.mark.slow


@functools.cache
def dumps() -> Path:
    """Every scenario's dumps, made once per session (a process group of its own, killed
    with all it started if it runs too long)."""
    out = Path(tempfile.mkdtemp(prefix="fsdpviz-flight-"))
    env = {**os.environ, "PYTHONPATH": str(JOB.parent), "OMP_NUM_THREADS": "1",
           "TORCH_CPP_LOG_LEVEL": "ERROR"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, str(JOB), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("the flight recorder jobs ran over 300 s") from None
    finally:
        # the ranks and the forkserver are in the job's process group: none outlives it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != 0:
        raise AssertionError(f"flight_job.py exited with {proc.returncode}:\n{stderr[-6000:]}")
    return out


@pytest.fixture(scope="session", autouse=True)
def _clean_up() -> Any:
    yield
    if dumps.cache_info().currsize:
        shutil.rmtree(dumps(), ignore_errors=True)


def load(name: str) -> FlightRecorderRun:
    return fsdpviz.load_flight_recorder(dumps() / name)


@functools.cache
def prediction(api: str) -> fsdpviz.Report:
    """What fsdpviz predicts for the job's model and options (its batch of 8 features)."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    if api == "fsdp1":
        policy = ModuleWrapPolicy({Block, Adapter})
        return fsdpviz.analyze(Model(), inputs(), auto_wrap_policy=policy, world_size=2)
    mesh: Any = ("replicate", 2, "shard", 2) if api == "hsdp" else None
    kwargs: dict[str, Any] = {"mesh": mesh} if mesh else {"world_size": 2}
    return fsdpviz.analyze(Model(), inputs(), fully_shard=[*UNITS, ""], **kwargs)


def diagnose(name: str, predicted: bool) -> Diagnosis:
    run = load(name)
    return run.diagnose(prediction(SCENARIOS[name].api) if predicted else None)


def fr_trace_first(folder: Path) -> tuple[str, int] | None:
    """The first collective torch's ``fr_trace`` flags (a mismatch, or ranks that never
    joined): ``(group desc, sequence id)``. gloo's dumps in torch 2.13 list no group members
    (its analyzer fails on them with a KeyError), so copies get them from the entries."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.loader import read_dir

    tmp = Path(tempfile.mkdtemp(prefix="fsdpviz-frtrace-"))
    try:
        raw = {int(f.name[4:]): pickle.loads(f.read_bytes()) for f in folder.glob("rank*")}
        members: dict[tuple[str, str], set[int]] = {}
        for rank, d in raw.items():
            for e in d["entries"]:
                members.setdefault(tuple(e["process_group"]), set()).add(rank)
        for rank, d in raw.items():
            d["pg_config"] = {
                name: {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
                for (name, desc), ranks in members.items()
                if rank in ranks
            }
            (tmp / f"rank{rank}").write_bytes(pickle.dumps(d))
        args = argparse.Namespace(
            trace_dir=str(tmp), prefix="rank", selected_ranks=None, allow_incomplete_ranks=True,
            pg_filters=None, output=None, just_print_entries=False, verbose=False,
            print_stack_trace=False, mismatch_cap=10, transform_ft=False, group_world_size=None,
        )  # fmt: skip
        details, version = read_dir(args)
        db = build_db(details, args, version)
    finally:
        gc.enable()  # torch's read_dir turns the garbage collector off and leaves it off
        shutil.rmtree(tmp, ignore_errors=True)
    flagged = [c for c in db.collectives if not c.pass_check or c.missing_ranks]
    if not flagged:
        return None
    return flagged[0].pg_desc.split(":")[-1], flagged[0].collective_seq_id


# ---------------------------------------------------------------------------- reading


def test_dumps_read_as_every_rank_s_collectives() -> None:
    run = load("fsdp1-healthy")
    assert run.world_size == 2 and run.backend == "gloo" and sorted(run.collectives) == [0, 1]
    first = run.collectives[0]
    # 3 iterations of FSDP1's 9 collectives: 3 forward all-gathers, 2 prefetched and 1 own in
    # backward, 3 reduce-scatters (gloo runs them as all-reduces of the whole gradient)
    assert [c.seq for c in first] == list(range(1, 28))
    assert [c.kind for c in first[:9]] == ["all_gather"] * 5 + [
        "reduce_scatter", "all_gather", "reduce_scatter", "reduce_scatter"]  # fmt: skip
    assert {c.op for c in first if c.kind == "reduce_scatter"} == {"all_reduce"}
    assert [c.how() for c in first[:9]] == [
        "pre_forward", "pre_forward", "pre_forward", "pre_backward", "pre_backward prefetch",
        "post_backward", "pre_backward prefetch", "post_backward", "post_backward",
    ]  # fmt: skip
    # blocks.0 has 76 parameters, blocks.1 and .2 144: the all-gathers' whole outputs
    assert [c.numel for c in first[:3]] == [76, 144, 144]
    assert [c.nbytes for c in first[:3]] == [304, 576, 576]
    assert first[0].input_sizes == ((38,),) and first[0].output_sizes == ((2, 38),)
    assert all(c.group == "0" and c.group_desc == "default_pg" for c in first)
    assert run.groups["0"].ranks == (0, 1) and run.groups["0"].role == "shard"
    assert all(c.t > 1e9 for c in first)  # the wall clock, as torch records it
    # the views' reports: a rank per report, collectives in order, iterations from the hooks
    assert [r.config.rank for r in run.ranks] == [0, 1]
    assert [len(it) for it in run.ranks[0].iterations] == [9, 9, 9]
    data = timeline_data(run, None, memory=None)
    assert [g["name"] for g in data["groups"]] == ["rank 0", "rank 1"]
    assert data["n_steps"] == 54 and data["clock"] == "recorded" and data["marks"] == []


def test_json_dumps_read_like_the_pickles_without_stacks() -> None:
    pickled, as_json = load("fsdp1-skip"), load("fsdp1-skip-json")
    for rank in (0, 1):
        a, b = pickled.collectives[rank], as_json.collectives[rank]
        assert [(c.seq, c.op, c.input_sizes, c.output_sizes) for c in a] == [
            (c.seq, c.op, c.input_sizes, c.output_sizes) for c in b
        ]
        assert all(not c.frames and c.hook is None for c in b)
    # without stacks FSDP's hooks are not known: the first mismatch is fr_trace's
    d = as_json.diagnose()
    assert d.divergence is not None and (d.divergence.seq, d.divergence.reasons) == (13, ("size",))


# ---------------------------------------------------------------------------- healthy


@pytest.mark.parametrize("name", ["fsdp1-healthy", "fsdp2-healthy"])
def test_a_healthy_job_diagnoses_as_healthy(name: str) -> None:
    alone, against = diagnose(name, False), diagnose(name, True)
    for d in (alone, against):
        assert d.healthy and d.divergence is None and d.mismatch is None
        assert str(d).count("No divergence") == 1
        assert not any(s.stuck for s in d.stops)
        assert d.view.marks() == []
    assert fr_trace_first(dumps() / name) is None
    assert "the dumps end in the backward of iteration 2" in alone.last_step
    assert against.last_step.startswith("the last completed step is iteration 2")
    assert all(not deps for deps in against.departures.values())
    assert "rank 1: as predicted (27 FSDP collectives, up to iteration 2)" in str(against)
    stop = against.stop(0)
    assert stop.predicted is not None
    assert (stop.predicted.iteration, stop.predicted.event.unit) == (2, "blocks.0")


# ---------------------------------------------------------------------------- hangs


# scenario -> (first divergence: seq, reasons; first mismatch torch's fr_trace also reports)
HANGS = {
    "fsdp1-skip": ((12, ("hook",)), 13),
    "fsdp2-skip": ((10, ("size",)), 10),
    "fsdp1-extra": ((28, ("missing",)), 28),
    "fsdp2-extra": ((28, ("missing",)), 28),
    "fsdp1-shape": ((10, ("size",)), 10),
    "fsdp2-shape": ((10, ("size",)), 10),
    "hsdp-extra": ((28, ("missing",)), 28),
    "fsdp1-ring": ((28, ("missing",)), 28),
}


@pytest.mark.parametrize("name", list(HANGS))
def test_a_hang_agrees_with_torch_s_analyzer_and_goes_further(name: str) -> None:
    (seq, reasons), mismatch = HANGS[name]
    theirs = fr_trace_first(dumps() / name)
    assert theirs is not None and theirs[1] == mismatch
    for predicted in (False, True):
        d = diagnose(name, predicted)
        assert d.divergence is not None and d.mismatch is not None
        assert (d.divergence.seq, d.divergence.reasons) == (seq, reasons)
        assert (d.mismatch.group.desc, d.mismatch.seq) == theirs
        assert d.divergence.seq <= d.mismatch.seq
        text = str(d)
        if d.divergence.seq < d.mismatch.seq:
            assert f"fr_trace would report the first mismatch only at #{mismatch}" in text
        else:
            assert "This is also the first mismatch torch's fr_trace reports." in text


def test_a_skipped_unit_with_a_twin_is_found_by_its_hook_before_sizes_differ() -> None:
    d = diagnose("fsdp1-skip", True)
    div = d.divergence
    assert div is not None and div.group.label() == "the default group"
    e0, e1 = div.entries[0], div.entries[1]
    assert e0 is not None and e1 is not None
    assert (e0.kind, e0.numel, e0.hook) == ("all_gather", 144, "pre_forward")
    assert (e1.kind, e1.numel, e1.hook) == ("all_gather", 144, "pre_backward")
    p0, p1 = div.predicted[0], div.predicted[1]
    assert p0 is not None and p1 is not None
    assert (p0.iteration, p0.event.unit, p0.event.hook) == (1, "blocks.2", "pre_forward")
    assert (p1.iteration, p1.event.unit, p1.event.hook) == (1, "blocks.2", "pre_backward")
    (first, *_) = d.departures[1]
    assert first.what == "skipped" and first.candidates == ("blocks.1", "blocks.2")
    assert [p.event.hook for p in first.predicted] == ["pre_forward"]
    assert d.departures[0] == []
    text = str(d)
    assert (
        "rank 1: in iteration 1 it skipped the forward of one of 'blocks.1' or 'blocks.2' "
        "(their all-gathers are alike, the same kind and size: the dumps cannot tell which); "
        "from #12 on it gathered 'blocks.2' (pre_backward) while rank 0 gathered 'blocks.2' "
        "(pre_forward)"
    ) in text
    # without the prediction, the stacks alone still place it
    alone = diagnose("fsdp1-skip", False)
    assert alone.divergence is not None and alone.divergence.seq == 12
    assert "rank 1: all_gather #12 (576 B, pre_backward)" in str(alone)


def test_a_skipped_unit_is_named_and_what_each_rank_did_instead() -> None:
    d = diagnose("fsdp2-skip", True)
    (first,) = d.departures[1]
    assert first.what == "skipped" and [p.event.unit for p in first.predicted] == ["blocks.0"]
    assert first.recorded is not None and first.recorded.seq == 10
    assert (
        "rank 1: in iteration 1 it skipped the forward of 'blocks.0'; from #10 on it gathered "
        "'blocks.1' (pre_forward) while rank 0 gathered 'blocks.0' (pre_forward)"
    ) in str(d)
    s0, s1 = d.stop(0), d.stop(1)
    assert s0.stuck and s1.stuck and s0.completed is None  # gloo: no completion records
    assert s0.predicted is not None and s1.predicted is not None
    assert (s0.predicted.event.unit, s1.predicted.event.unit) == ("blocks.0", "blocks.1")
    assert (s0.predicted.phase, s0.predicted.event.hook) == ("forward", "pre_forward")


@pytest.mark.parametrize("name", ["fsdp1-extra", "fsdp2-extra", "fsdp1-ring"])
def test_one_more_iteration_on_one_rank(name: str) -> None:
    d = diagnose(name, True)
    s0, s1 = d.stop(0), d.stop(1)
    assert s1.waits_for == (0,) and s1.stuck and not s0.stuck and s0.paired
    assert s1.predicted is not None and s0.predicted is not None
    assert (s1.predicted.iteration, s1.predicted.event.unit) == (3, "blocks.0")
    assert s0.predicted.iteration == 2
    assert d.departures == {0: [], 1: []}
    text = str(d)
    assert "Rank 1 is in iteration 3 while rank 0 finished iteration 2" in text
    assert "rank 0 of its group never issued it: this rank waits for it" in text


def test_a_ring_buffer_that_overwrote_its_start_still_places_iterations() -> None:
    run = load("fsdp1-ring")
    assert [len(cs) for cs in run.collectives.values()] == [10, 10]
    assert run.collectives[0][0].seq == 18 and run.collectives[0][0].record_id == 17
    assert any("ring buffer overwrote its oldest 17 collectives" in n for n in run.notes)
    d = run.diagnose(prediction("fsdp1"))
    a = d.alignments[0]["0"]
    assert a.absolute and a.matched[0] is not None and a.matched[0].iteration == 1
    assert d.view.ranks[0].config.iteration_offset == 1
    assert "ring buffer overwrote" in str(d)


def test_another_shape_is_a_collective_of_another_size() -> None:
    d = diagnose("fsdp1-shape", True)
    div = d.divergence
    assert div is not None
    e1 = div.entries[1]
    assert e1 is not None and e1.numel == 136  # the adapter's all-gather, 16 x 8 + 8
    assert div.predicted.get(1) is None  # the prediction never runs the adapter
    (dep,) = d.departures[1]
    assert dep.what == "extra" and dep.recorded is e1
    # the stack points at the branch that ran it: Model.forward's `x = self.adapter(x)`
    assert e1.caller is not None and e1.caller.name == "forward"
    source = Path(e1.caller.filename).read_text().splitlines()[e1.caller.line - 1]
    assert "self.adapter(x)" in source
    assert "a module it did not see run (a data-dependent branch?)" in str(d)


def test_hsdp_groups_are_the_mesh_dimensions() -> None:
    d = diagnose("hsdp-extra", True)
    roles = {g.desc: g.role for g in d.groups.values()}
    assert roles == {"mesh_shard": "shard", "mesh_replicate": "replicate"}
    shard = {g.ranks for g in d.groups.values() if g.role == "shard"}
    assert shard == {(0, 1), (2, 3)}
    div = d.divergence
    assert div is not None and div.group.ranks == (2, 3) and div.group.desc == "mesh_shard"
    assert "(ranks 2, 3; FSDP's shard group)" in str(d)
    s3 = d.stop(3)
    assert s3.waits_for == (2,) and s3.predicted is not None
    assert s3.predicted.iteration == 3
    for r in (0, 1, 2):
        s = d.stop(r)
        assert s.collective is not None and s.collective.group_desc == "mesh_replicate"
        assert s.paired and not s.stuck
        assert s.predicted is not None and s.predicted.event.group == "replicate"
    data = timeline_data(d.view, None, memory=None)
    lanes = {(lane["group"], lane["name"]) for lane in data["lanes"]}
    assert all((g, "replicate all-reduce") in lanes for g in range(4))


# ---------------------------------------------------------------------------- partial dumps


def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(dumps() / name, target)
    return target


def test_a_missing_rank_gives_a_partial_answer(tmp_path: Path) -> None:
    folder = _copy("fsdp2-skip", tmp_path)
    (folder / "rank1").unlink()
    run = fsdpviz.load_flight_recorder(folder)
    assert sorted(run.collectives) == [0] and run.groups["0"].size == 2
    assert run.groups["0"].unseen == 1 and run.world_size == 2  # its all-gathers' shape
    assert "no dump from rank 1" in run.notes
    alone, against = run.diagnose(), run.diagnose(prediction("fsdp2"))
    for d in (alone, against):
        assert "flight recorder dumps of 1 of 2 ranks" in str(d)
        assert "Only rank 0's collectives are here" in str(d)
        assert d.stop(0).stuck
        assert "1 rank of its group has no dump here" in str(d)
    hsdp = _copy("hsdp-extra", tmp_path)
    (hsdp / "rank2").unlink()
    run = fsdpviz.load_flight_recorder(hsdp)
    assert run.world_size == 4 and "no dump from rank 2" in run.notes
    d = run.diagnose(prediction("hsdp"))
    text = str(d)
    assert "No readable dump from rank 2: it may have died" in text
    s3 = d.stop(3)
    assert s3.stuck and s3.waits_for == () and s3.predicted is not None
    assert s3.predicted.iteration == 3
    assert "rank 3: all_gather #28" in text and "1 rank of its group has no dump here" in text


def test_a_cut_short_or_foreign_file_is_named_not_raised(tmp_path: Path) -> None:
    folder = _copy("fsdp1-extra", tmp_path)
    data = (folder / "rank1").read_bytes()
    (folder / "rank1").write_bytes(data[: len(data) // 2])
    (folder / "notes.txt").write_text("not a dump")
    (folder / "checkpoint_7").write_text("other files that end in digits are left alone")
    (folder / "rank3").write_bytes(b"")  # a rank that died while writing its dump
    run = fsdpviz.load_flight_recorder(folder)
    assert sorted(run.collectives) == [0] and run.world_size == 4
    joined = " | ".join(run.notes)
    assert "rank 1's dump could not be read (rank1: not a whole pickle" in joined
    assert "rank 3's dump could not be read (rank3: the file is empty" in joined
    assert "checkpoint" not in joined
    d = run.diagnose(prediction("fsdp1"))
    assert "could not be read" in str(d) and d.stop(0).collective is not None
    assert "No readable dump from ranks 1, 2, 3" in str(d)
    assert d.summary() == "only rank 0's collectives are here: nothing to compare them with"
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "README").write_text("no dumps")
    with pytest.raises(FileNotFoundError, match="holds no flight recorder dump"):
        fsdpviz.load_flight_recorder(tmp_path / "nothing")


def test_nccl_states_say_which_collective_never_completed(tmp_path: Path) -> None:
    """The same dumps as NCCL writes them: states, completion times, members listed."""
    folder = _copy("fsdp1-extra", tmp_path)
    for f in folder.glob("rank*"):
        d = pickle.loads(f.read_bytes())
        for e in d["entries"]:
            e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")
            e["state"] = "completed"
            e["time_discovered_started_ns"] = e["time_created_ns"] + 1000
            e["time_discovered_completed_ns"] = e["time_created_ns"] + 2000
        if f.name == "rank1":
            last = d["entries"][-1]
            last["state"] = "started"
            last["time_discovered_completed_ns"] = None
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
        f.write_bytes(pickle.dumps(d))
    run = fsdpviz.load_flight_recorder(folder)
    assert run.backend == "nccl" and run.groups["0"].listed
    d = run.diagnose(prediction("fsdp1"))
    assert d.stop(0).completed is True and not d.stop(0).stuck
    s1 = d.stop(1)
    assert s1.completed is False and s1.stuck and s1.collective is not None
    assert s1.collective.seq == 28 and "(started)" in str(d)
    assert run.collectives[0][0].duration is None
    assert d.view.ranks[0].iterations[0][0].duration == pytest.approx(1e-6)
    # the group lists rank 0, whose dump is gone: not a rank that never issued it
    (folder / "rank0").unlink()
    alone = fsdpviz.load_flight_recorder(folder).diagnose()
    assert alone.stop(1).stuck and alone.stop(1).waits_for == ()
    assert "1 rank of its group has no dump here" in str(alone)


# ---------------------------------------------------------------------------- fsdpviz.load


def test_load_reads_dumps_as_load_flight_recorder_does(tmp_path: Path) -> None:
    """A folder of dumps (pickles, or JSON ones named rank0.json as a recording's headers
    are), or one dump, is what load_flight_recorder gives."""
    for name in ("fsdp2-skip", "fsdp1-skip-json"):
        loaded, read = fsdpviz.load(dumps() / name), load(name)
        assert isinstance(loaded, FlightRecorderRun)
        assert loaded.collectives == read.collectives and loaded.notes == read.notes
        assert str(loaded.diagnose()) == str(read.diagnose())
        predicted = prediction(SCENARIOS[name.removesuffix("-json")].api)
        assert str(loaded.diagnose(predicted)) == str(read.diagnose(predicted))
    json_names = sorted(p.name for p in (dumps() / "fsdp1-skip-json").iterdir())
    assert json_names[:2] == ["rank0.json", "rank1.json"]
    for one in (dumps() / "fsdp2-skip" / "rank1", dumps() / "fsdp1-skip-json" / "rank1.json"):
        single = fsdpviz.load(one)
        assert isinstance(single, FlightRecorderRun)
        assert single.collectives == fsdpviz.load_flight_recorder(one).collectives
        assert sorted(single.collectives) == [1]


def test_report_of_a_dumps_folder_writes_its_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fsdpviz.cli import main

    folder = dumps() / "fsdp1-skip"
    page = tmp_path / "dumps.html"
    assert main(["report", str(folder), "-o", str(page)]) == 0
    out = capsys.readouterr().out
    run = fsdpviz.load_flight_recorder(folder)
    assert out.startswith(run.summary() + "\n")
    assert f"fsdpviz doctor {folder} MODEL [flags] reads it in FSDP's terms" in out
    assert f"fsdpviz flight recorder: {run.diagnose().summary()}" in page.read_text()
    assert main(["report", str(folder), "--policy", "transformer:Block"]) == 2
    err = capsys.readouterr().err
    assert f"--policy plans a model, and {str(folder)!r} is read as it was saved" in err
    assert main(["report", str(folder), "--check"]) == 2
    assert "is a recorded run" in capsys.readouterr().err


# ---------------------------------------------------------------------------- views, CLI


def test_the_view_marks_the_first_divergent_and_the_stuck_collectives(tmp_path: Path) -> None:
    d = diagnose("fsdp2-skip", True)
    data = timeline_data(d.view, None, memory=None)
    s = data["steps"]
    marked = sorted(
        (m["text"], s["group"][m["step"]], data["units"][s["unit"][m["step"]]])
        for m in data["marks"]
    )
    assert marked == [
        ("first collective where the ranks disagree", 0, "blocks.0"),
        ("first collective where the ranks disagree", 1, "blocks.1"),
        ("where this rank stopped: its last collective", 0, "blocks.0"),
        ("where this rank stopped: its last collective", 1, "blocks.1"),
    ]
    assert {(m.rank, m.kind) for m in d.view.marks()} == {
        (0, "diverge"), (1, "diverge"), (0, "stuck"), (1, "stuck")}  # fmt: skip
    # each mark says its kind: the front end draws a stuck collective in its own colour and
    # shape, with a legend entry per kind
    kinds = {m["text"]: m["kind"] for m in data["marks"]}
    assert kinds == {
        "first collective where the ranks disagree": "diverge",
        "where this rank stopped: its last collective": "stuck",
    }
    assert [g["name"] for g in data["groups"]] == ["rank 0", "rank 1"]
    # a rank's stuck collective is drawn for its timeout: it waited that long
    stuck = next(m["step"] for m in data["marks"] if m["text"].startswith("where this rank"))
    assert s["x1"][stuck] - s["x0"][stuck] == pytest.approx(3.0)
    page = d.save(tmp_path / "diagnosis.html")
    from fsdpviz.export._html import page_script

    text = page.read_text()
    assert "fsdpviz flight recorder: the ranks diverge at collective #10" in text
    assert "in iteration 1 it skipped the forward of &#x27;blocks.0&#x27;" in text
    import json

    config = json.loads(page_script(text, "fv-config"))
    page_marks = config["views"]["timeline"]["data"]["marks"]
    assert len(page_marks) == 4
    assert sorted(m["kind"] for m in page_marks) == ["diverge", "diverge", "stuck", "stuck"]
    assert [u.module for u in d.view.ranks[0].units][:4] == [
        u.module for u in prediction("fsdp2").units][:4]  # fmt: skip


def test_show_in_a_notebook_marks_them_too() -> None:
    view = diagnose("fsdp1-skip", True).show()
    marks = view.timeline.data["marks"]
    texts = {
        "first collective where the ranks disagree",
        "where this rank stopped: its last collective",
    }
    assert len(marks) == 4 and {m["text"] for m in marks} == texts
    assert len(view.timeline.data["groups"]) == 2


def test_doctor_prints_the_diagnosis_and_writes_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsdpviz.cli import main

    monkeypatch.chdir(JOB.parent)
    page = tmp_path / "doctor.html"
    args = ["doctor", str(dumps() / "fsdp2-skip"), "flight_job:model_and_inputs",
            "--fully-shard", ",".join(UNITS), "-o", str(page)]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "read against the prediction (FSDP2, 4 units, world size 2)" in out
    assert "it skipped the forward of 'blocks.0'" in out and page.is_file()
    assert main(["doctor", str(dumps() / "fsdp1-healthy"), "-o", str(page)]) == 0
    assert "No divergence" in capsys.readouterr().out
    assert main(["doctor", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
