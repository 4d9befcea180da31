"""Plans under other options without tracing again: replay, stored traces, sweep, suggest.

May import every layer below it (schema, trace, plan, schedule, cost).

- :func:`replay`: a traced report's hook calls fed through FSDP's runtime again
  (world size, backward prefetch, sharding, FSDP2 resharding and prefetch maps);
- :class:`Replanner`: what the explorer's controls re-plan with (stored traces of
  the model, replay, or a new trace);
- :func:`sweep` / :func:`suggest`: configurations side by side, and the plan that
  fits a memory budget with the least exposed communication.
"""

from fsdpviz.replan.hook_replay import REPLAYABLE, replay
from fsdpviz.replan.replanner import (
    BACKWARD_PREFETCH,
    SHARDING_STRATEGIES,
    PlanOptions,
    Recipe,
    Replanner,
)
from fsdpviz.replan.suggestion import Suggestion, suggest
from fsdpviz.replan.sweep_table import SweepTable, sweep

__all__ = [
    "BACKWARD_PREFETCH",
    "REPLAYABLE",
    "SHARDING_STRATEGIES",
    "PlanOptions",
    "Recipe",
    "Replanner",
    "Suggestion",
    "SweepTable",
    "replay",
    "suggest",
    "sweep",
]
