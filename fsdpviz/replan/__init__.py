"""fsdpviz internals."""

from fsdpviz.replan.replanner import (
    BACKWARD_PREFETCH,
    SHARDING_STRATEGIES,
    PlanOptions,
    Recipe,
    Replanner,
)

__all__ = ["BACKWARD_PREFETCH", "SHARDING_STRATEGIES", "PlanOptions", "Recipe", "Replanner"]
