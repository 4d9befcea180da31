"""The prefetch graph: layout in forward order, edge kinds, never-prefetched units, and the
backward prefetches FSDP gets wrong. Golden file ``tests/golden/views_prefetch_small.json``
(rewrite with ``FSDPVIZ_UPDATE_GOLDEN=1`` and review the diff).
"""

from __future__ import annotations

import dataclasses

import pytest
from torch.distributed.fsdp import BackwardPrefetch
from views_models import analyze_tiny, check_front_end_data, check_golden, figure_json

from fsdpviz import Event, Report
from fsdpviz.views import prefetch_analysis, prefetch_figure, unit_colors
from fsdpviz.views.prefetch import backward_unit_order, prefetch_data


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny(forward_prefetch=True)


def traces(fig: object) -> dict[str, object]:
    return {t.name: t for t in fig.data if t.name}  # type: ignore[attr-defined]


def test_prefetch_golden(report: Report) -> None:
    fig = prefetch_figure(report, highlight_unit="blocks.0", selected_unit="blocks.2")
    check_golden("views_prefetch_small.json", figure_json(fig))


def test_units_in_forward_order_with_edge_kinds(report: Report) -> None:
    fig = prefetch_figure(report)
    t = traces(fig)
    units = t["units"]
    assert list(units.customdata) == report.forward_order  # type: ignore[attr-defined]
    assert list(units.x) == [0, 1, 2, 3]  # type: ignore[attr-defined]
    assert {"forward order", "forward prefetch", "backward prefetch"} <= set(t)
    styles = {
        name: t[name].line.dash
        for name in ("forward order", "forward prefetch", "backward prefetch")  # type: ignore[attr-defined]
    }
    assert len(set(styles.values())) == 3  # distinct without colour
    # forward prefetch arcs above the line, backward below
    assert max(y for y in t["forward prefetch"].y if y is not None) > 0  # type: ignore[attr-defined]
    assert min(y for y in t["backward prefetch"].y if y is not None) < 0  # type: ignore[attr-defined]


def test_never_prefetched_units_are_marked() -> None:
    """Units all-gathered where a prefetch could have gathered them, never by one, get a
    square; not FSDP1's root: it is the first unit of the forward (nothing runs before it)
    and stays unsharded for backward, so it is all-gathered once and could not be
    prefetched."""
    none = analyze_tiny(backward_prefetch=None)
    facts = prefetch_analysis(none)
    assert facts.never_prefetched == ["blocks.0", "blocks.1", "blocks.2"]
    t = traces(prefetch_figure(none))
    assert list(t["never prefetched"].x) == [1, 2, 3]  # type: ignore[attr-defined]
    assert prefetch_data(none)["never"] == [False, True, True, True]
    gathered = [e.unit for e in none.iterations[-1] if e.kind == "all_gather"]
    assert gathered.count("") == 1 and gathered[0] == ""  # the root: once, first
    assert prefetch_analysis(analyze_tiny(forward_prefetch=True)).never_prefetched == []


def test_a_recording_draws_its_root_first_and_flags_nothing_it_did_right(report: Report) -> None:
    """A recording that states no forward or backward order (a profiler trace read back):
    the units go in the order the events name them, the root first, joined by the forward
    order; the root's pre-backward prefetch of the last block is not flagged."""
    recorded = dataclasses.replace(
        report, source="recording", forward_order=[], module_backward_order=[],
        config={"api": "FSDP1"},
    )  # fmt: skip
    facts = prefetch_analysis(recorded)
    assert facts.forward_order == ["", "blocks.0", "blocks.1", "blocks.2"]
    assert facts.backward_order[:2] == ["", "blocks.2"]
    assert facts.misordered == [] and facts.never_prefetched == []
    data = prefetch_data(recorded)
    assert data["units"] == ["", "blocks.0", "blocks.1", "blocks.2"]
    order = data["kinds"].index(next(k for k in data["kinds"] if k["name"] == "forward_order"))
    joined = [
        (s, t) for k, s, t in zip(data["edges"]["kind"], data["edges"]["source"],
                                  data["edges"]["target"], strict=True) if k == order
    ]  # fmt: skip
    assert joined == [(0, 1), (1, 2), (2, 3)]  # the root is no lone node


def test_backward_post_too_late_is_visible() -> None:
    r = analyze_tiny(backward_prefetch=BackwardPrefetch.BACKWARD_POST)
    facts = prefetch_analysis(r)
    assert facts.backward_order == ["", "blocks.2", "blocks.1", "blocks.0"]
    assert facts.missed, "BACKWARD_POST leaves the first backward all-gather on demand"
    prev, unit, post, gather = facts.missed[0]
    assert (prev, unit) == ("", "blocks.2")
    assert post is None or post > gather  # the root's post-backward comes last
    fig = prefetch_figure(r)
    assert "next in backward, gathered on demand" in traces(fig)
    note = fig.layout.annotations[0].text
    assert note.startswith("BACKWARD_POST prefetches too late")


def test_prefetch_of_the_wrong_unit_is_flagged(report: Report) -> None:
    """A backward prefetch whose target is not the next unit in backward is misordered."""
    events = list(report.iterations[1])
    pos = next(
        i
        for i, e in enumerate(events)
        if e.kind == "all_gather"
        and e.phase == "backward"
        and e.prefetch
        and e.hook_unit == "blocks.2"
    )
    events[pos] = dataclasses.replace(events[pos], unit="blocks.0")  # should be blocks.1
    wrong = dataclasses.replace(report, iterations=[report.iterations[0], events])
    facts = prefetch_analysis(wrong)
    assert facts.misordered == [("blocks.2", "blocks.0", "blocks.1", pos)]
    fig = prefetch_figure(wrong)
    assert "backward prefetch, not the next unit" in traces(fig)
    assert "not for the next unit" in fig.layout.annotations[0].text


def test_backward_order_falls_back_to_events(report: Report) -> None:
    bare = dataclasses.replace(report, module_backward_order=[])
    # the root's pre-backward hook runs first: it issues the first backward prefetch
    assert backward_unit_order(bare) == ["", "blocks.2", "blocks.1", "blocks.0"]
    assert backward_unit_order(bare) == backward_unit_order(report)


def test_rings_and_no_prefetch_config() -> None:
    r = analyze_tiny(backward_prefetch=None)
    facts = prefetch_analysis(r)
    assert facts.missed == []  # nothing asked for, nothing missed
    t = traces(prefetch_figure(r, highlight_unit="blocks.1"))
    assert list(t["current"].x) == [2] and list(t["selected"].x) == []  # type: ignore[attr-defined]


def test_unknown_unit_in_events_raises(report: Report) -> None:
    events = [
        *report.iterations[1],
        Event("all_gather", "nope", "backward", True, "pre_backward", "blocks.0"),
    ]
    bad = dataclasses.replace(report, iterations=[report.iterations[0], events])
    with pytest.raises(ValueError, match="'nope'"):
        prefetch_figure(bad)


def test_recording_title_names_the_source(report: Report) -> None:
    """A recording's config carries no prefetch options: the title says it was recorded."""
    recorded = dataclasses.replace(report, source="recording", config={"api": "FSDP1"})
    title = prefetch_figure(recorded).layout.title.text
    assert "recorded (FSDP1)" in title and "None" not in title


def test_prefetch_data_holds_what_the_figure_draws(report: Report) -> None:
    """prefetch_data, what the exported page draws: the units in forward order with their
    numbers and colours, every edge of the figure with its hover text, the notes."""
    data = prefetch_data(report)
    assert data["units"] == report.forward_order == ["", "blocks.0", "blocks.1", "blocks.2"]
    assert data["numbers"] == [[u.module for u in report.units].index(n) for n in data["units"]]
    assert data["colors"] == [unit_colors(report)[n] for n in data["units"]]
    assert data["never"] == [False, False, False, False]  # the root could not be prefetched
    assert data["hover"][1][0] == "'blocks.0' (Block)"
    kinds = [k["name"] for k in data["kinds"]]
    edges = data["edges"]
    drawn = {
        (kinds[k], data["units"][s], data["units"][t], text)
        for k, s, t, text in zip(
            edges["kind"], edges["source"], edges["target"], edges["text"], strict=True
        )
    }
    graph = report.unit_graph()
    assert {(k, a, b) for k, a, b, _ in drawn} == {
        (d["kind"], a, b) for a, b, d in graph.edges(data=True)
    }
    figure_texts = {
        text for t in prefetch_figure(report).data if t.legendgroup for text in t.text or ()
    }
    assert {text for *_, text in drawn if not text.startswith("forward order")} == figure_texts
    sides = {k["name"]: k["side"] for k in data["kinds"]}
    assert sides["forward_prefetch"] > 0 > sides["backward_prefetch"] > sides["missed"]


def test_prefetch_data_says_what_backward_post_gets_wrong() -> None:
    r = analyze_tiny(backward_prefetch=BackwardPrefetch.BACKWARD_POST)
    data = prefetch_data(r)
    kinds = [k["name"] for k in data["kinds"]]
    assert "missed" in {kinds[k] for k in data["edges"]["kind"]}
    assert data["notes"] and data["notes"][0].startswith("BACKWARD_POST prefetches too late")
    assert data["title"] == prefetch_figure(r).layout.title.text


def test_front_end_test_data_is_current(report: Report) -> None:
    """js/test/data holds what prefetch_data gives today: forward prefetch above the line and
    backward prefetch below (prefetch.json), and BACKWARD_POST's misses (prefetch_post.json).
    The front end is tested on them."""
    check_front_end_data("prefetch.json", prefetch_data(report))
    r = analyze_tiny(forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_POST)
    check_front_end_data("prefetch_post.json", prefetch_data(r))
