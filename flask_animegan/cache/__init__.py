"""The near-duplicate result cache: one rule, in near_duplicate.py."""

from __future__ import annotations

from .near_duplicate import CachedResult, NearDuplicateCache

__all__ = ["CachedResult", "NearDuplicateCache"]
