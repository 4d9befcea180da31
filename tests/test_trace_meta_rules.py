"""The meta trace accepts and refuses what the devices' kernels do (trace/meta_kernels.py),
and answers transformers' mask checks as a device would (trace/hf_masks.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from corner_models import no_cache

import fsdpviz
from fsdpviz.trace.meta_kernels import DtypeMismatch, device_rules

bf16, fp32 = torch.bfloat16, torch.float32


def _t(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.ones(shape, dtype=dtype, device=device)


def _calls(device: str) -> dict[str, Callable[[torch.dtype, torch.dtype], Any]]:
    def t(*shape: int) -> Callable[[torch.dtype], torch.Tensor]:
        return lambda dtype: _t(shape, dtype, device)

    offs = torch.tensor([3, 6], dtype=torch.int32, device=device)
    return {
        "mm": lambda a, b: torch.mm(t(4, 8)(a), t(8, 6)(b)),
        "addmm": lambda a, b: torch.addmm(t(6)(a), t(4, 8)(a), t(8, 6)(b)),
        "addmm self": lambda a, b: torch.addmm(t(6)(b), t(4, 8)(a), t(8, 6)(a)),
        "linear": lambda a, b: F.linear(t(4, 8)(a), t(6, 8)(b)),
        "linear bias": lambda a, b: F.linear(t(4, 8)(a), t(6, 8)(b), t(6)(b)),
        "linear 3d": lambda a, b: F.linear(t(2, 4, 8)(a), t(6, 8)(b), t(6)(b)),
        "matmul": lambda a, b: torch.matmul(t(2, 4, 8)(a), t(8, 6)(b)),
        "bmm": lambda a, b: torch.bmm(t(2, 4, 8)(a), t(2, 8, 6)(b)),
        "mv": lambda a, b: torch.mv(t(4, 8)(a), t(8)(b)),
        "conv2d": lambda a, b: F.conv2d(t(1, 3, 8, 8)(a), t(4, 3, 3, 3)(b)),
        "conv2d bias": lambda a, b: F.conv2d(t(1, 3, 8, 8)(a), t(4, 3, 3, 3)(b), t(4)(a)),
        "conv1d bias only": lambda a, b: F.conv1d(t(1, 3, 8)(a), t(4, 3, 3)(a), t(4)(b)),
        "conv_transpose2d": lambda a, b: F.conv_transpose2d(
            t(1, 3, 8, 8)(a), t(3, 4, 3, 3)(b), t(4)(b)
        ),
        "grouped_mm": lambda a, b: torch._grouped_mm(t(6, 16)(a), t(2, 16, 8)(b), offs=offs),
    }


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """("ran", (shape, dtype)) or ("refused", the error): what the user would meet."""
    try:
        out = call()
    except RuntimeError as e:
        return "refused", e
    return "ran", (tuple(out.shape), out.dtype)


@pytest.mark.parametrize("op", list(_calls("cpu")))
@pytest.mark.parametrize(("a", "b"), [(bf16, fp32), (fp32, bf16), (fp32, fp32), (bf16, bf16)])
def test_meta_refuses_what_the_cpu_refuses(op: str, a: torch.dtype, b: torch.dtype) -> None:
    """The real CPU refuses what the meta trace refuses, whatever kernel library it picks
    (its words differ between them: they are not compared); the meta trace says it in
    fsdpviz's words, naming the operator and each operand's dtype."""
    if op == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("no torch._grouped_mm in this torch")
    cpu = _outcome(lambda: _calls("cpu")[op](a, b))
    with device_rules():
        meta = _outcome(lambda: _calls("meta")[op](a, b))
    assert meta[0] == cpu[0], (meta, cpu)
    if meta[0] == "ran":
        assert meta == cpu
        return
    assert a != b
    error = meta[1]
    assert isinstance(error, DtypeMismatch), error
    assert error.dtypes == [a, b] or error.dtypes == [b, a]
    text = str(error)
    assert "met tensors of two dtypes" in text and "refuse mismatched dtypes" in text
    for role, t in error.operands:
        assert f"{role} {str(t.dtype).removeprefix('torch.')}" in text


def test_rules_hold_only_while_tracing() -> None:
    x, w = _t((4, 8), bf16, "meta"), _t((6, 8), fp32, "meta")
    with device_rules(), pytest.raises(DtypeMismatch, match="two dtypes"):
        F.linear(x, w)
    assert F.linear(x, w).dtype == bf16  # torch's own (lenient) meta kernel again


def test_rules_keep_autograd_on_meta() -> None:
    x = _t((4, 8), bf16, "meta").requires_grad_()
    w = _t((6, 8), bf16, "meta").requires_grad_()
    b = _t((6,), bf16, "meta").requires_grad_()
    with device_rules():
        F.linear(F.linear(x, w, b), w.t()).sum().backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None
    assert (x.grad.shape, w.grad.shape, b.grad.shape) == ((4, 8), (6, 8), (6,))


class _Convolutions(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3)
        self.body = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, bias=False), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)).mean((2, 3)))


@pytest.mark.parametrize(
    ("left_out", "params"),
    [("stem", "'stem.weight' and 'stem.bias'"), ("body.0", "'body.0.weight'")],
)
def test_convolution_left_in_float32_says_which_parameter_and_the_fix(
    left_out: str, params: str
) -> None:
    """A convolution FSDP leaves out of bfloat16 mixed precision: the trace refuses it as a
    device does, naming the parameters, the dtypes and the fix; the model comes back as it
    was. The CPU refuses the same step (in its kernel library's words)."""
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = _Convolutions()
    x = torch.randn(2, 3, 12, 12)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(fsdpviz.TraceError) as err:
        fsdpviz.analyze(
            model,
            x,
            world_size=2,
            auto_wrap_policy=ModuleWrapPolicy({torch.nn.Sequential}),
            mixed_precision=MixedPrecision(param_dtype=bf16),
            ignored_modules=[model.get_submodule(left_out)],
        )
    text = str(err.value)
    kind = type(model.get_submodule(left_out)).__name__
    assert text.startswith(
        f"tracing on the meta device failed in module {left_out!r} ({kind}): a convolution "
        "(conv2d) met tensors of two dtypes (input bfloat16, weight float32"
    )
    assert "refuse mismatched dtypes" in text
    plural = "s" if " and " in params else ""
    assert f"The float32 parameter{plural} {params} meet" in text
    assert f"model.get_submodule({left_out!r}).to(torch.bfloat16)" in text
    assert err.value.module == left_out
    assert isinstance(err.value.__cause__, DtypeMismatch)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    conv = model.get_submodule(left_out)
    with pytest.raises(RuntimeError):  # what the device does with the same step
        conv(torch.randn(2, conv.in_channels, 12, 12, dtype=bf16))


def _report(inputs: dict[str, Any], trace: str) -> fsdpviz.Report:
    model, _ = no_cache("qwen3")
    return fsdpviz.analyze(model, inputs, world_size=2, trace=trace)


def _ids() -> torch.Tensor:
    return no_cache("qwen3")[1]["input_ids"]


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"attention_mask": torch.ones(2, 12, dtype=torch.long)},
        {"position_ids": torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]])},
        {"position_ids": torch.arange(12)[None], "attention_mask": torch.ones(2, 12).long()},
    ],
    ids=["no-mask", "mask-of-ones", "packed-positions", "positions-and-mask"],
)
def test_mask_checks_answered_as_on_a_device(extra: dict[str, Any]) -> None:
    """``use_cache=False``: the meta trace runs and measures what the real trace does."""
    ids = _ids()
    inputs = {"input_ids": ids, "labels": ids, "use_cache": False, **extra}
    meta, real = _report(inputs, "meta"), _report(inputs, "real")
    assert meta.memory.peak == real.memory.peak
    assert [e.to_dict() for e in meta.iterations[1]] == [e.to_dict() for e in real.iterations[1]]


def test_mask_checks_that_need_values_say_what_to_pass() -> None:
    ids = _ids()
    base = {"input_ids": ids, "labels": ids, "use_cache": False}
    with pytest.raises(fsdpviz.TraceError) as err:
        _report({**base, "position_ids": torch.arange(12)[None]}, "meta")
    text = str(err.value)
    assert "their smallest and largest value (0 and 11) over rows of 12 do not tell" in text
    assert "leave position_ids out where each row is one sequence" in text
    padded = torch.ones(2, 12, dtype=torch.long)
    padded[:, :3] = 0
    with pytest.raises(fsdpviz.TraceError) as err:
        _report({**base, "attention_mask": padded}, "meta")
    assert "pass no attention_mask (or one of all ones) where no token is padding" in str(err.value)
    assert _report({**base, "attention_mask": padded}, "real").units  # real data: it runs


def test_selective_checkpointing_with_a_kv_cache_says_to_pass_use_cache_false() -> None:
    """A Hugging Face model keeps its KV cache by default (``use_cache=True``) and each
    checkpointed layer appends to it again when backward recomputes it: selective
    checkpointing then meets operators it did not store (torch raises in backward, on a
    device too). The error says so and what to pass; with ``use_cache=False`` it plans."""
    import hf_models

    from fsdpviz.schema.checkpointing import SelectiveCheckpoint

    model, inputs, layer = hf_models.llama()
    plan: dict[str, Any] = {
        "fully_shard": [layer], "world_size": 2, "progress": False,
        "activation_checkpointing": SelectiveCheckpoint([layer]),
    }  # fmt: skip
    with pytest.raises(fsdpviz.ConfigError) as err:
        fsdpviz.analyze(model, inputs, **plan)
    text = str(err.value)
    assert "backward failed under activation checkpointing while the model returns a KV" in text
    assert "pass use_cache=False (as gradient_checkpointing_enable() sets it)" in text
    assert "not found in storage" in text  # torch's own words
    report = fsdpviz.analyze(model, {**inputs, "use_cache": False}, **plan)
    assert report.config.activation_checkpointing == {
        "mode": "selective", "classes": [layer.__name__], "modules": 3,
    }  # fmt: skip
