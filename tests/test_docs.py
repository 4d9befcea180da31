"""Every code block of docs/*.md and README.md runs, in order, page by page.

A page runs in an empty directory: ``python`` blocks in one namespace, ``python
file=NAME`` blocks are written to NAME, ``bash`` blocks run in bash (the venv's
``fsdpviz`` and ``torchrun`` first on PATH); ``text`` blocks are output. Not run: the
README's quick start (``make``), which sets up a machine and is what CI runs, and
``bash hub`` blocks, which fetch configs from the Hugging Face hub (tests have no network;
docs/cli.md runs the same commands on a local config directory).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(page: Path) -> list[tuple[str, str, str, int]]:
    """(language, info, code, line) of each fenced block."""
    text = page.read_text()
    return [
        (m[1], m[2].strip(), m[3], text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)
    ]


def test_the_reference_pages_have_code() -> None:
    pages = {p.name: p for p in PAGES}
    for name in ("README.md", "api.md", "cost.md", "views.md", "recording.md", "cli.md"):
        assert blocks(pages[name]), name


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_bytes()) < 8 * 1024


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for lang, info, code, line in blocks(page):
        where = f"{page.name}:{line}"
        if lang == "python" and info.startswith("file="):
            (tmp_path / info.removeprefix("file=")).write_text(code)
        elif lang == "python":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(compile(code, where, "exec"), namespace)
        elif lang == "bash" and (info == "hub" or (page.name == "README.md" and "make " in code)):
            continue
        elif lang == "bash":
            done = subprocess.run(["bash", "-e", "-c", code], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=600)  # fmt: skip
            assert done.returncode == 0, f"{where}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        else:
            assert lang in ("text", "toml", "yaml"), f"{where}: unknown block language {lang!r}"


def test_the_way_in_leads_to_the_notebook() -> None:
    """The README says how to open the quick start in JupyterLab; `make demo` ends with the
    next step, `make lab` opens the quick start in the venv's JupyterLab (--allow-root as
    root). (`make -n`: the commands are printed, not run.)"""
    import shutil
    import subprocess

    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "notebooks/quickstart.ipynb" in readme
    assert "--allow-root" in readme
    if shutil.which("make") is None:
        pytest.skip("no make")
    demo = subprocess.run(["make", "-n", "-C", str(ROOT), "demo", "VENV=/nonexistent-venv"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "fsdpviz demo -o fsdpviz-demo.html" in demo and "make lab" in demo
    lab = subprocess.run(["make", "-n", "-C", str(ROOT), "lab", "VENV=/nonexistent-venv"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "/nonexistent-venv/bin/jupyter lab notebooks/quickstart.ipynb" in lab
    assert "--allow-root" in lab
    assert (ROOT / "notebooks" / "quickstart.ipynb").is_file()
