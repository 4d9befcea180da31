"""A tuning's page (``tuning.save("tune.html")``) and image: what the page holds (the tune
view's data, the plans of the configurations it keeps, each as the report's own page would
draw it), which plans it keeps and how many, and the mistakes a user can make.

The page drawn in Chromium is tested in ``test_browser_tune.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from views_models import needs_front_end, tune_small

from fsdpviz import ConfigError, Tuning
from fsdpviz.export import page_script
from fsdpviz.export._html import page_config
from fsdpviz.export._tune_page import MAX_PLANS, kept_plans, tune_page
from fsdpviz.views.tune_view import anchor_of, tune_data

pytestmark = needs_front_end


@pytest.fixture(scope="module")
def tuning() -> Tuning:
    return tune_small()


def _config(page: str) -> dict:  # type: ignore[type-arg]
    return json.loads(page_script(page, "fv-config"))


def test_the_page_holds_the_tune_view_and_the_plans_it_keeps(
    tuning: Tuning, tmp_path: Path
) -> None:
    path = tuning.save(str(tmp_path / "tune.html"))
    page = Path(path).read_text()
    config = _config(page)
    tune = config["tune"]
    best = tuning.best
    assert best is not None
    assert tune["state"]["data"] == json.loads(json.dumps(tune_data(tuning)))
    assert tune["state"]["selected"] == best.index  # the best's plan shown first
    kept = kept_plans(tuning, best)
    assert [int(k) for k in tune["plans"]] == [c.index for c in kept]
    assert tune["state"]["saved"] == [c.index for c in kept]
    n = len(tuning.candidates)
    others = [c for c in tuning.candidates if c not in kept]  # off the frontier, no knob's
    assert len(kept) == n - 1 and others[0] not in tuning.frontier
    assert tune["kept"].startswith(f"This page holds the plans of {n - 1} of the {n} ")
    for c in kept:
        plan = tune["plans"][str(c.index)]
        views = json.loads(page_script(page, plan["script"]))["views"]
        assert views == json.loads(json.dumps(page_config(c.report)["views"]))
        assert plan["label"] == c.label
        assert plan["title"].startswith(f"Configuration #{c.index}")
        assert f"{c.tokens_per_s:,.0f} tokens/s per GPU" in plan["title"]
        assert "peak memory per rank" in plan["header"]
    assert config["views"] == {"timeline": None, "explorer": None, "prefetch": None}
    heading = re.search(r"<h1>(.*?)</h1>", page)
    assert heading is not None and heading.group(1) == "fsdpviz tune: FSDP2 on 8 x H100 SXM 80GB"


def test_which_plans_a_page_keeps_first(tuning: Tuning) -> None:
    """The one shown first, the best, the given, each knob's alternative, the frontier."""
    first = tuning.candidates[2]
    kept = kept_plans(tuning, first)
    best = tuning.best
    assert best is not None
    assert kept[:3] == [first, best, tuning.user]
    alternatives = [a["candidate"] for a in tuning.alternatives()]
    assert all(c in kept for c in alternatives + tuning.frontier)
    assert len({c.index for c in kept}) == len(kept)
    assert kept_plans(tuning, first, max_plans=2) == [first, best]
    assert MAX_PLANS >= 20


def test_a_page_caps_its_plans_and_says_so(tuning: Tuning) -> None:
    page = tune_page(tuning, max_plans=2, selected=tuning.user.index)
    tune = _config(page)["tune"]
    assert tune["state"]["selected"] == tuning.user.index
    assert len(tune["plans"]) == 2
    n = len(tuning.candidates)
    assert tune["kept"].startswith(f"This page holds the plans of 2 of the {n} configurations")
    assert "tuning.candidates[i].report.save" in tune["kept"]
    one = _config(tune_page(tuning, max_bytes=1))["tune"]  # the first plan always
    assert list(one["plans"]) == [str(anchor_of(tuning).index)]


def test_a_tuning_where_nothing_fits_opens_on_the_lightest() -> None:
    tuning = tune_small(memory_budget="1MiB")
    tune = _config(tune_page(tuning))["tune"]
    low = min(tuning.candidates, key=lambda c: c.memory_bytes)
    assert tune["state"]["selected"] == low.index
    assert tune["state"]["data"]["anchor"] == "lightest"


def test_mistakes_say_what_to_do(tuning: Tuning, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'theme'"):
        tuning.save(str(tmp_path / "t.html"), them="dark")
    with pytest.raises(ConfigError, match="selected=999 is not the index"):
        tuning.save(str(tmp_path / "t.html"), selected=999)
    with pytest.raises(ConfigError, match=r"use \.html"):
        tuning.save(str(tmp_path / "t.graphml"))
    with pytest.raises(ConfigError, match="theme='blue'"):
        tune_page(tuning, theme="blue")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"for a tuning's \.png file"):
        tuning.save(str(tmp_path / "t.png"), selected=0)


def test_the_json_and_the_image(tuning: Tuning, tmp_path: Path) -> None:
    saved = json.loads(Path(tuning.save(str(tmp_path / "t.json"))).read_text())
    assert saved["frontier"] == [c.index for c in tuning.frontier]
    png = Path(tuning.save(str(tmp_path / "t.png"), width=900, height=500))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
