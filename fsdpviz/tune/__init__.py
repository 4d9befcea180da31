"""What should I change: the fastest configuration that fits, and why (``fsdpviz.tune``).

May import every layer below it (schema, trace, plan, schedule, cost, replan).
"""

from fsdpviz.tune.result import Candidate, TuneTable, Tuning
from fsdpviz.tune.search import suggest, tune
from fsdpviz.tune.space import KNOBS

__all__ = ["KNOBS", "Candidate", "TuneTable", "Tuning", "suggest", "tune"]
