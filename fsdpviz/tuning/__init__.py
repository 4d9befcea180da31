"""What should I change: the fastest configuration that fits, and why (``fsdpviz.tune``).

May import every layer below it (schema, trace, plan, schedule, cost, replan).
"""

from fsdpviz.tuning.result import Candidate, TuneTable, Tuning
from fsdpviz.tuning.search import suggest, tune
from fsdpviz.tuning.space import KNOBS

__all__ = ["KNOBS", "Candidate", "TuneTable", "Tuning", "suggest", "tune"]
