"""The strength option (docs/http-api.md, "Strength"): a milder style mixed from the
full-strength result and the photo it was made from, with no second inference.

The mix is in CIELAB: a* and b* move from the photo's to the result's; L* is split into a
base (a Gaussian blur, sigma growing with the picture) and detail, the base moving as the
colours do while the photo's detail fades faster than the result's lines come in, so that a
weaker style looks flatter and less drawn rather than like two pictures laid over each other
(docs/http-api.md, "Strength", compares the methods). static/animegan.js does the same."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFilter

from .colors import lab_from_rgb, rgb_from_lab

__all__ = ["FULL", "blur_radius", "mix_strength"]

#: the strength that is the network's result as it is
FULL = 100
#: pixels per band of rows, which bounds the float32 working arrays
BAND_PIXELS = 1 << 17


def blur_radius(size: tuple[int, int]) -> float:
    """The Gaussian's sigma that splits L* into base and detail, in pixels: growing with
    the long side, as the style's lines do."""
    return max(1.0, max(size) / 256)


def mix_strength(result: Image.Image, photo: Image.Image, strength: int) -> Image.Image:
    """``result`` (the full-strength conversion of ``photo``) at ``strength`` percent:
    100 is ``result``, 0 the photo. A photo of another size is resized to the result's."""
    if not 0 <= strength <= FULL:
        raise ValueError(f"strength must be from 0 to {FULL}, got {strength}")
    if strength == FULL:
        return result
    result = result if result.mode == "RGB" else result.convert("RGB")
    photo = photo if photo.mode == "RGB" else photo.convert("RGB")
    if photo.size != result.size:
        if abs(photo.width * result.height - photo.height * result.width) > max(result.size):
            raise ValueError(f"the photo is {photo.width}x{photo.height} and the result "
                             f"{result.width}x{result.height}: not the same picture")
        photo = photo.resize(result.size, Image.Resampling.LANCZOS)
    s = strength / FULL
    blur = ImageFilter.GaussianBlur(blur_radius(result.size))
    # the base of L* is that of the blurred picture: what a canvas's blur() gives the page
    result_base, photo_base = result.filter(blur), photo.filter(blur)
    mixed = Image.new("RGB", result.size)
    step = max(1, BAND_PIXELS // max(1, result.width))
    for top in range(0, result.height, step):
        box = (0, top, result.width, min(top + step, result.height))
        out, inp = (lab_from_rgb(np.asarray(picture.crop(box))) for picture in (result, photo))
        out_l, inp_l = (lab_from_rgb(np.asarray(picture.crop(box)))[..., 0]
                        for picture in (result_base, photo_base))
        lab = inp + s * (out - inp)  # a*, b* (and a first L*)
        lab[..., 0] = (inp_l + s * (out_l - inp_l) + (1 - s) ** 2 * (inp[..., 0] - inp_l)
                       + s * (out[..., 0] - out_l))
        mixed.paste(Image.fromarray(rgb_from_lab(lab)), box[:2])
    return mixed
