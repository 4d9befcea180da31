"""Models and FSDP options as users configure them: Hugging Face model ids, accelerate,
torchtitan and Lightning configurations, turned into :func:`fsdpviz.analyze` arguments.
May import fsdpviz.schema, fsdpviz.errors and fsdpviz.trace (the plan layer's peers).

Example::

    llama = fsdpviz.hf_model("meta-llama/Llama-3.1-8B", batch=2, seq=8192)
    plan = fsdpviz.from_accelerate("fsdp.yaml", llama.model)
    fsdpviz.analyze(llama.model, llama.inputs, **plan)
"""

from __future__ import annotations

from fsdpviz.configs.accelerate import from_accelerate
from fsdpviz.configs.common import ConfigNote, TrainerConfig
from fsdpviz.configs.hf import HFModel, hf_model
from fsdpviz.configs.lightning import from_lightning
from fsdpviz.configs.torchtitan import TorchtitanJob, from_torchtitan

__all__ = [
    "ConfigNote",
    "HFModel",
    "TorchtitanJob",
    "TrainerConfig",
    "from_accelerate",
    "from_lightning",
    "from_torchtitan",
    "hf_model",
]
