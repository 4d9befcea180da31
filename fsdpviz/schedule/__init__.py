"""FSDP2 (fully_shard): options, groups, runtime emulation."""
