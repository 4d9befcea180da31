"""Running a private meta copy of the model: module calls, autograd, activations and FLOPs.

May import fsdpviz.schema and fsdpviz.errors.
"""
