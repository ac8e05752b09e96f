"""The resize behind every fit (Lanczos) and the cache's samples (triangle filter), in two
horizontal bands on two threads.

Pillow lets go of the GIL while it resamples, so a picture fitted while another core is
idle (a lone request, or the only decode of the moment) takes about half the time: a
1080 x 1350 photo to 512 px, 13.8 ms on one thread, 7.5 ms on two, on the 2-core Xeon of
docs/benchmark.md. Under load both cores are busy anyway and the bands take turns; the
CPU spent is the same.

The bands do not depend on the machine (always two, split at the output's middle row, in
threads or one after the other on one CPU), so with one Pillow a picture is fitted the same
everywhere: instances sharing a cache agree. Against one ``Image.resize`` over the whole
box the result differs only by rounding: Pillow resamples in two passes, each rounded to
whole levels, and Pillow 13 takes them in the cheaper order, which for a band may be the
other one (a 1080 x 1350 photo to 1024 px: at most 3 levels, 0.08 on average; at 512 px
and with Pillow 12, the same pixels).
"""

from __future__ import annotations

import math

from PIL import Image

from ..process import in_halves

#: Pillow's ``reducing_gap`` for every fit: a reduction of 6x or more first averages
#: whole blocks (Image.reduce), then resamples over at least 3x. Such a fit runs on one
#: thread (each band would reduce its own blocks, which would change the result).
REDUCING_GAP = 3.0
#: Source pixels below which one resize is cheaper than handing a band to a thread.
MIN_BANDED_PIXELS = 1 << 18
_LANCZOS_SUPPORT = 3.0  # Pillow's Lanczos window, in output pixels

Box = tuple[float, float, float, float]


def banded(box_size: tuple[float, float], target: tuple[int, int], mode: str = "RGB") -> bool:
    """Whether :func:`resize` splits this resize into bands."""
    (box_width, box_height), (width, height) = box_size, target
    reduces = (int(box_width / width / REDUCING_GAP) > 1
               or int(box_height / height / REDUCING_GAP) > 1)
    return (mode == "RGB" and not reduces and height >= 4
            and box_width * box_height >= MIN_BANDED_PIXELS)


def band_bytes(box_size: tuple[float, float], target: tuple[int, int],
               pixel_bytes: int) -> int:
    """What the bands allocate beyond one resize of the whole box: the rows of the source
    both bands' horizontal passes cover (the window each side of the cut) and the two
    halves alongside the output they are pasted into."""
    if not banded(box_size, target):
        return 0
    width, height = target
    window = math.ceil(_LANCZOS_SUPPORT * box_size[1] / height) + 1
    return pixel_bytes * width * (2 * window + height)


def resize(image: Image.Image, target: tuple[int, int], box: Box | None = None,
           method: Image.Resampling = Image.Resampling.LANCZOS) -> Image.Image:
    """``image`` (its ``box``, by default all of it) resized to ``target`` with ``method``
    (Lanczos for every fit)."""
    box = box or (0, 0, image.width, image.height)
    x0, y0, x1, y1 = box
    if not banded((x1 - x0, y1 - y0), target, image.mode):
        return image.resize(target, method, box=box, reducing_gap=REDUCING_GAP)
    width, height = target
    middle = height // 2
    cut = y0 + (y1 - y0) * middle / height

    def band(top: float, bottom: float, rows: int) -> Image.Image:
        return image.resize((width, rows), method, box=(x0, top, x1, bottom))

    image.load()  # once, before two threads read it
    upper, bottom = in_halves(lambda: band(y0, cut, middle),
                              lambda: band(cut, y1, height - middle))
    out = Image.new(image.mode, target)
    out.paste(upper, (0, 0))
    out.paste(bottom, (0, middle))
    return out
