"""What should I change: the fastest configuration that fits, and why (``fsdpviz.tune``).

May import the layers under the API layer (schema, trace, plan, configs, schedule, cost)
and ``fsdpviz.api`` and ``fsdpviz.replan``, its own layer.
"""

from fsdpviz.tuning.result import Candidate, TuneTable, Tuning
from fsdpviz.tuning.search import suggest, tune
from fsdpviz.tuning.space import KNOBS

__all__ = ["KNOBS", "Candidate", "TuneTable", "Tuning", "suggest", "tune"]
