"""Tensor parallelism under FSDP2: ``parallelize_module``'s plan, read as torch applies it.

``parallelize_plan=`` is the dict torch's ``parallelize_module`` takes (module-name patterns,
matched one name atom at a time with ``fnmatch``, to ``ColwiseParallel``,
``RowwiseParallel``, ``SequenceParallel``, ``PrepareModuleInput``, ``PrepareModuleOutput``
objects), given for the whole model. :func:`resolve_plan` finds the module each entry
applies to and turns its style into a :class:`TPModule`: the tp placement of each of the
module's parameters (``ColwiseParallel``: a linear's weight and bias ``Shard(0)``, an
embedding's weight ``Shard(1)``; ``RowwiseParallel``: a linear's weight ``Shard(1)`` and
bias ``Replicate()``, an embedding's weight ``Shard(0)``; ``SequenceParallel``:
``Replicate()``), and how its inputs and outputs are redistributed. A model that was already
parallelised is read back by :func:`plan_from_hooks` from the hooks ``parallelize_module``
left on it.

:func:`collective` names the collective a redistribution issues (``Shard -> Replicate``: an
all-gather, ``Partial -> Replicate``: an all-reduce, ``Partial -> Shard``: a
reduce-scatter, ``Shard(a) -> Shard(b)``: an all-to-all, from ``Replicate``: none, a local
chunk). In backward the gradient goes the other way: the gradient of an input a
``ColwiseParallel`` linear (or a ``PrepareModuleInput`` feeding such linears) wants
replicated is a partial sum, and a gradient that would go back to ``Partial`` stays
replicated (DTensor's ``Redistribute.backward``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any, Literal

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from fsdpviz.errors import ConfigError, FSDPConfigError
from fsdpviz.schema.names import some_names
from fsdpviz.schema.report import FsdpWarning

Collective = Literal["tp_all_gather", "tp_reduce_scatter", "tp_all_reduce", "tp_all_to_all"]
Layout = tuple[str, int | None]  # ("shard", dim) | ("replicate", None) | ("partial", None)

REPLICATE: Layout = ("replicate", None)
PARTIAL: Layout = ("partial", None)
STYLES = (
    "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
    "PrepareModuleOutput", "PrepareModuleInputOutput",
)  # fmt: skip
# torchao's float8 styles (``torchao/float8/float8_tensor_parallel.py``) -> the torch style
# each subclasses: the same parameter sharding and layouts, the activations cast to float8
# first (see [Note: torchao's float8 tensor-parallel styles])
FLOAT8_STYLES = {
    "Float8ColwiseParallel": "ColwiseParallel",
    "Float8RowwiseParallel": "RowwiseParallel",
    "PrepareFloat8ModuleInput": "PrepareModuleInput",
}

# [Note: torchao's float8 tensor-parallel styles]
# ``Float8ColwiseParallel`` and ``Float8RowwiseParallel`` take an input that is not float8
# yet, make it a DTensor in its input layout and cast it to float8 there (tensorwise,
# ``hp_tensor_to_float8_dynamic``: each rank casts its own part, the scale from the amax of
# the whole), then redistribute it: a ``Shard -> Replicate`` all-gather moves the float8
# data, one byte an element (``Float8TrainingTensor``'s ``allgather_fp8`` gathers
# ``_data``; the scale, the same on every rank, stays). ``PrepareFloat8ModuleInput`` casts
# every input it has a layout for, then redistributes it, and leaves a float8 DTensor for
# the float8 linears inside, which cast it no more (``tensor_already_casted_to_fp8``), nor
# does their backward for the weight's gradient. After their output's redistribution
# (in high precision) both linear styles apply ``NoopFwToFloat8BwDynamic``: in backward the
# output gradient is cast to float8 (``cast_config_grad_output``: e5m2) in the output
# layout, so its redistribution back (a row-wise output's ``Shard(1)`` gradient
# all-gathered) moves float8 too and the linear's backward casts it no more. The gradient
# an input's redistribution takes back is the multiply's high-precision output (the cast's
# backward passes it on): its reduce-scatter moves high precision.


def layout_of(placement: Any) -> Layout | None:
    """A DTensor placement (``Shard(1)``, ``Replicate()``, ``Partial()``) as a layout; None
    stays None (an input a ``PrepareModuleInput`` leaves alone)."""
    if placement is None:
        return None
    name = type(placement).__name__
    if name in ("Shard", "_StridedShard"):
        return ("shard", int(placement.dim))
    if name == "Replicate":
        return REPLICATE
    if name == "Partial":
        return PARTIAL
    raise ConfigError(f"parallelize_plan: placement {placement!r} is not modelled")


def layout_name(layout: Layout) -> str:
    """``Shard(0)``, ``Replicate()``, ``Partial()``: as torch prints a placement."""
    kind, dim = layout
    return f"Shard({dim})" if kind == "shard" else f"{kind.capitalize()}()"


def same_layout(a: Layout, b: Layout, ndim: int) -> bool:
    """Whether a tensor of ``ndim`` dims in ``a`` is already in ``b`` (no redistribution)."""
    if a[0] == b[0] == "shard" and a[1] is not None and b[1] is not None:
        return a[1] % ndim == b[1] % ndim
    return a == b


def collective(src: Layout, dst: Layout, ndim: int) -> Collective | None:
    """The collective that redistributes a tensor of ``ndim`` dims from ``src`` to ``dst``."""
    if same_layout(src, dst, ndim) or src == REPLICATE:
        return None
    if src[0] == "shard":
        if dst == REPLICATE:
            return "tp_all_gather"
        return "tp_all_to_all" if dst[0] == "shard" else None
    if dst == REPLICATE:
        return "tp_all_reduce"
    return "tp_reduce_scatter" if dst[0] == "shard" else None


def backward_collective(grad: Layout, src: Layout, ndim: int) -> Collective | None:
    """The collective of a gradient in ``grad`` going back to ``src`` (``Partial`` stays
    replicated: DTensor keeps such gradients replicated)."""
    return collective(grad, REPLICATE if src == PARTIAL else src, ndim)


@dataclass(frozen=True)
class Redistribution:
    """One input (``position`` or keyword) or the output of a module: the layout it arrives
    in, the layout the style wants, and the layout its gradient comes back in."""

    src: Layout
    dst: Layout
    grad: Layout
    position: int | str = 0


@dataclass
class TPModule:
    """What ``parallelize_module`` does to one module."""

    fqn: str
    style: str  # the style's class name
    inputs: tuple[Redistribution, ...] = ()
    outputs: tuple[Redistribution, ...] = ()
    params: dict[str, Layout] = field(default_factory=dict)  # local name -> tp placement
    partial_grads: tuple[str, ...] = ()  # replicated parameters whose gradient is partial
    local_output: bool = True  # use_local_output: the output is a plain tensor again
    output_layout: Layout | None = None  # the output's layout when it stays a DTensor
    float8: bool = False  # one of torchao's float8 styles (FLOAT8_STYLES)
    # PrepareModuleInputOutput's use_local_input: its prepared inputs plain tensors again
    local_input: bool | None = None

    @property
    def base(self) -> str:
        """The torch style this one is or subclasses (``Float8RowwiseParallel``:
        ``RowwiseParallel``); ``PrepareModuleInputOutput``'s, ``PrepareModuleInput``, whose
        inputs it prepares as that does (its output as ``PrepareModuleOutput``)."""
        if self.style == "PrepareModuleInputOutput":
            return "PrepareModuleInput"
        return FLOAT8_STYLES.get(self.style, self.style)

    @property
    def inputs_local(self) -> bool:
        """Whether a prepared input is a plain tensor again: ``PrepareModuleInput``'s
        ``use_local_output``, ``PrepareModuleInputOutput``'s ``use_local_input``."""
        return self.local_output if self.local_input is None else self.local_input

    @property
    def description(self) -> str:
        """``ColwiseParallel(Replicate() -> Replicate(); out Shard(-1) -> Replicate())``: the
        style and the redistributions of its inputs and output."""
        parts = [f"{layout_name(r.src)} -> {layout_name(r.dst)}" for r in self.inputs]
        parts += [f"out {layout_name(r.src)} -> {layout_name(r.dst)}" for r in self.outputs]
        return f"{self.style}({'; '.join(parts)})"


@dataclass
class TPPlan:
    """The tensor-parallel plan of a model: ``size`` ranks on the mesh dimension ``dim``."""

    size: int
    dim: str
    modules: dict[str, TPModule]  # by module FQN, in the order the plan applied them

    def placements(self, model: nn.Module) -> dict[nn.Parameter, Layout]:
        """The tp placement of every parameter a style distributes."""
        mods = dict(model.named_modules())
        out: dict[nn.Parameter, Layout] = {}
        for fqn, tpm in self.modules.items():
            for name, layout in tpm.params.items():
                out[getattr(mods[fqn], name)] = layout
        return out

    def partial_grads(self, model: nn.Module) -> set[nn.Parameter]:
        mods = dict(model.named_modules())
        return {getattr(mods[f], n) for f, m in self.modules.items() for n in m.partial_grads}

    def describe(self) -> dict[str, str]:
        return {fqn: m.description for fqn, m in self.modules.items()}

    def unfreeze(self, model: nn.Module) -> list[str]:
        """Make the frozen parameters of ``SequenceParallel`` modules trainable, as
        ``parallelize_module`` does, and return their FQNs: the style's
        ``_replicate_module_fn`` wraps each in ``nn.Parameter(DTensor.from_local(...))``,
        whose ``requires_grad`` defaults to True (``ColwiseParallel`` and ``RowwiseParallel``
        pass the parameter's own). A norm frozen before ``parallelize_module`` then gets a
        gradient, the activations around it one too, and tensor parallelism's backward
        collectives run through the blocks."""
        out: list[str] = []
        for fqn, tpm in self.modules.items():
            if "SequenceParallel" not in tpm.style:
                continue
            for name, p in model.get_submodule(fqn).named_parameters():
                if not p.requires_grad:
                    p.requires_grad_(True)
                    out.append(f"{fqn}.{name}" if fqn else name)
        return out


def check_float8_styles(
    plan: TPPlan, model: nn.Module, float8: list[nn.Module], recipe: str | None
) -> None:
    """Refuse torchao's float8 styles where torchao refuses them, or where they are not
    modelled: ``Float8ColwiseParallel`` and ``Float8RowwiseParallel`` on a linear that does
    not train in float8 (``_apply``: "Expecting module to be Float8Linear"),
    ``PrepareFloat8ModuleInput`` on a module without one (its ``_apply`` finds no
    ``linear_mm_config``), and any of them under a rowwise recipe (the styles cast
    tensorwise, as they document; torchtitan applies them to tensorwise recipes only)."""
    picked = {id(m) for m in float8}
    for fqn, tpm in plan.modules.items():
        if not tpm.float8:
            continue
        where = f"parallelize_plan: {tpm.style} (for {fqn!r})"
        if recipe is None:
            raise FSDPConfigError(
                f"{where} needs torchao's float8 linears (ValueError: Expecting module to be "
                "Float8Linear); pass float8={...} (convert_to_float8_training's options) or "
                "use torch's ColwiseParallel, RowwiseParallel and PrepareModuleInput"
            )
        if recipe != "tensorwise":
            raise ConfigError(
                f"{where}: torchao's float8 tensor-parallel styles cast tensorwise and are "
                f"not modelled with recipe_name={recipe!r} (torchtitan applies them to "
                "tensorwise float8 only); use torch's styles with a rowwise recipe"
            )
        module = model.get_submodule(fqn)
        if tpm.base == "PrepareModuleInput":
            if not any(id(m) in picked for m in module.modules()):
                raise FSDPConfigError(
                    f"{where}: no linear under {fqn!r} trains in float8, so the style has no "
                    "float8 config to cast with (torchao: AssertionError); use "
                    "PrepareModuleInput, or convert its linears (float8 filter_fqns)"
                )
        elif id(module) not in picked:
            raise FSDPConfigError(
                f"{where}: Expecting module to be Float8Linear but found "
                f"{type(module).__name__} (torchao's ValueError: the float8 options leave "
                f"{fqn!r} in high precision, filter_fqns or its size); use "
                f"{tpm.base} for it"
            )


def local_shape(shape: Sequence[int], layout: Layout | None, size: int) -> list[int]:
    """One rank's piece of a tensor of ``shape`` in ``layout`` over ``size`` ranks: the
    first rank's chunk (``torch.chunk``: the largest one)."""
    out = list(shape)
    if layout is not None and layout[0] == "shard" and layout[1] is not None and out:
        d = layout[1] % len(out)
        out[d] = min(out[d], math.ceil(out[d] / size))
    return out


def unfrozen_warning(names: list[str]) -> FsdpWarning:
    """The warning of the frozen parameters ``SequenceParallel`` made trainable
    (:meth:`TPPlan.unfreeze`)."""
    return FsdpWarning(
        "tp_unfreezes",
        "SequenceParallel makes these frozen parameters trainable (parallelize_module wraps "
        "them in nn.Parameter, which requires grad), so they get gradients and the "
        "activations around them too; set requires_grad=False on them after "
        "parallelize_module (and pass the parallelised model) to keep them frozen: "
        + some_names(names, 6),
    )


# ---------------------------------------------------------------- resolving
def resolve_plan(model: nn.Module, plan: Any, size: int, dim: str) -> TPPlan:
    """``parallelize_module(model, tp_mesh, plan)`` as a :class:`TPPlan` (nothing is changed).

    Example::

        plan = {"layers.*.attention.wq": ColwiseParallel(), "layers.*.attention.wo":
                RowwiseParallel(output_layouts=Shard(1))}
        resolve_plan(model, plan, 8, "tp").modules["layers.0.attention.wq"].params
        # {'weight': ('shard', 0)}
    """
    if isinstance(plan, ParallelStyle):
        plan = {"": plan}
    if not isinstance(plan, dict) or not all(
        isinstance(k, str) and isinstance(v, ParallelStyle) for k, v in plan.items()
    ):
        raise ConfigError(
            "parallelize_plan must be parallelize_module's plan: a dict of module names (fnmatch "
            "patterns per name, e.g. 'layers.*.attention.wq') to ColwiseParallel(), "
            f"RowwiseParallel(), SequenceParallel(), PrepareModuleInput(...); got {plan!r}"
        )
    modules: dict[str, TPModule] = {}
    for pattern, style in plan.items():
        found = match_modules(model, pattern)
        if not found:
            raise ConfigError(
                f"parallelize_plan: {pattern!r} matches no module of the model (torch warns "
                "and skips it); check the name against model.named_modules()"
            )
        for fqn, module in found:
            _add(modules, style_module(fqn, module, style))
    order = {fqn: i for i, (fqn, _) in enumerate(model.named_modules())}
    return TPPlan(size, dim, dict(sorted(modules.items(), key=lambda kv: order[kv[0]])))


def _add(modules: dict[str, TPModule], tpm: TPModule) -> None:
    if tpm.fqn in modules:  # a second style on one module: its hooks come after the first's
        first = modules[tpm.fqn]
        both = first.style if first.style == tpm.style else f"{first.style} + {tpm.style}"
        if both == "PrepareModuleInput + PrepareModuleOutput":  # an applied one's two halves
            both = "PrepareModuleInputOutput"
        tpm = TPModule(
            tpm.fqn, both,
            first.inputs + tpm.inputs, first.outputs + tpm.outputs,
            {**first.params, **tpm.params}, first.partial_grads + tpm.partial_grads,
            tpm.local_output, tpm.output_layout, first.float8 or tpm.float8,
            first.inputs_local if first.inputs else tpm.local_input,
        )  # fmt: skip
    modules[tpm.fqn] = tpm


def match_modules(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    """The modules ``parallelize_module`` applies a plan entry to: one name atom at a time."""
    if pattern == "":
        return [("", model)]
    level: list[tuple[str, nn.Module]] = [("", model)]
    for token in pattern.split("."):
        level = [
            (f"{fqn}.{name}" if fqn else name, child)
            for fqn, module in level
            for name, child in module.named_children()
            if fnmatch(name, token)
        ]
    return level


def style_module(fqn: str, module: nn.Module, style: Any) -> TPModule:
    """What ``style`` does to ``module`` (``fqn``), read from the style's attributes."""
    name = type(style).__name__
    if name in FLOAT8_STYLES:
        return _float8(fqn, module, name, style)
    if name == "PrepareModuleInputOutput":
        first = style_module(fqn, module, style.prepare_module_input)
        second = style_module(fqn, module, style.prepare_module_output)
        return TPModule(
            fqn, name, first.inputs, second.outputs,
            local_output=second.local_output, output_layout=second.output_layout,
            local_input=first.local_output,  # torch gives it use_local_input
        )  # fmt: skip
    if name in ("ColwiseParallel", "RowwiseParallel"):
        return _linear(fqn, module, name, style)
    if name == "SequenceParallel":
        seq = layout_of(style.sequence_sharding[0])
        assert seq is not None
        return TPModule(
            fqn, name,
            inputs=(Redistribution(seq, seq, seq),),
            params={n: REPLICATE for n, _ in module.named_parameters()},
            partial_grads=tuple(n for n, _ in module.named_parameters()),
            local_output=bool(style.use_local_output), output_layout=seq,
        )  # fmt: skip
    if name == "PrepareModuleInput":
        return _prepare_input(fqn, name, style)
    if name == "PrepareModuleOutput":
        return _prepare_output(fqn, name, style)
    raise ConfigError(
        f"parallelize_plan: {name} (for {fqn!r}) is not modelled; use ColwiseParallel, "
        "RowwiseParallel, SequenceParallel, PrepareModuleInput or PrepareModuleOutput"
    )


def _float8(fqn: str, module: nn.Module, name: str, style: Any) -> TPModule:
    """One of torchao's float8 styles: its torch style's layouts, cast to float8 (see
    [Note: torchao's float8 tensor-parallel styles])."""
    dtype = getattr(style, "float8_dtype", None)
    if dtype is not None and str(dtype) != "torch.float8_e4m3fn":
        raise FSDPConfigError(
            f"parallelize_plan: {name} (for {fqn!r}) takes float8_dtype={dtype}; torchao "
            "casts only to torch.float8_e4m3fn (NotImplementedError)"
        )
    base = FLOAT8_STYLES[name]
    tpm = _linear(fqn, module, base, style) if base != "PrepareModuleInput" else (
        _prepare_input(fqn, base, style)
    )  # fmt: skip
    tpm.style, tpm.float8 = name, True
    return tpm


def _linear(fqn: str, module: nn.Module, name: str, style: Any) -> TPModule:
    colwise = name == "ColwiseParallel"
    if isinstance(module, nn.Linear):
        kind = "linear"
    elif isinstance(module, nn.Embedding):
        kind = "embedding"
    else:
        raise FSDPConfigError(
            f"parallelize_plan: {fqn!r} is a {type(module).__name__}, and {name} currently only "
            "support nn.Linear and nn.Embedding! (parallelize_module raises this)"
        )
    src = layout_of(style.input_layouts[0])
    out = layout_of(style.output_layouts[0])
    assert src is not None and out is not None
    params: dict[str, Layout]
    if colwise:
        dst = REPLICATE
        produced: Layout = ("shard", -1)
        params = {n: ("shard", 0 if kind == "linear" else 1) for n, _ in module.named_parameters()}
    else:
        dst = ("shard", -1) if kind == "linear" else REPLICATE
        produced = PARTIAL
        params = {n: ("shard", 1 if kind == "linear" else 0) for n, _ in module.named_parameters()}
        if kind == "linear" and getattr(module, "bias", None) is not None:
            params["bias"] = REPLICATE
    # the gradient of a replicated input of a column-wise linear is a partial sum
    grad = PARTIAL if colwise else dst
    partial_bias = (
        ("bias",) if not colwise and "bias" in params and out[0] == "shard" else ()
    )  # a replicated bias under a sequence-sharded output: its gradient sums over shards
    return TPModule(
        fqn, name,
        inputs=(Redistribution(src, dst, grad),),
        outputs=(Redistribution(produced, out, out),),
        params=params, partial_grads=partial_bias,
        local_output=bool(style.use_local_output), output_layout=out,
    )  # fmt: skip


def _prepare_input(fqn: str, name: str, style: Any) -> TPModule:
    inputs: list[Redistribution] = []
    pairs: list[tuple[int | str, Any, Any]] = []
    if style.input_layouts is not None:
        pairs += [
            (i, a, b)
            for i, (a, b) in enumerate(
                zip(style.input_layouts, style.desired_input_layouts, strict=True)
            )
        ]
    pairs += [
        (k, v, style.desired_input_kwarg_layouts.get(k))
        for k, v in style.input_kwarg_layouts.items()
    ]
    for position, a, b in pairs:
        src, dst = layout_of(a), layout_of(b)
        if src is None:
            continue
        dst = dst or src
        # the replicated input of an attention or MLP block feeds column-wise linears
        inputs.append(Redistribution(src, dst, PARTIAL if dst == REPLICATE else dst, position))
    return TPModule(fqn, name, inputs=tuple(inputs), local_output=bool(style.use_local_output))


def _prepare_output(fqn: str, name: str, style: Any) -> TPModule:
    outputs: list[Redistribution] = []
    for i, (a, b) in enumerate(
        zip(style.output_layouts, style.desired_output_layouts, strict=True)
    ):
        src, dst = layout_of(a), layout_of(b)
        if src is not None and dst is not None:
            outputs.append(Redistribution(src, dst, dst, i))
    # use_local_output=False: the (first) output stays a DTensor in its desired layout
    kept = outputs[0].dst if outputs and outputs[0].position == 0 else None
    return TPModule(
        fqn, name, outputs=tuple(outputs), local_output=bool(style.use_local_output),
        output_layout=kept,
    )  # fmt: skip


# ------------------------------------------------- an already parallelised model
def plan_from_hooks(model: nn.Module, size: int, dim: str) -> TPPlan:
    """The plan ``parallelize_module`` applied to ``model``, read from the hooks it left
    (each closes over its style, or a ``functools.partial`` of the style's function)."""
    modules: dict[str, TPModule] = {}
    for fqn, module in model.named_modules():
        found = tp_hooks(module)
        if not found:
            continue
        params = dict(module.named_parameters(recurse=False))
        for style in found.styles:
            _add(modules, style_module(fqn, module, style))
        for cls, fn in found.partials:
            tpm = _from_partials(fqn, module, cls, fn, found)
            placed = {n: _placement_of(p) for n, p in params.items()}
            tpm.params = {n: layout for n, layout in placed.items() if layout is not None}
            _add(modules, tpm)
    return TPPlan(size, dim, modules)


@dataclass
class _Found:
    styles: list[Any] = field(default_factory=list)  # style objects (PrepareModule*)
    partials: list[tuple[str, Any]] = field(default_factory=list)  # (class, input partial)
    outputs: dict[str, functools.partial[Any]] = field(default_factory=dict)  # class -> partial
    keys: list[tuple[dict[Any, Any], Any]] = field(default_factory=list)  # hooks to drop


def tp_hooks(module: nn.Module) -> _Found | None:
    """The hooks ``parallelize_module`` registered on ``module`` (None: none)."""
    found = _Found()
    for hooks in (module._forward_pre_hooks, module._forward_hooks):
        for key, fn in hooks.items():
            cells = [c.cell_contents for c in getattr(fn, "__closure__", None) or ()]
            for obj in cells:
                kind = type(obj).__name__
                if isinstance(obj, functools.partial):
                    kind = getattr(obj.func, "__qualname__", "").split(".")[0]
                if kind in FLOAT8_STYLES:
                    raise ConfigError(
                        f"{kind} already applied to {type(module).__name__}: a model "
                        "parallelised with torchao's float8 styles is not read back; pass the "
                        "model before parallelize_module and convert_to_float8_training, with "
                        "the plan as parallelize_plan={...} and float8={...}"
                    )
                if kind in STYLES[3:] and obj not in found.styles:
                    found.styles.append(obj)
                    found.keys.append((hooks, key))
                elif isinstance(obj, functools.partial):
                    cls = getattr(obj.func, "__qualname__", "").split(".")[0]
                    if cls not in STYLES[:3]:
                        continue
                    found.keys.append((hooks, key))
                    if obj.func.__name__ == "_prepare_input_fn":
                        found.partials.append((cls, obj))
                    else:
                        found.outputs[cls] = obj
    return found if found.keys else None


def _from_partials(fqn: str, module: nn.Module, cls: str, fn: Any, found: _Found) -> TPModule:
    out = found.outputs.get(cls)
    if cls == "SequenceParallel":
        seq = layout_of(fn.args[0][0])
        assert seq is not None
        local = bool(out.args[0]) if out is not None else False
        return TPModule(
            fqn, cls,
            inputs=(Redistribution(seq, seq, seq),),
            partial_grads=tuple(n for n, _ in module.named_parameters(recurse=False)),
            local_output=local, output_layout=seq,
        )  # fmt: skip
    src, dst = layout_of(fn.args[0][0]), layout_of(fn.args[1][0])
    assert src is not None and dst is not None
    out_layout = layout_of(out.args[0][0]) if out is not None else None
    local = bool(out.args[1]) if out is not None else True
    colwise = cls == "ColwiseParallel"
    produced: Layout = ("shard", -1) if colwise else PARTIAL
    outputs = (Redistribution(produced, out_layout, out_layout),) if out_layout else ()
    return TPModule(
        fqn, cls,
        inputs=(Redistribution(src, dst, PARTIAL if colwise else dst),),
        outputs=outputs, local_output=local, output_layout=out_layout,
    )  # fmt: skip


def _placement_of(p: Any) -> Layout | None:
    spec = getattr(p, "_spec", None)
    if spec is None:
        return None
    return layout_of(spec.placements[-1])


def parse_tp_mesh(
    sizes: tuple[int, ...], names: tuple[str, ...], plan: Any
) -> tuple[tuple[int, ...], tuple[str, ...], int, str]:
    """Split a mesh with a tensor-parallel dimension: the data-parallel sizes and names, and
    the tp size and name. The tp dimension is the one named ``tp`` or, unnamed, the last
    (torchtitan keeps tp innermost, inside a node)."""
    if plan is None:
        if "tp" in names:
            raise ConfigError(
                "the mesh has a 'tp' dimension but no parallelize_plan was given: pass "
                "parallelize_module's plan as parallelize_plan={...}, or leave tp out of the mesh"
            )
        return sizes, names, 1, ""
    if len(sizes) < 2:
        raise ConfigError(
            "parallelize_plan needs a mesh with a tensor-parallel dimension, e.g. "
            "mesh=('dp_shard', 32, 'tp', 8) (as init_device_mesh('cuda', (32, 8), "
            "mesh_dim_names=('dp_shard', 'tp')))"
        )
    at = names.index("tp") if "tp" in names else len(sizes) - 1
    if at != len(sizes) - 1:
        raise ConfigError(
            f"the mesh's tp dimension must be the last (innermost), as torchtitan builds it; got "
            f"dimensions {names}"
        )
    tp_name = names[at] if names else "tp"
    return sizes[:at], names[:at], sizes[at], tp_name
