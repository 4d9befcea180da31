"""The Python that runs a configuration without a pipeline: activation checkpointing, the
``fully_shard`` / ``FullyShardedDataParallel`` calls and the micro-batch loop, and the
:class:`Candidate` every style of code is made from."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from fsdpviz.plan.option_specs import OPTIONS, RESHARD
from fsdpviz.schema.checkpointing import CheckpointEvery, SelectiveCheckpoint
from fsdpviz.schema.config import ReportConfig
from fsdpviz.schema.mesh import HYBRID_STRATEGIES
from fsdpviz.schema.report import Report
from fsdpviz.tuning.space import TuneKwargs, reshard_given


class Candidate(Protocol):
    """What the code of a configuration is made from (a :class:`fsdpviz.tuning.Candidate`)."""

    knobs: dict[str, str]
    kwargs: TuneKwargs
    inputs: Any
    report: Report
    micro_batch: int
    grad_accum: int
    sync_each: bool


DTYPES = {
    torch.bfloat16: "torch.bfloat16",
    torch.float16: "torch.float16",
    torch.float32: "torch.float32",
}


# ------------------------------------------------------------------ checkpointing
def _class_names(spec: Any) -> list[str]:
    items = spec if isinstance(spec, (list, tuple, set, frozenset)) else [spec]
    return sorted(getattr(c, "__name__", str(c)) for c in items)


def classes_code(classes: Any) -> tuple[str, str]:
    """Module classes as the code names them: torch's own as ``torch.nn.Embedding``, the
    model's bare (and a comment that asks for their import, ``""`` where none is needed)."""
    items = classes if isinstance(classes, (list, tuple, set, frozenset)) else [classes]
    names: list[str] = []
    yours: list[str] = []
    for cls in items:
        name = getattr(cls, "__name__", str(cls))
        if getattr(torch.nn, name, None) is cls:
            names.append(f"torch.nn.{name}")
        else:
            names.append(name)
            yours.append(name)
    comment = f"  # import {', '.join(sorted(yours))} from your model's module" if yours else ""
    return ", ".join(sorted(names)), comment


def checkpointing_code(spec: Any, api: str = "FSDP2", target: str = "model") -> list[str]:
    """``apply_activation_checkpointing`` of ``spec``'s modules. FSDP2: before
    ``fully_shard`` (torchtitan's and accelerate's order), each block's checkpoint wrapper
    sharded as the block; FSDP1: after ``FullyShardedDataParallel`` (accelerate's order),
    inside each unit, so that the wrap policy meets the blocks themselves and the
    recomputation in backward runs within the unit's unsharded parameters (before FSDP1, the
    policy would wrap the block inside its checkpoint wrapper, whose recomputation then
    all-gathers the unit again). ``target``: the module it applies to (a pipeline stage's
    part of ``model``: every n-th block still counted over the whole ``model``)."""
    if spec is None:
        return []
    when = (
        "before fully_shard (as torchtitan and accelerate apply it)"
        if api == "FSDP2"
        else "inside the FSDP units: after FSDP, as accelerate applies it"
    )
    lines = [
        "",
        f"# activation checkpointing, {when}",
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (",
        "    apply_activation_checkpointing, checkpoint_wrapper,",
        ")",
    ]
    modules = spec.modules if isinstance(spec, (SelectiveCheckpoint, CheckpointEvery)) else spec
    if callable(modules) and not isinstance(modules, (list, tuple, type)):
        lines.append("check_fn = ...  # your predicate (module -> bool), as given to fsdpviz")
        names: list[str] = []
    else:
        names = _class_names(modules)
        code, comment = classes_code(modules)
        lines.append(f"blocks = ({code},){comment}")
    if isinstance(spec, CheckpointEvery) and spec.every > 1:
        lines += [
            "picked = [n for n, m in model.named_modules() if isinstance(m, blocks)]",
            f"every = set(picked[{spec.every - 1}::{spec.every}])  "
            f"# every {_nth(spec.every)} block, counting from 1",
            f"chosen = {{id(m) for n, m in {target}.named_modules() if n in every}}",
            "check_fn = lambda m: id(m) in chosen",
        ]
    elif names:
        lines.append("check_fn = lambda m: isinstance(m, blocks)")
    if isinstance(spec, SelectiveCheckpoint):
        # every operator of the plan's policy: the CPU's fused attention too, which a GPU
        # never calls and a run on the CPU saves as the plan does
        ops = sorted(str(op) for op in spec.save_ops)
        lines += [
            "import functools",
            "from torch.utils.checkpoint import (",
            "    CheckpointPolicy, create_selective_checkpoint_contexts,",
            ")",
            "",
            "save_ops = {",
            *[f"    {_op_code(op)}," for op in ops],
            "}",
            "",
            "def per_op_policy():  # torchtitan's selective_ac_option = 'op'",
            '    counts = {"forward": 0, "recompute": 0}',
            "",
            "    def policy(ctx, func, *args, **kwargs):",
            '        mode = "recompute" if ctx.is_recompute else "forward"',
            "        if func in (torch.ops.aten.mm.default, torch.ops.aten.linear.default):",
            "            counts[mode] += 1",
            f"            if counts[mode] % {spec.recompute_every_mm or 10**9} == 0:",
            "                return CheckpointPolicy.PREFER_RECOMPUTE",
            "        if func in save_ops:",
            "            return CheckpointPolicy.MUST_SAVE",
            "        return CheckpointPolicy.PREFER_RECOMPUTE",
            "",
            "    return create_selective_checkpoint_contexts(policy)",
            "",
            "wrapper = functools.partial(checkpoint_wrapper, context_fn=per_op_policy)",
            "apply_activation_checkpointing(",
            f"    {target}, checkpoint_wrapper_fn=wrapper, check_fn=check_fn",
            ")",
        ]
    else:
        lines.append(
            f"apply_activation_checkpointing({target}, checkpoint_wrapper_fn=checkpoint_wrapper, "
            "check_fn=check_fn)"
        )
    return lines


def _nth(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def _op_code(op: str) -> str:
    """An operator as Python names it: ``str(torch.ops.aten.mm.default)`` is
    ``"aten.mm.default"`` (namespace, name, overload), ``torch.ops.`` before it."""
    return op if op.startswith("torch.ops.") else f"torch.ops.{op}"


def _wrapped(name: str, spec: Any, c: Candidate) -> str:
    """A module's name once checkpoint_wrapper put its block in ``_checkpoint_wrapped_module``."""
    if spec is None:
        return name
    blocks = _checkpointed_blocks(c)
    for b in blocks:
        if name.startswith(b + "."):
            return f"{b}._checkpoint_wrapped_module{name[len(b) :]}"
    return name


def _checkpointed_blocks(c: Candidate) -> list[str]:
    spec = c.kwargs.get("activation_checkpointing")
    if spec is None:
        return []
    modules = spec.modules if isinstance(spec, (SelectiveCheckpoint, CheckpointEvery)) else spec
    names = set(_class_names(modules)) if isinstance(modules, (list, tuple, set)) else set()
    found = [m.fqn for m in c.report.modules if m.module_class in names and m.fqn]
    out: list[str] = []
    for f in found:
        if not any(f.startswith(o + ".") for o in out):
            out.append(f)
    if isinstance(spec, CheckpointEvery):  # the n-th, 2n-th, ... block, counting from 1
        return out[spec.every - 1 :: spec.every]
    return out


# ----------------------------------------------------------------------- FSDP2
def fsdp2_code(c: Candidate, before_shard: list[str] | None = None) -> list[str]:
    """The mesh, then ``before_shard`` (what applies to the model on it before FSDP: tensor
    parallelism, activation checkpointing, compile), then the ``fully_shard`` calls."""
    kw = c.kwargs
    cfg = c.report.config
    mp = kw.get("mp_policy")
    imports = ["from torch.distributed.device_mesh import init_device_mesh"]
    fsdp_names = ["fully_shard"]
    if mp is not None:
        fsdp_names.insert(0, "MixedPrecisionPolicy")
    if cfg.cpu_offload:
        fsdp_names.insert(0, "CPUOffloadPolicy")
    imports.append(f"from torch.distributed.fsdp import {', '.join(fsdp_names)}")
    lines = ["", *imports, ""]
    dims = cfg.parallel_dims
    if hsdp_tp(cfg):  # as torchtitan builds it: FSDP over replicate x shard
        lines += [
            f'mesh = init_device_mesh("cuda", {(dims.dp_replicate, dims.dp_shard, dims.tp)}, '
            'mesh_dim_names=("dp_replicate", "dp_shard", "tp"))',
            'dp_mesh = mesh["dp_replicate", "dp_shard"]  # HSDP: replicate x shard',
        ]
    elif cfg.tp_world_size:  # FSDP over the data-parallel ranks, a cp dimension's too
        lines += [
            f'mesh = init_device_mesh("cuda", ({dims.dp_cp}, {dims.tp}), '
            'mesh_dim_names=("dp_shard", "tp"))',
            'dp_mesh = mesh["dp_shard"]',
        ]
    elif cfg.mesh is not None:
        names = tuple(cfg.mesh)
        sizes = tuple(cfg.mesh.values())
        lines.append(f'dp_mesh = init_device_mesh("cuda", {sizes}, mesh_dim_names={names})  # HSDP')
    else:
        lines.append(
            f'dp_mesh = init_device_mesh("cuda", ({cfg.ranks},), mesh_dim_names=("dp_shard",))'
        )
    lines += before_shard or []
    common = ["mesh=dp_mesh"]
    if mp is not None:
        lines.append(f"mp_policy = {mp_policy_code(mp)}")
        common.append("mp_policy=mp_policy")
    if cfg.cpu_offload:
        common.append(f"offload_policy={offload_policy_code(kw.get('offload_policy'))}")
    placement = kw.get("shard_placement_fn")
    if callable(placement):
        lines.append("# shard_placement_fn: your function, as given")
        common.append("shard_placement_fn=shard_placement_fn")
    elif isinstance(placement, Mapping):
        lines.append("# placements: your {module: shard_placement_fn} mapping, as given")
    raf = reshard_given(kw)
    groups = [g for g in cfg.fully_shard if g]
    spec = kw.get("activation_checkpointing")
    lines.append("")
    lines += shard_calls(groups, raf, common, spec, c)
    root_raf = raf_of(raf, "", ("",))
    root_args = [
        *common,
        *([RESHARD.code(root_raf)] if root_raf is not None else []),
        *_placement_arg(placement, "", ("",)),
    ]
    lines.append(f"fully_shard(model, {', '.join(root_args)})")
    return lines


def hsdp_tp(cfg: ReportConfig) -> bool:
    """Whether the mesh is HSDP x TP, ``dp_replicate x dp_shard x tp`` (no cp, no pp)."""
    return bool(cfg.tp_world_size) and cfg.parallel_dims.hsdp and len(cfg.mesh or {}) == 3


def mp_policy_code(mp: Any) -> str:
    parts = []
    for field in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = getattr(mp, field, None)
        if value is not None:
            parts.append(f"{field}={DTYPES.get(value, repr(value))}")
    if getattr(mp, "cast_forward_inputs", True) is False:
        parts.append("cast_forward_inputs=False")
    return f"MixedPrecisionPolicy({', '.join(parts)})"


def offload_policy_code(policy: Any) -> str:
    """FSDP2's ``CPUOffloadPolicy`` as given: its shards pinned (torch's default) or not."""
    pinned = getattr(policy, "pin_memory", True)
    return "CPUOffloadPolicy()" if pinned else "CPUOffloadPolicy(pin_memory=False)"


def raf_of(raf: Any, name: str, fqns: tuple[str, ...]) -> Any:
    if isinstance(raf, Mapping):
        for key in (name, *fqns):
            if key in raf:
                return raf[key]
        return None
    return raf


def _placement_arg(placement: Any, name: str, fqns: tuple[str, ...]) -> list[str]:
    """A ``{module: shard_placement_fn}`` mapping's argument of one ``fully_shard`` call."""
    if isinstance(placement, Mapping):
        for key in (name, *fqns):
            if key in placement:
                return [f"shard_placement_fn=placements[{key!r}]"]
    return []


def shard_calls(
    groups: list[str], raf: Any, common: list[str], spec: Any, c: Candidate
) -> list[str]:
    """The ``fully_shard`` calls of the groups (bottom-up, as fsdpviz names them), a loop
    over a container's numbered children where they run in order with the same options."""
    lines: list[str] = []
    i = 0
    while i < len(groups):
        name = groups[i]
        fqns = tuple(name.split(", "))
        value = raf_of(raf, name, fqns)
        run = _numbered_run(groups, i, raf)
        placed = _placement_arg(c.kwargs.get("shard_placement_fn"), name, fqns)
        if placed:
            run = 1  # a mapping's function is the group's own: one call each
        if run > 2:
            parent = groups[i].rsplit(".", 1)[0]
            extra = [*common, *([RESHARD.code(value)] if value is not None else [])]
            # the first ``run`` children, where the container holds more (a later one
            # sharded with other options, or not at all)
            part = "" if run == _numbered_children(c, parent) else f"[:{run}]"
            lines.append(f"for block in model.get_submodule({parent!r}){part}:")
            lines.append(f"    fully_shard(block, {', '.join(extra)})")
            i += run
            continue
        args = [
            *common,
            *([RESHARD.code(value)] if value is not None else []),
            *placed,
        ]
        if len(fqns) == 1:
            target = f"model.get_submodule({_wrapped(fqns[0], spec, c)!r})"
        else:
            target = (
                "["
                + ", ".join(f"model.get_submodule({_wrapped(f, spec, c)!r})" for f in fqns)
                + "]"
            )
        lines.append(f"fully_shard({target}, {', '.join(args)})")
        i += 1
    return lines


def _numbered_children(c: Candidate, parent: str) -> int:
    """How many children ``parent`` (a ``ModuleList`` or ``Sequential``) holds."""
    pattern = re.compile(re.escape(parent) + r"\.\d+")
    return sum(1 for m in c.report.modules if pattern.fullmatch(m.fqn))


def _numbered_run(groups: list[str], start: int, raf: Any) -> int:
    """How many groups from ``start`` are ``parent.0``, ``parent.1``, ... with one option."""
    first = re.fullmatch(r"(.+)\.(\d+)", groups[start])
    if first is None or first.group(2) != "0":
        return 1
    parent = first.group(1)
    value = raf_of(raf, groups[start], (groups[start],))
    n = 0
    while start + n < len(groups) and groups[start + n] == f"{parent}.{n}":
        if raf_of(raf, groups[start + n], (groups[start + n],)) != value:
            break
        n += 1
    return n


# ----------------------------------------------------------------------- FSDP1
def fsdp1_code(c: Candidate) -> list[str]:
    kw = c.kwargs
    cfg = c.report.config
    names = ["FullyShardedDataParallel as FSDP", "ShardingStrategy"]
    args: list[str] = []
    policy = kw.get("auto_wrap_policy")
    lines = [""]
    if policy is not None:
        classes = list(getattr(policy, "_module_classes", ()))
        lines.append("from torch.distributed.fsdp.wrap import ModuleWrapPolicy")
        if classes:
            code, comment = classes_code(classes)
            if comment:
                lines.append(comment.strip())
            args.append(f"auto_wrap_policy=ModuleWrapPolicy({{{code}}})")
        else:
            args.append("auto_wrap_policy=...  # your policy, as given to fsdpviz")
    args.append(OPTIONS["sharding_strategy"].code(cfg.sharding_strategy))
    if cfg.backward_prefetch:
        names.append("BackwardPrefetch")
    args.append(OPTIONS["backward_prefetch"].code(cfg.backward_prefetch))
    if cfg.forward_prefetch:
        args.append(OPTIONS["forward_prefetch"].code(True))
    mp = kw.get("mixed_precision")
    if mp is not None:
        names.append("MixedPrecision")
        fields = [
            f"{f}={DTYPES.get(getattr(mp, f), repr(getattr(mp, f)))}"
            for f in ("param_dtype", "reduce_dtype", "buffer_dtype")
            if getattr(mp, f, None) is not None
        ]
        args.append(f"mixed_precision=MixedPrecision({', '.join(fields)})")
    if cfg.cpu_offload:  # CPUOffload(offload_params=True): FSDP1 offloads nothing else
        names.append("CPUOffload")
        args.append("cpu_offload=CPUOffload(offload_params=True)")
    if cfg.use_orig_params:
        args.append(OPTIONS["use_orig_params"].code(True))
    if cfg.process_group_size and cfg.sharding_strategy in HYBRID_STRATEGIES:
        # the shard groups as planned: without a mesh FSDP1 shards within each machine's
        # visible GPUs (torch.cuda.device_count(), _init_process_group_state_for_hybrid_shard)
        replicate, shard = cfg.parallel_dims.dp_replicate, cfg.parallel_dims.dp_shard
        lines.append("from torch.distributed.device_mesh import init_device_mesh")
        lines.append(
            f"# hybrid sharding: shard within groups of {shard} ranks, replicated across them"
        )
        args.append(
            f'device_mesh=init_device_mesh("cuda", ({replicate}, {shard}), '
            'mesh_dim_names=("replicate", "shard"))'
        )
    args.append("device_id=torch.cuda.current_device()")
    lines.insert(1, f"from torch.distributed.fsdp import {', '.join(names)}")
    lines.append("model = FSDP(")
    lines += [f"    model, {args[0]}," if i == 0 else f"    {a}," for i, a in enumerate(args)]
    lines.append(")")
    return lines


# ------------------------------------------------------------------- the loop
def _model_call(inputs: Any, m: int) -> tuple[str, str]:
    """How the loop cuts a micro-batch of ``m`` samples from ``batch`` (the slice at ``i``,
    as code) and calls the model with it, for inputs shaped as the candidate's: a tensor, a
    tuple of them, or keywords (those that are no tensor, as Hugging Face's
    ``use_cache=False``, passed as the configuration was planned with them)."""
    if isinstance(inputs, Mapping):
        fixed = "".join(
            f", {k}={v!r}" for k, v in inputs.items() if not isinstance(v, torch.Tensor)
        )
        return f"{{k: v[i : i + {m}] for k, v in batch.items()}}", f"model(**micro_batch{fixed})"
    if isinstance(inputs, (tuple, list)):
        return f"tuple(v[i : i + {m}] for v in batch)", "model(*micro_batch)"
    return f"batch[i : i + {m}]", "model(micro_batch)"


def loop_code(c: Candidate) -> list[str]:
    n = c.grad_accum
    m = c.micro_batch
    api = c.report.config.api
    cut, call = _model_call(c.inputs, m)
    if n <= 1:
        return [
            "",
            f"# each step: one forward and backward of {m} samples per rank (batch)",
            f"loss_fn({call.replace('micro_batch', 'batch')}).backward()",
            "optimizer.step()",
            "optimizer.zero_grad()",
        ]
    head = [
        f"# batch: one rank's {n * m} samples of a step, cut into micro-batches of {m}",
        f"micro_batches = [{cut} for i in range(0, {n * m}, {m})]",
    ]
    backward = f"(loss_fn({call}) / {n}).backward()"
    if c.sync_each:
        return [
            "",
            f"# each optimizer step: {n} micro-batches of {m} samples per rank, the",
            "# gradients reduced after each backward (FSDP's default) and added up",
            *head,
            "for micro_batch in micro_batches:",
            f"    {backward}",
            "optimizer.step()",
            "optimizer.zero_grad()",
        ]
    sync = (
        "model.set_requires_gradient_sync(last)"
        if api == "FSDP2"
        else "ctx = contextlib.nullcontext() if last else model.no_sync()"
    )
    lines = [
        "",
        f"# each optimizer step: {n} micro-batches of {m} samples per rank, the",
        "# gradients reduced only after the last (FSDP's gradient accumulation)",
    ]
    if api != "FSDP2":
        lines.append("import contextlib")
    lines += [
        *head,
        "for i, micro_batch in enumerate(micro_batches):",
        f"    last = i == {n - 1}",
        f"    {sync}",
    ]
    if api == "FSDP2":
        lines.append(f"    {backward}")
    else:
        lines += ["    with ctx:", f"        {backward}"]
    lines += ["optimizer.step()", "optimizer.zero_grad()"]
    return lines


__all__ = [
    "DTYPES",
    "Candidate",
    "checkpointing_code",
    "fsdp1_code",
    "fsdp2_code",
    "hsdp_tp",
    "loop_code",
    "mp_policy_code",
    "raf_of",
    "shard_calls",
]
