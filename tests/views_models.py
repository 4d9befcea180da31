"""Small models and reports shared by the view and widget tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pytest
import torch
from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz
from fsdpviz import Report
from fsdpviz.widgets.front_end import STATIC

GOLDEN_DIR = Path(__file__).parent / "golden"

needs_front_end = pytest.mark.skipif(
    not (STATIC / "widget.js").exists(),
    reason="front end not built: run `make js` (make test does)",
)
"""For tests of the widgets' front end (``pytestmark = needs_front_end``)."""


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc(self.norm(x))
        return out


class Tiny(nn.Module):
    """``inp``, three ``Block``s, ``head``: four wrap units with ``ModuleWrapPolicy({Block})``."""

    def __init__(self, d: int = 8, n: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def tiny_inputs() -> torch.Tensor:
    return torch.zeros(2, 4)


def analyze_tiny(**kwargs: Any) -> Report:
    torch.manual_seed(0)
    options: dict[str, Any] = {
        "auto_wrap_policy": ModuleWrapPolicy({Block}),
        "world_size": 4,
        "torch_version": "2.13",  # goldens: the same whatever torch is installed
    }
    options.update(kwargs)
    return fsdpviz.analyze(Tiny(), tiny_inputs(), progress=False, **options)


def figure_json(fig: go.Figure) -> Any:
    """The figure as plain JSON data (plotly's own encoding), for golden comparisons."""
    return json.loads(fig.to_json())


JS_DATA = Path(__file__).resolve().parent.parent / "js" / "test" / "data"


def check_front_end_data(name: str, data: Any) -> None:
    """``js/test/data/<name>`` holds ``data``: the front end's tests run on what Python
    writes today (``FSDPVIZ_UPDATE_GOLDEN=1`` rewrites it)."""
    path = JS_DATA / name
    text = json.dumps(data, indent=None, separators=(",", ":"), sort_keys=True) + "\n"
    if os.environ.get("FSDPVIZ_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with FSDPVIZ_UPDATE_GOLDEN=1"
    assert json.loads(path.read_text()) == json.loads(text), (
        f"{name} differs from what Python writes: rewrite it with FSDPVIZ_UPDATE_GOLDEN=1"
    )


def check_golden(name: str, data: Any) -> None:
    """Compare ``data`` with ``tests/golden/<name>``; ``FSDPVIZ_UPDATE_GOLDEN=1`` rewrites it."""
    path = GOLDEN_DIR / name
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if os.environ.get("FSDPVIZ_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with FSDPVIZ_UPDATE_GOLDEN=1 and review it"
    assert json.loads(path.read_text()) == json.loads(text), (
        f"{name} differs from the golden file; if the change is intended, rewrite it with "
        "FSDPVIZ_UPDATE_GOLDEN=1 and review the diff"
    )


def tune_small(memory_budget: str | None = "2.3MiB", **kwargs: Any) -> fsdpviz.Tuning:
    """A tuning of 7 configurations of a 3-layer example model on 8 ranks (units and
    checkpointing turned; 4 fit the default budget), its search time set to 1 s so that
    its words are the same on every run."""
    from fsdpviz.examples import ExampleConfig, example_inputs, example_model

    torch.manual_seed(0)
    c = ExampleConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_heads=2,
                      num_layers=3)  # fmt: skip
    options: dict[str, Any] = {"knobs": ["wrap", "activation_checkpointing"], "world_size": 8}
    options.update(kwargs)
    tuning = fsdpviz.tune(
        example_model(c), example_inputs(c), memory_budget=memory_budget, progress=False,
        **options,
    )  # fmt: skip
    tuning.seconds = 1.0
    return tuning


def tune_many() -> fsdpviz.Tuning:
    """A tuning of 132 configurations on 8 and 16 ranks under a 3 MiB budget (23 fit)."""
    from fsdpviz.examples import ExampleConfig, example_inputs, example_model

    torch.manual_seed(0)
    c = ExampleConfig(vocab_size=1000, hidden_size=96, intermediate_size=250, num_heads=4)
    tuning = fsdpviz.tune(example_model(c), example_inputs(c), world_size=[8, 16],
                          memory_budget="3MiB", progress=False)  # fmt: skip
    tuning.seconds = 1.0
    return tuning
