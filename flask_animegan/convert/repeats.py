"""Which frames of a job repeat the last *converted* one (so a slow change cannot creep
past), reusing its result. Looser than the cache's rule, which guards privacy across clients."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from ..config import PHASH_SIZE

#: Largest shift of the whole picture's mean, in levels (a fade moves it, noise does not).
SHIFT_LEVELS = 0.5
#: Largest mean absolute difference of any 8x8 block, in levels (motion moves it).
BLOCK_LEVELS = 5.0
#: Largest Hamming distance between the two phashes (the cache's hash).
PHASH_BITS = 6
BLOCK = 8
HASH_SIZE = PHASH_SIZE  # the hash the cache keeps


@dataclass
class Picture:
    """A fitted frame's pixels and its perceptual hash (computed when needed)."""

    pixels: np.ndarray  # height x width x 3, uint8
    _phash: int | None = field(default=None, repr=False)

    @classmethod
    def of(cls, image: Image.Image) -> Picture:
        """The picture of a fitted frame."""
        return cls(np.asarray(image.convert("RGB"), np.uint8))

    @property
    def phash(self) -> int:
        """The frame's perceptual hash, as the cache computes it."""
        if self._phash is None:
            import imagehash

            bits = imagehash.phash(Image.fromarray(self.pixels), hash_size=HASH_SIZE).hash
            self._phash = int.from_bytes(np.packbits(bits.flatten()).tobytes(), "big")
        return self._phash


@dataclass(frozen=True)
class Difference:
    """How far a frame is from the last converted one."""

    shift: float  # |mean of the signed differences|, levels
    worst_block: float  # the largest 8x8 block's mean absolute difference, levels
    phash_bits: int | None  # None: not computed (the pixels already differ too much)

    @property
    def repeat(self) -> bool:
        """Within every limit: the last converted frame's result is reused."""
        return (self.shift <= SHIFT_LEVELS and self.worst_block <= BLOCK_LEVELS
                and self.phash_bits is not None and self.phash_bits <= PHASH_BITS)


def difference(frame: Picture, anchor: Picture) -> Difference | None:
    """The rule's measures from ``anchor`` (None for another size); pHash only if needed."""
    if frame.pixels.shape != anchor.pixels.shape:
        return None
    signed = frame.pixels.astype(np.int16) - anchor.pixels.astype(np.int16)
    shift = abs(float(signed.mean()))
    per_pixel = np.abs(signed).mean(axis=2, dtype=np.float32)
    height, width = per_pixel.shape
    rows, columns = -(-height // BLOCK), -(-width // BLOCK)
    # pad partial edge blocks with the edge, so a change there is not diluted by zeros
    padded = np.pad(per_pixel, ((0, rows * BLOCK - height), (0, columns * BLOCK - width)),
                    mode="edge")
    worst = float(padded.reshape(rows, BLOCK, columns, BLOCK).mean(axis=(1, 3)).max())
    bits = None
    if shift <= SHIFT_LEVELS and worst <= BLOCK_LEVELS:
        bits = (frame.phash ^ anchor.phash).bit_count()
    return Difference(shift, worst, bits)


def is_repeat(frame: Picture, anchor: Picture | None) -> bool:
    """Whether ``frame`` may reuse the result of ``anchor``, the last converted frame."""
    if anchor is None:
        return False
    measured = difference(frame, anchor)
    return measured is not None and measured.repeat
