"""``fsdpviz tune`` and ``%fsdpviz tune``: the search from the flags a user already writes."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fsdpviz
from fsdpviz.cli import DOES_NOT_FIT, main
from fsdpviz.examples import ExampleConfig, example_inputs, example_model

MODELS = "tune_models_for_test"
SOURCE = """
from fsdpviz.examples import ExampleConfig, example_inputs, example_model
C = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=256, num_heads=4)
def build():
    return example_model(C), example_inputs(C)
"""
CONFIG = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=256, num_heads=4)


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / f"{MODELS}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop(MODELS, None)
    yield f"{MODELS}:build"
    sys.modules.pop(MODELS, None)


def test_tune_prints_the_best_the_frontier_and_the_code(
    models: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "tune.json"
    code = main(["tune", models, "--memory-budget", "3MiB", "-o", str(out_file)])
    out, err = capsys.readouterr()
    assert code == 0, err
    saved = json.loads(out_file.read_text())
    best = saved["rows"][saved["best"]]
    assert best["fits"] and best["memory_bytes"] <= 3 * 2**20
    assert f"Best: {best['tokens_per_s']:,.0f} tokens/s per GPU" in out
    assert "Frontier (no other configuration is both faster and lighter)" in out
    assert "yours" in out and "  best " in out
    assert "fully_shard(model, mesh=dp_mesh" in out  # the code of the best, FSDP2
    same = fsdpviz.tune(
        example_model(CONFIG), example_inputs(CONFIG), memory_budget="3MiB", progress=False
    )
    assert same.best is not None and same.best.tokens_per_s == best["tokens_per_s"]


def test_nothing_fits_exits_3(models: str, tmp_path: Path, capsys: Any) -> None:
    code = main(["tune", models, "--memory-budget", "64KiB", "-o", str(tmp_path / "t.json")])
    out, _ = capsys.readouterr()
    assert code == DOES_NOT_FIT and "Nothing fits." in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pin", "precison"], "--pin: unknown knob 'precison'; did you mean 'precision'?"),
        (["--allow", "fp8"], "allow: 'fp8'"),
        (["-o", "tune.png"], "fsdpviz tune writes the page (.html) or the search as JSON"),
        (["--world-size", "8,x"], "--world-size"),
    ],
)
def test_mistakes_are_usage_errors(
    models: str, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["tune", models, *flags])
    _, err = capsys.readouterr()
    assert code in (1, 2) and message in err


def test_fsdp1_flags_tune_fsdp1_and_pins_stay(models: str, tmp_path: Path, capsys: Any) -> None:
    code = main(
        ["tune", models, "--policy", "transformer:DecoderLayer", "--mixed-precision", "bf16",
         "--pin", "precision,micro_batch", "--memory-budget", "3MiB",
         "-o", str(tmp_path / "t.json")]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert {r["precision"] for r in rows} == {"bf16 params"}
    assert {r["micro_batch"] for r in rows} == {2}
    assert "FullyShardedDataParallel as FSDP" in out


def test_magic_tune_returns_the_tuning() -> None:
    IPython = pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    del IPython
    fresh = not InteractiveShell.initialized()
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "fsdpviz")
        shell.run_cell(
            "from fsdpviz.examples import ExampleConfig, example_inputs, example_model\n"
            "c = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=256, "
            "num_heads=4)\n"
            "model, ids = example_model(c), example_inputs(c)\n"
        )
        tuning = shell.run_line_magic(
            "fsdpviz", "tune model --inputs ids --memory-budget 3MiB --world-size 8,16 --pin wrap"
        )
    finally:
        if fresh:  # the next test that starts IPython gets a shell of its own kind
            InteractiveShell.clear_instance()
    assert isinstance(tuning, fsdpviz.Tuning)
    assert {c.world_size for c in tuning.candidates} == {8, 16}
    assert {c.knobs["wrap"] for c in tuning.candidates} == {"the root alone"}
