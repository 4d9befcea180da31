"""Errors fsdpviz raises: each says what was wrong and what to do."""

from __future__ import annotations


class FsdpvizError(Exception):
    """Base class of fsdpviz's errors."""


class ConfigError(FsdpvizError, ValueError):
    """An FSDP option or fsdpviz option that is invalid or not modelled."""


class FSDPConfigError(FsdpvizError, ValueError):
    """FSDP itself would raise for this model and configuration.

    The message is FSDP's own where fsdpviz ran FSDP's code to find it.
    """


class TraceError(FsdpvizError, RuntimeError):
    """The model could not be run for tracing; names the module that failed."""

    def __init__(self, message: str, module: str | None = None) -> None:
        super().__init__(message)
        self.module = module


class ExportError(FsdpvizError, RuntimeError):
    """A report could not be written in the requested format (a missing browser or bundle).

    The message says what is missing and how to install it.
    """
