"""A tuning in the notebook (``tuning.show()``): the scatter's synced state, a click that
opens that configuration's plan below, Python driving it, and what a saved notebook keeps.

A click in the page reaches Python as a state change the browser sends; the tests send it
the same way (``widget.set_state``). The drawing is tested with vitest (``js/test``) and in
Chromium (``test_browser_tune.py``).
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest
import traitlets
from views_models import needs_front_end, tune_small

from fsdpviz import Tuning
from fsdpviz.examples import ExampleConfig, example_inputs, example_model
from fsdpviz.export import MIME, page_script
from fsdpviz.views import explorer_data
from fsdpviz.views.tree import with_module_tree
from fsdpviz.views.tune_view import tune_data
from fsdpviz.widgets import Dashboard, TuneView, TuneWidget

pytestmark = needs_front_end


@pytest.fixture(scope="module")
def tuning() -> Tuning:
    return tune_small()


def test_the_scatter_s_traits(tuning: Tuning) -> None:
    view = TuneWidget(tuning)
    assert view.view == "tune"
    assert set(view.keys) >= {"view", "data", "selected", "saved", "busy", "error"}
    sent = view.get_state("data")["data"]  # one buffer of JSON, as every view's data
    assert json.loads(bytes(sent)) == json.loads(json.dumps(tune_data(tuning)))
    assert view.selected is None and view.saved is None
    view.set_state({"selected": tuning.user.index})  # a click in the browser
    assert view.candidate is tuning.user
    assert view.shown_report() is tuning.user.report
    with pytest.raises(traitlets.TraitError, match="selected=999 is not the index"):
        view.selected = 999
    assert view.page_state()["selected"] == tuning.user.index


def test_show_opens_the_best_and_a_click_opens_another(tuning: Tuning) -> None:
    view = tuning.show()
    best = tuning.best
    assert isinstance(view, TuneView) and best is not None
    assert view.selected == view.scatter.selected == best.index
    assert isinstance(view.dashboard, Dashboard)
    assert view.dashboard.explorer.report is best.report
    other = next(c for c in tuning.candidates if c is not best and not c.user)
    view.scatter.set_state({"selected": other.index})  # a click on its point
    assert view.selected == other.index
    assert view.dashboard.explorer.report is other.report
    assert view.views.children == (view.dashboard,)
    title = view.title.value
    assert f"#{other.index}" in title and f"{other.tokens_per_s:,.0f} tokens/s per GPU" in title
    assert other.label in title
    view.selected = tuning.user.index  # from Python: as a click
    assert view.scatter.selected == tuning.user.index
    assert view.dashboard.explorer.report is tuning.user.report
    view.selected = None
    assert view.dashboard is None and view.views.children == () and view.scatter.selected is None
    with pytest.raises(IndexError, match="no candidate has index 999"):
        view.open_plan(999)


def test_nothing_opened_and_browser_errors(tuning: Tuning) -> None:
    view = tuning.show(selected=None)
    assert view.selected is None and view.dashboard is None
    view.scatter.set_state({"error": "TypeError: boom"})
    assert "tune view (browser): TypeError: boom" in str(view.errors.last_error)
    with pytest.raises(ValueError, match="selected='first'"):
        tuning.show(selected="first")


def test_with_the_model_its_plan_re_plans() -> None:
    c = ExampleConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_heads=2,
                      num_layers=3)  # fmt: skip
    model = example_model(c)
    tuning = fsdpviz_tune(model, example_inputs(c))
    view = tuning.show(model=model)
    assert view.dashboard.explorer.replanner is not None
    assert view.dashboard.explorer.report is tuning.best.report  # type: ignore[union-attr]


def fsdpviz_tune(model: object, inputs: object) -> Tuning:
    import fsdpviz

    return fsdpviz.tune(model, inputs, world_size=8, knobs=["activation_checkpointing"],
                        memory_budget="2.3MiB", progress=False)  # fmt: skip


def test_a_saved_notebook_keeps_the_words_and_the_plan_shown(tuning: Tuning) -> None:
    view = tuning.show()
    view.selected = tuning.user.index
    bundle = view._repr_mimebundle_()
    assert bundle is not None
    assert {MIME, "image/svg+xml", "text/html", "text/plain"} <= set(bundle)
    assert bundle["text/plain"] == tuning.summary()
    html = bundle["text/html"]
    assert f"(the views below: configuration #{tuning.user.index}: " in html
    assert html.count("<circle ") == len(tuning.candidates)  # the scatter, static
    assert f"{len(tuning.candidates)} configurations, {len(tuning.fitting)} fit" in html
    config = json.loads(gzip.decompress(base64.b64decode(bundle[MIME]["config"])))
    shown = config["views"]["explorer"]["data"]
    assert shown == json.loads(json.dumps(explorer_data(with_module_tree(tuning.user.report))))


def test_the_view_saves_its_page_on_what_is_selected(tuning: Tuning, tmp_path: Path) -> None:
    view = tuning.show(selected=tuning.user.index)
    page = Path(view.save(tmp_path / "now.html")).read_text()
    config = json.loads(page_script(page, "fv-config"))
    assert config["tune"]["state"]["selected"] == tuning.user.index
