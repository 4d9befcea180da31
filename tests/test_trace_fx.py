"""``trace="fx"``: torch.fx symbolic tracing, for models with operators meta cannot run."""

from __future__ import annotations

from typing import Any

import handwritten_models as hm
import pytest
import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import fsdpviz


@torch.library.custom_op("fsdpviz_tests::cpu_only_gelu", mutates_args=())
def cpu_only_gelu(x: torch.Tensor) -> torch.Tensor:
    """An extension-style operator with a CPU kernel and no meta/fake kernel."""
    return torch.nn.functional.gelu(x)


def _gelu_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    y = x.detach().requires_grad_()
    with torch.enable_grad():
        (g,) = torch.autograd.grad(torch.nn.functional.gelu(y), y, grad)
    return g


def _gelu_setup(
    ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor
) -> None:
    ctx.save_for_backward(inputs[0])


cpu_only_gelu.register_autograd(_gelu_backward, setup_context=_gelu_setup)


class CustomOpBlock(hm.Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(cpu_only_gelu(self.fc1(self.ln(x))))


class CustomOpModel(hm.Stack):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CustomOpBlock() for _ in range(3))


MODELS = [hm.Stack, hm.Nested, hm.CalledTwice, hm.Reordered, hm.WithAux, hm.ParamFree]
POLICY = ModuleWrapPolicy({hm.Block, hm.Outer})


@pytest.mark.parametrize("bp", [BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST])
@pytest.mark.parametrize("model_cls", MODELS, ids=lambda m: m.__name__)
def test_fx_matches_the_autograd_trace(model_cls: type[nn.Module], bp: BackwardPrefetch) -> None:
    x = torch.randn(4, 8)
    kw = {"auto_wrap_policy": POLICY, "backward_prefetch": bp}
    exact = fsdpviz.analyze(model_cls(), x, **kw)
    fx = fsdpviz.analyze(model_cls(), x, trace="fx", **kw)
    assert fx.to_dict()["iterations"] == exact.to_dict()["iterations"]
    assert fx.forward_order == exact.forward_order
    assert [u.to_dict() for u in fx.units] == [u.to_dict() for u in exact.units]
    assert fx.module_order == exact.module_order
    assert [w.code for w in fx.warnings] == ["approximate_backward_order"]
    assert {m.fqn: m.calls for m in fx.modules} == {m.fqn: m.calls for m in exact.modules}


def test_custom_op_without_meta_kernel() -> None:
    model, x = CustomOpModel(), torch.randn(4, 8)
    kw = {"auto_wrap_policy": ModuleWrapPolicy({CustomOpBlock})}
    with pytest.raises(fsdpviz.TraceError) as err:
        fsdpviz.analyze(model, x, **kw)
    assert err.value.module == "blocks.0"
    assert "trace='fx'" in str(err.value) and "trace='real'" in str(err.value)
    fx = fsdpviz.analyze(model, x, trace="fx", **kw)
    real = fsdpviz.analyze(model, x, trace="real", **kw)
    assert fx.to_dict()["iterations"] == real.to_dict()["iterations"]
    assert fx.forward_order == ["", "blocks.0", "blocks.1", "blocks.2"]


def test_fx_failure_names_the_module() -> None:
    class Branchy(hm.Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # control flow on a traced value
                return x
            return super().forward(x)

    model = hm.Stack()
    model.blocks[2] = Branchy()
    with pytest.raises(fsdpviz.TraceError, match=r"failed in module 'blocks\.2'") as err:
        fsdpviz.analyze(model, torch.randn(4, 8), trace="fx")
    assert err.value.module == "blocks.2"
