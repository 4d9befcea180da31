"""The ``fsdpviz`` command line: ``demo``, ``report``, exit codes and messages."""

from __future__ import annotations

import functools
import importlib
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

import fsdpviz
from fsdpviz.cli import main
from fsdpviz.examples import ExampleConfig

MODELS = "fsdpviz_cli_test_models"

MODELS_SOURCE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 16)

        def forward(self, x):
            return x + self.fc2(torch.relu(self.fc1(x)))


    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 4)

        def forward(self, x):
            return self.proj(x)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))
            self.head = Head()

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)


    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            y = self.fc(x)
            return y if y.sum().item() > 0 else -y


    def build():
        return Net()


    def build_with_inputs():
        return Net(), torch.randn(2, 16)


    def make_inputs():
        return torch.randn(2, 16)


    def data_dependent():
        return DataDependent(), torch.randn(2, 16)


    def not_a_model():
        return 42


    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A factory module importable as ``MODELS``; cwd is ``tmp_path``."""
    src = tmp_path / "src"
    src.mkdir()
    (src / f"{MODELS}.py").write_text(MODELS_SOURCE)
    monkeypatch.syspath_prepend(str(src))  # also restores sys.path after the test
    monkeypatch.chdir(tmp_path)
    sys.modules.pop(MODELS, None)
    yield MODELS
    sys.modules.pop(MODELS, None)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- demo


def test_demo_writes_loadable_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "demo.json"
    code, out, err = _run(capsys, "demo", "-o", str(path))
    assert code == 0, err
    report = fsdpviz.load(str(path))
    n = ExampleConfig().num_layers
    assert len(report.units) == n + 1
    assert report.forward_order == ["", *(f"layers.{i}" for i in range(n))]
    assert report.config["world_size"] == 8
    assert report.summary() in out
    assert str(path) in out
    assert json.loads(path.read_text())["source"] == "prediction"


def test_demo_default_path_is_the_html_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(capsys, "demo", "--world-size", "16")
    assert code == 0
    assert "wrote fsdpviz-demo.html" in out
    page = (tmp_path / "fsdpviz-demo.html").read_text()
    assert page.startswith("<!doctype html>")
    assert "world size 16" in page
    assert '"fv-explorer"' in page and "fv-timeline" in page


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("demo.html", lambda p: p.read_text().startswith("<!doctype html>")),
        ("demo.svg", lambda p: "layers.0 [unit 1]" in p.read_text()),
        ("demo.graphml", lambda p: "<graphml" in p.read_text()),
        ("demo.nodelink.json", lambda p: "edges" in json.loads(p.read_text())),
        ("DEMO.JSON", lambda p: "traceEvents" in json.loads(p.read_text())),
    ],
)
def test_demo_writes_every_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, check: Callable[[Path], bool]
) -> None:
    path = tmp_path / name
    code, out, err = _run(capsys, "demo", "-o", str(path))
    assert code == 0, err
    assert f"wrote {path}" in out
    assert check(path)


@pytest.mark.parametrize("name", ["demo", "demo.json.txt", "demo.csv"])
def test_demo_rejects_unknown_suffix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = tmp_path / name
    code, out, err = _run(capsys, "demo", "-o", str(path))
    assert code == 2
    assert "unknown suffix" in err
    assert ".html, .fsdpviz.json, .json" in err and ".png" in err and ".graphml" in err
    assert not path.exists()
    assert out == ""


def test_demo_export_failure_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No Chromium for an image: exit status 1 and how to install one, no traceback."""
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium"))
    code, _, err = _run(capsys, "demo", "-o", str(tmp_path / "demo.png"))
    assert code == 1
    assert err.startswith("error: cannot write")
    assert "apt-get install -y chromium" in err
    assert "Traceback" not in err
    assert not (tmp_path / "demo.png").exists()


def test_demo_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "demo", "-o", str(tmp_path / "nope" / "demo.json"))
    assert code == 2
    assert "does not exist" in err


@pytest.mark.parametrize("value", ["0", "-3", "eight"])
def test_bad_world_size(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, _, err = _run(capsys, "demo", "--world-size", value)
    assert code == 2
    assert "positive integer" in err


def test_no_command_and_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        _run(
            capsys,
        )[0]
        == 2
    )
    code, _, err = _run(capsys, "demo", "--frobnicate")
    assert code == 2
    assert "unrecognized arguments" in err


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "report", "--help")
    assert code == 0
    assert "MODULE:FACTORY" in out and "transformer:Class" in out
    for flag in ("--grad-accum N", "--compile [CLASSES]", "--float8 [SPEC]",
                 "--float32-matmul-precision {highest,high,medium}"):  # fmt: skip
        assert flag in out
    code, out, _ = _run(capsys, "--version")
    assert code == 0
    assert fsdpviz.__version__ in out


# -------------------------------------------------------------- report


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[fsdpviz.Report, str]:
    code, out, err = _run(capsys, "report", *argv, "-o", "out.json")
    assert code == 0, err
    return fsdpviz.load("out.json"), out


def test_report_factory_returning_model_and_inputs(
    models: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report, out = _report(capsys, f"{models}:build_with_inputs", "--policy", "transformer:Block")
    assert [u.module for u in report.units] == ["", "blocks.0", "blocks.1", "blocks.2"]
    assert report.forward_order == ["", "blocks.0", "blocks.1", "blocks.2"]
    assert report.summary() in out
    assert "out.json" in out


def test_report_with_inputs_factory(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    report, _ = _report(
        capsys, f"{models}:build", "--inputs", f"{models}:make_inputs", "--policy", "none"
    )
    assert [u.module for u in report.units] == [""]
    assert report.config["auto_wrap_policy"] is None


def test_report_default_output_path(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without -o: the interactive page report.html, and a line saying only the root is a
    unit when no wrap policy was given."""
    code, out, _ = _run(capsys, "report", f"{models}:build_with_inputs")
    assert code == 0
    assert "wrote report.html" in out
    assert "root only: 1 unit (no wrap policy" in out
    assert "<html" in Path("report.html").read_text()[:200].lower()


def test_report_policy_transformer_several_classes(
    models: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report, _ = _report(
        capsys, f"{models}:build_with_inputs", "--policy", "transformer:Block, Head"
    )
    assert [u.module for u in report.units] == ["", "blocks.0", "blocks.1", "blocks.2", "head"]
    assert "Block" in report.config["auto_wrap_policy"]
    assert "Head" in report.config["auto_wrap_policy"]


def test_report_policy_size(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    report, _ = _report(capsys, f"{models}:build_with_inputs", "--policy", "size:500")
    assert "min_num_params=500" in report.config["auto_wrap_policy"]
    mod = sys.modules[models]
    expected = fsdpviz.analyze(
        mod.build(),
        mod.make_inputs(),
        auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=500),
    )
    assert [u.module for u in report.units] == [u.module for u in expected.units]
    assert len(report.units) > 1


def test_report_policy_matches_python_api(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    report, _ = _report(capsys, f"{models}:build_with_inputs", "--policy", "transformer:Block")
    mod = sys.modules[models]
    expected = fsdpviz.analyze(
        mod.build(), mod.make_inputs(), auto_wrap_policy=ModuleWrapPolicy({mod.Block})
    )
    assert report.to_dict() == expected.to_dict()


@pytest.mark.parametrize(
    ("flags", "key", "value"),
    [
        (["--backward-prefetch", "post"], "backward_prefetch", "BACKWARD_POST"),
        (["--backward-prefetch", "none"], "backward_prefetch", None),
        (["--backward-prefetch", "pre"], "backward_prefetch", "BACKWARD_PRE"),
        ([], "backward_prefetch", "BACKWARD_PRE"),
        (["--forward-prefetch"], "forward_prefetch", True),
        ([], "forward_prefetch", False),
        (["--use-orig-params"], "use_orig_params", True),
        (["--sharding-strategy", "grad_op"], "sharding_strategy", "SHARD_GRAD_OP"),
        (["--sharding-strategy", "no_shard"], "sharding_strategy", "NO_SHARD"),
        (["--sharding-strategy", "full"], "sharding_strategy", "FULL_SHARD"),
        (["--sharding-strategy", "hybrid"], "sharding_strategy", "HYBRID_SHARD"),
        (["--world-size", "32"], "world_size", 32),
        (["--trace", "real"], "trace", "real"),
    ],
)
def test_report_fsdp_options(
    models: str,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    key: str,
    value: object,
) -> None:
    report, _ = _report(
        capsys, f"{models}:build_with_inputs", "--policy", "transformer:Block", *flags
    )
    assert report.config[key] == value


def test_report_hybrid_shard_group(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    report, _ = _report(
        capsys,
        f"{models}:build_with_inputs",
        "--sharding-strategy",
        "hybrid",
        "--world-size",
        "16",
    )
    assert report.config["shard_world_size"] == 8


def test_report_fsdp2(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--fully-shard plans FSDP2 on classes and FQNs, as ``fully_shard=[Block, "head"]``."""
    report, _ = _report(
        capsys,
        f"{models}:build_with_inputs",
        "--fully-shard",
        "Block,head",
        "--reshard-after-forward",
        "false",
        "--mixed-precision",
        "bf16,fp32",
        "--world-size",
        "4",
    )
    from torch.distributed.fsdp import MixedPrecisionPolicy

    factories = importlib.import_module(models)
    same = fsdpviz.analyze(
        *factories.build_with_inputs(),
        fully_shard=[factories.Block, "head"],
        reshard_after_forward=False,
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        world_size=4,
        progress=False,
    )
    assert report.config["api"] == "FSDP2"
    assert [u.module for u in report.units] == [u.module for u in same.units]
    assert report.iterations == same.iterations
    assert report.config["mp_policy"] == same.config["mp_policy"]


def test_report_fsdp1_mixed_precision(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    report, _ = _report(
        capsys, f"{models}:build_with_inputs", "--policy", "transformer:Block",
        "--mixed-precision", "fp16",
    )  # fmt: skip
    assert all(u.compute_dtype == "float16" for u in report.units if u.numel)


# ---------------------------------------------------- the job around FSDP


def test_report_job_flags_print_what_analyze_gives(
    models: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--grad-accum, --compile, --float8 and --float32-matmul-precision plan what the Python
    keywords plan, and the command prints what that report says: a line per micro-step, the
    step as the time model costs it compiled, in float8, on TF32."""
    report, out = _report(
        capsys, f"{models}:build_with_inputs", "--fully-shard", "Block", "--world-size", "4",
        "--grad-accum", "3", "--compile", "Block", "--float8",
        "all-gather,filter_fqns=head", "--float32-matmul-precision",
        "high",
    )  # fmt: skip
    factories = importlib.import_module(models)
    same = fsdpviz.analyze(
        *factories.build_with_inputs(), fully_shard=[factories.Block], world_size=4,
        grad_accum=3, compile=[factories.Block], float32_matmul_precision="high",
        float8={"enable_fsdp_float8_all_gather": True, "filter_fqns": ["head"]}, progress=False,
    )  # fmt: skip
    assert report.to_dict() == same.to_dict()
    assert report.config["grad_accum"] == 3 and report.config["compile"] == ["Block"]
    assert report.config["float8"] == {
        "recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": True,
        "filter_fqns": ["head"],
    }  # fmt: skip
    assert report.config["float32_matmul_precision"] == "high"
    assert same.summary() in out
    assert "  first step, micro-step 1/3 (no gradient sync): " in out
    assert "  steady step, micro-step 3/3 (synced): " in out
    assert same.timeline.summary().splitlines()[0] in out
    assert (
        "  job: grad_accum 3 (no gradient sync on 2), torch.compile on Block (fused kernels), "
        "float8 linears (tensorwise) + float8 all-gather, TF32 matmuls "
        "(float32_matmul_precision high)\n"
    ) in out

    def without(key: str) -> fsdpviz.Report:
        options = {
            "grad_accum": 3, "compile": [factories.Block], "float32_matmul_precision": "high",
            "float8": {"enable_fsdp_float8_all_gather": True, "filter_fqns": ["head"]},
        }  # fmt: skip
        del options[key]
        return fsdpviz.analyze(
            *factories.build_with_inputs(), fully_shard=[factories.Block], world_size=4,
            progress=False, **options,
        )  # fmt: skip

    eager, wide = without("compile").timeline, without("float8").timeline
    assert same.timeline.totals["memory_bound_s"] < eager.totals["memory_bound_s"]  # fused
    assert same.timeline.totals["all_gather_bytes"] < wide.totals["all_gather_bytes"]
    for other in (eager, wide):
        assert other.summary().splitlines()[0] not in out


def test_report_job_flags_fsdp1_and_bare(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    """FSDP1 takes them too; bare --compile and --float8 are compile=True and float8=True;
    `--compile MODEL` reads MODEL as the model (argparse gave it to --compile)."""
    report, out = _report(
        capsys, "--compile", f"{models}:build_with_inputs", "--policy", "transformer:Block",
        "--grad-accum", "2", "--float8", "--float32-matmul-precision", "medium",
    )  # fmt: skip
    factories = importlib.import_module(models)
    same = fsdpviz.analyze(
        *factories.build_with_inputs(), auto_wrap_policy=ModuleWrapPolicy({factories.Block}),
        grad_accum=2, compile=True, float8=True, float32_matmul_precision="medium",
        progress=False,
    )  # fmt: skip
    assert report.to_dict() == same.to_dict()
    assert report.config["compile"] is True and report.config["float8"] is not None
    assert same.summary() in out and "micro-step 2/2 (synced)" in out
    assert (
        "  job: grad_accum 2 (no_sync() on 1), torch.compile (fused kernels), float8 linears "
        "(tensorwise), TF32 matmuls (float32_matmul_precision medium)\n"
    ) in out
    plain, out = _report(capsys, f"{models}:build_with_inputs", "--policy", "transformer:Block")
    assert "job:" not in out
    for key in ("grad_accum", "compile", "float8", "float32_matmul_precision"):
        assert key not in plain.config.to_dict()  # not given: not stated, as in Python


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grad-accum", "0"], "argument --grad-accum: must be a positive int (micro-steps "
         "per optimizer step), got '0'"),
        (["--grad-accum", "two"], "must be a positive int"),
        (["--float32-matmul-precision", "hgh"], "argument --float32-matmul-precision: must be "
         "one of highest, high, medium (as torch.set_float32_matmul_precision takes it), got "
         "'hgh'; did you mean 'high'?"),
        (["--compile", "Blok"], "--compile: the model has no module of class 'Blok'; did you "
         "mean 'Block'?"),
        (["--float8", "rowwize"], "--float8: unknown 'rowwize'; did you mean 'rowwise'?"),
        (["--float8", "allgather"], "--float8: unknown 'allgather'; did you mean 'all-gather'?"),
        (["--float8", "recipe=rowwise"], "--float8: unknown key 'recipe'; did you mean "
         "'recipe_name'?"),
        (["--float8", "enable_fsdp_float8_all_gather"], "--float8: "
         "enable_fsdp_float8_all_gather needs FSDP2 (fully_shard); FSDP1 all-gathers the "
         "weights in their own dtype. Drop it, or plan with --fully-shard NAMES"),
        (["--fully-shard", "Block", "--float8", "recipe_name=rowwise,"
          "enable_fsdp_float8_all_gather=true"], "--float8: enable_fsdp_float8_all_gather "
         "applies to tensorwise scaling"),
    ],
)  # fmt: skip
def test_report_bad_job_flags(
    models: str, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    """The messages analyze gives for these keywords, in the flags' words: exit status 2."""
    code, out, err = _run(capsys, "report", f"{models}:build_with_inputs", *flags)
    assert code == 2 and out == ""
    assert err.startswith("fsdpviz report: error: ") and "usage:" not in err
    assert message in err
    assert "Traceback" not in err


# --------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--fully-shard", "Block", "--backward-prefetch", "post"], "is an FSDP1 option"),
        (
            ["--fully-shard", "Block", "--policy", "transformer:Block", "--use-orig-params"],
            "--policy, --use-orig-params are FSDP1 options",
        ),
        (["--reshard-after-forward", "true"], "is an FSDP2 option: add --fully-shard"),
        (["--fully-shard", "Blok"], "did you mean 'Block'?"),
        (["--fully-shard", ","], "at least one module class or FQN"),
        (["--fully-shard", "Block", "--reshard-after-forward", "maybe"], "true, false or"),
        (["--mixed-precision", "bf17"], "unknown dtype 'bf17'; did you mean 'bf16'?"),
        (["--mixed-precision", "bf16,fp32,fp16"], "DTYPE or DTYPE,REDUCE_DTYPE"),
    ],
)
def test_report_bad_fsdp_flags(
    models: str, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    code, out, err = _run(capsys, "report", f"{models}:build_with_inputs", *flags)
    assert code == 2 and out == ""
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("transformer:Blok", "did you mean 'Block'?"),
        ("transformer:Block,Haed", "did you mean 'Head'?"),
        ("transformer:Zzzzzz", "no module of class 'Zzzzzz'"),
        ("transformer:", "not valid"),
        ("transformer:,", "at least one class name"),
        ("size:abc", "positive integer"),
        ("size:0", "positive integer"),
        ("size:", "not valid"),
        ("bogus", "not valid"),
        ("none:x", "not valid"),
    ],
)
def test_report_bad_policy(
    models: str, capsys: pytest.CaptureFixture[str], policy: str, message: str
) -> None:
    code, out, err = _run(
        capsys, "report", f"{models}:build_with_inputs", "--policy", policy, "-o", "out.json"
    )
    assert code == 2
    assert out == ""
    assert message in err
    assert err.startswith("fsdpviz report: error: ") and "usage:" not in err
    assert "Traceback" not in err
    assert not Path("out.json").exists()


def test_report_size_policy_accepts_scientific(
    models: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report, _ = _report(capsys, f"{models}:build_with_inputs", "--policy", "size:1e3")
    assert "min_num_params=1000" in report.config["auto_wrap_policy"]


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_such_module_xyz:build", "cannot import module 'no_such_module_xyz'"),
        (f"{MODELS}:biuld", "has no attribute 'biuld'; did you mean 'build'?"),
        (f"{MODELS}:Net.nope", f"'{MODELS}:Net' has no attribute 'nope'"),
        (f"{MODELS}", "must be MODULE:NAME"),
        (f"{MODELS}:", "must be MODULE:NAME"),
        ("models.py:build", "looks like a file"),
        (f"{MODELS}:NOT_CALLABLE", "not a callable"),
        (f"{MODELS}:not_a_model", "expected an nn.Module or (model, inputs)"),
        (f"{MODELS}:build", "pass --inputs"),
    ],
)
def test_report_bad_factory(
    models: str, capsys: pytest.CaptureFixture[str], factory: str, message: str
) -> None:
    code, _, err = _run(capsys, "report", factory)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_report_bad_inputs_factory(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "report", f"{models}:build", "--inputs", f"{models}:make_input")
    assert code == 2
    assert "--inputs" in err and "did you mean 'make_inputs'?" in err


def test_report_rejects_unknown_suffix(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "report", f"{models}:build_with_inputs", "-o", "r.csv")
    assert code == 2
    assert "unknown suffix '.csv'" in err and ".html" in err


def test_report_writes_html(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        capsys, "report", f"{models}:build_with_inputs", "--policy", "transformer:Block",
        "-o", "report.html",
    )  # fmt: skip
    assert code == 0, err
    page = Path("report.html").read_text()
    assert "fsdpviz prediction: FSDP1, 4 units" in page
    assert "wrote report.html" in out


def test_report_bad_choice(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        capsys, "report", f"{models}:build_with_inputs", "--sharding-strategy", "zero3"
    )
    assert code == 2
    assert "invalid choice" in err


def test_report_analysis_error_exits_1(models: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "report", f"{models}:data_dependent", "-o", "out.json")
    assert code == 1
    assert err.startswith("error: tracing on the meta device failed")
    assert "Traceback" not in err
    assert out == ""
    assert not Path("out.json").exists()


def test_report_trace_real_handles_data_dependent_model(
    models: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report, _ = _report(capsys, f"{models}:data_dependent", "--trace", "real")
    assert report.config["trace"] == "real"
    assert [u.module for u in report.units] == [""]


def test_report_finds_modules_in_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Like ``python -m``, the console script can import ``./module.py``."""
    name = "fsdpviz_cli_cwd_models"
    (tmp_path / f"{name}.py").write_text(MODELS_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        code, _, err = _run(capsys, "report", f"{name}:build_with_inputs", "-o", "x.json")
    finally:
        sys.modules.pop(name, None)
    assert code == 0, err


# ------------------------------------------------------ real entry point


def test_python_dash_m_demo(tmp_path: Path) -> None:
    path = tmp_path / "demo.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpviz", "demo", "-o", str(path), "--world-size", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {path}" in proc.stdout
    report = fsdpviz.load(str(path))
    assert len(report.units) == ExampleConfig().num_layers + 1
    assert report.config["world_size"] == 4


def test_python_dash_m_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpviz", "demo", "-o", str(tmp_path / "demo.txt")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("fsdpviz demo: error: cannot write")
    assert "usage:" not in proc.stderr
    assert "unknown suffix '.txt'" in proc.stderr


def test_report_cpu_offload_and_checkpointing_flags(
    models: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The flags that act on fsdpviz's advice: --cpu-offload (both APIs) and
    --activation-checkpointing (classes, or selective:CLASSES)."""
    fsdp1, _ = _report(capsys, f"{models}:build_with_inputs", "--policy", "transformer:Block",
                       "--cpu-offload", "--activation-checkpointing", "Block")  # fmt: skip
    assert fsdp1.config.cpu_offload and fsdp1.config.api == "FSDP1"
    assert fsdp1.config.activation_checkpointing == {
        "mode": "full", "classes": ["Block"], "modules": 3,
    }  # fmt: skip
    flags = ["--fully-shard", "Block", "--cpu-offload", "--activation-checkpointing"]
    fsdp2, _ = _report(capsys, f"{models}:build_with_inputs", *flags, "selective:Block")
    assert fsdp2.config.cpu_offload and fsdp2.config.api == "FSDP2"
    assert fsdp2.config.activation_checkpointing["mode"] == "selective"


def test_advice_as_flags() -> None:
    from fsdpviz._options_cli import flags_for

    assert flags_for({"activation_checkpointing": ["Block"]}) == "--activation-checkpointing Block"
    assert flags_for({"world_size": 128}) == "--world-size 128"
    assert flags_for({"sharding_strategy": "FULL_SHARD"}) == "--sharding-strategy full"
    assert flags_for({"reshard_after_forward": True}) == "--reshard-after-forward true"
    assert flags_for({"cpu_offload": True}) == "--cpu-offload"
    assert flags_for({"mixed_precision": "bfloat16"}) == "--mixed-precision bf16"
    assert flags_for({"use_cache": False}, "hf") == "--set use_cache=false"
    assert flags_for({"use_cache": False}, "factory") == (
        "use_cache=False in the inputs (--inputs, or the factory's)"
    )
