"""The result cache (reused only for the same photo) and the result pages, on one storage seam."""

from __future__ import annotations

from .near_duplicate import CachedResult, NearDuplicateCache
from .results import ResultStore, StoredResult

__all__ = ["CachedResult", "NearDuplicateCache", "ResultStore", "StoredResult"]
