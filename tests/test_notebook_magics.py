"""``%load_ext fsdpviz``: the line and cell magics in a real IPython shell."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

IPython = pytest.importorskip("IPython")


@pytest.fixture(scope="module")
def ip() -> Iterator[Any]:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "fsdpviz")
    shell.run_cell(
        "import torch, fsdpviz\n"
        "from fsdpviz.examples import example_model, example_inputs\n"
        "model = example_model(device='meta')\n"
        "ids = example_inputs(device='meta')\n"
    )
    yield shell


def test_line_magic_returns_the_report(ip: Any) -> None:
    line = "model --inputs ids --policy transformer:DecoderLayer --backward-prefetch post"
    report = ip.run_line_magic("fsdpviz", line + " --world-size 64")
    assert report.config["backward_prefetch"] == "BACKWARD_POST"
    assert report.config["world_size"] == 64
    assert report.forward_order[:2] == ["", "layers.0"]


def test_line_magic_fsdp2(ip: Any) -> None:
    line = "model --inputs ids --fully-shard DecoderLayer,lm_head --mixed-precision bf16"
    report = ip.run_line_magic("fsdpviz", line + " --reshard-after-forward 2 --world-size 8")
    assert report.config["api"] == "FSDP2"
    assert "lm_head" in [u.module for u in report.units]
    assert report.config["mp_policy"]["param_dtype"] == "bfloat16"
    assert set(report.config["reshard_after_forward"].values()) == {2}


def test_line_magic_job_flags(ip: Any) -> None:
    """The job around FSDP, as analyze takes it: the report is the one analyze gives."""
    import fsdpviz
    from fsdpviz.examples import DecoderLayer

    line = (
        "model --inputs ids --fully-shard DecoderLayer --grad-accum 2 --compile DecoderLayer "
        "--float8 --float32-matmul-precision high"
    )
    report = ip.run_line_magic("fsdpviz", line)
    same = fsdpviz.analyze(
        ip.user_ns["model"], ip.user_ns["ids"], fully_shard=[DecoderLayer], grad_accum=2,
        compile=[DecoderLayer], float8=True, float32_matmul_precision="high", progress=False,
    )  # fmt: skip
    assert report.to_dict() == same.to_dict()
    assert report.config["grad_accum"] == 2 and report.config["compile"] == ["DecoderLayer"]
    assert repr(report) == same.summary() and "micro-step 2/2 (synced)" in repr(report)
    bare = ip.run_line_magic("fsdpviz", "--compile model --inputs ids --world-size 4")
    assert bare.config["compile"] is True and bare.config["world_size"] == 4


def test_cell_magic_traces_the_model_the_cell_runs(ip: Any) -> None:
    cell = (
        "net = example_model(device='cpu')\n"
        "out = net(example_inputs(batch=1, seq=8, device='cpu')['input_ids'])\n"
    )
    report = ip.run_cell_magic("fsdpviz", "--policy transformer:DecoderLayer --world-size 4", cell)
    assert report.config["world_size"] == 4
    assert len(report.units) == 5
    assert "out" in ip.user_ns  # the cell itself ran


def test_cell_magic_shows_the_report_not_the_cells_last_value(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cell that ends on the model's output (a training step often does) runs as it is,
    prints what it prints, and shows no tensor: the magic's answer is the report."""
    cell = (
        "net = example_model(device='cpu')\n"
        "print('the cell ran')\n"
        "net(example_inputs(batch=1, seq=8, device='cpu')['input_ids'])\n"
    )
    count = ip.execution_count
    report = ip.run_cell_magic("fsdpviz", "--policy transformer:DecoderLayer --world-size 4", cell)
    printed = capsys.readouterr().out
    assert printed == "the cell ran\n", printed  # no "Out[...]: tensor(...)"
    assert len(report.units) == 5 and ip.execution_count == count


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("model --inputs ids --polcy size:10", "unknown option --polcy; did you mean --policy?"),
        ("model --inputs ids --policy transformer:DecoderLayr", "did you mean 'DecoderLayer'"),
        ("model", "pass --inputs EXPR"),
        ("ids --inputs ids", "must be a torch.nn.Module"),
        ("model --inputs ids --world-size 0", "--world-size: expected a positive integer"),
        ("model --inputs ids --fully-shard DecoderLayer --forward-prefetch", "is an FSDP1 option"),
        (
            "model --inputs ids --grad-accum 0",
            "--grad-accum: must be a positive int (micro-steps per optimizer step), got '0'",
        ),
        (
            "model --inputs ids --grad-acum 2",
            "unknown option --grad-acum; did you mean --grad-accum?",
        ),
        (
            "model --inputs ids --float32-matmul-precision tf32",
            "must be one of highest, high, medium",
        ),
        (
            "model --inputs ids --compile DecoderLayr",
            "--compile: the model has no module of "
            "class 'DecoderLayr'; did you mean 'DecoderLayer'?",
        ),
        (
            "model --inputs ids --float8 enable_fsdp_float8_all_gather=true",
            "--float8: enable_fsdp_float8_all_gather needs FSDP2",
        ),
    ],
)
def test_errors_are_short_messages(ip: Any, line: str, message: str) -> None:
    from IPython.core.error import UsageError

    with pytest.raises(UsageError) as err:
        ip.run_line_magic("fsdpviz", line)
    assert message in str(err.value)


def test_help_lists_the_options(ip: Any) -> None:
    doc = ip.find_line_magic("fsdpviz").__doc__
    assert "--backward-prefetch" in doc and "--fully-shard" in doc
    for flag in ("--grad-accum N", "--compile [CLASSES]", "--float8 [SPEC]",
                 "--float32-matmul-precision highest|high|medium"):  # fmt: skip
        assert flag in doc
