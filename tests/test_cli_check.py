"""``fsdpviz report --check``: a training repository's CI gate on whether a plan fits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import fsdpviz
from fsdpviz.cli import DOES_NOT_FIT, main

MODELS = "fsdpviz_check_models"
# About 1.5 GiB of activations per sample of 4,096 tokens: 64 samples do not fit an H100
# (80 GiB) and fit an H200 (141 GiB); 2 samples of 128 tokens fit anywhere.
SOURCE = textwrap.dedent(
    """
    import torch
    from fsdpviz.examples import ExampleConfig, example_model

    CONFIG = ExampleConfig(vocab_size=32000, hidden_size=1024, intermediate_size=4096,
                           num_layers=2, num_heads=8)


    def _model():
        with torch.device("meta"):
            return example_model(CONFIG)


    def big():
        return _model(), torch.zeros(64, 4096, dtype=torch.long)


    def small():
        return _model(), torch.zeros(2, 128, dtype=torch.long)
    """
)


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    src = tmp_path / "src"
    src.mkdir()
    (src / f"{MODELS}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop(MODELS, None)
    yield MODELS
    sys.modules.pop(MODELS, None)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["report", *argv, "--fully-shard", "DecoderLayer"])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_fails_a_plan_that_does_not_fit(
    models: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, f"{models}:big", "--check")
    assert code == DOES_NOT_FIT == 3
    assert err.startswith("check failed: does not fit in H100 SXM 80GB: peak ")
    assert "78.5 GiB" in err and "First try: activation checkpointing" in err
    assert "warning [out_of_memory]: does not fit" in out  # the summary says it too
    assert not Path("report.html").exists()  # --check writes nothing unless -o says so


def test_check_passes_a_plan_that_fits(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, f"{models}:small", "--check")
    assert code == 0 and err == ""
    assert "check passed: fits in H100 SXM 80GB: needs " in out and "headroom" in out
    assert not Path("report.html").exists()


def test_check_on_the_machine_asked_for(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, f"{models}:big", "--check", "--machine", "h200", "-o", "p.json")
    assert code == 0 and "check passed: fits in H200 SXM 141GB" in out
    report = fsdpviz.load("p.json")
    assert isinstance(report, fsdpviz.Report) and report.config.machine == "h200"
    assert "wrote p.json" in out


def test_report_prints_whether_it_fits(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, f"{models}:big", "-o", "big.json")
    assert code == 0  # without --check, a plan that does not fit is still written
    assert "does not fit in H100 SXM 80GB: needs " in out and Path("big.json").exists()


def test_check_needs_measured_activations(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, f"{models}:small", "--check", "--trace", "fx")
    assert code == 2 and "--check needs the activations the trace measures" in err


def test_unknown_machine(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, f"{models}:small", "--machine", "h1000")
    assert code == 2 and "unknown GPU 'h1000'; did you mean 'h100'? (one of a100," in err


def test_the_exit_status_of_the_command(models: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "fsdpviz", "report", f"{models}:big", "--check"]
    env_path = str(tmp_path / "src")
    proc = subprocess.run(
        [*argv, "--fully-shard", "DecoderLayer"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": env_path},
    )
    assert proc.returncode == DOES_NOT_FIT, proc.stderr
    assert "check failed: does not fit in H100 SXM 80GB" in proc.stderr


def test_the_advice_is_written_as_flags_and_holds(
    models: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command-line user is told the flag that tries the advice (not a Python call), and
    the flag does what the advice says: with it, the plan fits."""
    code, out, err = _run(capsys, f"{models}:big", "--check")
    assert code == DOES_NOT_FIT
    assert (
        "First try: activation checkpointing of each DecoderLayer with "
        "--activation-checkpointing DecoderLayer (activations and temporaries hold" in err
    )
    assert "activation_checkpointing=" not in out + err and "analyze(" not in out + err
    assert "with --activation-checkpointing DecoderLayer" in out  # the summary's warning too
    code, out, err = _run(capsys, f"{models}:big", "--check", "--activation-checkpointing",
                          "DecoderLayer")  # fmt: skip
    assert code == 0 and "check passed: fits in H100 SXM 80GB" in out, err
    code, _, err = _run(capsys, f"{models}:big", "--activation-checkpointing", "DecoderLayr")
    assert code == 2 and "did you mean 'DecoderLayer'?" in err
