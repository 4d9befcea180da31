"""The code that runs a configuration, in the style asked for: ``fully_shard`` /
``FullyShardedDataParallel`` calls with activation checkpointing and the micro-batch loop
(``fsdp_code.py``, ``pipeline_code.py`` under a pipeline), or a trainer's keys (torchtitan's
job TOML, accelerate's config YAML: ``trainer_code.py``) where those can say it."""

from __future__ import annotations

from fsdpviz.errors import ConfigError
from fsdpviz.tuning.fsdp_code import (
    Candidate,
    checkpointing_code,
    fsdp1_code,
    fsdp2_code,
    loop_code,
)
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
    lines = ["import torch"]
    checkpointing = checkpointing_code(kw.get("activation_checkpointing"), api)
    if api == "FSDP2":
        lines += checkpointing
    if c.report.pipeline is not None:
        lines += pipeline_code(c)
        return "\n".join(lines)
    lines += fsdp2_code(c) if api == "FSDP2" else [*fsdp1_code(c), *checkpointing]
    lines += loop_code(c)
    return "\n".join(lines)


__all__ = ["STYLES", "configuration_code"]
