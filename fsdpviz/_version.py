"""``fsdpviz.__version__``, from the installed package's metadata."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fsdpviz")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"
