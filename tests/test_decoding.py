"""Decoding an upload: by content, every mode to RGB, orientation, sizing, limits, and the
DecodedUpload it gives, the same from a helper process as from this thread."""

from __future__ import annotations

import io
import json
from dataclasses import fields

import numpy as np
import pytest
from conftest import encode_image, open_image, photo, photo_bytes
from PIL import Image, ImageCms

from flask_animegan.errors import BadImage, ImageTooLarge, UnsupportedImage
from flask_animegan.inputs import decoding
from flask_animegan.inputs.decoding import DecodedUpload
from flask_animegan.inputs.helper import answer_of, upload_of
from flask_animegan.inputs.isolation import Decoder
from flask_animegan.runtime.engine import InferenceEngine

BIG = 10**8


def decode_upload(data: bytes, size: int = 512, **kwargs) -> DecodedUpload:
    limits = decoding.DecodeLimits(max_pixels=kwargs.pop("max_pixels", BIG))
    return decoding.decode_upload(data, limits, size=size, **kwargs)


def decode(data: bytes, size: int = 512, **kwargs) -> Image.Image:
    """The fitted image of the upload."""
    return decode_upload(data, size, **kwargs).image


def quadrants(width: int = 80, height: int = 60) -> Image.Image:
    """Red, green / blue, white quadrants: any rotation or mirror changes it."""
    image = Image.new("RGB", (width, height))
    w, h = width // 2, height // 2
    for box, colour in (((0, 0, w, h), (255, 0, 0)), ((w, 0, width, h), (0, 255, 0)),
                        ((0, h, w, height), (0, 0, 255)), ((w, h, width, height), (255,) * 3)):
        image.paste(colour, box)
    return image


def quadrant_colours(image: Image.Image) -> list[tuple[int, ...]]:
    w, h = image.size
    points = [(w // 4, h // 4), (3 * w // 4, h // 4), (w // 4, 3 * h // 4), (3 * w // 4, 3 * h // 4)]
    return [tuple(round(c / 255) * 255 for c in image.getpixel(p)) for p in points]


# The EXIF spec's display transform for each orientation, inverted: what a camera stores.
STORED_FOR_ORIENTATION = {
    1: lambda im: im,
    2: lambda im: im.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
    3: lambda im: im.transpose(Image.Transpose.ROTATE_180),
    4: lambda im: im.transpose(Image.Transpose.FLIP_TOP_BOTTOM),
    5: lambda im: im.transpose(Image.Transpose.TRANSPOSE),
    6: lambda im: im.transpose(Image.Transpose.ROTATE_90),  # displayed by turning 90 deg CW
    7: lambda im: im.transpose(Image.Transpose.TRANSVERSE),
    8: lambda im: im.transpose(Image.Transpose.ROTATE_270),
}


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_comes_out_upright(orientation):
    upright = quadrants()
    stored = STORED_FOR_ORIENTATION[orientation](upright)
    exif = Image.Exif()
    exif[0x0112] = orientation
    decoded = decode(encode_image(stored, "JPEG", quality=95, exif=exif.tobytes()))
    assert decoded.size == upright.size
    assert quadrant_colours(decoded) == quadrant_colours(upright)


@pytest.mark.parametrize("fmt,orientation,square", [("JPEG", n, False) for n in range(1, 9)]
                         + [("JPEG", 6, True), ("PNG", 6, False), ("PNG", 8, True)])
def test_the_caches_statistics_are_of_the_upright_picture(orientation, square, fmt):
    """A photo stored turned with an EXIF orientation has the statistics of the same photo
    stored upright (reduced by 2 for the samples: a JPEG at its DCT scale), and its fitted
    size (fitted_size, no fit) is the fit's."""
    upright = photo("coffee").resize((1300, 1040))
    exif = Image.Exif()
    exif[0x0112] = orientation
    params = {"quality": 95} if fmt == "JPEG" else {}
    stored = encode_image(STORED_FOR_ORIENTATION[orientation](upright), fmt,
                          exif=exif.tobytes(), **params)
    limits = decoding.DecodeLimits()
    turned = decoding.sample_upload(stored, limits, size=256, square=square)
    plain = decoding.sample_upload(encode_image(upright, fmt, **params), limits, size=256,
                                   square=square)
    assert turned.source_size == (1300, 1040)
    assert np.abs(turned.samples.luma.astype(int) - plain.samples.luma).max() <= 2
    assert np.abs(turned.samples.cells.astype(int) - plain.samples.cells).max() <= 2
    for size in (64, 1000):
        assert decoding.fitted_size(turned.source_size, size, square) == decode(
            stored, size=size, square=square).size


def test_orientation_through_the_api(client):
    exif = Image.Exif()
    exif[0x0112] = 6
    stored = STORED_FOR_ORIENTATION[6](quadrants(120, 90))
    response = client.post("/animegan/convert",
                           data=encode_image(stored, "JPEG", exif=exif.tobytes()),
                           content_type="image/jpeg")
    assert response.status_code == 200
    assert open_image(response.data).size == (120, 90)


def rgba_half_transparent() -> Image.Image:
    image = Image.new("RGBA", (40, 20), (0, 0, 0, 255))
    image.paste((0, 0, 0, 0), (20, 0, 40, 20))
    return image


@pytest.mark.parametrize("make,fmt", [
    (lambda: rgba_half_transparent(), "PNG"),
    (lambda: rgba_half_transparent().convert("LA"), "PNG"),
    (lambda: rgba_half_transparent().convert("P"), "PNG"),  # P with a transparent index
    (lambda: rgba_half_transparent(), "WEBP"),
])
def test_alpha_is_composited_on_white(make, fmt):
    image = make()
    data = encode_image(image, fmt, lossless=True) if fmt == "WEBP" else encode_image(image, fmt)
    decoded = decode(data)
    assert decoded.mode == "RGB"
    assert decoded.getpixel((5, 10)) == (0, 0, 0)
    assert decoded.getpixel((35, 10)) == (255, 255, 255)


@pytest.mark.parametrize("mode,fmt", [("1", "PNG"), ("L", "PNG"), ("P", "GIF"), ("CMYK", "JPEG"),
                                      ("RGB", "BMP"), ("RGB", "TIFF"), ("L", "TIFF")])
def test_every_mode_becomes_rgb_with_the_same_look(mode, fmt):
    source = photo("coffee").resize((60, 40))
    data = encode_image(source.convert(mode), fmt)
    decoded = decode(data)
    assert decoded.mode == "RGB" and decoded.size == (60, 40)
    reference = source.convert(mode).convert("RGB")
    difference = np.abs(np.asarray(decoded, float) - np.asarray(reference, float)).mean()
    assert difference < 8, difference


def test_16_bit_grayscale_is_scaled_not_clipped():
    ramp = (np.linspace(0, 65535, 64 * 16).reshape(16, 64)).astype(np.uint16)
    image = Image.fromarray(ramp)
    assert image.mode == "I;16"
    data = encode_image(image, "PNG")
    decoded = np.asarray(decode(data))
    assert decoded[..., 0].min() == 0 and decoded[..., 0].max() == 255
    assert np.all(np.diff(decoded[0, :, 0].astype(int)) >= 0)  # a ramp stays a ramp


def test_an_icc_tagged_image_is_converted_and_the_profile_dropped():
    # Pillow can only build sRGB, LAB and XYZ profiles, so this checks the conversion
    # path end to end with an sRGB tag (identity within rounding), not a gamut change.
    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))
    source = photo("coffee").resize((64, 48))
    decoded = decode(encode_image(source, "PNG", icc_profile=profile.tobytes()))
    assert np.abs(np.asarray(decoded, int) - np.asarray(source, int)).max() <= 2
    assert "icc_profile" not in decoded.info


def test_animated_gif_uses_the_first_frame():
    frames = [Image.new("RGB", (32, 32), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert decode(buffer.getvalue()).getpixel((16, 16)) == (255, 0, 0)


def test_not_an_image_and_unsupported_formats():
    with pytest.raises(BadImage, match="empty"):
        decode(b"")
    with pytest.raises(BadImage, match="not an image"):
        decode(b"<html><body>hi</body></html>")
    with pytest.raises(UnsupportedImage, match="PCX"):
        decode(encode_image(photo("coffee"), "PCX"))


def test_truncated_png_and_bad_crc_are_bad_images():
    png = photo_bytes("coffee", "PNG")
    with pytest.raises(BadImage, match="truncated or corrupt"):
        decode(png[: len(png) // 2])
    corrupted = bytearray(png)
    corrupted[40] ^= 0xFF  # inside the first IDAT chunk: its CRC no longer matches
    with pytest.raises(BadImage):
        decode(bytes(corrupted))


def test_decompression_bomb_is_refused_from_the_header():
    # a tiny PNG that declares 20000 x 20000 pixels (10x the limit; 50000 x 50000 took 4 s
    # to make)
    bomb = Image.new("1", (20000, 20000))
    buffer = io.BytesIO()
    bomb.save(buffer, "PNG")
    assert len(buffer.getvalue()) < 100_000
    with pytest.raises(ImageTooLarge, match="too many pixels"):
        decode(buffer.getvalue(), max_pixels=40_000_000)


@pytest.mark.parametrize("side", [7000, 10000])  # 49 M: over our limit; 100 M: Pillow warns too
def test_images_over_the_pixel_limit_are_refused_before_decoding(side):
    buffer = io.BytesIO()
    Image.new("1", (side, side)).save(buffer, "PNG")
    with pytest.raises(ImageTooLarge, match="pixels"):
        decode(buffer.getvalue(), max_pixels=40_000_000)
    jpeg_header_only = encode_image(Image.new("RGB", (side, 8)), "JPEG")
    with pytest.raises(ImageTooLarge):
        decode(jpeg_header_only, max_pixels=side * 4)


@pytest.mark.parametrize("side", [7000, 16384])
def test_a_webp_canvas_over_the_pixel_limit_is_refused_from_its_header(side):
    """An extended WebP (alpha: a VP8X chunk) whose header declares a larger canvas than
    its picture: a 413 that names the size, whatever libwebp makes of the mismatch."""
    small = encode_image(Image.new("RGBA", (32, 24), (10, 20, 30, 128)), "WEBP")
    assert decoding.webp_canvas(small) == (32, 24)
    forged = bytearray(small)
    forged[24:27] = forged[27:30] = (side - 1).to_bytes(3, "little")
    with pytest.raises(ImageTooLarge, match=f"{side}x{side}"):
        decode(bytes(forged), max_pixels=40_000_000)
    assert decoding.webp_canvas(photo_bytes("coffee")) is None  # not a WebP


def test_big_jpegs_are_decoded_at_reduced_scale():
    big = photo("astronaut").resize((2048, 2048))
    decoded = decode_upload(encode_image(big, "JPEG"), size=512)
    assert decoded.image.size == (512, 512)  # DCT scaling 1/4, not a full 2048 decode
    assert decoded.source_size == (2048, 2048)  # the file's size, not the reduced decode's
    square = decode(encode_image(big.resize((2048, 1024)), "JPEG"), size=512, square=True)
    assert min(square.size) >= 512  # the centre square must still cover the size


@pytest.mark.parametrize("size,square", [(512, False), (512, True), (300, False), (1024, False)])
def test_a_fit_in_two_bands_is_one_resize_on_every_machine(monkeypatch, size, square):
    # a phone-sized photo (1080 x 1350) fitted under 6x runs in two bands on two threads:
    # one Lanczos resize over the whole box but for rounding (Pillow 13 may take a band's
    # two passes in the other order), and the same picture whether the bands ran side by
    # side or one after the other (a 1-CPU machine)
    from flask_animegan import process
    from flask_animegan.inputs import resample

    image = photo("astronaut").resize((1080, 1350), Image.Resampling.LANCZOS)
    side = min(image.size)
    box = ((0, (image.height - side) // 2, side, (image.height + side) // 2) if square
           else (0, 0, *image.size))
    target = decoding.output_size(box[2] - box[0], box[3] - box[1], size)
    assert resample.banded((box[2] - box[0], box[3] - box[1]), target)
    fitted = decoding.fit(image, size, square=square)
    whole = image.resize(target, Image.Resampling.LANCZOS, box=box, reducing_gap=3.0)
    difference = np.abs(np.asarray(fitted, np.int16) - np.asarray(whole, np.int16))
    assert fitted.size == target and difference.max() <= 4
    assert difference.mean() < 0.2
    monkeypatch.setattr(process, "side_thread", lambda: None)
    assert np.array_equal(np.asarray(decoding.fit(image, size, square=square)),
                          np.asarray(fitted))


def test_a_forked_child_fits_in_bands_with_a_side_thread_of_its_own():
    # gunicorn forks its workers, RQ its work horses: the parent's thread is not theirs
    import os
    import select
    import signal

    from flask_animegan.process import side_thread

    image = Image.new("RGB", (1080, 1350), (10, 20, 30))
    expected = np.asarray(decoding.fit(image, 512))
    parent_side = side_thread()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without pytest's cleanup
        child_side = side_thread()  # None on one CPU, as in the parent
        ok = (np.array_equal(np.asarray(decoding.fit(image, 512)), expected)
              and (child_side is None or child_side is not parent_side))
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    try:
        answered, _, _ = select.select([read], [], [], 60)
        if not answered:  # never hang the suite on a child stuck on a lock
            os.kill(pid, signal.SIGKILL)
        answer = os.read(read, 1) if answered else b"(no answer in 60 s)"
    finally:
        os.waitpid(pid, 0)
        os.close(read)
    assert answer == b"1"


def test_a_fit_on_the_side_thread_runs_its_bands_there_instead_of_waiting_for_itself():
    from flask_animegan.process import side_thread

    side = side_thread()
    if side is None:
        pytest.skip("one CPU: there is no side thread")
    image = Image.new("RGB", (1080, 1350), (10, 20, 30))
    fitted = side.submit(decoding.fit, image, 512).result(timeout=30)
    assert fitted.size == (410, 512) and fitted.getpixel((200, 300)) == (10, 20, 30)


def test_a_fit_that_reduces_first_runs_whole():
    # 6x or more: Pillow averages whole blocks first, which bands would place differently
    from flask_animegan.inputs import resample

    image = Image.new("RGB", (3000, 2000), (10, 20, 30))
    assert not resample.banded(image.size, decoding.output_size(*image.size, 256))
    assert decoding.fit(image, 256).getpixel((5, 5)) == (10, 20, 30)


# -- the DecodedUpload ----------------------------------------------------------------------
def exif_turned(orientation: int = 6) -> bytes:
    """A 120x90 picture stored as 90x120 with an EXIF orientation that turns it back."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode_image(STORED_FOR_ORIENTATION[orientation](quadrants(120, 90)), "JPEG",
                        exif=exif.tobytes())


def sixteen_bit_png() -> bytes:
    ramp = (np.linspace(0, 65535, 96 * 64).reshape(64, 96)).astype(np.uint16)
    return encode_image(Image.fromarray(ramp), "PNG")


#: One file per decode path: (name, file, format, source size).
UPLOADS = [
    ("JPEG", lambda: photo_bytes("astronaut", "JPEG"), "JPEG", (512, 512)),
    ("JPEG turned by EXIF", exif_turned, "JPEG", (120, 90)),
    ("CMYK JPEG", lambda: encode_image(photo("coffee").resize((150, 100)).convert("CMYK"),
                                       "JPEG"), "JPEG", (150, 100)),
    ("PNG with alpha", lambda: encode_image(rgba_half_transparent(), "PNG"), "PNG", (40, 20)),
    ("16-bit PNG", sixteen_bit_png, "PNG", (96, 64)),
    ("GIF", lambda: encode_image(photo("chelsea").resize((90, 60)).convert("P"), "GIF"),
     "GIF", (90, 60)),
    ("WebP", lambda: photo_bytes("chelsea", "WEBP"), "WEBP", (451, 300)),
]


@pytest.mark.parametrize("name,make,fmt,source_size", UPLOADS, ids=[u[0] for u in UPLOADS])
def test_a_decode_says_what_the_file_was(name, make, fmt, source_size):
    decoded = decode_upload(make(), size=64)
    assert decoded.format == fmt and decoded.source_size == source_size
    assert decoded.image.mode == "RGB"
    assert decoded.image.size == decoding.output_size(*source_size, 64)
    assert decoded.image.info == {}  # nothing of the file travels beside the pixels


@pytest.fixture(scope="module")
def decoders():
    return {isolation: Decoder(limits=decoding.DecodeLimits(max_pixels=BIG), isolation=isolation,
                               timeout=10, slots=1, max_queue=1, queue_timeout=10)
            for isolation in ("process", "thread")}


@pytest.mark.parametrize("square", [False, True])
@pytest.mark.parametrize("name,make,fmt,source_size", UPLOADS, ids=[u[0] for u in UPLOADS])
def test_a_helper_process_gives_the_same_decoded_upload_as_this_thread(decoders, name, make,
                                                                       fmt, source_size, square):
    data = make()
    helper = decoders["process"].decode(data, size=96, square=square)
    thread = decoders["thread"].decode(data, size=96, square=square)
    assert isinstance(helper, DecodedUpload)
    assert (helper.source_size, helper.format) == (thread.source_size, thread.format)
    assert (helper.source_size, helper.format) == (source_size, fmt)
    assert isinstance(helper.source_size, tuple)  # not JSON's list
    assert helper.image.mode == thread.image.mode == "RGB"
    assert helper.image.size == thread.image.size
    assert helper.image.tobytes() == thread.image.tobytes()
    assert helper.jpeg_tables == thread.jpeg_tables


def test_a_decode_names_how_a_jpeg_was_compressed_and_nothing_for_other_formats():
    """The same for two photos saved at one quality, another at another quality or
    sampling; 0 for every format that is not a JPEG, whatever it compresses with."""
    def tables(name: str, **params: object) -> int:
        return decode_upload(photo_bytes(name, "JPEG", **params), size=64).jpeg_tables

    at_90 = tables("chelsea", quality=90)
    assert at_90 != 0 and at_90 == tables("astronaut", quality=90)
    assert at_90 != tables("chelsea", quality=89) != tables("chelsea", quality=70)
    assert at_90 != tables("chelsea", quality=90, subsampling=0)  # 4:4:4, not 4:2:0
    for name, make, fmt, _ in UPLOADS:
        assert (decode_upload(make(), size=64).jpeg_tables != 0) is (fmt == "JPEG"), name


def test_the_helper_protocol_carries_every_field_of_the_decoded_upload():
    decoded = decode_upload(exif_turned(), size=64)
    header, pixels = answer_of(decoded)
    header = json.loads(json.dumps(header))  # as it travels
    named = {field.name for field in fields(DecodedUpload)} - {"image"}
    assert named <= set(header) and header["ok"] is True
    again = upload_of(header, pixels)
    assert again.source_size == decoded.source_size and again.format == decoded.format
    assert again.jpeg_tables == decoded.jpeg_tables > 0
    assert again.image.tobytes() == decoded.image.tobytes()


@pytest.mark.parametrize("size_in,size,expected", [
    ((600, 400), 512, (512, 341)), ((400, 600), 512, (341, 512)), ((300, 200), 512, (300, 200)),
    ((1, 4000), 512, (1, 512)), ((4000, 1), 512, (512, 1)), ((1, 1), 512, (1, 1)),
])
def test_output_size_rule(size_in, size, expected):
    assert decoding.output_size(*size_in, size) == expected


@pytest.mark.parametrize("shape", [(1, 1), (1, 300), (300, 1), (7, 9), (16, 15)])
def test_images_smaller_than_the_network_needs_still_convert(app, shape):
    engine: InferenceEngine = app.extensions["animegan"].engine
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (*shape, 3), np.uint8))
    result = engine.run(image)
    assert result.size == image.size and result.mode == "RGB"
