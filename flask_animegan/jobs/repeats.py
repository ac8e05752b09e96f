"""Which frames of a job repeat the last converted one, so that its result is reused.

The rule (docs/benchmark.md, section 8): a frame is converted again unless it has the
last converted frame's size, its pixels are on average at most :data:`SHIFT_LEVELS`
levels brighter or darker than that frame's, no 8x8 block of it differs from that frame
by more than :data:`BLOCK_LEVELS` levels on average (mean absolute difference over the
block's pixels and channels), and its perceptual hash is within :data:`PHASH_BITS` bits
of that frame's.

It is not the cache's "same photo" rule (``cache.fingerprint``), which is made for
privacy across clients and is too strict for one video: H.264 refines a held shot's
picture frame by frame (at x264's default crf 23 its frames exceed that rule by up to
1.9x). Within one job there is no privacy question, only whether converting the frame
again would give a visibly different result. The frame is always compared with the last
*converted* frame, never the previous one, so a slow change cannot creep past the rule
one small step at a time: a reused result is never further from its frame than the rule
allows. bench/jobs.py chose the numbers on generated H.264 clips (its figures are in
docs/benchmark.md, section 8): a held shot's frames at crf 18-28 stay within 0.2 levels
of shift and, but for a few at crf 28, 5 levels in the worst block, while a pan of
0.5 px a frame, a zoom of 0.5 % a frame, a box of 5 % of the picture moving 1 px a frame
and a fade to black over 4 s move the worst block or the shift past them. The cost: a
change slower than that (a pan of 0.25 px a frame) is shown in steps of at most the
rule's limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

#: Largest shift of the whole picture's mean, in levels (a fade moves it, noise does not).
SHIFT_LEVELS = 0.5
#: Largest mean absolute difference of any 8x8 block, in levels (motion moves it).
BLOCK_LEVELS = 5.0
#: Largest Hamming distance between the two 256-bit phashes (the cache's hash).
PHASH_BITS = 6
BLOCK = 8
HASH_SIZE = 16  # ANIMEGAN_PHASH_SIZE's default: the hash the cache keeps


@dataclass
class Picture:
    """A fitted frame as the rule compares it: its pixels and (computed when first
    needed) its perceptual hash."""

    pixels: np.ndarray  # height x width x 3, uint8
    _phash: int | None = field(default=None, repr=False)

    @classmethod
    def of(cls, image: Image.Image) -> Picture:
        """The picture of a fitted RGB frame."""
        return cls(np.asarray(image.convert("RGB"), np.uint8))

    @property
    def phash(self) -> int:
        """The frame's perceptual hash, as the cache computes it."""
        if self._phash is None:
            import imagehash  # imported on first use, as the cache does

            bits = imagehash.phash(Image.fromarray(self.pixels), hash_size=HASH_SIZE).hash
            self._phash = int.from_bytes(np.packbits(bits.flatten()).tobytes(), "big")
        return self._phash


@dataclass(frozen=True)
class Difference:
    """How far a frame is from the last converted one, in the rule's three measures."""

    shift: float  # |mean of the signed differences|, levels
    worst_block: float  # the largest 8x8 block's mean absolute difference, levels
    phash_bits: int | None  # None: not computed (the pixels already differ too much)

    @property
    def repeat(self) -> bool:
        """Within every limit of the rule: the last converted frame's result is reused."""
        return (self.shift <= SHIFT_LEVELS and self.worst_block <= BLOCK_LEVELS
                and self.phash_bits is not None and self.phash_bits <= PHASH_BITS)


def difference(frame: Picture, anchor: Picture) -> Difference | None:
    """The rule's measures between ``frame`` and ``anchor`` (the last converted frame);
    None when their sizes differ (never a repeat). The phash, the dearest measure, is
    computed only when the pixels pass."""
    if frame.pixels.shape != anchor.pixels.shape:
        return None
    signed = frame.pixels.astype(np.int16) - anchor.pixels.astype(np.int16)
    shift = abs(float(signed.mean()))
    per_pixel = np.abs(signed).mean(axis=2, dtype=np.float32)
    height, width = per_pixel.shape
    rows, columns = -(-height // BLOCK), -(-width // BLOCK)
    # the last row and column of blocks may be partial: pad with the edge, so a change
    # there is measured over the pixels it has rather than diluted by zeros
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
