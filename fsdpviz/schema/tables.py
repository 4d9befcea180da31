"""Plain records to a ``pandas.DataFrame``, for the result tables (pandas optional)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any


def dataframe(records: Sequence[Mapping[str, object]], *, flatten: bool = False) -> Any:
    """``records`` as a DataFrame (``flatten``: nested dicts become dotted columns)."""
    try:
        pd = importlib.import_module("pandas")
    except ImportError as e:
        raise ImportError(
            "this needs pandas: pip install pandas (or use .records(), plain dicts)"
        ) from e
    return pd.json_normalize(records) if flatten else pd.DataFrame.from_records(records)
