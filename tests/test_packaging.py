"""The wheel ships the bundled front end (fsdpviz/static is build output, ignored by git)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "fsdpviz" / "static"


@pytest.mark.skipif(not (STATIC / "timeline.js").exists(), reason="run `make js` first")
def test_wheel_contains_the_front_end(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("fsdpviz-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "fsdpviz/static/timeline.js",
        "fsdpviz/static/timeline.css",
        "fsdpviz/static/standalone.js",
        "fsdpviz/export/page.css",
    } <= names
    assert "fsdpviz/widgets/timeline_widget.py" in names
    assert not any(n.startswith("js/") for n in names)
