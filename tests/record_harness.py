"""Run ``tests/record_job.py`` under torchrun (CPU, gloo) once per session, and helpers."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from record_job import cases, inputs

import fsdpviz

JOB = Path(__file__).with_name("record_job.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(
    nproc: int, modes: str, out: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node nproc tests/record_job.py modes out`` on 127.0.0.1."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node", str(nproc), "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()),
        str(JOB), modes, str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@functools.cache
def job(nproc: int, modes: str, expect_failure: bool = False) -> Path:
    """The output directory of one torchrun job; each distinct job runs once per session."""
    out = Path(tempfile.mkdtemp(prefix="fsdpviz-record-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    done = torchrun(nproc, modes, out)
    if (done.returncode != 0) != expect_failure:
        raise AssertionError(
            f"torchrun {modes} on {nproc} ranks exited with {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        )
    return out


def predict(name: str, world_size: int) -> fsdpviz.Report:
    """``analyze`` of case ``name`` of ``record_job`` on ``world_size`` ranks."""
    build, kwargs = cases()[name]
    torch.manual_seed(0)
    return fsdpviz.analyze(build(), inputs(), world_size=world_size, **kwargs)


def untimed(report: fsdpviz.Report) -> fsdpviz.Report:
    """``report`` without timestamps and module events, as a prediction has none."""
    its = [[e.untimed() for e in it] for it in report.iterations]
    return replace(report, iterations=its, module_events=[])
