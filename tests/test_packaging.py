"""The sdist and the wheel ship the bundled front end (fsdpviz/static is build output,
ignored by git) and the prebuilt JupyterLab extension (fsdpviz/labextension, installed as
share/jupyter/labextensions/fsdpviz), so installing either needs no Node.js or npm, and
JupyterLab in a fresh environment lists the extension, enabled and OK."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
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
LABEXTENSION = ROOT / "fsdpviz" / "labextension"
SHARED = "fsdpviz-0.1.0.data/data/share/jupyter/labextensions/fsdpviz/"


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    subprocess.run(command, check=True, env=env)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from the sdist where no node or npm can be found (the sdist's built
    front end and extension ship as they are)."""
    if not (STATIC / "widget.js").exists() or not (LABEXTENSION / "package.json").exists():
        pytest.skip("run `make js` first")
    tmp_path = tmp_path_factory.mktemp("packaging")
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
    assert {"fsdpviz/labextension/package.json", "install.json", "js/src/lab/index.ts"} <= names
    assert not any(n.startswith(("js/node_modules", "js/lib", ".venv")) for n in names)
    only_python = tmp_path / "bin"
    only_python.mkdir()
    (only_python / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(only_python)}
    (source,) = (tmp_path / "src").iterdir()
    wheels = tmp_path / "wheels"
    _pip("wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(wheels),
         str(source), env=env)  # fmt: skip
    (built,) = wheels.glob("fsdpviz-*.whl")
    return built


def test_sdist_and_wheel_contain_the_front_end(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert (
        FRONT_END | {"fsdpviz/export/page.css", "fsdpviz/views/colors.json", "fsdpviz/py.typed"}
        <= names
    )
    assert not any(n.startswith("js/") for n in names)
    # the JupyterLab extension, where JupyterLab looks, once (not also inside the package)
    shared = {n.removeprefix(SHARED) for n in names if n.startswith(SHARED)}
    assert {"package.json", "install.json"} <= shared
    assert any(re.fullmatch(r"static/remoteEntry\.\w+\.js", n) for n in shared), shared
    assert not any(n.startswith("fsdpviz/labextension") for n in names)


def test_jupyterlab_lists_the_extension_of_a_fresh_install(wheel: Path, tmp_path: Path) -> None:
    """``pip install`` of the wheel in a fresh venv, then ``jupyter labextension list``
    there: fsdpviz enabled and OK. JupyterLab's Python packages come from this venv (a
    ``.pth`` file: installing them again would only fetch them again); the fresh venv's
    own ``share/jupyter`` holds nothing but what the wheel installed."""
    import venv

    fresh = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=False).create(fresh)
    python = fresh / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    here = sysconfig.get_paths()["purelib"]
    Path(purelib, "_dev_site.pth").write_text(here + "\n")
    _pip("--python", str(python), "install", "--no-deps", "--no-index", "--quiet", str(wheel))
    assert (fresh / "share/jupyter/labextensions/fsdpviz/install.json").is_file()
    listed = subprocess.run(
        [str(python), "-m", "jupyterlab.labextensions", "list"],  # jupyter labextension list
        check=True, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    assert str(fresh / "share/jupyter/labextensions") in text, text
    line = next((ln for ln in text.splitlines() if ln.strip().startswith("fsdpviz ")), None)
    assert line is not None, text
    assert re.search(r"fsdpviz v0\.1\.0 enabled\s+OK \(python, fsdpviz\)", line), line
