"""The sdist and the wheel ship the bundled front end (fsdpviz/static is build output,
ignored by git), so installing either needs no Node.js or npm."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "fsdpviz" / "static"
FRONT_END = {
    "fsdpviz/static/widget.js",
    "fsdpviz/static/widget.css",
    "fsdpviz/static/page.js",
}


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    subprocess.run(command, check=True, env=env)


@pytest.mark.skipif(not (STATIC / "widget.js").exists(), reason="run `make js` first")
def test_sdist_and_wheel_contain_the_front_end(tmp_path: Path) -> None:
    sdist_dir = tmp_path / "sdist"
    # pip builds no sdist; hatchling's PEP 517 hook does, as `python -m build --sdist` would
    code = (
        "import sys; from hatchling.build import build_sdist; "
        f"print(build_sdist({str(sdist_dir)!r}))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    (sdist,) = sdist_dir.glob("fsdpviz-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tar.extractall(tmp_path / "src", filter="data")
    assert FRONT_END | {"js/src/widget.ts", "fsdpviz/export/page.css"} <= names
    assert not any(n.startswith(("js/node_modules", ".venv")) for n in names)
    # A wheel from the sdist where no node or npm can be found: the bundle ships as it is.
    only_python = tmp_path / "bin"
    only_python.mkdir()
    (only_python / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(only_python)}
    (source,) = (tmp_path / "src").iterdir()
    wheels = tmp_path / "wheels"
    _pip("wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(wheels),
         str(source), env=env)  # fmt: skip
    (wheel,) = wheels.glob("fsdpviz-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert (
        FRONT_END | {"fsdpviz/export/page.css", "fsdpviz/views/colors.json", "fsdpviz/py.typed"}
        <= names
    )
    assert not any(n.startswith("js/") for n in names)
