"""The explorer's re-plan controls: ipywidgets bound to a :class:`~fsdpviz.replan.PlanOptions`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Unpack

import ipywidgets as w

from fsdpviz.plan.option_specs import FSDP_OPTIONS, OPTIONS, RESHARD, OptionSpec
from fsdpviz.replan import PlanOptions, Replanner
from fsdpviz.replan.replanner import PlanChanges
from fsdpviz.widgets.front_end import TraitChange

__all__ = ["PlanControls"]

_NO_MODEL = (
    "The controls show this plan's options; to change them and re-plan, give the model: "
    "report.show(model=model, inputs=inputs) or Explorer(report, model=model, inputs=inputs)."
)
_WORLD_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
_STYLE = {"description_width": "initial"}


class PlanControls(w.VBox):  # type: ignore[misc]
    """Policy, world size, sharding, prefetch and recipe controls; calls
    ``on_change(options)`` when they change."""

    def __init__(
        self,
        options: PlanOptions,
        replanner: Replanner | None,
        on_change: Callable[[PlanOptions], None],
        no_replan: str | None = None,
    ) -> None:
        """``no_replan``: why the controls cannot re-plan, shown under them where there is
        no ``replanner`` (by default: no model was given)."""
        no_replan = no_replan or _NO_MODEL
        self.options = options
        self._on_change = on_change
        self._syncing = False
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
        self.fsdp = {
            spec.name: _control(spec, getattr(options, spec.name), options.world_size)
            for spec in _CONTROLLED
        }
        """The controls of the FSDP options (:mod:`fsdpviz.plan.option_specs`), by name."""
        self.world_size = self.fsdp["world_size"]
        self.sharding = self.fsdp["sharding_strategy"]
        self.backward = self.fsdp["backward_prefetch"]
        self.forward = self.fsdp["forward_prefetch"]
        self.reshard = self.fsdp[RESHARD.name]
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
            self.reshard,
        ]
        self.note = w.HTML(
            "" if replanner is not None else f"<small><i>{no_replan}</i></small>",
            layout=w.Layout(display="none" if replanner is not None else None),
        )
        """Why the controls are greyed out, where they are (no model to re-plan)."""
        super().__init__(
            [
                w.HBox([self.policy, self.recipe]),
                w.HBox([self.classes, w.VBox([self.min_params, self.forward])]),
                w.HBox([self.world_size, self.sharding, self.reshard, self.backward]),
                self.note,
            ]
        )
        self._replans = replanner is not None
        if replanner is None:
            for c in self._all:
                c.tooltip = no_replan
        else:
            for c in self._all:
                c.observe(self._changed, names="value")
        self._sync_enabled()

    def _sync_enabled(self) -> None:
        """Only the chosen API's controls are active; a policy's own control is shown
        only under that policy (FSDP2 takes layer classes, so no size slider)."""
        fsdp2 = self.recipe.value == "FSDP2"
        self.classes.layout.display = None if self.policy.value == "classes" else "none"
        self.min_params.layout.display = (
            None if self.policy.value == "size" and not fsdp2 else "none"
        )
        self.sharding.layout.display = "none" if fsdp2 else None
        self.reshard.layout.display = None if fsdp2 else "none"
        if not self._replans:  # shown as planned, not to be changed: no model to re-plan
            for c in self._all:
                c.disabled = True
            return
        self.sharding.disabled = fsdp2
        self.backward.disabled = fsdp2
        self.forward.disabled = fsdp2
        for c in (self.backward, self.forward):
            c.tooltip = (
                "FSDP2 prefetches implicitly; explicit maps are fsdpviz.analyze options"
                if fsdp2
                else ""
            )
        choices = _reshard_choices(int(self.world_size.value))
        if [v for _, v in self.reshard.options] != [v for _, v in choices]:
            # a factor of the old world size that does not divide the new one: back to True
            keep = (
                self.reshard.value
                if any(
                    v is self.reshard.value
                    or (type(v) is type(self.reshard.value) and v == self.reshard.value)
                    for _, v in choices
                )
                else True
            )
            self._syncing = True
            try:
                self.reshard.options = choices
                self.reshard.value = keep
            finally:
                self._syncing = False

    def read(self) -> PlanOptions:
        """The options the controls show now."""
        return PlanOptions(
            policy=self.policy.value,
            layer_classes=tuple(self.classes.value),
            min_num_params=int(self.min_params.value),
            recipe=self.recipe.value,
            **{name: _read(OPTIONS[name], c.value) for name, c in self.fsdp.items()},
        )

    def set(self, *, as_browser: bool = False, **changes: Unpack[PlanChanges]) -> None:
        """Set controls by option name, e.g. ``set(world_size=64)``.

        ``as_browser=True`` delivers each change as the page does (``widget.set_state``
        with the widget's synced state), so the views answer as they do to a click.
        """
        own = {
            "policy": self.policy,
            "layer_classes": self.classes,
            "min_num_params": self.min_params,
            "recipe": self.recipe,
            **self.fsdp,
        }
        widgets = {f.name: own[f.name] for f in dataclasses.fields(PlanOptions)}
        value: Any  # each option's, as PlanChanges types it
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

    def _changed(self, change: TraitChange) -> None:
        if self._syncing:
            return
        self._sync_enabled()
        options = self.read()
        if options != self.options:
            self.options = options
            self._on_change(options)


# The FSDP options the controls choose: those the table gives a control's label.
_CONTROLLED = tuple(spec for spec in FSDP_OPTIONS if spec.label)


def _control(spec: OptionSpec, value: Any, world_size: int) -> w.Widget:
    """The control of an FSDP option: a checkbox for a bool, else a dropdown of its values
    (an enum's members; a value the list lacks shows the default), labelled from the table."""
    if spec.kind == "bool":
        return w.Checkbox(
            value=value, description=spec.label, indent=False, layout=w.Layout(width="auto")
        )
    choices: list[Any]
    if spec.kind == "int":
        choices = sorted({*_WORLD_SIZES, value})
    elif spec.kind == "reshard":
        choices = _reshard_choices(world_size)
    else:
        choices = [(str(v), v) for v in spec.choices]
        value = value if value in spec.choices else spec.default
    tooltip = {"tooltip": spec.tooltip} if spec.tooltip else {}
    return w.Dropdown(
        options=choices,
        value=value,
        description=spec.label,
        style=_STYLE,
        layout=w.Layout(width="auto"),
        **tooltip,
    )


def _read(spec: OptionSpec, value: Any) -> Any:
    """A control's value as :class:`PlanOptions` holds it."""
    return int(value) if spec.kind == "int" else bool(value) if spec.kind == "bool" else value


def _reshard_choices(world_size: int) -> list[tuple[str, bool | int]]:
    """The values of FSDP2's resharding (:data:`RESHARD`) for ``world_size`` ranks: ``True``,
    ``False`` and each factor N with 1 < N < world size (``fully_shard`` turns 1 into
    ``False`` and the world size into ``True``)."""
    factors = [n for n in range(2, world_size) if world_size % n == 0]
    choices: list[tuple[str, bool | int]] = [("True", True), ("False", False)]
    choices += [(f"{n} ranks", n) for n in factors]
    return choices
