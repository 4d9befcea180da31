"""Errors fsdpviz raises: each says what was wrong and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the one of ``choices`` closest to ``word`` (difflib's
    match), or ``""`` when none is close: the end of an error about an unknown name."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
