"""The Python of what a configuration does around FSDP, in torchtitan's order: torchao's
float8 linears (converted when the model is built), tensor parallelism
(``parallelize_module``, before activation checkpointing, which renames the blocks'
children), activation checkpointing, ``torch.compile`` of the blocks, then FSDP."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdpviz.errors import ConfigError
from fsdpviz.plan.job import JobOptions
from fsdpviz.plan.tensor_parallel import FLOAT8_STYLES, PARTIAL, layout_name, layout_of
from fsdpviz.tuning.fsdp_code import Candidate, classes_code


# ------------------------------------------------------------------ float8
def float8_code(job: JobOptions) -> list[str]:
    """``convert_to_float8_training`` of the linears the plan trains in float8 (``job``:
    the configuration's job options, parsed once): torchtitan's filter (no ``filter_fqns``
    substring in the name, both dimensions divisible by 16) and its config (float8
    all-gathers under FSDP2 where the plan has them)."""
    spec = job.float8
    if spec is None:
        return []
    config = (
        f'Float8LinearConfig.from_recipe_name("{spec.recipe_name}")'
        if spec.recipe_name != "tensorwise"
        else "Float8LinearConfig(enable_fsdp_float8_all_gather=True)"
        if spec.enable_fsdp_float8_all_gather
        else "Float8LinearConfig()"
    )
    return [
        "",
        f"# float8 linears ({spec.recipe_name} scaling), as torchtitan converts them when it "
        "builds the model",
        "from torchao.float8 import Float8LinearConfig, convert_to_float8_training",
        "",
        f"filter_fqns = {list(spec.filter_fqns)!r}  # linears kept in high precision",
        "",
        "def float8_filter(module, fqn):  # torchtitan's: dimensions divisible by 16",
        "    if any(f in fqn for f in filter_fqns):",
        "        return False",
        "    return module.in_features % 16 == 0 and module.out_features % 16 == 0",
        "",
        "convert_to_float8_training(",
        f"    model, config={config}, module_filter_fn=float8_filter",
        ")",
    ]


def float8_step_code(job: JobOptions) -> list[str]:
    """After each optimizer step: the float8 weights' scales computed for FSDP's next
    all-gathers, where the plan precomputes them."""
    spec = job.float8
    if spec is None or not spec.precompute_float8_dynamic_scale_for_fsdp:
        return []
    return [
        "from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp",
        "precompute_float8_dynamic_scale_for_fsdp(model)",
    ]


# ------------------------------------------------------------------ tensor parallelism
_STYLE_DEFAULTS: dict[str, dict[str, Any]] = {
    "ColwiseParallel": {"input_layouts": "Replicate()", "output_layouts": "Shard(-1)"},
    "RowwiseParallel": {"input_layouts": "Shard(-1)", "output_layouts": "Replicate()"},
}


def _placement_code(p: Any) -> str | None:
    """A style's layout as the code writes it, ``Shard(dim)`` or ``Replicate()`` (None: one
    the code does not write, ``Partial()`` or a placement the plan does not model)."""
    try:
        layout = layout_of(p)
    except ConfigError:
        return None
    return None if layout is None or layout == PARTIAL else layout_name(layout)


def _style_code(style: Any) -> str | None:
    """A torch parallel style as the code that makes it (None: one this cannot write)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    name = type(style).__name__
    kind = type(style)
    if name in FLOAT8_STYLES and type(style).__module__.startswith("torchao."):
        # torchao's float8 styles: their torch base's arguments (their default float8
        # dtype and config lookup kept)
        kind = {c.__name__: c for c in (ColwiseParallel, RowwiseParallel, PrepareModuleInput)}[
            FLOAT8_STYLES[name]
        ]
        if getattr(style, "fwd_config_submodule_fqn", None) is not None:
            return None
    args: list[str] = []
    if kind in (ColwiseParallel, RowwiseParallel):
        for field, default in _STYLE_DEFAULTS[kind.__name__].items():
            layouts = getattr(style, field)
            if len(layouts) != 1:
                return None
            code = _placement_code(layouts[0])
            if code is None:
                return None
            if code != default:
                args.append(f"{field}={code}")
        if style.use_local_output is not True:
            args.append("use_local_output=False")
    elif kind is SequenceParallel:
        dims = [_placement_code(p) for p in style.sequence_sharding]
        if len(dims) != 1 or dims[0] is None or not dims[0].startswith("Shard("):
            return None
        dim = style.sequence_sharding[0].dim
        if dim != 1:
            args.append(f"sequence_dim={dim}")
        if style.use_local_output is not False:
            args.append("use_local_output=True")
    elif kind is PrepareModuleInput:
        if style.with_kwargs:
            return None
        for field in ("input_layouts", "desired_input_layouts"):
            layouts = getattr(style, field)
            if layouts is None:
                continue
            codes = [_placement_code(p) if p is not None else "None" for p in layouts]
            if any(x is None for x in codes):
                return None
            args.append(f"{field}=({', '.join(str(x) for x in codes)},)")
        if style.use_local_output is not False:
            args.append("use_local_output=True")
    else:
        return None
    if getattr(style, "src_data_rank", 0) != 0:
        return None
    return f"{name}({', '.join(args)})"


def tp_code(c: Candidate, target: str = "model") -> list[str]:
    """``parallelize_module`` of the plan over the mesh's ``tp`` dimension: the plan written
    out where its styles are torch's own, else the plan given to fsdpviz by name."""
    plan = c.kwargs.get("parallelize_plan")
    if not c.report.config.tp_world_size or plan is None:
        return []
    lines = [
        "",
        "# tensor parallelism, before activation checkpointing and FSDP (torchtitan's order)",
        "from torch.distributed.tensor.parallel import parallelize_module",
    ]
    styles = (
        {k: _style_code(v) for k, v in plan.items()} if isinstance(plan, Mapping) else {"": None}
    )
    if all(styles.values()):
        used = sorted({str(s).split("(", 1)[0] for s in styles.values()})
        torch_styles = [s for s in used if s not in FLOAT8_STYLES]
        float8_styles = [s for s in used if s in FLOAT8_STYLES]
        if torch_styles:
            lines.append(f"from torch.distributed.tensor.parallel import {', '.join(torch_styles)}")
        if float8_styles:  # torchtitan's enable_float8_tensorwise_tp: float8 all-gathers
            lines.append(
                f"from torchao.float8.float8_tensor_parallel import {', '.join(float8_styles)}"
            )
        placements = sorted(
            {p for s in styles.values() for p in ("Shard", "Replicate") if f"{p}(" in str(s)}
        )
        if placements:
            lines.append(f"from torch.distributed.tensor import {', '.join(placements)}")
        lines += [
            "parallelize_plan = {",
            *[f"    {k!r}: {v}," for k, v in styles.items()],
            "}",
        ]
    else:
        lines.append("parallelize_plan = ...  # your plan, as given to fsdpviz")
    lines.append(f'parallelize_module({target}, mesh["tp"], parallelize_plan)')
    return lines


# ------------------------------------------------------------------ torch.compile
def compile_code(job: JobOptions, target: str = "model") -> list[str]:
    """``torch.compile`` as planned (``job``'s): each block of the classes compiled in
    place (``Module.compile``: its name and FSDP's calls unchanged), or the whole model."""
    compiled = job.compile
    if compiled is False:
        return []
    if compiled is True:
        return ["", "# torch.compile, the whole model", f"{target}.compile()"]
    code, comment = classes_code(list(compiled))
    return [
        "",
        "# torch.compile, each block on its own (torchtitan's per-block compile), in place",
        f"compiled = ({code},){comment}",
        f"for block in [m for m in {target}.modules() if isinstance(m, compiled)]:",
        "    block.compile()",
    ]


__all__ = ["compile_code", "float8_code", "float8_step_code", "tp_code"]
