"""What a user calls: a plan predicted (``analyze``), two plans compared (``compare``).

May import every layer below it (schema, trace, plan, configs, schedule, cost); ``replan``
and ``tuning``, in the same layer, build on it.
"""
