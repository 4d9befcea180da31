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
from fsdpviz.trace.meta_kernels import device_rules

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
        "grouped_mm": lambda a, b: torch._grouped_mm(t(6, 16)(a), t(2, 16, 8)(b), offs=offs),
    }


def _name(dtype: torch.dtype) -> str:
    return {bf16: "BFloat16", fp32: "Float"}[dtype]


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        out = call()
    except RuntimeError as e:
        return "refused", str(e).splitlines()[0]
    return "ran", (tuple(out.shape), out.dtype)


@pytest.mark.parametrize("op", list(_calls("cpu")))
@pytest.mark.parametrize(("a", "b"), [(bf16, fp32), (fp32, bf16), (fp32, fp32), (bf16, bf16)])
def test_meta_refuses_what_the_cpu_refuses(op: str, a: torch.dtype, b: torch.dtype) -> None:
    if op == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("no torch._grouped_mm in this torch")
    cpu = _outcome(lambda: _calls("cpu")[op](a, b))
    with device_rules():
        meta = _outcome(lambda: _calls("meta")[op](a, b))
    assert meta[0] == cpu[0]
    if cpu[0] == "ran":
        assert meta == cpu
        return
    # The CPU's words depend on its kernel library (a CPU with bfloat16 instructions runs a
    # bfloat16 convolution through oneDNN, which words the refusal its own way); the meta
    # trace words it as the plain kernel does, naming both dtypes.
    plain = f"expected scalar type {_name(a)} but found {_name(b)}"
    assert meta[1] in (plain, cpu[1])


def test_rules_hold_only_while_tracing() -> None:
    x, w = _t((4, 8), bf16, "meta"), _t((6, 8), fp32, "meta")
    with device_rules(), pytest.raises(RuntimeError, match="same dtype"):
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
