"""The explorer's re-plan controls: ipywidgets bound to a :class:`~fsdpviz.replan.PlanOptions`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as w

from fsdpviz.replan import BACKWARD_PREFETCH, SHARDING_STRATEGIES, PlanOptions, Replanner

__all__ = ["PlanControls"]

_NO_MODEL = (
    "Re-planning needs the model: report.show(model=model, inputs=inputs) or "
    "Explorer(report, model=model, inputs=inputs)."
)
_WORLD_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
_LAYOUT = w.Layout(width="auto")
_STYLE = {"description_width": "initial"}


class PlanControls(w.VBox):  # type: ignore[misc]
    """Policy, world size, sharding, prefetch and recipe controls.

    Calls ``on_change(options, from_browser)``: ``from_browser`` is true when the change
    came from the page (ipywidgets locks the properties it sets from the front end).
    """

    def __init__(
        self,
        options: PlanOptions,
        replanner: Replanner | None,
        on_change: Callable[[PlanOptions, bool], None],
    ) -> None:
        self.options = options
        self._on_change = on_change
        classes = replanner.layer_classes() if replanner is not None else []
        known = {name for name, _ in classes}
        extra = [(c, 0) for c in options.layer_classes if c not in known]
        self.policy = w.ToggleButtons(
            options=[("layer classes", "classes"), ("size", "size"), ("root only", "none")],
            value=options.policy,
            description="policy",
            style=_STYLE,
        )
        self.classes = w.SelectMultiple(
            options=[(f"{n} ×{k}" if k else n, n) for n, k in [*classes, *extra]],
            value=tuple(options.layer_classes),
            rows=min(max(len(classes), 2), 6),
            description="wrap classes",
            style=_STYLE,
            layout=w.Layout(width="320px"),
        )
        self.min_params = w.FloatLogSlider(
            value=max(options.min_num_params, 1_000),
            base=10,
            min=3,
            max=11,
            step=0.1,
            description="min params",
            continuous_update=False,
            readout_format=".2s",
            style=_STYLE,
        )
        sizes = sorted({*_WORLD_SIZES, options.world_size})
        self.world_size = w.Dropdown(
            options=sizes,
            value=options.world_size,
            description="world size",
            style=_STYLE,
            layout=_LAYOUT,
        )
        self.sharding = w.Dropdown(
            options=list(SHARDING_STRATEGIES),
            value=options.sharding_strategy
            if options.sharding_strategy in SHARDING_STRATEGIES
            else "FULL_SHARD",
            description="sharding",
            style=_STYLE,
            layout=_LAYOUT,
        )
        self.backward = w.Dropdown(
            options=[(str(v), v) for v in BACKWARD_PREFETCH],
            value=options.backward_prefetch,
            description="backward prefetch",
            style=_STYLE,
            layout=_LAYOUT,
        )
        self.forward = w.Checkbox(
            value=options.forward_prefetch,
            description="forward prefetch",
            indent=False,
            layout=_LAYOUT,
        )
        self.recipe = w.ToggleButtons(
            options=["FSDP1", "FSDP2"],
            value=options.recipe,
            description="recipe",
            style=_STYLE,
            tooltips=[
                "FullyShardedDataParallel(auto_wrap_policy=...)",
                "fully_shard on each wrap class, then the root",
            ],
        )
        self._all = [
            self.policy,
            self.classes,
            self.min_params,
            self.world_size,
            self.sharding,
            self.backward,
            self.forward,
            self.recipe,
        ]
        super().__init__(
            [
                w.HBox([self.policy, self.recipe]),
                w.HBox([self.classes, w.VBox([self.min_params, self.forward])]),
                w.HBox([self.world_size, self.sharding, self.backward]),
            ]
        )
        if replanner is None:
            for c in self._all:
                c.disabled = True
                c.tooltip = _NO_MODEL
        else:
            for c in self._all:
                c.observe(self._changed, names="value")
            self._sync_enabled()

    def _sync_enabled(self) -> None:
        fsdp2 = self.recipe.value == "FSDP2"
        self.classes.disabled = self.policy.value != "classes"
        self.min_params.disabled = self.policy.value != "size" or fsdp2
        self.backward.disabled = fsdp2
        self.forward.disabled = fsdp2
        for c in (self.backward, self.forward):
            c.tooltip = (
                "FSDP2 prefetches implicitly; explicit maps are fsdpviz.analyze options"
                if fsdp2
                else ""
            )

    def read(self) -> PlanOptions:
        """The options the controls show now."""
        return PlanOptions(
            policy=self.policy.value,
            layer_classes=tuple(self.classes.value),
            min_num_params=int(self.min_params.value),
            world_size=int(self.world_size.value),
            sharding_strategy=self.sharding.value,
            backward_prefetch=self.backward.value,
            forward_prefetch=bool(self.forward.value),
            recipe=self.recipe.value,
        )

    def set(self, *, as_browser: bool = False, **changes: Any) -> None:
        """Set controls by option name, e.g. ``set(world_size=64)``.

        ``as_browser=True`` delivers each change as the page does (``widget.set_state``
        with the widget's synced state), so the views answer as they do to a click.
        """
        widgets = {
            "policy": self.policy,
            "layer_classes": self.classes,
            "min_num_params": self.min_params,
            "world_size": self.world_size,
            "sharding_strategy": self.sharding,
            "backward_prefetch": self.backward,
            "forward_prefetch": self.forward,
            "recipe": self.recipe,
        }
        for name, value in changes.items():
            if name not in widgets:
                raise KeyError(f"no control {name!r}; controls: {', '.join(widgets)}")
            widget = widgets[name]
            value = tuple(value) if name == "layer_classes" else value
            if not as_browser:
                widget.value = value
            elif isinstance(widget, w.Checkbox | w.FloatLogSlider):
                widget.set_state({"value": value})
            else:  # the pickers sync the index of their choice (choices, for SelectMultiple)
                values = [v for _, v in widget._options_full]
                index = [values.index(v) for v in value] if name == "layer_classes" else None
                widget.set_state({"index": values.index(value) if index is None else index})

    def _changed(self, change: dict[str, Any]) -> None:
        self._sync_enabled()
        options = self.read()
        if options != self.options:
            self.options = options
            self._on_change(options, bool(change["owner"]._property_lock))
