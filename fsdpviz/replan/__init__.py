"""Plans under other options without tracing again: replay, stored traces, sweep.

May import the layers under the API layer (schema, trace, plan, configs, schedule, cost)
and ``fsdpviz.api`` (``analyze``), its own layer.

- :func:`replay`: a traced report's hook calls fed through FSDP's runtime again
  (world size, backward prefetch, sharding, FSDP2 resharding and prefetch maps, mixed
  precision's reduce dtype);
- :class:`Replanner`: what the explorer's controls re-plan with (stored traces of
  the model, replay, or a new trace);
- :func:`sweep`: configurations side by side (:func:`fsdpviz.tune` searches them).
"""

from fsdpviz.replan.hook_replay import REPLAYABLE, replay
from fsdpviz.replan.replanner import (
    BACKWARD_PREFETCH,
    SHARDING_STRATEGIES,
    PlanOptions,
    Recipe,
    Replanner,
)
from fsdpviz.replan.sweep_table import SweepTable, sweep

__all__ = [
    "BACKWARD_PREFETCH",
    "REPLAYABLE",
    "SHARDING_STRATEGIES",
    "PlanOptions",
    "Recipe",
    "Replanner",
    "SweepTable",
    "replay",
    "sweep",
]
