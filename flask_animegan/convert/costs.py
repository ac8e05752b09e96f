"""What work takes from the rate limit: one rule for every kind (:func:`work_cost`)."""

from __future__ import annotations

import math

from ..config import FRAMES_PER_CONVERSION

#: The rule, in the words docs/http-api.md and the OpenAPI document both give.
COST_RULE = (
    "a request is charged by the work the model did: one conversion per ANIMEGAN_MAX_SIDE² "
    "pixels begun of a photo's result (tiled or not), plus one per face portrait mode "
    f"converts apart, and one per {FRAMES_PER_CONVERSION} frames an animation or a video "
    "decodes, taken as they pass; a cache hit and a refusal before decoding cost nothing")


def work_cost(*, side: int, cap: int, size: tuple[int, int] | None = None, faces: int = 0,
              frames: int = 0) -> int:
    """Conversions the work counts as: a picture of ``size`` one per ``side`` squared output
    pixels begun, plus one per face portrait mode converted (an inference each), at most
    ``cap`` so that no photo is refused forever; ``frames`` decoded one per
    FRAMES_PER_CONVERSION begun."""
    cost = 0
    if size is not None:
        cost = max(1, math.ceil(size[0] * size[1] / side ** 2)) + faces
        cost = min(cap, cost)
    return cost + frames_cost(frames)


def frames_cost(frames: int) -> int:
    """Conversions ``frames`` decoded frames count as (none: none)."""
    return math.ceil(frames / FRAMES_PER_CONVERSION) if frames > 0 else 0
