"""Every notebook in ``notebooks/`` runs top to bottom in a fresh kernel, each in under 2 minutes.

The notebooks are copied into a temporary directory and run there, so what they write
(``fsdpviz-out/``) never lands in the repository. The kernel is the Python running
pytest: a ``python3`` kernel spec for ``sys.executable`` is written to a temporary
directory put first on ``JUPYTER_PATH`` (nothing is registered globally).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat import NotebookNode

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
MIME = "application/vnd.fsdpviz.report+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
SVG = "image/svg+xml"
LIMIT_S = 120.0
PROBE = "import sys; print('kernel python:', sys.executable)"


@pytest.fixture(scope="module")
def kernel_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ``kernels/python3/kernel.json`` that starts ``sys.executable``."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3 (tests)", "language": "python"})
    )
    return root


def _execute(name: str, kernel_path: Path, tmp_path: Path, mp: pytest.MonkeyPatch) -> Any:
    """Run notebook ``name`` in a copy under ``tmp_path``; return (notebook, seconds, workdir)."""
    mp.setenv("JUPYTER_PATH", str(kernel_path))
    mp.setenv("OMP_NUM_THREADS", "1")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_VERBOSITY", "error")
    workdir = tmp_path / "nb"
    workdir.mkdir()
    shutil.copy(NOTEBOOKS / name, workdir / name)
    nb = nbformat.read(workdir / name, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(
        nb,
        timeout=int(LIMIT_S),
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    seconds = time.perf_counter() - start
    print(f"{name}: {seconds:.1f} s")
    assert seconds < LIMIT_S, f"{name} took {seconds:.0f} s, over the {LIMIT_S:.0f} s limit"
    assert f"kernel python: {sys.executable}" in _texts(nb.cells[-1])
    _check_saved_views(name, nb)
    return nb, seconds, workdir


def _check_saved_views(name: str, nb: NotebookNode) -> None:
    """Every fsdpviz output (a live widget, a card) carries the views' data for fsdpviz's
    JupyterLab extension and a static SVG fallback, so the saved notebook keeps them."""
    shown = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            html = data.get("text/html", "")
            # a tqdm bar: with a total ("40%|"), or counting ("7config [00:01, ...]")
            progress = re.search(r"\d+%\||\d+\w* \[\d+:\d+", data.get("text/plain", ""))
            if (
                (WIDGET in data and not progress)
                or MIME in data
                or html.startswith('<div class="fsdpviz-card"')
            ):
                shown += 1
                where = f"{name}: the output of {cell.source.splitlines()[0]!r}"
                assert MIME in data and SVG in data, f"{where} has {sorted(data)}"
                assert data[SVG].startswith("<svg") and data["text/plain"].strip(), where
                assert data[MIME]["config"], where
    assert shown > 0, f"{name} shows no fsdpviz output"


def _texts(cell: NotebookNode) -> str:
    """Everything a reader sees in a cell's outputs: streams and text/plain, HTML, errors.

    A stream reads as the page shows it: one text, however many messages the kernel sent
    it in (how print() output is cut into messages depends on timing)."""
    parts: list[str] = []
    last_stream: str | None = None
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and out.name == last_stream:
            parts[-1] += out.text
        elif out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("display_data", "execute_result"):
            for mime in ("text/plain", "text/html"):
                if mime in out.data:
                    parts.append(out.data[mime])
        last_stream = out.name if out.output_type == "stream" else None
    return "\n".join(parts)


def _cell(nb: NotebookNode, source_start: str) -> NotebookNode:
    """The code cell whose source starts with ``source_start``."""
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith(source_start):
            return cell
    raise AssertionError(f"no code cell starts with {source_start!r}")


def _mimes(cell: NotebookNode) -> set[str]:
    return {m for out in cell.get("outputs", []) for m in out.get("data", {})}


def test_every_notebook_is_tested() -> None:
    names = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert names == sorted(
        [
            "quickstart.ipynb",
            "fsdp2_vs_fsdp1.ipynb",
            "record_real_run.ipynb",
            "memory_budget.ipynb",
        ]
    )


def test_notebooks_are_committed_without_outputs() -> None:
    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path.name
        assert nb.metadata.kernelspec.name == "python3", path.name


@pytest.mark.slow
def test_quickstart(kernel_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb, _, workdir = _execute("quickstart.ipynb", kernel_path, tmp_path, monkeypatch)
    card = _cell(nb, "report = fsdpviz.analyze(")
    html = next(o.data["text/html"] for o in card.outputs if "text/html" in o.get("data", {}))
    assert html.startswith('<div class="fsdpviz-card"')
    assert "<b>fsdpviz</b> prediction · FSDP1 · 9 wrap units · world size 8" in html
    assert "auto_wrap_policy ModuleWrapPolicy({LlamaDecoderLayer})" in html
    assert "model.layers.0" in html and "LlamaDecoderLayer" in html
    assert "<b>peak " in html and "<svg" in html
    assert "fsdpviz prediction: 9 units, world size 8" in _texts(card)  # text/plain
    assert "application/vnd.jupyter.widget-view+json" in _mimes(_cell(nb, "view = report.show("))
    step = _texts(_cell(nb, "view.timeline.step = 10"))
    assert "event 10: " in step and "unit outlined: model.layers." in step
    # nbconvert --to html of the notebook as JupyterLab saves it (no widget state; nbclient
    # keeps it, and nbconvert would embed the live widgets): the static SVG stands in
    from nbconvert import HTMLExporter

    saved = nbformat.from_dict(nb)
    saved.metadata.pop("widgets", None)
    page, _ = HTMLExporter().from_notebook_node(saved)
    images = page.count('data-mime-type="image/svg+xml"')
    assert images >= 1 and "Error displaying widget" not in page, images
    assert "data:image/svg+xml;base64," in page
    out = workdir / "fsdpviz-out"
    assert (out / "quickstart.html").stat().st_size > 10_000
    assert (out / "units.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "image/png" in _mimes(_cell(nb, "from IPython.display import Image"))


@pytest.mark.slow
def test_fsdp2_vs_fsdp1(kernel_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb, _, _ = _execute("fsdp2_vs_fsdp1.ipynb", kernel_path, tmp_path, monkeypatch)
    card = _texts(_cell(nb, "fsdp2 = fsdpviz.analyze("))
    assert "<b>fsdpviz</b> prediction · FSDP2 · 9 wrap units · world size 8" in card
    assert "fully_shard on 9 modules · reshard_after_forward True" in card
    same = _texts(_cell(nb, "cmp = fsdpviz.compare(fsdp1, fsdp2)"))
    assert "same wrapping, different schedule" in same
    assert "same wrapping: True | identical schedule: False" in same
    assert "application/vnd.jupyter.widget-view+json" in _mimes(_cell(nb, "cmp.show()"))
    root = _texts(
        _cell(nb, 'for name, report in (("FSDP1", fsdp1), ("FSDP2", fsdp2)):\n    print(name)')
    )
    assert "free (root) (post_forward of (root))" in root
    assert "all_gather (root) (pre_backward of (root))" in root
    assert "prefetch" in _texts(
        _cell(nb, 'for name, report in (("FSDP1", fsdp1), ("FSDP2", fsdp2)):\n    pre')
    )
    split = _texts(_cell(nb, "fsdp2_split = fsdpviz.analyze("))
    assert "different wrapping" in split
    assert "parameter lm_head.weight: unit (root) in FSDP1" in split
    table = _texts(_cell(nb, "plans = {"))
    assert table.splitlines()[0].split() == [
        "plan",
        "units",
        "peak",
        "MiB",
        "dominated",
        "by",
        "step",
        "ms",
        "exposed",
        "ms",
    ]
    assert "FSDP2 split" in table and len(table.strip().splitlines()) == 4


@pytest.mark.slow
def test_record_real_run(
    kernel_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb, _, workdir = _execute("record_real_run.ipynb", kernel_path, tmp_path, monkeypatch)
    assert "step 2: loss" in _texts(_cell(nb, "def torchrun("))
    ok = _texts(_cell(nb, 'run = fsdpviz.load("fsdpviz-out/run")'))
    assert "<b>fsdpviz</b> recording · FSDP1 · 2 of 2 ranks · gloo" in ok
    assert "✓ all ranks issued the same events in every iteration" in ok
    assert "recording equals prediction" in _texts(_cell(nb, 'sys.path.insert(0, "fsdpviz-out")'))
    branch = _texts(_cell(nb, 'torchrun("fsdpviz-out/run-branch"'))
    assert "Ranks diverge in iteration 0 at event 3 (forward)" in branch
    assert "ranks diverge at event 3" in branch  # marked in the card's figure
    divergence = _texts(_cell(nb, "divergence = branch.divergence()"))
    assert (
        "rank 0: all_gather 'blocks.1' (pre_forward of 'blocks.1')  in Net > blocks.1" in divergence
    )
    assert (
        "rank 1: all_gather 'blocks.2' (pre_forward of 'blocks.2')  in Net > blocks.2" in divergence
    )
    for shown in ("branch.rank(1).show()", "branch.show()"):
        assert "application/vnd.jupyter.widget-view+json" in _mimes(_cell(nb, shown)), shown
    diff = _texts(_cell(nb, "print(fsdpviz.diff(branch, prediction))"))
    assert "recording differs from prediction" in diff and "rank 1: forward order differs" in diff
    for run in ("run", "run-branch"):
        assert sorted(p.name for p in (workdir / "fsdpviz-out" / run).iterdir()) == [
            "rank0.json", "rank0.jsonl", "rank1.json", "rank1.jsonl"
        ]  # fmt: skip


@pytest.mark.slow
def test_memory_budget(kernel_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb, _, _ = _execute("memory_budget.ipynb", kernel_path, tmp_path, monkeypatch)
    table = _texts(_cell(nb, "table = fsdpviz.sweep("))
    assert "4 configurations from 1 trace(s) and 3 replay(s)" in table
    assert table.count("(over budget)") == 1
    assert "application/vnd.jupyter.widget-view+json" in _mimes(
        _cell(nb, "sweep_view = table.show()")
    )
    tuning = _texts(_cell(nb, "tuning = fsdpviz.tune("))
    assert "fsdpviz tune · FSDP2 on 8 x H100 SXM 80GB" in tuning
    assert "fit a budget of 14 GiB per rank" in tuning and "Best: " in tuning
    assert "Per knob, the best alternative:" in tuning
    assert "application/vnd.jupyter.widget-view+json" in _mimes(_cell(nb, "tuning.show()"))
    best = _texts(_cell(nb, "best = tuning.best"))
    assert "fully_shard(model, mesh=dp_mesh" in best and "<b>fsdpviz</b> prediction · FSDP2" in best
    assert "Nothing fits." in _texts(_cell(nb, "tight = fsdpviz.suggest("))
    checkpointed = _texts(_cell(nb, "checkpointed = fsdpviz.tune("))
    assert "fit a budget of 8 GiB per rank" in checkpointed and "Best: " in checkpointed
    assert "peak " in _texts(_cell(nb, "checkpointed.best.report"))
    lora = _texts(_cell(nb, "from peft import LoraConfig"))  # will my 70B LoRA fit on 8 GPUs?
    assert "44,564,480 trainable of 70,598,270,976 parameters" in lora
    assert "fits in A100 SXM 80GB" in lora
    forty = _texts(_cell(nb, "from fsdpviz.cost import memory_model"))
    assert "does not fit in A100 SXM 40GB" in forty
    assert "optimizer state per rank: 42 MiB for the adapters, 32.9 GiB for a full" in forty
