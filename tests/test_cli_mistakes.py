"""What a new user gets wrong at the command line and with ``fsdpviz.load``: each gets a
message that names the fix, and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import fsdpviz
from fsdpviz.cli import main
from fsdpviz.examples import example_analysis


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


# ---------------------------------------------------------------- fsdpviz.load
@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("load")
    report = example_analysis(world_size=2)
    report.save(out / "report.json")
    report.save(out / "report.html")
    report.save(out / "units.nodelink.json")
    (out / "notes.json").write_text("these are my notes\n")
    (out / "list.json").write_text(json.dumps([1, 2]))
    (out / "bytes.json").write_bytes(b"\x80\x81\xfe")
    (out / "profile.json").write_text(json.dumps({"traceEvents": []}))
    return out


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("notes.json", "'{}' is not JSON (Expecting value at line 1, column 1), not an "
         "fsdpviz report: fsdpviz.load reads the .json of report.save('report.json')"),
        ("report.html", "is an HTML page (the report's page shows it; save the report as "
         ".json to load it)"),
        ("units.nodelink.json", "is a graph (.nodelink.json: networkx.node_link_graph reads "
         "it), not an fsdpviz report"),
        ("profile.json", "is a Chrome trace without a report in it (a torch.profiler trace is "
         "read by fsdpviz.load_profile)"),
        ("list.json", "is JSON holding a list without 'units', not an fsdpviz report"),
        ("bytes.json", "is not a text file, not an fsdpviz report"),
    ],
)  # fmt: skip
def test_load_says_what_a_file_is_and_what_it_reads(files: Path, name: str, said: str) -> None:
    with pytest.raises(fsdpviz.ConfigError) as err:
        fsdpviz.load(files / name)
    assert said.format(files / name) in str(err.value)


def test_load_of_a_missing_path(files: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        fsdpviz.load("nope.json")
    assert str(err.value) == (
        "'nope.json' does not exist: fsdpviz.load reads a report's .json (written by "
        "report.save('report.json') or report.to_json(path)), the directory "
        "fsdpviz.record(model, out_dir=...) wrote, or a directory of torch flight "
        "recorder dumps"
    )
    assert isinstance(fsdpviz.load(files / "report.json"), fsdpviz.Report)


def test_load_of_a_folder_that_is_neither_a_recording_nor_dumps(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "outputs"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes")
    (folder / "rank0.json").write_text(json.dumps({"loss": 1.5}))  # neither header nor dump
    with pytest.raises(FileNotFoundError) as err:
        fsdpviz.load(folder)
    assert str(err.value) == (
        f"{str(folder)!r} is neither a run fsdpviz.record wrote (rank<N>.json and rank<N>.jsonl "
        "per rank) nor torch flight recorder dumps (a file per rank named <prefix><rank>, as "
        "torch writes them: nccl_trace_rank_0, ...): it holds notes.txt, rank0.json"
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"it holds nothing$"):
        fsdpviz.load(tmp_path / "empty")
    code, out, err_text = _run(capsys, "report", str(folder))
    assert code == 2 and out == "" and "is neither a run fsdpviz.record wrote" in err_text
    code, out, err_text = _run(capsys, "doctor", str(folder))
    assert code == 2 and "it holds notes.txt, rank0.json" in err_text


def test_report_of_a_saved_report_writes_it_again(
    files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = fsdpviz.load(files / "report.json")
    assert isinstance(saved, fsdpviz.Report)
    code, out, _ = _run(
        capsys, "report", str(files / "report.json"), "-o", str(tmp_path / "r.html")
    )
    assert code == 0 and out.startswith(saved.summary() + "\n")
    assert "fsdpviz prediction: FSDP1" in (tmp_path / "r.html").read_text()
    code, out, _ = _run(capsys, "report", str(files / "report.json"), "--check")
    assert code == 0 and "check passed" in out
    code, out, err = _run(capsys, "report", str(files / "report.json"), "--world-size", "4",
                          "--grad-accum", "2")  # fmt: skip
    assert code == 2 and "--world-size, --grad-accum plan a model, and" in err
    code, out, err = _run(capsys, "report", str(files / "notes.json"))
    assert code == 2 and "is not JSON (Expecting value at line 1, column 1)" in err


# ---------------------------------------------------------------- the command line
MODELS_SOURCE = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return x + self.fc(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build():
    return Net(), torch.randn(2, 16)
"""


@pytest.fixture
def factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "mistakes_models.py").write_text(MODELS_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return "mistakes_models:build"


def test_misspelled_options_get_a_suggestion(
    factory: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, "report", factory, "--wrold-size", "8")
    assert code == 2 and "usage:" not in err  # the usage block only when asked (--help)
    assert err.splitlines() == [
        "fsdpviz report: error: unrecognized arguments: --wrold-size 8; --wrold-size: did you "
        "mean --world-size?",
        "(fsdpviz report --help lists the options)",
    ]
    code, _, err = _run(capsys, "demo", "--wrold-size=8", "--outptu", "x.html")
    assert code == 2
    assert "--wrold-size: did you mean --world-size?; --outptu: did you mean --output?" in err
    code, _, err = _run(capsys, "report", factory, "--grad-acum", "2", "--float32-matmul-precison")
    assert "--grad-acum: did you mean --grad-accum?; --float32-matmul-precison: did you mean " \
        "--float32-matmul-precision?" in err and code == 2  # fmt: skip
    code, out, _ = _run(capsys, "--vers")  # argparse's abbreviations still work
    assert code == 0 and out.startswith("fsdpviz ")
    code, _, err = _run(capsys, "--verison")
    assert code == 2 and "fsdpviz: error: unrecognized arguments: --verison; --verison: did " \
        "you mean --version?" in err  # fmt: skip


def test_trace_fx_is_fsdp1_only(factory: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "report", "--help")
    help_text = " ".join(out.split()).replace("--fully- shard", "--fully-shard")
    assert code == 0 and "through torch.fx (fx: FSDP1 only, not with --fully-shard)" in help_text
    code, _, err = _run(capsys, "report", factory, "--fully-shard", "Block", "--trace", "fx")
    assert code == 2 and "--trace fx traces FSDP1 plans only" in err
    assert "use --trace meta (default) or --trace real" in err


def test_policy_none_says_one_unit(factory: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "report", factory, "--policy", "none", "-o", "r.json")
    assert code == 0
    assert "prediction: 1 unit, world size 8" in out and "1 units" not in out
    assert "root only, as --policy none asks: the whole model is one unit" in out
    assert "-0%" not in out
    assert fsdpviz.load("r.json").timeline.totals["overlap"] >= 0.0


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from transformers import Qwen2Config

    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=96)  # fmt: skip
    cfg.architectures = ["Qwen2ForCausalLM"]
    path = tmp_path_factory.mktemp("qwen2")
    cfg.save_pretrained(path)
    return path


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--fully-shard", "Qwen2Block"], "--fully-shard: the model has no module of class or "
         "FQN 'Qwen2Block'; did you mean 'Qwen2DecoderLayer'? (its classes with parameters, "
         "blocks first: Qwen2DecoderLayer (x2), Qwen2MLP (x2), Qwen2Attention (x2)"),
        (["--policy", "transformer:Qwen2DecoderLayr"], "--policy: the model has no module of "
         "class 'Qwen2DecoderLayr'; did you mean 'Qwen2DecoderLayer'?"),
        (["--policy", "transformer:Qwen2Modle"], "did you mean 'Qwen2Model'?"),
    ],
)  # fmt: skip
def test_unknown_classes_point_at_the_block(
    qwen2_dir: Path, flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, "report", f"hf:{qwen2_dir}", *flags)
    assert code == 2 and said in err, err


# ---------------------------------------------------------------- the Python API
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"auto_wrap_policy": Block}, "auto_wrap_policy is the class Block, but "
         "FullyShardedDataParallel takes a policy: pass auto_wrap_policy=ModuleWrapPolicy("
         "{Block}) (from torch.distributed.fsdp.wrap), or fully_shard=[Block] to plan FSDP2"),
        ({"auto_wrap_policy": {Block}}, "auto_wrap_policy is a set of module classes, but "
         "FullyShardedDataParallel takes a policy: pass auto_wrap_policy=ModuleWrapPolicy("
         "{Block})"),
        ({"auto_wrap_policy": "Block"}, "auto_wrap_policy is the name 'Block', but "
         "FullyShardedDataParallel takes a policy: pass auto_wrap_policy=ModuleWrapPolicy("
         "{Block}) with the classes imported from their modules (names are for the command "
         "line's --policy transformer:NAME), or fully_shard=['Block'] to plan FSDP2"),
        ({"fully_shard": ["Blok"]}, "fully_shard: no module named 'Blok' in the model; a "
         "string names a module (an FQN such as 'layers.0') or a class of the model's modules: "
         "did you mean the class 'Block'?"),
        ({"fully_shard": ["layers.00"]}, "did you mean 'layers.0'?"),
        ({"fully_shard": [("Block",)]}, "a tuple groups modules by FQN into one fully_shard "
         "call, and 'Block' is a class name: list it alone (fully_shard=['Block'])"),
        ({"fully_shard": [Block], "trace": "fx"}, "trace='fx' is not valid for FSDP2 "
         "(trace='fx' traces FSDP1 plans only); use 'meta' (default) or 'real'"),
    ],
)  # fmt: skip
def test_options_point_the_right_way(kwargs: dict[str, object], said: str) -> None:
    with pytest.raises(fsdpviz.ConfigError) as err:
        fsdpviz.analyze(Net(), torch.randn(2, 8), **kwargs)  # type: ignore[arg-type]
    assert said in str(err.value)


def test_fully_shard_takes_class_names_as_the_command_line_does() -> None:
    by_name = fsdpviz.analyze(Net(), torch.randn(2, 8), fully_shard=["Block"])
    by_class = fsdpviz.analyze(Net(), torch.randn(2, 8), fully_shard=[Block])
    assert [u.module for u in by_name.units] == ["layers.0", "layers.1"]
    assert by_name.units == by_class.units and by_name.iterations == by_class.iterations


def test_real_fsdp1_refuses_classes_as_a_policy_too(fake_pg: int) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    for policy in (Block, {Block}):
        with pytest.raises(TypeError):
            FullyShardedDataParallel(Net(), auto_wrap_policy=policy, device_id=torch.device("cpu"))


def test_errors_of_the_users_code_are_a_message(
    factory: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "broken_models.py").write_text(
        "def build():\n    raise RuntimeError('the weights are not downloaded')\n"
    )
    code, _, err = _run(capsys, "report", "broken_models:build")
    assert code == 1
    assert err.splitlines() == [
        "error: RuntimeError: the weights are not downloaded (raised in broken_models.py, "
        "line 2, in build)",
        "(set FSDPVIZ_TRACEBACK=1 to see the whole traceback)",
    ]
    (tmp_path / "taken.html").mkdir()  # a directory where the page would go
    code, _, err = _run(capsys, "report", factory, "-o", "taken.html")
    assert code == 2 and "cannot write 'taken.html': it is a directory; give a file name" in err
    monkeypatch.setenv("FSDPVIZ_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="the weights are not downloaded"):
        main(["report", "broken_models:build"])


@pytest.mark.parametrize("command", ["report", "tune"])
def test_a_factory_without_inputs_says_how_to_give_them(
    factory: str, tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "model_only.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Linear(4, 4)\n"
    )
    code, _, err = _run(capsys, command, "model_only:build", "-o", "out.html")
    assert code == 2
    assert "model_only:build returned only a model; pass --inputs MODULE:FACTORY, or make " \
        "the factory return (model, inputs)" in err  # fmt: skip


# ------------------------------------------------ flags that do not apply, paths, speed
def test_flags_that_do_not_apply_are_refused(
    factory: str, files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flag that would be ignored is a mistake: --batch, --seq and --set build an hf: model,
    and a factory builds its own (with --check, the check would pass on the wrong plan)."""
    code, out, err = _run(
        capsys, "report", factory, "--batch", "512", "--seq", "99999", "--set", "foo=1", "--check"
    )
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "fsdpviz report: error: --set, --batch, --seq: for Hugging Face models built from "
        "their config (hf:ID) only; mistakes_models:build builds its own model and inputs: "
        "leave them out, or change the factory"
    ]
    code, _, err = _run(capsys, "report", str(files / "report.json"), "--seq", "8")
    assert code == 2 and "--seq plans a model, and" in err
    code, _, err = _run(capsys, "report", "--torchtitan-config", "job.toml", "--batch", "2")
    assert code == 2 and "--torchtitan-config builds its own model and batch" in err


@pytest.mark.parametrize("path", ["./runs/report.json", "report.json", "runs/report.json"])
def test_a_mistyped_path_is_not_found(
    factory: str, path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "report", path)
    assert code == 2 and out == ""
    assert err.startswith(f"fsdpviz report: error: {path!r} not found: MODEL is a saved "), err
    assert "MODULE:NAME" not in err


def test_mistakes_are_answered_before_torch_is_loaded(tmp_path: Path) -> None:
    """Each mistake is found by reading the command line alone: torch (seconds to load) is
    not imported, and no usage block is printed."""
    import subprocess
    import sys

    script = (
        "import sys\nfrom fsdpviz.cli import main\n"
        "for argv in ([], ['report', 'm:f', '--wrold-size', '8'], ['report', 'nope.json'],"
        " ['report', 'm:f', '--batch', '2'], ['report', 'm:f', '--policy', 'bogus'],"
        " ['report', 'm:f', '--mixed-precision', 'bf17'], ['report', 'm:f', '-o', 'r.csv'],"
        " ['report', 'm:f', '--fully-shard', 'B', '--use-orig-params'],"
        " ['report', 'm:f', '--machine', 'h1000'], ['report', 'mymodel'],"
        " ['report', 'm:f', '--activation-checkpointing', 'full:B']):\n"
        "    print(main(argv), 'torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.stdout.split("\n")[:-1] == ["2 False"] * 11, proc.stdout + proc.stderr
    errors = proc.stderr.split("fsdpviz report: error: ")[1:]
    assert len(errors) == 10 and "usage:" not in "".join(errors)
    assert "did you mean 'h100'?" in errors[7]
    assert "must be MODULE:NAME" in errors[8]


def test_a_config_field_gets_a_suggestion(
    qwen2_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--set's mistakes are the command line's: exit status 2, as for any other flag."""
    code, out, err = _run(capsys, "report", f"hf:{qwen2_dir}", "--set", "num_hidden_layer=2")
    assert code == 2 and out == ""
    assert err.splitlines() == [
        "fsdpviz report: error: Qwen2Config has no field 'num_hidden_layer' to set; did you "
        "mean 'num_hidden_layers'?"
    ]
    code, _, err = _run(capsys, "report", f"hf:{qwen2_dir}", "--set", "num_hidden_layers=two")
    assert code == 2 and "Qwen2Config.num_hidden_layers is an integer" in err
