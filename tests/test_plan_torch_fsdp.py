"""Whose FSDP a plan follows: the installed torch's, or ``torch_version=``'s.

The behaviours that differ between releases are planned from the release's rules
(``fsdpviz/plan/torch_fsdp.py``); these tests plan for older releases on whatever torch is
installed, and check the rules against the installed torch's own code (2.8 to 2.14). The
conformance suites run real FSDP on an older torch too (``make test-older-torch``).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import handwritten_models as hm
import pytest
import torch
from torch import nn

import fsdpviz
from fsdpviz import Report
from fsdpviz.errors import ConfigError, FSDPConfigError
from fsdpviz.plan.torch_fsdp import NEWEST, OLDEST, TorchFSDP, installed, torch_fsdp
from fsdpviz.replan import replay
from fsdpviz.views.card import report_html


def _x() -> torch.Tensor:
    return torch.zeros(2, 8)


def _events(report: Report, it: int = 0) -> list[tuple[str, str, str]]:
    return [(e.kind, e.unit, e.phase) for e in report.iterations[it]]


def _fsdp2(version: str | None = None, model: nn.Module | None = None, **kw: Any) -> Report:
    options: dict[str, Any] = {"fully_shard": [hm.Block], "world_size": 4, **kw}
    if version is not None:
        options["torch_version"] = version
    return fsdpviz.analyze(model or hm.Stack(), _x(), progress=False, **options)


def test_a_plan_states_the_installed_torch() -> None:
    report = fsdpviz.analyze(hm.Stack(), _x(), world_size=4, progress=False)
    version = torch.__version__.split("+")[0]
    assert report.config.torch_version == version
    assert report.config.to_dict()["torch_version"] == version
    assert report.config.whose_fsdp == f"FSDP1 of torch {version}"
    assert f"FSDP1 of torch {version}" in report.summary()
    assert f"· torch {version}</div>" in report_html(report)


def test_a_plan_for_another_release_says_so() -> None:
    report = _fsdp2("2.8")
    assert report.config.torch_version == "2.8"
    assert "FSDP2 of torch 2.8" in report.summary()
    assert "torch 2.8" in report_html(report)
    assert Report.from_json(report.to_json()).config.torch_version == "2.8"


@pytest.mark.parametrize("bad", ["2.5", "2.15", "3.0", "latest", 2.8])
def test_a_release_outside_the_range_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="torch_version"):
        _fsdp2(bad)


def test_a_report_saved_without_the_torch_version_loads(tmp_path: Path) -> None:
    data = _fsdp2().to_dict()
    del data["config"]["torch_version"]
    old = Report.from_dict(data)
    assert old.config.torch_version is None and "torch_version" not in old.config
    assert old.config.whose_fsdp == "FSDP2"
    assert "torch" not in old.summary().splitlines()[0]
    assert "· torch" not in report_html(old)
    # a replay of it follows the installed torch
    assert replay(old, world_size=2).config.torch_version is None


def test_before_2_8_the_root_stays_unsharded_even_when_asked() -> None:
    for version, root_freed in (("2.7", False), ("2.8", True)):
        report = _fsdp2(version, reshard_after_forward=True)
        forward_frees = [u for k, u, p in _events(report) if k == "free" and p == "forward"]
        assert ("" in forward_frees) is root_freed, version
        assert report.config.reshard_after_forward[""] is root_freed
    # by default the root stays unsharded in every release
    for version in ("2.6", "2.13"):
        assert _fsdp2(version).config.reshard_after_forward[""] is False


def test_one_rank_all_gathers_before_2_9() -> None:
    gathers = {
        v: sum(k == "all_gather" for k, _, _ in _events(_fsdp2(v, world_size=1)))
        for v in ("2.8", "2.9")
    }
    assert gathers["2.9"] == 0
    assert gathers["2.8"] == 5 + 4  # every group in forward, the blocks again in backward
    assert _events(_fsdp2("2.8", world_size=1))[0] == ("all_gather", "", "forward")


class _HalfRun(nn.Module):
    """A grouped call's second module never runs forward."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.a(x)))


def test_a_grouped_call_half_run_before_2_13_is_never_completed() -> None:
    kw: dict[str, Any] = {"fully_shard": [("a", "b")], "world_size": 2}
    new = fsdpviz.analyze(_HalfRun(), _x(), torch_version="2.13", progress=False, **kw)
    old = fsdpviz.analyze(_HalfRun(), _x(), torch_version="2.12", progress=False, **kw)
    assert "grouped_forward_incomplete" not in [w.code for w in new.warnings]
    warning = next(w for w in old.warnings if w.code == "grouped_forward_incomplete")
    assert warning.units == ["a, b"] and "torch 2.12" in warning.message
    # 2.13: the root's post-forward completes the group (it is freed in forward);
    # 2.12: it stays unsharded, is never all-gathered in backward, freed at the end
    assert ("free", "a, b", "forward") in _events(new)
    assert ("free", "a, b", "forward") not in _events(old)
    assert ("free", "a, b", "backward") in _events(old)


def test_ignored_params_needs_2_7() -> None:
    model = hm.Stack()
    with pytest.raises(FSDPConfigError, match=r"torch 2\.7"):
        _fsdp2("2.6", model, ignored_params={model.head.weight})
    _fsdp2("2.7", model, ignored_params={model.head.weight})


def test_a_replay_follows_the_release_of_its_report() -> None:
    base = _fsdp2("2.8", reshard_after_forward=True)
    replayed = replay(base, world_size=1)
    assert replayed.config.torch_version == "2.8"
    fresh = _fsdp2("2.8", reshard_after_forward=True, world_size=1)
    assert [_events(replayed, i) for i in range(2)] == [_events(fresh, i) for i in range(2)]


def test_the_rules_of_each_release() -> None:
    assert TorchFSDP.of("2.13.0+cpu").version == "2.13.0"
    first = {
        "ignored_params": (2, 7),
        "final_callback_by_state": (2, 7),
        "auto_reshard_after_forward": (2, 8),
        "one_rank_copies": (2, 9),
        "post_forward_in_backward_skips": (2, 10),
        "recompute_unshards": (2, 11),
        "hooks_enter_dataclasses": (2, 12),
        "grouped_per_member": (2, 13),
        "recompute_casts": (2, 13),
        "warns_view_output": (2, 13),
    }
    for minor in range(OLDEST[1], NEWEST[1] + 1):
        rules = torch_fsdp(f"2.{minor}")
        for flag, since in first.items():
            assert getattr(rules, flag) is ((2, minor) >= since), (flag, minor)


def test_the_rules_match_the_installed_torch() -> None:
    """Each flag read off the installed torch's FSDP2 where its code shows it."""
    from torch.distributed.fsdp import _common_utils, fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group, _fsdp_state

    rules = installed()
    assert OLDEST <= rules.release <= NEWEST
    state = inspect.getsource(_fsdp_state)
    group = inspect.getsource(_fsdp_param_group)
    found = {
        "ignored_params": "ignored_params" in inspect.signature(fully_shard).parameters,
        "auto_reshard_after_forward": "_auto_reshard_after_forward" in state,
        "one_rank_copies": "world_size == 1" in group,
        "post_forward_in_backward_skips": "is_bw()" in group,
        "hooks_enter_dataclasses": hasattr(_common_utils, "collect_grad_tensors"),
        "grouped_per_member": "_force_complete_incomplete_states" in state,
        "warns_view_output": "returned a view tensor" in state,
    }
    for flag, present in found.items():
        assert getattr(rules, flag) is present, flag
