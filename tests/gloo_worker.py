"""Worker for the gloo conformance tests (spawned by torch.multiprocessing).

``run(rank, world_size, port, out_dir, suite)`` records every case of one suite on each
rank: ``"two"`` (2 ranks: FSDP1 and FSDP2 cases), ``"one"`` (1 rank, where FSDP1 switches
to NO_SHARD), ``"hybrid"`` (4 ranks in two shard groups of 2, FSDP1's hybrid strategies
given their ``(shard, replicate)`` process groups), ``"accum"`` (2 ranks: gradient
accumulation over ``ACCUM`` micro-steps, FSDP1 ``no_sync`` and FSDP2
``set_requires_gradient_sync(False)``) or ``"tp"`` (4 ranks as a dp 2 x tp 2
mesh: a Llama-style model with torchtitan's tensor-parallel plan, ``fully_shard`` on dp) or
``"corners"`` (2 ranks: :func:`corner_cases`, each recorded or refused) or ``"peft"`` (2
ranks: :func:`peft_cases`, fine-tuning adapters, with the bytes of every collective) or
``"placement"`` (2 ranks: :func:`placement_cases`, FSDP2's ``shard_placement_fn``, with the
bytes of every collective).
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import handwritten_models as hm
import torch
import torch.distributed as dist
from fsdp_harness import record_real_fsdp1, record_real_fsdp2
from rank_exit import leave_rank
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from fsdpviz.schedule.tp_mm_strategy import GPUS_PER_NODE


def gloo_cases() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    """name -> (model factory, inputs factory, FSDP kwargs); deterministic on every rank."""
    from hf_models import HF_MODELS

    def x() -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

    def llama() -> Any:
        return HF_MODELS["llama"]()[0]

    def llama_inputs() -> Any:
        return HF_MODELS["llama"]()[1]

    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    block = ModuleWrapPolicy({hm.Block})
    return {
        "stack-pre": (hm.Stack, x, {"auto_wrap_policy": block}),
        "twice-post-fwd": (
            hm.CalledTwice,
            x,
            {
                "auto_wrap_policy": block,
                "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
                "forward_prefetch": True,
            },
        ),
        "nested-grad-op": (
            hm.Nested,
            x,
            {
                "auto_wrap_policy": ModuleWrapPolicy({hm.Block, hm.Outer}),
                "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP,
                "use_orig_params": True,
            },
        ),
        "llama-fwd-prefetch": (
            llama,
            llama_inputs,
            {"auto_wrap_policy": ModuleWrapPolicy({LlamaDecoderLayer}), "forward_prefetch": True},
        ),
        # FSDP1 keeps the string, which never equals a BackwardPrefetch: no backward prefetch
        "stack-string-prefetch": (hm.Stack, x, {"auto_wrap_policy": block,
                                                "backward_prefetch": "BACKWARD_PRE"}),
    }  # fmt: skip


def one_rank_cases() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    """name -> (model factory, inputs factory, FSDP kwargs) on a process group of one rank."""

    def x() -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

    block = ModuleWrapPolicy({hm.Block})
    return {
        "one-full-shard": (hm.Stack, x, {"auto_wrap_policy": block}),
        "one-grad-op-post": (
            hm.CalledTwice,
            x,
            {
                "auto_wrap_policy": block,
                "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP,
                "backward_prefetch": BackwardPrefetch.BACKWARD_POST,
            },
        ),
        "one-string-strategy": (hm.Stack, x, {"auto_wrap_policy": block,
                                              "sharding_strategy": "FULL_SHARD"}),
    }  # fmt: skip


HYBRID_SHARD_GROUP = 2


def hybrid_cases() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    """name -> (model factory, inputs factory, FSDP kwargs) on 4 ranks in shard groups of 2."""

    def x() -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

    block = ModuleWrapPolicy({hm.Block})
    return {
        f"hybrid-{s.name.lower()}-{p.name.lower()}": (
            hm.Stack if p == BackwardPrefetch.BACKWARD_PRE else hm.Nested,
            x,
            {
                "auto_wrap_policy": block
                if p == BackwardPrefetch.BACKWARD_PRE
                else ModuleWrapPolicy({hm.Block, hm.Outer}),
                "sharding_strategy": s,
                "backward_prefetch": p,
            },
        )
        for s in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
        for p in (BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST)
    }


def _hybrid_groups(rank: int, world_size: int) -> tuple[Any, Any]:
    """This rank's (shard, replicate) process groups; every rank creates every group."""
    size = HYBRID_SHARD_GROUP
    shard = replicate = None
    for start in range(0, world_size, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            shard = group
    for offset in range(size):
        group = dist.new_group(list(range(offset, world_size, size)))
        if rank % size == offset:
            replicate = group
    return shard, replicate


def gloo_fsdp2_cases() -> dict[str, tuple[Any, Any, list[tuple[str, ...]], dict[str, Any]]]:
    """name -> (model factory, inputs factory, fully_shard calls, FSDP2 options)."""
    from hf_models import HF_MODELS
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def x() -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

    blocks = [(f"blocks.{i}",) for i in range(4)]
    llama = HF_MODELS["llama"]
    layers = [(f"model.layers.{i}",) for i in range(3)]
    return {
        "fsdp2-stack-explicit": (
            hm.Stack,
            x,
            blocks,
            {"forward_prefetch": {"blocks.0": ["blocks.1", "blocks.2"]}},
        ),
        "fsdp2-llama-bf16": (
            lambda: llama()[0],
            lambda: llama()[1],
            layers,
            {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)},
        ),
    }


ACCUM = 3  # micro-steps per optimizer step in the "accum" suite


def accum_cases() -> dict[str, tuple[Any, Any, Any, dict[str, Any]]]:
    """name -> (model factory, inputs factory, fully_shard calls or None for FSDP1, options),
    each trained with ``ACCUM`` micro-steps per optimizer step."""
    from hf_models import HF_MODELS
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    def x() -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

    def llama() -> Any:
        return HF_MODELS["llama"]()[0]

    def llama_inputs() -> Any:
        return HF_MODELS["llama"]()[1]

    block = ModuleWrapPolicy({hm.Block})
    grad_op = ShardingStrategy.SHARD_GRAD_OP
    return {
        "accum-full-shard": (hm.Stack, x, None, {"auto_wrap_policy": block}),
        "accum-grad-op": (
            hm.Stack, x, None, {"auto_wrap_policy": block, "sharding_strategy": grad_op},
        ),
        "accum-grad-op-post-fwd": (
            hm.CalledTwice, x, None,
            {"auto_wrap_policy": block, "sharding_strategy": grad_op, "use_orig_params": True,
             "backward_prefetch": BackwardPrefetch.BACKWARD_POST, "forward_prefetch": True},
        ),
        "accum-llama-grad-op": (
            llama, llama_inputs, None,
            {"auto_wrap_policy": ModuleWrapPolicy({LlamaDecoderLayer}),
             "sharding_strategy": grad_op},
        ),
        "accum-fsdp2-stack": (hm.Stack, x, [(f"blocks.{i}",) for i in range(4)], {}),
        "accum-fsdp2-llama-bf16": (
            llama, llama_inputs, [(f"model.layers.{i}",) for i in range(3)],
            {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)},
        ),
    }  # fmt: skip


class Corner(NamedTuple):
    """A case real FSDP and fsdpviz must agree on: both accept it (and plan the same
    schedule) or both reject it for the same reason (``accepts=False``).

    ``build()`` gives ``(model, inputs)``; ``options(model)`` the ``analyze`` keyword
    arguments for that model; FSDP2 cases name their ``fully_shard`` calls by FQN."""

    build: Any
    api: str
    options: Any
    accepts: bool
    said: str | None = None  # where real FSDP's message names objects: the part fsdpviz says
    loss: Any = None  # the loss from the model's output (default: fsdpviz's)
    # a group reduce-scattered before all its gradients exist: FSDP2 moves those that do,
    # fsdpviz sizes the reduce-scatter by all its trainable parameters
    partial_grads: bool = False


def corner_cases() -> dict[str, Corner]:
    """name -> case, on 2 ranks: the cases that refuse come last (a rank that raised in
    forward leaves its FSDP state behind)."""
    import functools

    import corner_models as cm
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy
    from torch.distributed.fsdp.wrap import CustomPolicy, lambda_auto_wrap_policy

    def wrap_layers(model: torch.nn.Module) -> dict[str, Any]:
        layer = type(model.get_submodule("model.layers.0"))
        return {"auto_wrap_policy": ModuleWrapPolicy({layer})}

    def layers(prefix: str, n: int = 2) -> Any:
        return lambda model: {"fully_shard": [(f"{prefix}.{i}",) for i in range(n)]}

    def head_in_fp32(api: str) -> Any:
        def options(model: torch.nn.Module) -> dict[str, Any]:
            if api == "FSDP1":
                return {
                    "auto_wrap_policy": ModuleWrapPolicy({hm.Block}),
                    "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16),
                    "ignored_modules": [model.get_submodule("head")],
                }
            return {
                "fully_shard": [(f"blocks.{i}",) for i in range(4)],
                "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16),
                "ignored_params": [model.get_parameter(n) for n in ("head.weight", "head.bias")],
            }

        return options

    def x() -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

    return {
        "mla-fsdp1": Corner(cm.deepseek_mla, "FSDP1", wrap_layers, True),
        "mla-fsdp2": Corner(cm.deepseek_mla, "FSDP2", layers("model.layers"), True),
        **{
            f"{name}-no-cache": Corner(
                lambda name=name: cm.no_cache(name),
                api,
                wrap_layers if api == "FSDP1" else layers("model.layers"),
                True,
            )
            for name, api in (("qwen3", "FSDP1"), ("gemma3", "FSDP2"), ("qwen3_moe", "FSDP1"))
        },
        "identity-policy-fsdp1": Corner(
            lambda: (cm.stack(), x()),
            "FSDP1",
            lambda model: {
                "auto_wrap_policy": CustomPolicy(lambda m: m is model.head or m is model.blocks[1])
            },
            True,
        ),
        "lambda-in-list-fsdp1": Corner(
            lambda: (cm.stack(), x()),
            "FSDP1",
            lambda model: {
                "auto_wrap_policy": functools.partial(
                    lambda_auto_wrap_policy, lambda_fn=lambda m: m in [model.blocks[0], model.inp]
                )
            },
            True,
        ),
        "paramless-unit-fsdp1": Corner(
            lambda: (cm.WithActivation(), x()),
            "FSDP1",
            lambda model: {
                "auto_wrap_policy": CustomPolicy(
                    lambda m: (
                        {"sharding_strategy": ShardingStrategy.SHARD_GRAD_OP}
                        if isinstance(m, cm.Activation)
                        else isinstance(m, hm.Block)
                    )
                )
            },
            True,
        ),
        "bart-no-mask-fsdp2": Corner(
            cm.bart,
            "FSDP2",
            lambda model: {
                "fully_shard": [
                    (f"model.{part}.layers.{i}",)
                    for part in ("encoder", "decoder")
                    for i in range(2)
                ]
            },
            True,
        ),
        "learned-mask-fsdp2": Corner(
            lambda: (
                cm.BiasedStack(),
                torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0)),
            ),
            "FSDP2",
            lambda model: {"fully_shard": [("blocks.0",), ("blocks.1",)]},
            True,
        ),
        "chunked-head-fsdp2": Corner(
            lambda: (cm.ChunkedHead(), x()),
            "FSDP2",
            lambda model: {"fully_shard": [("blocks.0",), ("blocks.1",), ("norm", "head")]},
            True,
            loss=cm.chunked_loss,
            partial_grads=True,
        ),
        "no-shard-orig-params-fsdp1": Corner(
            lambda: (cm.stack(), x()),
            "FSDP1",
            lambda model: {
                "auto_wrap_policy": ModuleWrapPolicy({hm.Block}),
                "sharding_strategy": ShardingStrategy.NO_SHARD,
                "use_orig_params": True,
            },
            True,
        ),
        "scalar-fsdp1": Corner(
            lambda: (cm.WithScalar(), x()),
            "FSDP1",
            lambda model: {"auto_wrap_policy": ModuleWrapPolicy({cm.Scaled})},
            False,
        ),
        "module-list-fsdp2": Corner(
            lambda: (cm.stack(), x()),
            "FSDP2",
            lambda model: {"fully_shard": [("blocks",)]},
            False,
            "fully_shard does not support containers that do not implement forward",
        ),
        "fp32-head-fsdp1": Corner(lambda: (cm.stack(), x()), "FSDP1", head_in_fp32("FSDP1"), False),
        "fp32-head-fsdp2": Corner(lambda: (cm.stack(), x()), "FSDP2", head_in_fp32("FSDP2"), False),
    }


def record_corners(rank: int, world_size: int, out_dir: str) -> None:
    """Each corner case on this rank: its recording, or what real FSDP raised."""
    for name, case in corner_cases().items():
        torch.manual_seed(0)
        model, inputs = case.build()
        options = case.options(model)
        try:
            with _Collectives() as moved:
                if case.api == "FSDP1":
                    report = record_real_fsdp1(model, inputs, options, case.loss, copied=False)
                else:
                    report = _record_fsdp2(model, inputs, options, world_size, case.loss)
        except Exception as e:  # real FSDP refuses: what it said, to compare
            text = json.dumps({"type": type(e).__name__, "message": str(e)})
            (Path(out_dir) / f"{name}-rank{rank}.error.json").write_text(text)
            continue
        report.to_json(Path(out_dir) / f"{name}-rank{rank}.json")
        path = Path(out_dir) / f"{name}-collectives-rank{rank}.json"
        path.write_text(json.dumps(moved.moved))


def _record_fsdp2(
    model: Any, inputs: Any, options: dict[str, Any], world_size: int, loss: Any = None
) -> Any:
    names = {p: n for n, p in model.named_parameters()}
    ignored = [names[p] for p in options.get("ignored_params", [])]
    return record_real_fsdp2(
        model, inputs, options["fully_shard"], world_size, mp_policy=options.get("mp_policy"),
        ignored_params=ignored, loss=loss,
    )  # fmt: skip


def peft_cases() -> dict[str, Corner]:
    """name -> fine-tuning case on 2 ranks: LoRA (Llama) and DoRA (GPT-NeoX) adapters as
    ``peft`` builds them, under FSDP1 and FSDP2. FSDP1 wraps them as accelerate does for a
    PEFT model (peft's ``fsdp_auto_wrap_policy``: each adapter a unit of its own, and each
    layer) or each layer with ``use_orig_params=True`` (frozen and trainable parameters in
    one FlatParameter)."""
    import peft_models as pm
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def peft_policy(model: torch.nn.Module) -> dict[str, Any]:
        from peft.utils.other import fsdp_auto_wrap_policy

        return {"auto_wrap_policy": fsdp_auto_wrap_policy(model)}

    def layer_class(model: torch.nn.Module) -> type[torch.nn.Module]:
        name = type(model.get_base_model()).__name__
        return pm.MODELS["llama-lora" if "Llama" in name else "neox-dora"]()[2]

    def layers(orig_params: bool) -> Any:
        def options(model: torch.nn.Module) -> dict[str, Any]:
            return {"auto_wrap_policy": ModuleWrapPolicy({layer_class(model)}),
                    "use_orig_params": orig_params}  # fmt: skip

        return options

    def shard_layers(mp: bool) -> Any:
        def options(model: torch.nn.Module) -> dict[str, Any]:
            layer = layer_class(model)
            names = [n for n, m in model.named_modules() if isinstance(m, layer)]
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            return {"fully_shard": [(n,) for n in names], **({"mp_policy": policy} if mp else {})}

        return options

    def build(name: str) -> Any:
        return lambda: pm.MODELS[name]()[:2]

    return {
        "peft-llama-lora-fsdp1-peft-policy": Corner(
            build("llama-lora"), "FSDP1", peft_policy, True
        ),
        "peft-llama-lora-fsdp1-orig-params": Corner(
            build("llama-lora"), "FSDP1", layers(True), True
        ),
        "peft-llama-lora-fsdp2-bf16": Corner(
            build("llama-lora"), "FSDP2", shard_layers(True), True
        ),
        "peft-neox-dora-fsdp1-orig-params": Corner(build("neox-dora"), "FSDP1", layers(True), True),
        "peft-neox-dora-fsdp2": Corner(build("neox-dora"), "FSDP2", shard_layers(False), True),
        "peft-llama-bf16-fp32-adapters-fsdp2": Corner(
            build("llama-lora-bf16"), "FSDP2", shard_layers(False), True
        ),
    }


def record_peft(rank: int, world_size: int, out_dir: str) -> None:
    """Each fine-tuning case on this rank: its recording, the tensor each collective moved
    (``[kind, bytes]``: an all-gather's output, a reduce-scatter's input), and after one more
    step of AdamW over ``model.parameters()`` the bytes of its state and of the gradients
    FSDP left (per FlatParameter / parameter group, as the ranks hold them)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    for name, case in peft_cases().items():
        torch.manual_seed(0)
        model, inputs = case.build()
        options = case.options(model)
        measured: dict[str, Any] = {}
        mode = _Collectives()

        def step(
            wrapped: torch.nn.Module,
            measured: dict[str, Any] = measured,
            mode: Any = mode,
            inputs: Any = inputs,
        ) -> None:
            measured["recorded"] = len(mode.moved)  # the recorded iterations' collectives
            opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
            wrapped(**inputs).loss.backward()
            if isinstance(wrapped, FSDP):
                grads = [m._handle.flat_param.grad for m in FSDP.fsdp_modules(wrapped)
                         if m._handle is not None]  # fmt: skip
            else:  # FSDP2: a group's gradients are views of its reduce-scatter output
                grads = [p.grad._local_tensor for p in wrapped.parameters() if p.grad is not None]
            storages = {g.untyped_storage()._cdata: g.untyped_storage().nbytes()
                        for g in grads if g is not None}  # fmt: skip
            measured["sharded_grads"] = sum(storages.values())
            opt.step()
            local = [
                getattr(t, "_local_tensor", t)  # FSDP2: this rank's part of a DTensor
                for state in opt.state.values()
                for k, t in state.items()
                if k != "step"
            ]
            measured["optimizer"] = sum(t.numel() * t.element_size() for t in local)

        with mode:
            if case.api == "FSDP1":
                report = record_real_fsdp1(model, inputs, options, loss=_hf_loss, after=step)
            else:
                report = record_real_fsdp2(
                    model, inputs, options["fully_shard"], world_size, loss=_hf_loss,
                    mp_policy=options.get("mp_policy"), after=step,
                )  # fmt: skip
        report.to_json(Path(out_dir) / f"{name}-rank{rank}.json")
        measured["collectives"] = mode.moved
        (Path(out_dir) / f"{name}-measured-rank{rank}.json").write_text(json.dumps(measured))


def _hf_loss(out: Any) -> torch.Tensor:
    loss: torch.Tensor = out.loss
    return loss


class _Collectives:
    """Every all-gather, reduce-scatter and all-reduce FSDP issues in the block, as
    ``[kind, bytes]`` (an all-gather's output, a reduce-scatter's input, an all-reduce's
    tensor): the ``torch.distributed`` functions FSDP1 and FSDP2 call, wrapped."""

    _WRAPPED: ClassVar[dict[str, tuple[str, tuple[int, str]]]] = {  # function -> (kind, arg)
        "all_gather_single": ("all_gather", (0, "output_tensor")),
        "all_gather": ("all_gather", (0, "tensor_list")),  # FSDP1 on a CPU: the output's chunks
        "reduce_scatter_single": ("reduce_scatter", (1, "input")),
        "all_reduce": ("all_reduce", (0, "tensor")),
    }

    def __init__(self) -> None:
        self.moved: list[list[Any]] = []
        self._originals: dict[str, Any] = {}

    def __enter__(self) -> _Collectives:
        for name, (kind, arg) in self._WRAPPED.items():
            original = self._originals[name] = getattr(dist, name)

            def wrapped(*args: Any, original: Any = original, kind: str = kind,
                        arg: tuple[int, str] = arg, **kwargs: Any) -> Any:  # fmt: skip
                t = args[arg[0]] if len(args) > arg[0] else kwargs[arg[1]]
                parts = t if isinstance(t, list) else [t]
                self.moved.append([kind, sum(p.numel() * p.element_size() for p in parts)])
                return original(*args, **kwargs)

            setattr(dist, name, wrapped)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)


TP_MESH = (2, 2)  # (dp, tp)


def record_tp(rank: int, out_dir: str) -> None:
    """FSDP2 + tensor parallelism as torchtitan applies it, recorded on this rank."""
    import tp_models
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from fsdpviz.recording import FSDP2Recorder

    mesh = init_device_mesh("cpu", TP_MESH, mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = tp_models.parallelize(tp_models.Llama(), mesh["tp"])
    for (name,) in tp_models.LAYERS:
        fully_shard(model.get_submodule(name), mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    with FSDP2Recorder(model) as rec, _tp_collectives() as collectives:
        for _ in range(3):
            model(tp_models.tokens()).sum().backward()
    rec.report().to_json(Path(out_dir) / f"tp-llama-rank{rank}.json")
    path = Path(out_dir) / f"tp-llama-collectives-rank{rank}.json"
    path.write_text(json.dumps(collectives))


_FUNCOL = {  # DTensor's redistributions: functional collective -> fsdpviz's kind
    "all_gather_single": "tp_all_gather",
    "all_gather_tensor": "tp_all_gather",
    "reduce_scatter_single": "tp_reduce_scatter",
    "reduce_scatter_tensor": "tp_reduce_scatter",
    "all_reduce": "tp_all_reduce",
    "all_to_all_single": "tp_all_to_all",
}


@contextmanager
def devices_per_host(n: int | None) -> Iterator[None]:
    """DTensor's cost model (``redistribute_cost``) weighing a mesh as on hosts of ``n``
    devices (``_mesh_resources.num_devices_per_host``; None: this machine's), its cached
    topologies (``MeshTopoInfo.build_from_mesh``) and sharding decisions cleared before and
    after, so that no decision made with the one is reused with the other."""
    from torch.distributed.device_mesh import _mesh_resources
    from torch.distributed.tensor._collective_utils import MeshTopoInfo
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    def clear() -> None:
        MeshTopoInfo.build_from_mesh.cache_clear()
        _clear_sharding_prop_cache()

    own = "num_devices_per_host" in vars(_mesh_resources)
    before = _mesh_resources.num_devices_per_host
    clear()
    if n is not None:
        _mesh_resources.num_devices_per_host = lambda device_type: n
    try:
        yield
    finally:
        if n is not None and own:
            _mesh_resources.num_devices_per_host = before
        elif n is not None:
            del _mesh_resources.num_devices_per_host
        clear()


@contextmanager
def _tp_collectives(
    dtypes: bool = False, per_host: int | None = GPUS_PER_NODE
) -> Iterator[list[list[Any]]]:
    """Every functional collective DTensor issues, as ``[kind, bytes of the whole tensor]``
    (an all-gather's output, a reduce-scatter's or an all-reduce's input). With ``dtypes``:
    ``[kind, bytes, dtype]`` of the data it moves (a float8 tensor's ``_data``:
    ``allgather_fp8`` gathers it, not its scale), the scalar amax all-reduces of float8
    casts among them (``[tp_all_reduce, 8, float64]``: see [Note: float8 amax all-reduces]).
    DTensor's cost model weighs the mesh as on hosts of ``per_host`` devices (a GPU job's
    nodes, as fsdpviz plans: :mod:`fsdpviz.schedule.tp_mm_strategy`; None: this
    machine's, one CPU a host)."""
    import torch.distributed._functional_collectives as funcol

    seen: list[list[Any]] = []
    originals = {name: getattr(funcol, name) for name in _FUNCOL}

    def wrap(name: str) -> Any:
        def collective(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            out = originals[name](t, *args, **kwargs)
            whole = out if _FUNCOL[name] == "tp_all_gather" else t
            if not dtypes:
                seen.append([_FUNCOL[name], whole.numel() * whole.element_size()])
                return out
            data = getattr(whole, "_data", whole)
            nbytes = data.numel() * data.element_size()
            seen.append([_FUNCOL[name], nbytes, str(data.dtype).removeprefix("torch.")])
            return out

        return collective

    for name in _FUNCOL:
        setattr(funcol, name, wrap(name))
    try:
        with devices_per_host(per_host):
            yield seen
    finally:
        for name, fn in originals.items():
            setattr(funcol, name, fn)


def _on_dim_1(p: torch.nn.Parameter) -> Any:
    from torch.distributed.tensor import Shard

    return Shard(1) if p.ndim == 2 else None


def _on_last_dim(p: torch.nn.Parameter) -> Any:
    from torch.distributed.tensor import Shard

    return Shard(-1) if p.ndim == 2 else None


def placement_cases() -> dict[str, tuple[Any, Any, list[tuple[str, ...]], dict[str, Any]]]:
    """name -> (model factory, inputs factory, fully_shard calls, FSDP2 options), each with a
    ``shard_placement_fn``: the 2-D weights on dim 1 (the head's 3-row bias on dim 0, padded
    on 2 ranks), for every call or for some (a mapping), in fp32 or bf16."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def x() -> torch.Tensor:
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(0))

    blocks = [(f"blocks.{i}",) for i in range(4)]
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return {
        "placement-dim1": (hm.Stack, x, blocks, {"shard_placement_fn": _on_dim_1}),
        "placement-mapping-bf16": (
            hm.Stack,
            x,
            blocks,
            {
                "shard_placement_fn": {"blocks.1": _on_last_dim, "": _on_dim_1},
                "mp_policy": bf16,
            },
        ),
        "placement-no-reshard": (
            hm.Stack,
            x,
            blocks,
            {"shard_placement_fn": _on_last_dim, "reshard_after_forward": False},
        ),
    }


def record_placement(rank: int, world_size: int, out_dir: str) -> None:
    """Each ``shard_placement_fn`` case on this rank: its recording and the tensor each
    collective moved (``[kind, bytes]``: an all-gather's output, a reduce-scatter's input)."""
    for name, (build, inputs, calls, kwargs) in placement_cases().items():
        torch.manual_seed(0)
        with _Collectives() as moved:
            report = record_real_fsdp2(build(), inputs(), calls, world_size, **kwargs)
        report.to_json(Path(out_dir) / f"{name}-rank{rank}.json")
        path = Path(out_dir) / f"{name}-collectives-rank{rank}.json"
        path.write_text(json.dumps(moved.moved))


def record_suite(rank: int, world_size: int, out_dir: str, suite: str) -> None:
    """Record every FSDP1 and FSDP2 case of ``suite`` on this rank."""
    if suite == "accum":
        for name, (build, inputs, calls, kwargs) in accum_cases().items():
            torch.manual_seed(0)
            if calls is None:
                report = record_real_fsdp1(build(), inputs(), kwargs, grad_accum=ACCUM)
            else:
                report = record_real_fsdp2(
                    build(), inputs(), calls, world_size, grad_accum=ACCUM, **kwargs
                )
            report.to_json(Path(out_dir) / f"{name}-rank{rank}.json")
        return
    fsdp1 = {"two": gloo_cases, "one": one_rank_cases, "hybrid": hybrid_cases}[suite]()
    groups = _hybrid_groups(rank, world_size) if suite == "hybrid" else None
    for name, (build, inputs, kwargs) in fsdp1.items():
        torch.manual_seed(0)
        if groups is not None:
            kwargs = {**kwargs, "process_group": groups}
        report = record_real_fsdp1(build(), inputs(), kwargs)
        report.to_json(Path(out_dir) / f"{name}-rank{rank}.json")
    for name, (build, inputs, calls, kwargs) in (
        gloo_fsdp2_cases().items() if suite == "two" else []
    ):
        torch.manual_seed(0)
        report = record_real_fsdp2(build(), inputs(), calls, world_size, **kwargs)
        report.to_json(Path(out_dir) / f"{name}-rank{rank}.json")


def run(rank: int, world_size: int, port: int, out_dir: str, suite: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        if suite == "tp":
            record_tp(rank, out_dir)
        elif suite == "pipeline":
            import pipeline_job

            pipeline_job.record(rank, out_dir)
        elif suite == "corners":
            record_corners(rank, world_size, out_dir)
        elif suite == "placement":
            record_placement(rank, world_size, out_dir)
        elif suite == "peft":
            record_peft(rank, world_size, out_dir)
        else:
            record_suite(rank, world_size, out_dir, suite)
    except BaseException:
        dist.destroy_process_group()
        raise  # torch.multiprocessing.spawn reports it to the parent
    leave_rank()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_suite(out: Path, world_size: int, suite: str) -> Path:
    """Run ``suite`` on ``world_size`` gloo ranks (each writes its recordings to ``out``);
    every rank leaves through :func:`rank_exit.leave_rank`, so none aborts at exit."""
    import torch.multiprocessing as mp

    mp.spawn(run, args=(world_size, free_port(), str(out), suite), nprocs=world_size, join=True)
    return out
