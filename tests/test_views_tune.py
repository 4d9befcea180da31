"""The tune view's data and figure: every configuration of a tuning as a point, placed and
described as the Python API states it, the capacity line, the frontier, the best and the
configuration as given, and the knob table.

Golden files ``tests/golden/views_tune_small.json`` (the data) and
``views_tune_small_figure.json`` (the figure); ``js/test/data/tune.json`` is what the front
end's tests draw. Rewrite them after an intended change with
``FSDPVIZ_UPDATE_GOLDEN=1 pytest tests/test_views_tune.py`` and review the diff.
"""

from __future__ import annotations

import pytest
from views_models import check_front_end_data, check_golden, figure_json, tune_small

from fsdpviz import Tuning
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.timeline import duration_text
from fsdpviz.tuning.result import KNOB_NAMES
from fsdpviz.views.style import format_bytes, theme_colors
from fsdpviz.views.tune_view import GROUP_COLORS, anchor_of, tune_data, tune_figure


@pytest.fixture(scope="module")
def tuning() -> Tuning:
    return tune_small()


def test_tune_data_golden(tuning: Tuning) -> None:
    data = tune_data(tuning)
    check_golden("views_tune_small.json", data)
    check_front_end_data("tune.json", data)


def test_every_point_is_a_candidate_as_the_api_states_it(tuning: Tuning) -> None:
    data = tune_data(tuning)
    p = data["points"]
    cands = tuning.candidates
    assert p["index"] == [c.index for c in cands]
    assert p["y"] == [c.tokens_per_s for c in cands]
    assert p["x"] == [c.memory_bytes for c in cands] == [c.peak_bytes for c in cands]  # budget
    assert p["fits"] == [c.fits for c in cands]
    assert p["traced"] == [c.traced for c in cands]
    cap = data["capacity"]
    assert cap == {"bytes": tuning.budget, "label": f"budget: {size_text(tuning.budget)} per rank"}
    # left of the line fits, right of it does not
    assert all((x <= cap["bytes"]) == fits for x, fits in zip(p["x"], p["fits"], strict=True))
    assert 0 < sum(p["fits"]) < len(cands)
    frontier = {c.index for c in tuning.frontier}
    assert p["frontier"] == [c.index in frontier for c in cands]
    assert [p["index"][k] for k in data["frontier"]] == [
        c.index for c in sorted(tuning.frontier, key=lambda c: (c.memory_bytes, -c.tokens_per_s))
    ]
    assert tuning.best is not None and p["index"][data["best"]] == tuning.best.index
    assert p["index"][data["user"]] == tuning.user.index and tuning.user.user
    assert data["groups"] == [{"world_size": 8, "label": "8 ranks", "color": GROUP_COLORS[0]}]
    assert data["summary"] == tuning.summary().splitlines()
    assert data["x_label"] == "memory per rank: peak"


def test_hover_says_what_the_api_says(tuning: Tuning) -> None:
    data = tune_data(tuning)
    best = tuning.best
    assert best is not None
    k = data["best"]
    lines = data["points"]["hover"][k]
    assert lines[0] == f"#{best.index} · best · on the frontier · fits"
    assert lines[1] == (
        f"{best.tokens_per_s:,.0f} tokens/s per GPU ({best.total_tokens_per_s:,.0f} on "
        f"{best.world_size} GPUs)"
    )
    assert lines[2] == (
        f"MFU {best.mfu:.1%}, step {duration_text(best.step_s)}, exposed communication "
        f"{duration_text(best.exposed_comm_s)}"
    )
    assert lines[3] == (
        f"memory per rank: peak {size_text(best.peak_bytes)} of the "
        f"{size_text(tuning.budget or 0)} budget (reserved ≈ {size_text(best.reserved_bytes)})"
    )
    knob_lines = [f"{KNOB_NAMES[k]}: {v}" for k, v in best.knobs.items()]
    assert lines[-1 - len(knob_lines) : -1] == knob_lines
    user = data["points"]["hover"][data["user"]]
    assert "as given" in user[0].split(" · ") and user[-1] == "traced: the model ran for it"


def test_the_knob_table_is_the_best_the_given_and_each_alternative(tuning: Tuning) -> None:
    data = tune_data(tuning)
    best = tuning.best
    assert best is not None and data["anchor"] == "best"
    alts = {a["knob"]: a for a in tuning.alternatives()}
    assert [r["knob"] for r in data["knobs"]] == list(best.knobs)
    for row in data["knobs"]:
        assert row["name"] == KNOB_NAMES[row["knob"]]
        assert row["value"] == best.knobs[row["knob"]]
        assert row["user"] == tuning.user.knobs[row["knob"]]
        alt = alts.get(row["knob"])
        if alt is None:
            assert row["alternative"] is None and row["candidate"] is None
        else:
            assert row["alternative"] == alt["text"]
            assert data["points"]["index"][row["candidate"]] == alt["candidate"].index
    assert {r["knob"] for r in data["knobs"] if r["alternative"]} == {
        "wrap",
        "activation_checkpointing",
    }


def test_the_machines_memory_is_the_line_without_a_budget() -> None:
    tuning = tune_small(memory_budget=None)
    data = tune_data(tuning)
    fig = tune_figure(tuning)  # 78.5 GiB usable, the points a few MiB: named at the edge
    assert fig.layout.xaxis.range[1] < data["capacity"]["bytes"] / 3
    assert any(a.text == f"<b>{data['capacity']['label']}</b> →" for a in fig.layout.annotations)
    cands = tuning.candidates
    usable = cands[0].usable_bytes
    assert data["capacity"] == {
        "bytes": usable,
        "label": f"{tuning.machine}: {size_text(usable)} usable",
    }
    assert data["points"]["x"] == [max(c.peak_bytes, c.reserved_bytes) for c in cands]
    assert data["points"]["x"] == [c.memory_bytes for c in cands]
    assert data["points"]["x"] == [c.report.memory.needed for c in cands]
    assert data["points"]["fits"] == [x <= usable for x in data["points"]["x"]]
    assert data["x_label"] == "memory per rank: the larger of peak and reserved"
    assert "(peak " in data["points"]["hover"][0][3]


def test_nothing_fits_compares_with_the_lightest() -> None:
    tuning = tune_small(memory_budget="1MiB")
    data = tune_data(tuning)
    assert tuning.best is None and data["best"] is None
    assert data["anchor"] == "lightest"
    low = anchor_of(tuning)
    assert low.memory_bytes == min(c.memory_bytes for c in tuning.candidates)
    assert [r["value"] for r in data["knobs"]] == list(low.knobs.values())
    assert not any(data["points"]["fits"])


def test_tune_figure_golden_and_what_it_draws(tuning: Tuning) -> None:
    fig = tune_figure(tuning)
    check_golden("views_tune_small_figure.json", figure_json(fig))
    data = tune_data(tuning)
    p = data["points"]
    names = [t.name for t in fig.data]
    assert names[0] == "frontier" and "best" in names and "as given" in names
    drawn = {}
    for t in fig.data:
        if t.type == "scatter" and t.name.startswith("8 ranks"):
            fits = t.name.endswith(", fits")
            for x, y, text in zip(t.x, t.y, t.text, strict=True):
                drawn[text] = (x, y, fits)
    assert len(drawn) == len(p["index"])
    for k in range(len(p["index"])):
        assert drawn["<br>".join(p["hover"][k])] == (p["x"][k], p["y"][k], p["fits"][k])
    table = next(t for t in fig.data if t.type == "table")
    turned = [r for r in data["knobs"] if r["alternative"]]
    assert list(table.cells.values[0]) == [r["name"] for r in turned] + ["not turned"]
    assert list(table.cells.values[2])[:-1] == [r["alternative"] for r in turned]
    shapes = fig.layout.shapes
    assert any(s.type == "line" and s.x0 == tuning.budget for s in shapes)
    axis = fig.layout.xaxis
    assert list(axis.ticktext) == ["0"] + [format_bytes(v) for v in axis.tickvals[1:]]
    assert axis.range[1] >= max(p["x"]) and axis.range[1] >= (tuning.budget or 0)
    dark = tune_figure(tuning, theme="dark")
    assert dark.layout.template.layout.paper_bgcolor == theme_colors("dark")["bg"]
