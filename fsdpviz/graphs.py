"""Graphs of a report as ``networkx.DiGraph`` (placeholder replaced below)."""
