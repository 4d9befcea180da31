"""What FSDP issues, in order: its runtime ported and driven by the traced copy (``analyze``).

May import fsdpviz.schema, fsdpviz.errors, fsdpviz.trace and fsdpviz.plan.
"""
