"""fsdpviz internals."""
