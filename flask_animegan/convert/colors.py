"""Keeping the input's colours in a converted picture (docs/http-api.md, "Colours"): ``luma``
matches the input's mean brightness as AnimeGANv2's script does, on the right channels and with
a bounded gain; ``keep`` puts the input's CIELAB chroma under the result's lightness (Gatys et
al. 2016), a band of rows at a time to bound memory."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageStat

__all__ = ["COLOR_MODES", "MAX_GAIN", "MAX_L_SHIFT", "brightness", "keep_colors", "lab_from_rgb",
           "rgb_from_lab"]

COLOR_MODES = ("off", "luma", "keep")

#: luma's gain bound: a black or white input never erases the style's picture
MAX_GAIN = 2.0
#: keep's mean L* moves at most this far (of 100), its spread by MAX_GAIN, for the same reason
MAX_L_SHIFT = 25.0
#: pixels per band of rows, which bounds the float32 working arrays
BAND_PIXELS = 1 << 17
#: Rec. 601 luma weights on gamma-encoded R, G, B (AnimeGANv2's brightness measure)
LUMA_WEIGHTS = np.array([0.299, 0.587, 0.114])

# sRGB (D65) to CIE XYZ, and the D65 white point (the values scikit-image uses)
_RGB_TO_XYZ = np.array([[0.412453, 0.357580, 0.180423],
                        [0.212671, 0.715160, 0.072169],
                        [0.019334, 0.119193, 0.950227]])
_XYZ_TO_RGB = np.linalg.inv(_RGB_TO_XYZ)
_WHITE = np.array([0.95047, 1.0, 1.08883])
_DELTA = 6 / 29


def _decode_srgb(encoded: np.ndarray) -> np.ndarray:
    """sRGB-encoded values in [0, 1] to linear light."""
    return np.where(encoded <= 0.04045, encoded / 12.92,
                    ((encoded + 0.055) / 1.055) ** 2.4)


def _encode_srgb(linear: np.ndarray) -> np.ndarray:
    """Linear light in [0, 1] to sRGB-encoded values in [0, 1]."""
    linear = np.clip(linear, 0, 1)
    return np.where(linear <= 0.0031308, linear * 12.92,
                    1.055 * np.power(linear, 1 / 2.4) - 0.055)


#: uint8 sRGB -> linear light, one entry per value
_LINEAR = _decode_srgb(np.arange(256) / 255).astype(np.float32)
#: linear light quantised to 1/_STEPS -> uint8 sRGB, rounding like the formula near black
_STEPS = 65535
_ENCODED = np.round(_encode_srgb(np.arange(_STEPS + 1) / _STEPS) * 255).astype(np.uint8)


def _f(t: np.ndarray) -> np.ndarray:
    """CIELAB's companding of X/Xn, Y/Yn, Z/Zn."""
    return np.where(t > _DELTA ** 3, np.cbrt(t), t / (3 * _DELTA ** 2) + 4 / 29)


def _f_inverse(f: np.ndarray) -> np.ndarray:
    return np.where(f > _DELTA, f ** 3, 3 * _DELTA ** 2 * (f - 4 / 29))


def _companded_xyz(pixels: np.ndarray) -> np.ndarray:
    """uint8 (..., 3) sRGB to f(X/Xn), f(Y/Yn), f(Z/Zn) in float32 (..., 3)."""
    linear = _LINEAR[pixels]
    xyz = linear @ (_RGB_TO_XYZ.T / _WHITE[:, None].T).astype(np.float32)
    return _f(xyz)


def _rgb_from_companded(f_xyz: np.ndarray) -> np.ndarray:
    """f(X/Xn), f(Y/Yn), f(Z/Zn) (..., 3) back to uint8 sRGB, out-of-gamut colours clipped."""
    xyz = _f_inverse(f_xyz)
    linear = xyz @ (_XYZ_TO_RGB * _WHITE[None, :]).T.astype(np.float32)
    index = np.clip(linear, 0, 1)
    index *= _STEPS
    index += 0.5
    encoded: np.ndarray = _ENCODED[index.astype(np.int32)]
    return encoded


def lab_from_rgb(pixels: np.ndarray) -> np.ndarray:
    """uint8 sRGB (..., 3) to CIELAB (D65) L*, a*, b* in float32 (..., 3)."""
    f = _companded_xyz(np.asarray(pixels, np.uint8))
    lab = np.empty_like(f)
    lab[..., 0] = 116 * f[..., 1] - 16
    lab[..., 1] = 500 * (f[..., 0] - f[..., 1])
    lab[..., 2] = 200 * (f[..., 1] - f[..., 2])
    return lab


def rgb_from_lab(lab: np.ndarray) -> np.ndarray:
    """CIELAB (D65) (..., 3) to uint8 sRGB, colours outside sRGB clipped per channel."""
    lab = np.asarray(lab, np.float32)
    f = np.empty_like(lab)
    f[..., 1] = (lab[..., 0] + 16) / 116
    f[..., 0] = f[..., 1] + lab[..., 1] / 500
    f[..., 2] = f[..., 1] - lab[..., 2] / 200
    return _rgb_from_companded(f)


def _bands(image: Image.Image) -> list[tuple[int, int, int, int]]:
    """Crop boxes of whole rows, about BAND_PIXELS each, top to bottom."""
    step = max(1, BAND_PIXELS // max(1, image.width))
    return [(0, top, image.width, min(top + step, image.height))
            for top in range(0, image.height, step)]


def _lightness_stats(image: Image.Image) -> tuple[float, float]:
    """Mean and standard deviation of L*, from a thumbnail (the same figures, less work)."""
    k = max(1, -(-max(image.size) // 512))
    sample = image.resize((-(-image.width // k), -(-image.height // k)),
                          Image.Resampling.NEAREST) if k > 1 else image
    lightness = 116 * _companded_xyz(np.asarray(sample))[..., 1] - 16
    return float(lightness.mean()), float(lightness.std())


def _keep_chroma(result: Image.Image, source: Image.Image) -> Image.Image:
    """The source's a*, b* over the result's L*, moved to the source's mean and spread."""
    (mean_out, spread_out), (mean_in, spread_in) = (_lightness_stats(result),
                                                    _lightness_stats(source))
    gain = min(MAX_GAIN, max(1 / MAX_GAIN, spread_in / max(spread_out, 1e-3)))
    target = min(mean_out + MAX_L_SHIFT, max(mean_out - MAX_L_SHIFT, mean_in))
    # L* = 116 f(Y) - 16, so the tone change on L* is the same affine map on f(Y)
    f_gain, f_shift = gain, (target - gain * mean_out + 16 * (1 - gain)) / 116
    kept = Image.new("RGB", result.size)
    for box in _bands(result):
        f_result = _companded_xyz(np.asarray(result.crop(box)))
        f_source = _companded_xyz(np.asarray(source.crop(box)))
        f_y = f_result[..., 1:2]
        f_y *= f_gain
        f_y += f_shift
        np.clip(f_y, 4 / 29, 1, out=f_y)  # L* within [0, 100]
        # a*, b* are differences of f(X), f(Y), f(Z): the source's, on the new f(Y)
        f_source -= f_source[..., 1:2]
        f_source += f_y
        kept.paste(Image.fromarray(_rgb_from_companded(f_source)), box[:2])
    return kept


def brightness(image: Image.Image) -> float:
    """Mean Rec. 601 luma of an RGB image, 0-255 (from its histograms: no copy of the pixels)."""
    return float(np.array(ImageStat.Stat(image).mean[:3]) @ LUMA_WEIGHTS)


def _match_brightness(result: Image.Image, source: Image.Image) -> Image.Image:
    """The result scaled (then shifted) to the source's mean brightness by a lookup table."""
    target, current = brightness(source), brightness(result)
    histograms = np.array(result.histogram(), np.float64).reshape(3, 256)
    histograms /= histograms.sum(axis=1, keepdims=True)
    values = np.arange(256, dtype=np.float64)

    def table(gain: float, shift: float) -> np.ndarray:
        # halves round towards the target, so a near-black result that is darkened by half
        # (its levels of 1 at 0.5) moves at all
        half = 0.5 if target >= current else 0.5 - 1e-9
        return np.clip(np.floor(values * gain + shift + half), 0, 255)

    if current < 0.5:
        # a black result cannot be scaled: lift it, as far as MAX_GAIN lifts mid-grey
        gain, shift = 1.0, min(target, 127.5 * (MAX_GAIN - 1))
    else:
        gain, shift = min(MAX_GAIN, max(1 / MAX_GAIN, target / current)), 0.0
        # what clipping takes back is given back as a shift, once
        reached = float((histograms @ table(gain, 0.0)) @ LUMA_WEIGHTS)
        if abs(current * gain - reached) >= 0.5:
            shift = current * gain - reached
    return result.point(table(gain, shift).astype(np.uint8).tolist() * 3)


def keep_colors(result: Image.Image, source: Image.Image, mode: str) -> Image.Image:
    """``result`` with the colours of ``source`` (same size) kept as ``mode`` says."""
    if mode not in COLOR_MODES:
        raise ValueError(f"unknown colour mode {mode!r}: use one of {', '.join(COLOR_MODES)}")
    if mode == "off":
        return result
    if result.size != source.size:
        raise ValueError(f"the result is {result.width}x{result.height} and the source "
                         f"{source.width}x{source.height}: fit the source to the result first")
    result = result if result.mode == "RGB" else result.convert("RGB")
    source = source if source.mode == "RGB" else source.convert("RGB")
    if mode == "luma":
        return _match_brightness(result, source)
    return _keep_chroma(result, source)
