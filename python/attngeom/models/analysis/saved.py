"""What every analysis result shares: its dict written as JSON, atomically (:class:`SavedResult`),
and arrays as JSON lists with NaN as null (:func:`json_floats`)."""
from __future__ import annotations

import json

import numpy as np

from ..._durable import write_atomic


class SavedResult:
    """A result with a ``to_dict()``, which :meth:`to_json` writes."""

    def to_json(self, path) -> str:
        """Write :meth:`to_dict` to `path` as JSON, atomically (a reader sees the old file or
        the new one, never a torn one); returns the path."""
        return write_atomic(path, json.dumps(self.to_dict(), indent=1))


def json_floats(a) -> list:
    """An array as nested lists with NaN as None (JSON has no NaN).

    Examples
    --------
    >>> from attngeom.models.analysis.saved import json_floats
    >>> json_floats(np.array([1.0, np.nan]))
    [1.0, None]
    """
    return np.where(np.isfinite(a), a, None).tolist() if np.size(a) else []
