"""The code that runs a configuration, in the style asked for: ``fully_shard`` /
``FullyShardedDataParallel`` calls with activation checkpointing and the micro-batch loop
(``fsdp_code.py``, ``pipeline_code.py`` under a pipeline), or a trainer's keys (torchtitan's
job TOML, accelerate's config YAML: ``trainer_code.py``) where those can say it."""

from __future__ import annotations

from fsdpviz.errors import ConfigError
from fsdpviz.plan.job import parse_job_options
from fsdpviz.tuning.fsdp_code import (
    Candidate,
    checkpointing_code,
    fsdp1_code,
    fsdp2_code,
    loop_code,
)
from fsdpviz.tuning.job_code import compile_code, float8_code, float8_step_code, tp_code
from fsdpviz.tuning.pipeline_code import pipeline_code
from fsdpviz.tuning.trainer_code import accelerate_yaml, torchtitan_toml

STYLES = ("python", "torchtitan", "accelerate")


def configuration_code(c: Candidate, style: str = "python") -> str:
    """See :meth:`fsdpviz.tuning.Candidate.code`."""
    if style not in STYLES:
        raise ConfigError(f"code style must be one of {', '.join(STYLES)}, got {style!r}")
    if style == "torchtitan":
        return torchtitan_toml(c)
    if style == "accelerate":
        if c.report.pipeline is not None:
            raise ConfigError(
                "accelerate's FSDP has no pipeline parallelism: take code('python') "
                "(torch.distributed.pipelining) or code('torchtitan') for a pipeline"
            )
        return accelerate_yaml(c)
    kw = c.kwargs
    api = c.report.config.api
    job = parse_job_options(kw, api)
    lines = ["import torch"]
    checkpointing = checkpointing_code(kw.get("activation_checkpointing"), api)
    # torchtitan's order: float8 linears, tensor parallelism, checkpointing, compile, FSDP
    lines += float8_code(job)
    if c.report.pipeline is not None:  # each stage split, then the rest on each
        part = "stage_model"
        on_stage = checkpointing_code(kw.get("activation_checkpointing"), api, part)
        lines += pipeline_code(c, [*tp_code(c, part), *on_stage, *compile_code(job, part)])
        return "\n".join(lines)
    if api == "FSDP2":
        lines += fsdp2_code(c, [*tp_code(c), *checkpointing, *compile_code(job)])
    else:
        lines += [*fsdp1_code(c), *checkpointing, *compile_code(job)]
    loop = loop_code(c)
    step = loop.index("optimizer.step()")
    lines += [*loop[: step + 1], *float8_step_code(job), *loop[step + 1 :]]
    return "\n".join(lines)


__all__ = ["STYLES", "configuration_code"]
