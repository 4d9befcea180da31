"""Which modules FSDP makes units of and what each holds: FSDP1 policies, FSDP2 groups, options.

May import fsdpviz.schema, fsdpviz.errors and fsdpviz.trace.
"""
