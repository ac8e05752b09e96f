"""The exact JPEG re-save check: which decodes carry a grid, and what re-encoding proves."""

from __future__ import annotations

import io
import random
import time

import numpy as np
import pytest
from conftest import PHOTOS, encode_image, photo
from PIL import Image, ImageCms, ImageFilter, PngImagePlugin

from flask_animegan.cache.jpeg_grid import (
    INFO_KEY,
    LOSSY_KEY,
    UPLOAD_MAX_BYTES,
    JpegGrid,
    grid_of,
    is_lossy_webp,
    keepable_upload,
    same_source,
    same_upload,
)
from flask_animegan.inputs import decoding
from flask_animegan.inputs.decoding import (
    DecodeLimits,
    count_jpeg_scans,
    without_metadata,
)
from flask_animegan.inputs.isolation import Decoder

SIDE = 256


def fitted_photo(name: str, size: int = SIDE) -> Image.Image:
    """The photo as the service would fit it, via a lossless file."""
    data = encode_image(photo(name), "PNG", compress_level=0)
    return decoding.decode_upload(data, decoding.DecodeLimits(max_pixels=10**8), size=size)


def decoded(data: bytes, size: int = SIDE, square: bool = False) -> Image.Image:
    return decoding.decode_upload(data, decoding.DecodeLimits(max_pixels=10**8), size=size, square=square)


def faint_blur(image: Image.Image, box: tuple[int, int, int, int]) -> Image.Image:
    copy = image.copy()
    copy.paste(image.filter(ImageFilter.GaussianBlur(5)).crop(box), box[:2])
    return copy


# -- which decodes carry a grid ---------------------------------------------------------

@pytest.mark.parametrize("params", [{"quality": 90}, {"quality": 75, "subsampling": 0},
                                    {"quality": 95, "subsampling": 1},
                                    {"quality": 85, "progressive": True}],
                         ids=["q90 4:2:0", "q75 4:4:4", "q95 4:2:2", "progressive"])
def test_a_jpeg_decoded_at_its_own_size_carries_its_grid(params):
    image = fitted_photo("coffee")
    data = encode_image(image, "JPEG", **params)
    found = grid_of(decoded(data))
    assert found is not None and found == JpegGrid.of(Image.open(io.BytesIO(data)))
    assert found.subsampling == params.get("subsampling", 2)


def test_a_gray_jpeg_carries_a_one_table_grid():
    data = encode_image(fitted_photo("camera").convert("L"), "JPEG", quality=90)
    found = grid_of(decoded(data))
    assert found is not None and found.mode == "L" and len(found.qtables) == 1


def exif_turned(image: Image.Image) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode_image(image, "JPEG", quality=90, exif=exif.tobytes())


@pytest.mark.parametrize("upload, size, square", [
    pytest.param(lambda im: encode_image(im, "JPEG"), 200, False, id="scaled down"),
    pytest.param(lambda im: encode_image(im, "JPEG", quality=90), SIDE, True,
                 id="cropped to a square"),
    pytest.param(exif_turned, SIDE, False, id="EXIF turned"),
    pytest.param(lambda im: encode_image(im, "JPEG", icc_profile=ImageCms.ImageCmsProfile(
        ImageCms.createProfile("sRGB")).tobytes()), SIDE, False, id="colour profile"),
    pytest.param(lambda im: encode_image(im, "PNG"), SIDE, False, id="PNG"),
    pytest.param(lambda im: encode_image(im.convert("CMYK"), "JPEG"), SIDE, False, id="CMYK"),
])
def test_pixels_that_are_not_the_jpegs_own_carry_no_grid(upload, size, square):
    image = fitted_photo("chelsea")  # 256 x 170: a square crop or a downscale changes it
    data = upload(image)
    assert grid_of(decoded(data, size=size, square=square)) is None
    if size != SIDE or square:  # the same file, decoded as it is, does carry one
        assert grid_of(decoded(data)) is not None


def test_the_grid_crosses_the_decode_helper_process():
    data = encode_image(fitted_photo("rocket"), "JPEG", quality=90)
    answers = {}
    for isolation in ("process", "thread"):
        decoder = Decoder(limits=DecodeLimits(), isolation=isolation, timeout=10, slots=1,
                          max_queue=2, queue_timeout=5)
        image = decoder.decode(data, size=SIDE)
        answers[isolation] = (grid_of(image), image.tobytes())
    assert answers["process"] == answers["thread"] and answers["process"][0] is not None


# -- the grid's own formats ----------------------------------------------------------------

def test_a_grid_round_trips_through_json_and_bytes():
    grid = grid_of(decoded(encode_image(fitted_photo("astronaut"), "JPEG", quality=83)))
    assert JpegGrid.from_json(grid.to_json()) == grid
    packed = grid.pack()
    assert JpegGrid.unpack(b"xy" + packed + b"tail", 2) == (grid, 2 + len(packed))


def test_malformed_grids_read_as_none_and_never_raise():
    packed = grid_of(decoded(encode_image(fitted_photo("coffee"), "JPEG"))).pack()
    for end in range(len(packed)):
        assert JpegGrid.unpack(packed[:end])[0] is None
    rng = random.Random(7)
    for _ in range(300):
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        grid, _ = JpegGrid.unpack(blob)
        assert grid is None or grid.valid()
    for value in (None, 1, "x", {}, {"mode": "RGB"}, {"mode": "P", "subsampling": 2,
                                                       "qtables": [[1] * 64]},
                  {"mode": "L", "subsampling": -1, "qtables": [[0] * 64]},
                  {"mode": "L", "subsampling": -1, "qtables": [[1] * 63]}):
        assert JpegGrid.from_json(value) is None


# -- what re-encoding proves -----------------------------------------------------------------

@pytest.mark.parametrize("name", PHOTOS)
def test_every_jpeg_re_save_of_an_input_is_recognised_exactly(name):
    """Each photo saved at q70-95 and each subsampling: the same source, both ways."""
    original = fitted_photo(name)
    for quality, subsampling in ((70, 2), (85, 0), (95, 1), (90, 2)):
        copy = decoded(encode_image(original, "JPEG", quality=quality, subsampling=subsampling))
        assert same_source(copy, grid_of(copy), original, None) is True, (quality, subsampling)
        assert same_source(original, None, copy, grid_of(copy)) is True
        again = decoded(encode_image(copy, "JPEG", quality=quality, subsampling=subsampling))
        assert same_source(again, grid_of(again), copy, grid_of(copy)) is True


@pytest.mark.parametrize("name", ["rocket", "moon", "clock", "retina"])
def test_a_faint_edit_saved_as_jpeg_is_an_edit_both_ways(name):
    """A blur of a flat corner (under a level on average) cannot hide in re-encoding noise."""
    original = fitted_photo(name)
    box = (8, 8, 8 + original.width // 10, 8 + original.height // 10)
    edited = decoded(encode_image(faint_blur(original, box), "JPEG", quality=90))
    change = np.abs(np.asarray(edited.crop(box), np.float32)
                    - np.asarray(original.crop(box), np.float32)).mean()
    plain = decoded(encode_image(original, "JPEG", quality=90))
    noise = np.abs(np.asarray(plain.crop(box), np.float32)
                   - np.asarray(original.crop(box), np.float32)).mean()
    print(f"\n{name}: the edit changes its box by {change:.2f} levels, a re-save by {noise:.2f}")
    assert same_source(edited, grid_of(edited), original, None) is False
    assert same_source(original, None, edited, grid_of(edited)) is False
    assert same_source(plain, grid_of(plain), original, None) is True


def test_inputs_of_other_sizes_or_without_a_grid_get_no_verdict():
    original = fitted_photo("coffee")
    copy = decoded(encode_image(original, "JPEG", quality=90))
    smaller = original.resize((original.width - 8, original.height - 8))
    assert same_source(copy, grid_of(copy), smaller, None) is None
    lossless_edit = faint_blur(original, (0, 0, 40, 40))
    assert same_source(lossless_edit, None, original, None) is None  # the cell hashes' job
    other = fitted_photo("chelsea").resize(original.size)
    assert same_source(copy, grid_of(copy), other, None) is None  # nothing in common
    assert INFO_KEY in copy.info


# -- lossy WebP: no exact check, so identical pixels only ------------------------------------

def webp(image: Image.Image, **params) -> bytes:
    return encode_image(image, "WEBP", **params)


def test_lossy_webps_are_told_from_lossless_ones_by_their_chunks():
    image = fitted_photo("coffee")
    animation = io.BytesIO()
    image.save(animation, "WEBP", save_all=True, append_images=[image.rotate(90)],
               lossless=True)
    assert is_lossy_webp(webp(image, quality=80))
    assert is_lossy_webp(webp(image.convert("RGBA"), quality=80))  # VP8X + ALPH + VP8
    assert not is_lossy_webp(webp(image, lossless=True))
    assert not is_lossy_webp(webp(image.convert("RGBA"), lossless=True))
    assert is_lossy_webp(animation.getvalue())  # frames: counted as lossy
    assert not is_lossy_webp(encode_image(image, "PNG"))
    data = webp(image, quality=80)
    for end in range(0, 64):  # a cut file never raises (the decoder refuses it anyway)
        is_lossy_webp(data[:end])


def test_a_decoded_lossy_webp_is_marked_in_both_decode_modes():
    data = webp(fitted_photo("rocket"), quality=80)
    for isolation in ("process", "thread"):
        decoder = Decoder(limits=DecodeLimits(), isolation=isolation, timeout=10, slots=1,
                          max_queue=2, queue_timeout=5)
        assert decoder.decode(data, size=SIDE).info.get(LOSSY_KEY) is True
        lossless = decoder.decode(webp(fitted_photo("rocket"), lossless=True), size=SIDE)
        assert LOSSY_KEY not in lossless.info


def test_a_webp_of_many_empty_chunks_is_walked_in_bounded_time():
    chunks = b"JUNK\x00\x00\x00\x00" * 2_000_000  # 16 MB of empty chunks, no image chunk
    data = b"RIFF" + (len(chunks) + 4).to_bytes(4, "little") + b"WEBP" + chunks
    started = time.perf_counter()
    assert is_lossy_webp(data)  # no image chunk in reach: counted as lossy
    assert time.perf_counter() - started < 0.5


# -- small uploads the service shrinks: the same check at their own resolution ------------

def whole(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def corner_box(image: Image.Image) -> tuple[int, int, int, int]:
    return (8, 8, 8 + image.width // 10, 8 + image.height // 10)


@pytest.mark.parametrize("name", ["rocket", "moon", "clock", "cell", "coffee"])
def test_a_faint_edit_of_a_small_upload_is_an_edit_at_its_own_size(name):
    """The classes a shrunk JPEG hid from every statistic: A uploads a JPEG (or a PNG)
    larger than the output; B blurs a flat corner of that file at its own resolution and
    saves it as JPEG q90 or q75. Whatever came first, it is an edit; a plain re-save of
    A's file is the same source."""
    jpeg = encode_image(photo(name), "JPEG", quality=90)
    png = encode_image(photo(name), "PNG", compress_level=6)
    for first in (jpeg, png):
        image = whole(first)
        for quality in (90, 75):
            edit = encode_image(faint_blur(image, corner_box(image)), "JPEG", quality=quality)
            plain = encode_image(image, "JPEG", quality=quality)
            assert same_upload(edit, first) is False, quality
            assert same_upload(first, edit) is False
            assert same_upload(plain, first) is True
            assert same_upload(first, plain) is True


def test_uploads_get_no_verdict_unless_both_are_small_files_of_one_size():
    image = photo("coffee")
    jpeg = encode_image(image, "JPEG", quality=90)
    assert same_upload(jpeg, jpeg) is True  # the same file
    smaller = encode_image(image.resize((image.width - 16, image.height)), "JPEG", quality=90)
    assert same_upload(jpeg, smaller) is None
    png = encode_image(image, "PNG")
    assert same_upload(png, encode_image(faint_blur(image, corner_box(image)), "PNG")) is None
    noise = np.random.default_rng(1).integers(0, 256, (1800, 1800, 3), np.uint8)
    heavy = encode_image(Image.fromarray(noise), "PNG")
    assert len(heavy) > UPLOAD_MAX_BYTES and not keepable_upload(heavy)
    assert same_upload(heavy, jpeg) is None
    wide = Image.new("RGB", (4100, 3100), (40, 90, 160))  # 12.7 megapixels in a few KiB
    assert same_upload(encode_image(wide, "JPEG"), encode_image(wide, "JPEG", quality=80)) is None
    cmyk = encode_image(image.convert("CMYK"), "JPEG", quality=90)
    assert same_upload(cmyk, encode_image(image.convert("CMYK"), "JPEG", quality=80)) is None
    webp_file = webp(image, lossless=True)
    assert same_upload(webp_file, jpeg) is None and not keepable_upload(webp_file)


def test_kept_uploads_that_do_not_decode_give_no_verdict_and_never_raise():
    """A stored value is read back from the cache's storage (Redis): a truncated, flipped
    or scan-padded file is no verdict, never an error, and never a long decode."""
    jpeg = encode_image(photo("rocket"), "JPEG", quality=90)
    rng = random.Random(11)
    started = time.perf_counter()
    for cut in [3, 20, 200, len(jpeg) // 2, len(jpeg) - 2]:
        assert same_upload(jpeg[:cut], jpeg) in (None, False)
    for _ in range(40):
        flipped = bytearray(jpeg)
        flipped[rng.randrange(len(jpeg))] ^= 1 << rng.randrange(8)
        assert same_upload(bytes(flipped), jpeg) in (None, True, False)
    limit = DecodeLimits().max_scans
    scans = jpeg[:-2] + jpeg[jpeg.rindex(b"\xff\xda"):-2] * limit + b"\xff\xd9"
    assert count_jpeg_scans(scans) > limit
    assert same_upload(scans, jpeg) is None
    assert time.perf_counter() - started < 20


def test_whole_size_checks_run_one_at_a_time_and_a_long_wait_is_a_miss(monkeypatch):
    """Each holds up to about 130 MiB, so a process runs one at a time; a check that
    cannot start within the wait says "differ" (a miss), never "no verdict" (which would
    leave a faint edit to the statistics)."""
    from flask_animegan.cache import jpeg_grid

    jpeg = encode_image(photo("rocket"), "JPEG", quality=90)
    resaved = encode_image(Image.open(io.BytesIO(jpeg)).convert("RGB"), "JPEG", quality=75)
    assert same_upload(resaved, jpeg) is True
    monkeypatch.setattr(jpeg_grid, "WHOLE_SIZE_WAIT", 0.2)
    with jpeg_grid._WHOLE_SIZE_CHECK:  # another thread's check in progress
        started = time.perf_counter()
        assert same_upload(resaved, jpeg) is False
        assert time.perf_counter() - started < 2
    assert same_upload(resaved, jpeg) is True


def with_metadata(fmt: str) -> bytes:
    """The astronaut with GPS and camera details (EXIF), a comment or text chunk, and,
    for a JPEG, a video appended after its end as some phones do."""
    exif = Image.Exif()
    exif[0x010F] = "CameraMaker"
    exif[0x8825] = {1: "N", 2: (51.0, 30.0, 1.0)}  # GPS
    if fmt == "PNG":
        info = PngImagePlugin.PngInfo()
        info.add_text("Location", "HomeAddress")
        return encode_image(photo("astronaut"), "PNG", pnginfo=info, exif=exif.tobytes())
    return encode_image(photo("astronaut"), "JPEG", quality=90, progressive=fmt == "progressive",
                        exif=exif.tobytes(), comment=b"HomeAddress") + b"ftypmp4 \xff\xd9"


@pytest.mark.parametrize("fmt", ["JPEG", "progressive", "PNG"])
def test_a_kept_file_has_no_metadata_and_the_same_pixels(fmt):
    data = with_metadata(fmt)
    assert b"CameraMaker" in data and b"HomeAddress" in data
    kept = without_metadata(data)
    for secret in (b"CameraMaker", b"HomeAddress", b"ftypmp4", b"Exif"):
        assert secret not in kept
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(kept))),
                          np.asarray(Image.open(io.BytesIO(data))))
    assert without_metadata(kept) == kept


@pytest.mark.parametrize("fmt", ["JPEG", "progressive", "PNG"])
def test_stripping_cut_or_flipped_files_never_raises(fmt):
    """Every prefix up to 300 bytes, a seeded sample of longer ones, and seeded bit flips:
    bytes or nothing, never an error, and never metadata."""
    data = with_metadata(fmt)
    rng = random.Random(fmt)
    cuts = list(range(300)) + rng.sample(range(300, len(data)), 60)
    for cut in cuts:
        kept = without_metadata(data[:cut])
        assert b"CameraMaker" not in kept
    for _ in range(200):
        flipped = bytearray(data)
        flipped[rng.randrange(min(len(data), 4096))] ^= 1 << rng.randrange(8)
        assert isinstance(without_metadata(bytes(flipped)), bytes)
    assert without_metadata(b"GIF89a" + data) == b""
