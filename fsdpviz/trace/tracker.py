"""Module-level tracing of one forward/backward, in the style of ``ModTracker``.

Hooks go on fsdpviz's private copy of the model only. They record the order in
which modules first run, how often each runs, the tensor shapes each saw, and
which module was running when something failed.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from fsdpviz.errors import ConfigError, TraceError
from fsdpviz.schema.memory import size_text
from fsdpviz.schema.report import FsdpWarning
from fsdpviz.trace.checkpointing import is_checkpointed
from fsdpviz.trace.copy import index_range, inputs_copy
from fsdpviz.trace.hf_masks import answered_mask_checks
from fsdpviz.trace.meta_kernels import DtypeMismatch, device_rules, dtype_name

# what runs a step's backward (``run_step``'s ``backward=``): from these outputs (or the
# loss) with these gradients of them (None: the loss's own), then the model's output
Backward = Callable[[list[torch.Tensor], list[torch.Tensor] | None, Any], None]


@dataclass
class ModuleCalls:
    calls: int = 0
    input_shapes: list[list[int]] = field(default_factory=list)
    output_shapes: list[list[int]] = field(default_factory=list)


def _shapes(obj: Any, limit: int = 8) -> list[list[int]]:
    out: list[list[int]] = []
    for leaf in tree_leaves(obj):
        if isinstance(leaf, torch.Tensor):
            out.append(list(leaf.shape))
            if len(out) >= limit:
                break
    return out


class ModuleTracker:
    """Records module calls on ``model`` (a private copy) while tracing."""

    def __init__(self, model: nn.Module, on_call: Callable[[], None] | None = None) -> None:
        self.names = {m: n for n, m in model.named_modules()}
        self.records: dict[str, ModuleCalls] = {n: ModuleCalls() for n in self.names.values()}
        self.order: list[str] = []
        self.backward_order: list[str] = []
        self.stack: list[str] = []
        self._on_call = on_call
        self._in_backward: set[str] = set()
        # What the step showed that runs silently on meta but fails on a device.
        self.warnings: list[FsdpWarning] = []
        # Set by the cost model's probe (fsdpviz.trace.probe): ``run_step`` runs under it.
        self.measure: Callable[[nn.Module, Any], AbstractContextManager[None]] | None = None
        # Set by the cost model's probe: runs a compiled loss (torch.compile(loss_fn)).
        self.call_loss: Callable[[Callable[[Any], torch.Tensor], Any], torch.Tensor] | None = None
        self._handles = []
        for module in self.names:
            self._handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post))

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        name = self.names.get(module, "?")
        self.stack.append(name)
        rec = self.records.setdefault(name, ModuleCalls())
        if rec.calls == 0:
            self.order.append(name)
            rec.input_shapes = _shapes((args, kwargs))
        rec.calls += 1
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            self._check_ids(name, module, args[0] if args else kwargs.get("input"))
        if self._on_call is not None:
            self._on_call()

    def _check_ids(self, name: str, module: nn.Embedding | nn.EmbeddingBag, ids: Any) -> None:
        """Token ids outside an embedding's rows index out of range on a device; meta, which
        holds no values, runs on: say so."""
        known = index_range(ids)
        if known is None:
            return
        given, lo, hi = known
        rows = module.num_embeddings
        if lo >= 0 and hi < rows:
            return
        message = (
            f"{given} holds ids from {lo} to {hi}, but {name!r} ({type(module).__name__}) has "
            f"{rows} rows (ids 0 to {rows - 1}): on a device this step fails with an index "
            "out of range; the meta trace cannot tell. Check the tokenizer and the config's "
            "vocab_size"
        )
        if all(w.message != message for w in self.warnings):
            self.warnings.append(FsdpWarning(code="ids_out_of_range", message=message, units=[]))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        name = self.names.get(module, "?")
        rec = self.records[name]
        if not rec.output_shapes:
            rec.output_shapes = _shapes(output)
        if self.stack and self.stack[-1] == name:
            self.stack.pop()
        if torch.is_grad_enabled():
            for t in tree_leaves(output):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(functools.partial(self._backward_reached, name))  # type: ignore[no-untyped-call]

    def _backward_reached(self, name: str, grad: torch.Tensor) -> None:
        if name not in self._in_backward:
            self._in_backward.add(name)
            self.backward_order.append(name)

    def reset_calls(self) -> None:
        """Forget call counts (keep shapes) before tracing another iteration."""
        for rec in self.records.values():
            rec.calls = 0
        self.order.clear()
        self.backward_order.clear()
        self._in_backward.clear()
        self.stack.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


USE_CACHE_CODE = "use_cache_checkpointed"
"""The warning of a model that returns a KV cache under activation checkpointing."""


def cache_bytes(output: Any) -> int:
    """Bytes of the tensors a Hugging Face model's output holds in its KV cache (``cache``,
    formerly ``past_key_values``; ``use_cache=True``); 0 when it holds none."""
    keys = output.keys() if isinstance(output, dict) else ()  # (ModelOutput is a dict)
    found = [output[k] for k in ("cache", "past_key_values") if k in keys]
    seen: set[int] = set()
    total = 0

    def visit(obj: Any, depth: int) -> None:
        nonlocal total
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen:
                seen.add(id(obj))
                total += obj.numel() * obj.element_size()
        elif depth < 4 and isinstance(obj, (list, tuple)):
            for x in obj:
                visit(x, depth + 1)
        elif depth < 4 and obj is not None and hasattr(obj, "__dict__"):
            for x in vars(obj).values():
                visit(x, depth + 1)

    for cache in found:
        visit(cache, 0)
    return total


def _check_cache(model: nn.Module, output: Any, tracker: ModuleTracker) -> None:
    """A model called with ``use_cache=True`` under activation checkpointing: say so."""
    held = cache_bytes(output)
    if not held or any(w.code == USE_CACHE_CODE for w in tracker.warnings):
        return
    if not is_checkpointed(model):
        return

    tracker.warnings.append(
        FsdpWarning(
            USE_CACHE_CODE,
            f"the model returns a KV cache (use_cache=True, its config's default) under "
            f"activation checkpointing: the cache keeps every layer's keys and values "
            f"({size_text(held)} after forward) through backward, and each recomputed layer "
            "appends them again. Training needs no cache: use_cache=False (as "
            "gradient_checkpointing_enable() sets it)",
            fix={"use_cache": False},
        )
    )


def default_loss(output: Any) -> torch.Tensor:
    """``output.loss`` if set, else ``output.logits.sum()``, else the sum of float tensors."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits.sum()
    floats = [
        t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    if not floats:
        raise ConfigError(
            "the model output has no floating-point tensor to build a loss from; pass "
            "loss=lambda out: ... returning a scalar tensor"
        )
    total = floats[0].sum()
    for t in floats[1:]:
        total = total + t.sum()
    return total


# What meta tensors cannot do: values (.item(), data-dependent shapes), or operators with
# no meta kernel. Any other failure is the model's own answer to its inputs.
_NEEDS_VALUES = (
    "meta",
    "fake impl",
    "abstract impl",
    ".item()",
    "data-dependent",
    "_local_scalar_dense",
    "data_ptr",
    "nonzero",
    "cannot copy out",
)


# What the kernels say when two tensors of an operator have different dtypes.
_DTYPE_MISMATCH = re.compile(
    r"have the same dtype|expected scalar type|type \(.*\) should be the same|"
    r"input dtypes must be the same",
    re.IGNORECASE,
)


def failure_hint(
    e: BaseException,
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    where: str,
    failing: str = "",
) -> str:
    """What to do about a failed step in module ``failing``: for tensors of two dtypes, which
    parameters FSDP casts; other tracing for what meta tensors cannot do; otherwise the
    inputs, since the model rejected them."""
    text = f"{type(e).__name__}: {e}"
    module = dict(model.named_modules()).get(failing)
    if isinstance(e, DtypeMismatch):
        return mismatched_parameters(e, model, failing)
    if isinstance(e, RuntimeError) and _DTYPE_MISMATCH.search(text):  # trace="real"
        return dtype_hint(module)
    if where == "the meta device" and _in_transformers_masks(e):
        return (
            "transformers' mask code reads values here (whether attention_mask pads tokens, "
            "whether position_ids pack sequences), which meta tensors do not hold. To plan, "
            "pass no attention_mask (or one of all ones) where no token is padding: the model "
            "then masks causally, as it does on a device for a mask of ones; leave position_ids "
            "out where each row is one sequence; or analyse with trace='real'."
        )
    if where == "the meta device" and (
        isinstance(e, NotImplementedError) or any(k in text.lower() for k in _NEEDS_VALUES)
    ):
        return (
            "If the model needs real data here (data-dependent control flow such as .item(), "
            "or an operator with no meta kernel), analyse with trace='real' on a model that "
            "lives on a real device, or with trace='fx' (torch.fx symbolic tracing runs no "
            "operator) for models fx can trace."
        )
    return "The model rejected its inputs; check them: " + describe_inputs(model, args, kwargs)


def _in_transformers_masks(e: BaseException) -> bool:
    """The failure happened inside ``transformers.masking_utils``."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == "transformers.masking_utils":
            return True
        tb = tb.tb_next
    return False


def mismatched_parameters(e: DtypeMismatch, model: nn.Module, module: str) -> str:
    """What to change for a dtype mismatch: the operands that are the model's parameters (or
    views of them, as ``F.linear``'s transposed weight), the dtype they meet, and the fixes;
    the failing module's parameter dtypes where no operand is a parameter."""
    names = {id(p): name for name, p in model.named_parameters()}
    found: dict[str, torch.dtype] = {}
    for _, t in e.operands:
        name = names.get(id(t))
        if name is None and t._base is not None:
            name = names.get(id(t._base))
        if name is not None:
            found.setdefault(name, t.dtype)
    if not found:
        return dtype_hint(model.get_submodule(module) if module else model)
    said = []
    for dtype in dict.fromkeys(found.values()):
        params = [n for n, d in found.items() if d == dtype]
        met = " and ".join(dtype_name(d) for d in e.dtypes if d != dtype)
        which = " and ".join(repr(n) for n in params)
        verb = "parameters" if len(params) > 1 else "parameter"
        meet = "meet" if len(params) > 1 else "meets"
        said.append(f"the {dtype_name(dtype)} {verb} {which} {meet} {met} tensors")
    # the compute dtype: the one no parameter has (else the first operand's, the input's)
    target = next((d for d in e.dtypes if d not in found.values()), e.dtypes[0])
    owner = f"model.get_submodule({module!r})" if module else "model"
    text = "; ".join(said)
    return (
        text[0].upper() + text[1:] + ". With mixed precision, FSDP casts only the parameters "
        "it manages: parameters of ignored_modules / ignored_states / ignored_params, and of "
        "modules MixedPrecision's _module_classes_to_ignore leaves out, keep their own dtype "
        "while the activations they meet are in param_dtype. Fix: cast the module to the "
        f"compute dtype ({owner}.to({target})), cast its input in its forward, or let FSDP "
        "manage its parameters."
    )


def dtype_hint(module: nn.Module | None) -> str:
    """Why a step meets tensors of two dtypes, and the fixes (where the mismatch's operands
    are not known: a real trace, which raises the device kernel's own error)."""
    held = ""
    if module is not None:
        dtypes: dict[str, list[str]] = {}
        for name, p in module.named_parameters():
            dtypes.setdefault(str(p.dtype).removeprefix("torch."), []).append(name)
        if dtypes:
            held = (
                "This module's parameters are "
                + "; ".join(
                    f"{d} ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
                    for d, names in dtypes.items()
                )
                + ". "
            )
    return (
        f"{held}Tensors of two dtypes meet in one operator, and the device's kernel refuses "
        "them. With mixed precision, FSDP casts only the parameters it "
        "manages: parameters of ignored_modules / ignored_states / ignored_params, and of "
        "modules MixedPrecision's _module_classes_to_ignore leaves out, keep their own dtype "
        "while the activations they meet are in param_dtype. Cast that module to the compute "
        "dtype (module.to(torch.bfloat16)), cast its input in its forward, or let FSDP manage "
        "its parameters."
    )


def describe_inputs(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``input_ids: int64[2, 8], labels: int64[3, 5]`` and the names the model's forward
    takes, with a suggestion for a keyword it does not name (``inputs_ids``)."""

    def shape(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
        return type(x).__name__

    given = [f"inputs[{i}]: {shape(a)}" for i, a in enumerate(args)]
    given += [f"{k}: {shape(v)}" for k, v in kwargs.items()]
    parts = [", ".join(given) or "no inputs"]
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return parts[0]
    named = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for key in kwargs:
        if key not in params:
            close = difflib.get_close_matches(key, named, n=1)
            tip = f" (did you mean {close[0]!r}?)" if close else ""
            parts.append(f"{key!r} is not a parameter of {type(model).__name__}.forward{tip}")
    shown = ", ".join(named[:8]) + (", ..." if len(named) > 8 else "")
    parts.append(f"{type(model).__name__}.forward takes ({shown})")
    return "; ".join(parts)


class Removable(Protocol):
    """What installed hooks and can take them out again (a tracker, an emulation, a probe)."""

    def remove(self) -> None: ...


def remove_hooks(*installed: Removable | None) -> None:
    """Take out the hooks of each of ``installed`` that is there, in order (a step's cleanup,
    however the step ended)."""
    for hooks in installed:
        if hooks is not None:
            hooks.remove()


def run_stored_step(
    model: nn.Module,
    inputs: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    tracker: ModuleTracker,
    handles: list[Any],
    on_loss: Callable[[torch.Tensor], None],
) -> None:
    """One step of a stored trace on meta (``fsdpviz.replan.stored_fsdp1``,
    ``fsdpviz.replan.stored_fsdp2``); the tracker and ``handles`` are removed and gradients
    dropped however it ends."""
    try:
        args, kwargs = inputs_copy(inputs, "meta")
        run_step(model, args, kwargs, loss_fn, tracker, "the meta device", on_loss)
    finally:
        tracker.remove()
        for h in handles:
            h.remove()
        for p in model.parameters():
            p.grad = None


def run_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    tracker: ModuleTracker,
    where: str,
    on_loss: Callable[[torch.Tensor], None] | None = None,
    *,
    stage_output: bool = False,
    keep_output: bool = False,
    backward: Backward | None = None,
) -> Any:
    """One forward and backward on the copy; failures name the module that failed.

    With ``tracker.measure`` set (the cost model's probe), the step runs under it.
    ``stage_output``: ``model`` is a pipeline stage before the last, whose backward starts
    from the gradient of each of its output tensors (what the next stage sends back) instead
    of a loss; ``on_loss`` is then called with the first of them. ``keep_output``: return the
    model's output, alive to the end of the measured step (a pipeline stage's, sent on);
    else it dies with the step, as a training loop drops it (None is returned).
    ``backward``: runs the backward from the outputs (or the loss) and their gradients
    (None: the loss's), in place of ``torch.autograd.backward``.
    """
    # torch imports Dynamo on the first call of a function it wraps in _disable_dynamo; made
    # inside the measured step, that import leaves storages of the step alive until a cyclic
    # collection (which analyze defers), so the first trace in a process counted more
    importlib.import_module("torch._dynamo")
    measure = tracker.measure(model, (args, kwargs)) if tracker.measure else nullcontext()
    meta = where == "the meta device"
    kernels = device_rules() if meta else nullcontext()
    masks = answered_mask_checks(model, args, kwargs) if meta else nullcontext()
    with measure, kernels, masks:
        output = _step(
            model, args, kwargs, loss_fn, tracker, where, on_loss, stage_output, backward
        )
        if not keep_output:
            output = None
    return output


def _step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    loss_fn: Callable[[Any], torch.Tensor] | None,
    tracker: ModuleTracker,
    where: str,
    on_loss: Callable[[torch.Tensor], None] | None,
    stage_output: bool = False,
    backward: Backward | None = None,
) -> Any:
    try:
        output = model(*args, **kwargs)
    except ConfigError:
        raise  # what fsdpviz cannot plan (its emulations say why), not the model failing
    except Exception as e:
        failing = tracker.stack[-1] if tracker.stack else ""
        cls = type(dict(model.named_modules()).get(failing, model)).__name__
        label = repr(failing) if failing else "(root)"
        said = str(e) if isinstance(e, DtypeMismatch) else f"{type(e).__name__}: {e}"
        raise TraceError(
            f"tracing on {where} failed in module {label} ({cls}): {said}\n"
            + failure_hint(e, model, args, kwargs, where, failing),
            module=failing,
        ) from e
    _check_cache(model, output, tracker)
    if stage_output:
        tensors = [
            t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        sent = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
        if sent and not tensors and not any(p.requires_grad for p in model.parameters()):
            # a frozen stage whose inputs need no gradient: torch's stage_backward finds no
            # output that needs one and runs autograd on none (the next stage sends none)
            if on_loss is not None:
                on_loss(sent[0])
            return output
        if not tensors:
            raise ConfigError(
                f"pipeline stage {type(model).__name__} returns no tensor that requires grad, "
                "so no gradient flows back through it"
            )
        if on_loss is not None:
            on_loss(tensors[0])
        # what the next stage sends back lands in a buffer PipelineStage allocated before
        # the step (counted with the stage's inputs), not in memory the step allocates
        with _disable_current_modes():
            grads = [torch.ones_like(t) for t in tensors]
        if backward is None:
            torch.autograd.backward(tensors, grads)
        else:
            backward(tensors, grads, output)
        return output
    fn = loss_fn or default_loss
    # torch.compile(loss_fn): its function runs (on meta, not Dynamo); the probe holds its
    # memory as the compiled loss does
    compiled = getattr(fn, "_torchdynamo_orig_callable", None)
    if compiled is None:
        loss = fn(output)
    elif tracker.call_loss is None:
        loss = compiled(output)
    else:
        loss = tracker.call_loss(compiled, output)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ConfigError("loss must return a scalar tensor")
    if not loss.requires_grad:
        raise ConfigError(
            "the loss does not require grad, so there is no backward pass to analyse; check "
            "that parameters require grad or pass loss=... that depends on them"
        )
    if on_loss is not None:
        on_loss(loss)
    try:
        if backward is None:
            loss.backward()  # type: ignore[no-untyped-call]
        else:
            backward([loss], None, output)
    except RuntimeError as e:
        held = cache_bytes(output)
        if held and is_checkpointed(model):
            raise ConfigError(
                "backward failed under activation checkpointing while the model returns a KV "
                f"cache (use_cache=True, its config's default; {size_text(held)} after "
                "forward): each checkpointed layer appends its keys and values to the cache "
                "again when backward recomputes it, so the recomputation does not run as the "
                "forward did (selective checkpointing finds operators it did not store). "
                "Training needs no cache: pass use_cache=False (as "
                f"gradient_checkpointing_enable() sets it). torch said: {e}"
            ) from e
        raise
    return output
