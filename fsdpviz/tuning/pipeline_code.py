"""The Python that runs a configuration under pipeline parallelism: FSDP2 inside
``torch.distributed.pipelining`` (the mesh, each stage's modules and the stages of each
rank, their ``fully_shard`` calls and ``PipelineStage``, the schedule)."""

from __future__ import annotations

import re

from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.pipeline import schedule_class
from fsdpviz.tuning.fsdp_code import Candidate, mp_policy_code, raf_of, shard_calls
from fsdpviz.tuning.space import reshard_given


def on_stage(line: str) -> str:
    """A line of code about ``model`` made one about ``stage_model``: the name ``model`` in
    code, not in a string (a module's name, such as Hugging Face's ``'model.layers.0'``) nor
    in a comment."""
    out: list[str] = []
    quote = ""
    word = re.compile(r"\bmodel\b")
    i = 0
    for m in re.finditer(r"['\"#]", line):
        ch = m.group()
        if quote:
            if ch == quote:
                out.append(line[i : m.end()])
                i, quote = m.end(), ""
            continue
        out.append(word.sub("stage_model", line[i : m.start()]))
        i = m.start()
        if ch == "#":
            break
        quote = ch
    else:
        if not quote:
            out.append(word.sub("stage_model", line[i:]))
            i = len(line)
    out.append(line[i:])
    return "".join(out)


def pipeline_code(c: Candidate, before_shard: list[str] | None = None) -> list[str]:
    """FSDP2 inside ``torch.distributed.pipelining``: the mesh, each stage's modules (as the
    plan split them), then on each stage torchtitan's order (``before_shard``: tensor
    parallelism, activation checkpointing, compile; then its ``fully_shard`` calls), its
    ``PipelineStage``, the schedule."""
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
        lines.append(f"mp_policy = {mp_policy_code(mp)}")
        common.append("mp_policy=mp_policy")
    raf = reshard_given(kw)
    spec = kw.get("activation_checkpointing")
    lines += ["", "stages = []", "for index in stages_of_rank[pp_rank]:"]
    lines.append("    # split_stage: yours, the model with only these modules (torchtitan's split)")
    lines.append("    stage_model = split_stage(model, stage_modules[index])")
    lines += [f"    {line}" if line else "" for line in before_shard or []]
    for st in pipe.stages:
        groups = [u for u in st.units if u and not u.startswith("(")]
        calls = shard_calls(groups, raf, common, spec, c)
        root = f"(root of stage {st.index})"
        root_raf = raf_of(raf, root, (root,))
        root_args = [*common]
        if root_raf is not None:
            root_args.append(RESHARD.code(root_raf))
        calls.append(f"fully_shard(model, {', '.join(root_args)})")
        lines.append(f"    if index == {st.index}:")
        lines += ["        " + on_stage(line) for line in calls]
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


__all__ = ["on_stage", "pipeline_code"]
