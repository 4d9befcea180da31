"""What FSDP issues, in order: its runtime ported and driven by the traced copy
(one analysis per API, which ``fsdpviz.analyze`` picks from).

May import fsdpviz.schema, fsdpviz.errors, fsdpviz.trace and fsdpviz.plan.
"""
