"""A candidate's tensor-parallel plan for its float8 recipe: torchao's float8 styles
(``Float8ColwiseParallel``, ``Float8RowwiseParallel``, ``PrepareFloat8ModuleInput``: the
activations gathered in float8) where torchtitan's ``enable_float8_tensorwise_tp`` puts
them, and torch's own styles otherwise (torchao refuses its styles on a linear that does
not train in float8, and they cast tensorwise only)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
)

from fsdpviz.plan.job import Float8
from fsdpviz.plan.tensor_parallel import FLOAT8_STYLES, match_modules

# a float8 choice's label where torchao's styles are tried beside the user's own plan
FLOAT8_TP = "torchao's float8 TP styles"
_BASES = {"ColwiseParallel": ColwiseParallel, "RowwiseParallel": RowwiseParallel}


def has_float8_styles(plan: Any) -> bool:
    """Whether a ``parallelize_plan`` holds one of torchao's float8 styles."""
    styles = plan.values() if isinstance(plan, Mapping) else [plan]
    return any(type(s).__name__ in FLOAT8_STYLES for s in styles)


def _restyled(cls: Callable[..., ParallelStyle], style: ParallelStyle) -> ParallelStyle:
    """A ``cls`` style with ``style``'s layouts (a linear style's, or ``PrepareModuleInput``'s:
    torchao's float8 styles subclass torch's)."""
    if isinstance(style, PrepareModuleInput):
        return cls(
            input_layouts=style.input_layouts,
            desired_input_layouts=style.desired_input_layouts,
            use_local_output=style.use_local_output,
        )
    assert isinstance(style, (ColwiseParallel, RowwiseParallel))
    return cls(
        input_layouts=style.input_layouts[0],
        output_layouts=style.output_layouts[0],
        use_local_output=style.use_local_output,
    )


def plain_tp_plan(plan: Mapping[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """``plan`` with each of torchao's float8 styles as the torch style it subclasses (the
    same sharding and layouts, the activations in high precision): torchtitan's plan without
    float8 linears."""
    out: dict[str, ParallelStyle] = {}
    for pattern, style in plan.items():
        name = type(style).__name__
        if name in ("Float8ColwiseParallel", "Float8RowwiseParallel"):
            out[pattern] = _restyled(_BASES[FLOAT8_STYLES[name]], style)
        elif name == "PrepareFloat8ModuleInput":
            out[pattern] = _restyled(PrepareModuleInput, style)
        else:
            out[pattern] = style
    return out


def float8_tp_plan(
    model: nn.Module,
    plan: Mapping[str, ParallelStyle],
    spec: Float8,
    block: type[nn.Module] | None,
    prepare_inputs: bool,
) -> dict[str, ParallelStyle] | None:
    """``plan`` (torch's styles) with torchao's float8 styles where torchtitan's
    ``apply_tp`` gives them to tensorwise float8 linears: ``Float8ColwiseParallel`` /
    ``Float8RowwiseParallel`` for a ``ColwiseParallel`` / ``RowwiseParallel`` entry whose
    modules are all linears inside the model's ``block`` that train in float8 under ``spec``
    (torchao raises ValueError on any other linear; the output head and embeddings keep
    torch's styles, as in torchtitan), and, with ``prepare_inputs`` (torchtitan's own plan,
    whose prepared inputs feed only the projections), ``PrepareFloat8ModuleInput`` for a
    ``PrepareModuleInput`` entry whose modules' linears all take a float8 style (the input
    cast once, gathered in float8). None where no entry changes, or torchao is not installed."""
    if spec.recipe_name != "tensorwise":
        return None
    try:
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )
    except ImportError:
        return None
    if block is None:
        return None
    float8 = {
        f"{at}.{fqn}" if fqn else at
        for at, b in model.named_modules()
        if isinstance(b, block)
        for fqn, m in b.named_modules()
        if isinstance(m, nn.Linear)
        and spec.picks(f"{at}.{fqn}" if fqn else at, m.in_features, m.out_features)
    }
    out: dict[str, ParallelStyle] = dict(plan)
    styled: set[str] = set()  # the linears given a float8 style
    for pattern, style in plan.items():
        found = match_modules(model, pattern)
        if type(style) not in (ColwiseParallel, RowwiseParallel) or not found:
            continue
        if all(fqn in float8 for fqn, _ in found):
            cls = Float8ColwiseParallel if type(style) is ColwiseParallel else Float8RowwiseParallel
            out[pattern] = _restyled(cls, style)
            styled.update(fqn for fqn, _ in found)
    for pattern, style in plan.items() if prepare_inputs else ():
        found = match_modules(model, pattern)
        if type(style) is not PrepareModuleInput or style.with_kwargs or not found:
            continue
        linears = [
            f"{fqn}.{name}" if fqn else name
            for fqn, module in found
            for name, m in module.named_modules()
            if isinstance(m, nn.Linear)
        ]
        if linears and all(x in styled for x in linears):
            out[pattern] = _restyled(PrepareFloat8ModuleInput, style)
    return out if styled else None


__all__ = ["FLOAT8_TP", "float8_tp_plan", "has_float8_styles", "plain_tp_plan"]
