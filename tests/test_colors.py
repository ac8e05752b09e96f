"""Colour keeping (``flask_animegan.convert.colors``): the CIELAB conversion against
scikit-image's, what each mode does to seeded random pictures, the inputs that break naive
corrections (flat, black, white, one colour, 1x1) through the real generator, the memory of
a 4096-px ``keep``, and the acceptance on six photos with the shipped ``toon_demo``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from skimage import color

from bench import colors as bench_colors
from flask_animegan.convert.colors import (
    COLOR_MODES,
    MAX_GAIN,
    MAX_L_SHIFT,
    brightness,
    keep_colors,
    lab_from_rgb,
    rgb_from_lab,
)
from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR


def random_picture(seed: int, width: int, height: int, low: int = 0, high: int = 256) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(low, high, (height, width, 3), np.uint8))


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image).astype(np.int16)


def test_the_cielab_conversion_is_scikit_images():
    every = np.stack(np.meshgrid(*[np.arange(0, 256, 5)] * 3), -1).reshape(-1, 1, 3).astype(np.uint8)
    ours = lab_from_rgb(every)
    assert ours.dtype == np.float32
    assert np.abs(ours - color.rgb2lab(every)).max() < 2e-3
    assert np.array_equal(rgb_from_lab(color.rgb2lab(every)), every)


def test_off_is_the_result_itself_and_bad_arguments_say_what_to_do():
    result, source = random_picture(0, 16, 8), random_picture(1, 16, 8)
    assert keep_colors(result, source, "off") is result
    with pytest.raises(ValueError, match="use one of off, luma, keep"):
        keep_colors(result, source, "vivid")
    with pytest.raises(ValueError, match="fit the source to the result first"):
        keep_colors(result, random_picture(1, 8, 16), "keep")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(1, 48), height=st.integers(1, 48))
def test_a_picture_kept_with_its_own_colours_is_itself(seed, width, height):
    picture = random_picture(seed, width, height)
    for mode in COLOR_MODES:
        kept = keep_colors(picture, picture, mode)
        assert kept.size == picture.size and kept.mode == "RGB"
        assert np.abs(pixels(kept) - pixels(picture)).max() <= 1, mode


def expected_keep(result: Image.Image, source: Image.Image) -> np.ndarray:
    """What keep promises, recomputed with scikit-image: the source's a*, b* over the
    result's L* moved to the source's mean and spread (within MAX_L_SHIFT, MAX_GAIN)."""
    lab_result, lab_source = color.rgb2lab(np.asarray(result)), color.rgb2lab(np.asarray(source))
    lightness = lab_result[..., 0]
    gain = np.clip(lab_source[..., 0].std() / max(lightness.std(), 1e-3), 1 / MAX_GAIN, MAX_GAIN)
    target = np.clip(lab_source[..., 0].mean(), lightness.mean() - MAX_L_SHIFT,
                     lightness.mean() + MAX_L_SHIFT)
    expected = lab_source.copy()
    expected[..., 0] = np.clip(target + gain * (lightness - lightness.mean()), 0, 100)
    return expected


def inside_srgb(lab: np.ndarray, margin: float = 0.002) -> np.ndarray:
    """Where a Lab colour is an sRGB colour (by ``margin`` in linear light)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lab2xyz warns of Z < 0, which this mask is for
        xyz = color.lab2xyz(lab)
    linear = xyz @ color.colorconv.rgb_from_xyz.T
    return np.all((linear > margin) & (linear < 1 - margin), axis=-1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(1, 40), height=st.integers(1, 40),
       low=st.integers(0, 128), spread=st.integers(1, 128))
def test_keep_is_the_sources_chroma_over_the_results_lightness(seed, width, height, low, spread):
    result = random_picture(seed, width, height, low, low + spread)
    source = random_picture(seed + 1, width, height)
    kept = color.rgb2lab(np.asarray(keep_colors(result, source, "keep")))
    expected = expected_keep(result, source)
    inside = inside_srgb(expected)
    # 8-bit rounding moves a colour by under 1.5 (ΔE76); outside sRGB it is clipped
    assert np.all(np.linalg.norm(kept - expected, axis=-1)[inside] < 1.5)
    assert np.all(np.abs(kept[..., 0] - expected[..., 0])[~inside] < 50)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40),
       result_range=st.tuples(st.integers(0, 200), st.integers(1, 55)),
       source_range=st.tuples(st.integers(0, 200), st.integers(1, 55)))
def test_luma_moves_the_brightness_to_the_inputs_within_its_gain(seed, size, result_range,
                                                                 source_range):
    result = random_picture(seed, size, size, result_range[0], sum(result_range))
    source = random_picture(seed + 1, size, size, source_range[0], sum(source_range))
    current, target = brightness(result), brightness(source)
    reached = brightness(keep_colors(result, source, "luma"))
    if current >= 0.5 and 1 / MAX_GAIN <= target / current <= MAX_GAIN:
        assert abs(reached - target) <= 1.5, (current, target, reached)
    else:  # as far as the gain allows, in the right direction, never past
        assert min(current, target) - 1 <= reached <= max(current, target) + 1
        # (a target within half a level of a flat picture's is no level away: it stays)
        assert abs(reached - target) < abs(current - target) or abs(current - target) < 0.5


def uniform(rgb: tuple[int, int, int], size: tuple[int, int] = (96, 64)) -> Image.Image:
    return Image.new("RGB", size, rgb)


def gradient(size: tuple[int, int] = (96, 64)) -> Image.Image:
    ramp = np.linspace(0, 255, size[0], dtype=np.float32)
    rgb = np.stack([np.tile(ramp, (size[1], 1)), np.tile(ramp[::-1], (size[1], 1)),
                    np.full((size[1], size[0]), 128.0)], -1)
    return Image.fromarray(rgb.astype(np.uint8))


HARD_INPUTS = {
    "black": uniform((0, 0, 0)),
    "white": uniform((255, 255, 255)),
    "flat grey": uniform((128, 128, 128)),
    "one colour": uniform((200, 30, 40)),
    "1x1": uniform((12, 200, 90), (1, 1)),
    "1x64": gradient((1, 64)),
    "64x1": gradient((64, 1)),
}


@pytest.mark.parametrize("name", HARD_INPUTS)
def test_hard_inputs_through_the_generator_give_a_picture_in_every_mode(app, name):
    source = HARD_INPUTS[name]
    result = app.extensions["animegan"].engine.run(source)
    for mode in COLOR_MODES:
        with np.errstate(all="raise"):  # an inf or NaN on the way raises here
            kept = keep_colors(result, source, mode)
        assert kept.size == source.size and kept.mode == "RGB"
        assert max(high for _, high in kept.getextrema()) > 0, (name, mode, "all black")


SYNTHETIC = {
    "grey result, colourful source": (uniform((128, 128, 128)), gradient()),
    "colourful result, grey source": (gradient(), uniform((128, 128, 128))),
    "black result, colourful source": (uniform((0, 0, 0)), gradient()),
    "colourful result, black source": (gradient(), uniform((0, 0, 0))),
    "white result, colourful source": (uniform((255, 255, 255)), gradient()),
    "colourful result, white source": (gradient(), uniform((255, 255, 255))),
    "black result, black source": (uniform((0, 0, 0)), uniform((0, 0, 0))),
}


@pytest.mark.parametrize("name", SYNTHETIC)
def test_results_and_sources_at_the_extremes_give_a_picture(name):
    result, source = SYNTHETIC[name]
    for mode in ("luma", "keep"):
        with np.errstate(all="raise"):
            kept = keep_colors(result, source, mode)
        # black over black has no brightness to keep nor to lift: it stays what it was
        if name != "black result, black source":
            assert max(high for _, high in kept.getextrema()) > 0, (name, mode, "all black")
    if "colourful source" in name:  # keep takes the source's colours, here its gradient
        kept = color.rgb2lab(np.asarray(keep_colors(result, source, "keep")))
        assert np.ptp(kept[..., 1]) > 20 and np.ptp(kept[..., 2]) > 5, name


def test_a_4096_px_keep_stays_within_a_band_of_its_output():
    """A full float64 copy of a 4096 x 4096 picture is 384 MiB; keep works a band of rows at
    a time, so over its inputs it holds its answer (64 MiB in Pillow) and a few MiB more."""
    peak = bench_colors.peak_memory(4096, "keep")
    assert peak["peak_over_inputs_mib"] < 128, peak
    peak = bench_colors.peak_memory(4096, "luma")
    assert peak["peak_over_inputs_mib"] < 96, peak


@pytest.mark.slow
def test_keep_halves_the_colour_distance_on_six_photos_with_toon_demo():
    """What colour keeping is for: the mean CIEDE2000 distance to the input drops by at least
    50 % with keep against off; luma brings the mean brightness within a level."""
    rows = bench_colors.fidelity(bench_colors.Converter(SHIPPED_STYLES_DIR / "toon_demo.pt"))
    summary = bench_colors.summary(rows)
    assert set(rows) == set(bench_colors.PHOTOS) and len(rows) == 6
    assert summary["keep_saving"] >= 0.5, summary
    for name, row in rows.items():  # every photo gets closer, none further
        assert row["keep"]["ciede2000"] < 0.8 * row["off"]["ciede2000"], (name, row)
        assert row["luma"]["brightness_error"] <= 1.0, (name, row)
        assert row["keep"]["brightness_error"] <= 2.0, (name, row)
    assert summary["mean"]["off"]["brightness_error"] > 5  # toon_demo darkens: a real test
