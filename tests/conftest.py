"""Shared fixtures: a fake process group so real FSDP runs in this process."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch.distributed as dist

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FAKE_WORLD_SIZE = 4


@pytest.fixture(scope="session")
def fake_pg() -> Iterator[int]:
    """Real FSDP on the CPU in one process: a fake process group of 4 ranks."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=FAKE_WORLD_SIZE)
    yield FAKE_WORLD_SIZE
