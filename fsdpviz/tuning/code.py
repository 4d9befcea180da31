"""The code that runs a configuration: ``fully_shard`` / ``FullyShardedDataParallel`` calls with
activation checkpointing and the micro-batch loop, or a trainer's keys (torchtitan's job
TOML, accelerate's config YAML) where those can say it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from fsdpviz.schema.report import Report
from fsdpviz.trace.checkpointing import CheckpointEvery, SelectiveCheckpoint


class Candidate(Protocol):
    """What the code of a configuration is made from (a :class:`fsdpviz.tuning.Candidate`)."""

    knobs: dict[str, str]
    kwargs: dict[str, Any]
    report: Report
    micro_batch: int
    grad_accum: int
    sync_each: bool


STYLES = ("python", "torchtitan", "accelerate")
_DTYPES = {
    torch.bfloat16: "torch.bfloat16",
    torch.float16: "torch.float16",
    torch.float32: "torch.float32",
}


def configuration_code(c: Candidate, style: str = "python") -> str:
    """See :meth:`fsdpviz.tuning.Candidate.code`."""
    if style not in STYLES:
        from fsdpviz.errors import ConfigError

        raise ConfigError(f"code style must be one of {', '.join(STYLES)}, got {style!r}")
    if style == "torchtitan":
        return _torchtitan(c)
    if style == "accelerate":
        if c.report.pipeline is not None:
            from fsdpviz.errors import ConfigError

            raise ConfigError(
                "accelerate's FSDP has no pipeline parallelism: take code('python') "
                "(torch.distributed.pipelining) or code('torchtitan') for a pipeline"
            )
        return _accelerate(c)
    kw = c.kwargs
    api = c.report.config.api
    lines = ["import torch"]
    lines += _checkpointing(kw.get("activation_checkpointing"))
    if c.report.pipeline is not None:
        lines += _pipeline(c)
        return "\n".join(lines)
    lines += _fsdp2(c) if api == "FSDP2" else _fsdp1(c)
    lines += _loop(c)
    return "\n".join(lines)


# ------------------------------------------------------------------ checkpointing
def _class_names(spec: Any) -> list[str]:
    items = spec if isinstance(spec, (list, tuple, set, frozenset)) else [spec]
    return sorted(getattr(c, "__name__", str(c)) for c in items)


def _checkpointing(spec: Any) -> list[str]:
    if spec is None:
        return []
    lines = [
        "",
        "# activation checkpointing, before fully_shard (as torchtitan and accelerate apply it)",
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
        lines.append(f"blocks = ({', '.join(names)},)  # import them from your model's module")
    if isinstance(spec, CheckpointEvery) and spec.every > 1:
        lines += [
            "picked = [m for m in model.modules() if isinstance(m, blocks)]",
            f"every = {{id(m) for m in picked[{spec.every - 1}::{spec.every}]}}  "
            f"# every {_nth(spec.every)} block, counting from 1",
            "check_fn = lambda m: id(m) in every",
        ]
    elif names:
        lines.append("check_fn = lambda m: isinstance(m, blocks)")
    if isinstance(spec, SelectiveCheckpoint):
        ops = sorted(str(op) for op in spec.save_ops if "for_cpu" not in str(op))
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
            "    model, checkpoint_wrapper_fn=wrapper, check_fn=check_fn",
            ")",
        ]
    else:
        lines.append(
            "apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper, "
            "check_fn=check_fn)"
        )
    return lines


def _nth(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def _op_code(op: str) -> str:
    if op.startswith("_c10d_functional."):
        return f"torch.ops.{op}"
    return op if op.startswith("torch.ops.") else f"torch.ops.aten.{op}"


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
    return out


# ----------------------------------------------------------------------- FSDP2
def _fsdp2(c: Candidate) -> list[str]:
    kw = c.kwargs
    cfg = c.report.config
    mp = kw.get("mp_policy")
    imports = ["from torch.distributed.device_mesh import init_device_mesh"]
    fsdp_names = ["fully_shard"]
    if mp is not None:
        fsdp_names.insert(0, "MixedPrecisionPolicy")
    if "offload_policy" in kw and kw["offload_policy"] is not None:
        fsdp_names.insert(0, "CPUOffloadPolicy")
    imports.append(f"from torch.distributed.fsdp import {', '.join(fsdp_names)}")
    lines = ["", *imports, ""]
    if cfg.tp_world_size:
        shard = cfg.ranks // cfg.tp_world_size
        lines += [
            f'mesh = init_device_mesh("cuda", ({shard}, {cfg.tp_world_size}), '
            'mesh_dim_names=("dp_shard", "tp"))',
            "# tensor parallelism first: parallelize_module(model, mesh['tp'], plan)",
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
    common = ["mesh=dp_mesh"]
    if mp is not None:
        lines.append(f"mp_policy = {_mp_policy(mp)}")
        common.append("mp_policy=mp_policy")
    if kw.get("offload_policy") is not None:
        common.append("offload_policy=CPUOffloadPolicy()")
    placement = kw.get("shard_placement_fn")
    if callable(placement):
        lines.append("# shard_placement_fn: your function, as given")
        common.append("shard_placement_fn=shard_placement_fn")
    elif isinstance(placement, Mapping):
        lines.append("# placements: your {module: shard_placement_fn} mapping, as given")
    raf = kw.get("reshard_after_forward")
    groups = [g for g in cfg.fully_shard if g]
    spec = kw.get("activation_checkpointing")
    lines.append("")
    lines += _shard_calls(groups, raf, common, spec, c)
    root_raf = _raf_of(raf, "", ("",))
    root_args = [
        *common,
        *([f"reshard_after_forward={root_raf!r}"] if root_raf is not None else []),
        *_placement_arg(placement, "", ("",)),
    ]
    lines.append(f"fully_shard(model, {', '.join(root_args)})")
    return lines


def _mp_policy(mp: Any) -> str:
    parts = []
    for field in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = getattr(mp, field, None)
        if value is not None:
            parts.append(f"{field}={_DTYPES.get(value, repr(value))}")
    if getattr(mp, "cast_forward_inputs", True) is False:
        parts.append("cast_forward_inputs=False")
    return f"MixedPrecisionPolicy({', '.join(parts)})"


def _raf_of(raf: Any, name: str, fqns: tuple[str, ...]) -> Any:
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


def _shard_calls(
    groups: list[str], raf: Any, common: list[str], spec: Any, c: Candidate
) -> list[str]:
    """The ``fully_shard`` calls of the groups (bottom-up, as fsdpviz names them), a loop
    over a container's numbered children where they run in order with the same options."""
    lines: list[str] = []
    i = 0
    while i < len(groups):
        name = groups[i]
        fqns = tuple(name.split(", "))
        value = _raf_of(raf, name, fqns)
        run = _numbered_run(groups, i, raf)
        placed = _placement_arg(c.kwargs.get("shard_placement_fn"), name, fqns)
        if placed:
            run = 1  # a mapping's function is the group's own: one call each
        if run > 2:
            parent = groups[i].rsplit(".", 1)[0]
            extra = [*common, *([f"reshard_after_forward={value!r}"] if value is not None else [])]
            lines.append(f"for block in model.get_submodule({parent!r}):")
            lines.append(f"    fully_shard(block, {', '.join(extra)})")
            i += run
            continue
        args = [
            *common,
            *([f"reshard_after_forward={value!r}"] if value is not None else []),
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


def _numbered_run(groups: list[str], start: int, raf: Any) -> int:
    """How many groups from ``start`` are ``parent.0``, ``parent.1``, ... with one option."""
    first = re.fullmatch(r"(.+)\.(\d+)", groups[start])
    if first is None or first.group(2) != "0":
        return 1
    parent = first.group(1)
    value = _raf_of(raf, groups[start], (groups[start],))
    n = 0
    while start + n < len(groups) and groups[start + n] == f"{parent}.{n}":
        if _raf_of(raf, groups[start + n], (groups[start + n],)) != value:
            break
        n += 1
    return n


# ----------------------------------------------------------------------- FSDP1
def _fsdp1(c: Candidate) -> list[str]:
    kw = c.kwargs
    cfg = c.report.config
    names = ["FullyShardedDataParallel as FSDP", "ShardingStrategy"]
    args: list[str] = []
    policy = kw.get("auto_wrap_policy")
    lines = [""]
    if policy is not None:
        classes = sorted(
            getattr(p, "__name__", str(p)) for p in getattr(policy, "_module_classes", ())
        )
        lines.append("from torch.distributed.fsdp.wrap import ModuleWrapPolicy")
        if classes:
            args.append(f"auto_wrap_policy=ModuleWrapPolicy({{{', '.join(classes)}}})")
        else:
            args.append("auto_wrap_policy=...  # your policy, as given to fsdpviz")
    args.append(f"sharding_strategy=ShardingStrategy.{cfg.sharding_strategy}")
    if cfg.backward_prefetch:
        names.append("BackwardPrefetch")
        args.append(f"backward_prefetch=BackwardPrefetch.{cfg.backward_prefetch}")
    else:
        args.append("backward_prefetch=None")
    if cfg.forward_prefetch:
        args.append("forward_prefetch=True")
    mp = kw.get("mixed_precision")
    if mp is not None:
        names.append("MixedPrecision")
        fields = [
            f"{f}={_DTYPES.get(getattr(mp, f), repr(getattr(mp, f)))}"
            for f in ("param_dtype", "reduce_dtype", "buffer_dtype")
            if getattr(mp, f, None) is not None
        ]
        args.append(f"mixed_precision=MixedPrecision({', '.join(fields)})")
    if kw.get("cpu_offload") is not None:
        names.append("CPUOffload")
        args.append("cpu_offload=CPUOffload(offload_params=True)")
    if cfg.use_orig_params:
        args.append("use_orig_params=True")
    args.append("device_id=torch.cuda.current_device()")
    lines.insert(1, f"from torch.distributed.fsdp import {', '.join(names)}")
    if cfg.process_group_size and cfg.sharding_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        lines.append(
            f"# hybrid sharding: shard within groups of {cfg.process_group_size} ranks "
            '(device_mesh=init_device_mesh("cuda", (replicas, shard)))'
        )
    lines.append("model = FSDP(")
    lines += [f"    model, {args[0]}," if i == 0 else f"    {a}," for i, a in enumerate(args)]
    lines.append(")")
    return lines


# ------------------------------------------------------------------- pipeline
def _pipeline(c: Candidate) -> list[str]:
    """FSDP2 inside ``torch.distributed.pipelining``: the mesh, each stage's modules (as the
    plan split them), its ``fully_shard`` calls, its ``PipelineStage``, the schedule."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from fsdpviz.plan.pipeline import schedule_class

    kw = c.kwargs
    cfg = c.report.config
    pipe = c.report.pipeline
    assert pipe is not None
    _, cls = schedule_class(pipe.schedule)
    mp = kw.get("mp_policy")
    fsdp_names = ["fully_shard"]
    if mp is not None:
        fsdp_names.insert(0, "MixedPrecisionPolicy")
    names = tuple(cfg.mesh or {"pp": pipe.pp_size})
    sizes = tuple((cfg.mesh or {"pp": pipe.pp_size}).values())
    lines = [
        "",
        "from torch.distributed.device_mesh import init_device_mesh",
        f"from torch.distributed.fsdp import {', '.join(fsdp_names)}",
        "from torch.distributed.pipelining import PipelineStage",
        f"from torch.distributed.pipelining.schedules import {cls.__name__}",
        "",
        f'mesh = init_device_mesh("cuda", {sizes}, mesh_dim_names={names})',
    ]
    dp_dims = tuple(n for n in names if n in ("dp_replicate", "dp_shard"))
    lines.append(
        f"dp_mesh = mesh[{dp_dims[0]!r}]" if len(dp_dims) == 1 else f"dp_mesh = mesh[{dp_dims!r}]"
    )
    if cfg.tp_world_size:
        lines.append("# tensor parallelism first: parallelize_module(stage_model, mesh['tp'], ...)")
    lines += ['pp_rank = mesh["pp"].get_local_rank()', ""]
    lines.append("# the stages' modules (each rank keeps its stages' and deletes the others, as")
    lines.append("# torchtitan's pipeline_module_split does), and the stages of each pipeline rank")
    lines.append("stage_modules = {")
    lines += [f"    {st.index}: {st.modules!r}," for st in pipe.stages]
    lines.append("}")
    ranks: dict[int, list[int]] = {}
    for st in pipe.stages:
        ranks.setdefault(st.rank, []).append(st.index)
    lines.append(f"stages_of_rank = {ranks!r}")
    common = ["mesh=dp_mesh"]
    if mp is not None:
        lines.append(f"mp_policy = {_mp_policy(mp)}")
        common.append("mp_policy=mp_policy")
    raf = kw.get("reshard_after_forward")
    spec = kw.get("activation_checkpointing")
    lines += ["", "stages = []", "for index in stages_of_rank[pp_rank]:"]
    lines.append("    # split_stage: yours, the model with only these modules (torchtitan's split)")
    lines.append("    stage_model = split_stage(model, stage_modules[index])")
    for st in pipe.stages:
        groups = [u for u in st.units if u and not u.startswith("(")]
        calls = _shard_calls(groups, raf, common, spec, c)
        root = f"(root of stage {st.index})"
        root_raf = _raf_of(raf, root, (root,))
        root_args = [*common]
        if root_raf is not None:
            root_args.append(f"reshard_after_forward={root_raf!r}")
        calls.append(f"fully_shard(model, {', '.join(root_args)})")
        lines.append(f"    if index == {st.index}:")
        lines += ["        " + line.replace("model", "stage_model") for line in calls]
    lines.append(
        f"    stages.append(PipelineStage(stage_model, index, {len(pipe.stages)}, "
        'torch.device("cuda"), group=mesh["pp"].get_group()))'
    )
    single = issubclass(cls, PipelineScheduleSingle)
    lines += [
        f"schedule = {cls.__name__}({'stages[0]' if single else 'stages'}, "
        f"n_microbatches={pipe.microbatches}, loss_fn=loss_fn)",
        "",
        f"# each step: a batch of {c.micro_batch} samples per pipeline, in {pipe.microbatches} "
        "microbatches:",
        "# schedule.step(batch) on the first stage's rank, schedule.step(target=labels) on the",
        "# last's, schedule.step() between; then optimizer.step(); optimizer.zero_grad()",
    ]
    return lines


# ------------------------------------------------------------------- the loop
def _loop(c: Candidate) -> list[str]:
    n = c.grad_accum
    api = c.report.config.api
    if n <= 1:
        return [
            "",
            f"# each step: one forward and backward of {c.micro_batch} samples per rank, then",
            "# optimizer.step(); optimizer.zero_grad()",
        ]
    if c.sync_each:
        return [
            "",
            f"# each optimizer step: {n} micro-batches of {c.micro_batch} samples per rank, the",
            "# gradients reduced after each backward (FSDP's default) and added up",
            f"for micro_batch in batch.split({c.micro_batch}):",
            f"    (loss_fn(model(micro_batch)) / {n}).backward()",
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
        f"# each optimizer step: {n} micro-batches of {c.micro_batch} samples per rank, the",
        "# gradients reduced only after the last (FSDP's gradient accumulation)",
    ]
    if api != "FSDP2":
        lines.append("import contextlib")
    lines += [
        f"for i, micro_batch in enumerate(batch.split({c.micro_batch})):",
        f"    last = i == {n - 1}",
        f"    {sync}",
    ]
    if api == "FSDP2":
        lines.append(f"    (loss_fn(model(micro_batch)) / {n}).backward()")
    else:
        lines += ["    with ctx:", f"        (loss_fn(model(micro_batch)) / {n}).backward()"]
    lines += ["optimizer.step()", "optimizer.zero_grad()"]
    return lines


# ------------------------------------------------------------------ torchtitan
def _torchtitan(c: Candidate) -> str:
    kw = c.kwargs
    cfg = c.report.config
    notes: list[str] = []
    mp = kw.get("mp_policy")
    param = getattr(mp, "param_dtype", None) or torch.float32
    reduce = getattr(mp, "reduce_dtype", None) or param
    tt_dtype = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
    raf = kw.get("reshard_after_forward")
    if isinstance(raf, Mapping):
        raf = _titan_policy(raf)
    if raf is None or raf == "default":
        policy = "default"
    elif raf is False:
        policy = "never"
    elif raf is True:
        policy = "always"
    else:
        policy = "default"
        notes.append(
            f"reshard_after_forward={raf!r} has no fsdp_reshard_after_forward value; "
            "torchtitan's apply_fsdp needs a change for it"
        )
    dp = cfg.ranks // (cfg.tp_world_size or 1)
    replicate = 1
    if cfg.mesh is not None and not cfg.tp_world_size:
        replicate = cfg.ranks // cfg.shard_ranks
        dp = cfg.shard_ranks
    pipe = c.report.pipeline
    if pipe is not None:  # the mesh's own dims: pp x dp_replicate x dp_shard (x tp)
        mesh = dict(cfg.mesh or {})
        replicate, dp = mesh.get("dp_replicate", 1), mesh.get("dp_shard", 1)
    global_batch = c.micro_batch * c.grad_accum * replicate * dp
    if c.grad_accum > 1 and not c.sync_each:
        notes.append(
            "torchtitan reduces the gradients after every micro-batch; this configuration "
            "reduces them only after the last (set_requires_gradient_sync(False) before the "
            "others), which its train step needs a change for"
        )
    micro = f"{c.grad_accum} micro-batch{'es' if c.grad_accum > 1 else ''} per step"
    out = [
        "[training]",
        f"local_batch_size = {c.micro_batch}",
        f"global_batch_size = {global_batch}  # {micro}",
        f'mixed_precision_param = "{tt_dtype.get(param, "float32")}"',
        f'mixed_precision_reduce = "{tt_dtype.get(reduce, "float32")}"',
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {dp}",
        f'fsdp_reshard_after_forward = "{policy}"',
        f"tensor_parallel_degree = {cfg.tp_world_size or 1}",
    ]
    if pipe is not None:
        from fsdpviz.plan.pipeline import schedule_class

        parts = [st.modules for st in sorted(pipe.stages, key=lambda st: st.index)]
        name, _ = schedule_class(pipe.schedule)
        out += [
            f"pipeline_parallel_degree = {pipe.pp_size}",
            f'pipeline_parallel_schedule = "{name}"',
            f"pipeline_parallel_microbatch_size = {c.micro_batch // pipe.microbatches}",
            f"module_fqns_per_model_part = {json.dumps(parts)}",
        ]
    out += [
        "",
        "[activation_checkpoint]",
    ]
    spec = kw.get("activation_checkpointing")
    if spec is None:
        out.append('mode = "none"')
    elif isinstance(spec, SelectiveCheckpoint):
        out += ['mode = "selective"', 'selective_ac_option = "op"']
    elif isinstance(spec, CheckpointEvery):
        out += ['mode = "selective"', f'selective_ac_option = "{spec.every}"']
    else:
        out.append('mode = "full"')
    if cfg.compile:
        out += ["", "[compile]", "enable = true", 'components = ["model", "loss"]']
    if cfg.float8:
        out += ["", "[model]", 'converters = ["quantize.linear.float8"]']
        f8 = []
        if cfg.float8.get("enable_fsdp_float8_all_gather"):
            f8.append("enable_fsdp_float8_all_gather = true")
        if cfg.float8.get("recipe_name", "tensorwise") != "tensorwise":
            f8.append(f'recipe_name = "{cfg.float8["recipe_name"]}"')
        if cfg.float8.get("filter_fqns"):
            f8.append(f"filter_fqns = {json.dumps(list(cfg.float8['filter_fqns']))}")
        if f8:
            out += ["", "[quantize.linear.float8]", *f8]
    wrap = c.knobs.get("wrap", "")
    per_block = "each" in wrap and "+" not in wrap and "child" not in wrap
    if not per_block and "as given" not in wrap:
        notes.append(
            f"units {wrap!r}: torchtitan's apply_fsdp shards each block, the embedding and "
            "the norm with the output; other units need a change to apply_fsdp"
        )
    if kw.get("offload_policy") is not None:
        out.insert(5, "enable_cpu_offload = true")
    return "\n".join(out + [f"# note: {n}" for n in notes])


def _titan_policy(per_group: Mapping[str, Any]) -> Any:
    """A per-group ``reshard_after_forward`` as torchtitan's ``fsdp_reshard_after_forward``
    would set it (``"default"``: every group but the last, the norm with the output; the
    value itself where it is none of torchtitan's)."""
    values = list(per_group.values())
    if all(v is False for v in values):
        return False
    if all(v is True for v in values):
        return True
    if all(v is True for v in values[:-1]) and values[-1] is False:
        return "default"
    return dict(per_group)


# ------------------------------------------------------------------ accelerate
def _accelerate(c: Candidate) -> str:
    kw = c.kwargs
    cfg = c.report.config
    notes: list[str] = []
    fsdp2 = cfg.api == "FSDP2"
    mp = kw.get("mp_policy", kw.get("mixed_precision"))
    param = getattr(mp, "param_dtype", None)
    reduce = getattr(mp, "reduce_dtype", None)
    mixed = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(param, "no")  # type: ignore[arg-type]
    if mixed != "no" and reduce is not None and reduce != param:
        notes.append(
            f"accelerate's mixed_precision: {mixed} reduces gradients in {mixed}; for "
            f"{_DTYPES.get(reduce, reduce)} reduction pass FullyShardedDataParallelPlugin("
            "mixed_precision_policy=...) in code"
        )
    block = _block_name(c)
    out = [
        "distributed_type: FSDP",
        f"mixed_precision: {mixed}",
        f"num_processes: {cfg.ranks}",
        "fsdp_config:",
        f"  fsdp_version: {2 if fsdp2 else 1}",
    ]
    if block:
        out += [
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
            f"  fsdp_transformer_layer_cls_to_wrap: {block}",
        ]
    else:
        out.append("  fsdp_auto_wrap_policy: NO_WRAP")
    if fsdp2:
        raf = kw.get("reshard_after_forward")
        out.append(f"  fsdp_reshard_after_forward: {'false' if raf is False else 'true'}")
        if raf not in (None, True, False):
            notes.append(f"reshard_after_forward={raf!r} is not an accelerate setting")
    else:
        out.append(f"  fsdp_sharding_strategy: {cfg.sharding_strategy}")
        out.append(f"  fsdp_backward_prefetch: {cfg.backward_prefetch or 'NO_PREFETCH'}")
        out.append(f"  fsdp_forward_prefetch: {str(cfg.forward_prefetch).lower()}")
    spec = kw.get("activation_checkpointing")
    out.append(f"  fsdp_activation_checkpointing: {'true' if spec is not None else 'false'}")
    if isinstance(spec, (SelectiveCheckpoint, CheckpointEvery)):
        notes.append(
            "accelerate checkpoints every wrapped block; per-op or every-nth checkpointing "
            "needs apply_activation_checkpointing in code (Candidate.code())"
        )
    offload = kw.get("offload_policy", kw.get("cpu_offload")) is not None
    out.append(f"  fsdp_offload_params: {'true' if offload else 'false'}")
    out.append(
        f"# gradient_accumulation_steps={c.grad_accum} and per_device_train_batch_size="
        f"{c.micro_batch} go to Accelerator(...) / TrainingArguments"
    )
    if c.grad_accum > 1 and c.sync_each:
        out.append(
            "# the gradients reduced after every micro-batch: "
            "GradientAccumulationPlugin(num_steps=..., sync_each_batch=True)"
        )
    return "\n".join(out + [f"# note: {n}" for n in notes])


def _block_name(c: Candidate) -> str:
    wrap = c.knobs.get("wrap", "")
    m = re.match(r"each (\w+)", wrap)
    return m.group(1) if m else ""


__all__ = ["STYLES", "configuration_code"]
