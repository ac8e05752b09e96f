"""Decoding an upload: by content, every mode to RGB, orientation, sizing, limits, and the
DecodedUpload it gives, the same from a helper process as from this thread."""

from __future__ import annotations

import io

import numpy as np
import pytest
from conftest import encode_image, open_image, photo, photo_bytes
from PIL import Image, ImageCms

from flask_animegan.errors import BadImage, ImageTooLarge, UnsupportedImage
from flask_animegan.inputs import decoding
from flask_animegan.inputs.decoding import DecodedUpload
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


@pytest.mark.parametrize("fmt,orientation", [("JPEG", n) for n in (1, 3, 6, 8)]
                         + [("PNG", 6), ("PNG", 8)])
def test_a_cover_fit_is_upright_and_its_centre_square_is_the_size(fmt, orientation):
    """A cover fit's short side is the size, upright whatever the EXIF orientation, and its
    centre square is the square fit but for resampling (what a face style crops when no
    face is found); fitted_size says its size without a decode."""
    upright = photo("coffee").resize((1300, 1040))
    exif = Image.Exif()
    exif[0x0112] = orientation
    params = {"quality": 95} if fmt == "JPEG" else {}
    stored = encode_image(STORED_FOR_ORIENTATION[orientation](upright), fmt,
                          exif=exif.tobytes(), **params)
    covered = decode_upload(stored, size=256, cover=True)
    assert covered.source_size == (1300, 1040)
    assert covered.image.size == (320, 256) == decoding.fitted_size((1300, 1040), 256,
                                                                    cover=True)
    plain = decode(encode_image(upright, fmt, **params), size=256, cover=True)
    assert np.abs(np.asarray(covered.image, int) - np.asarray(plain, int)).mean() < 1
    centre = covered.image.crop((32, 0, 288, 256))
    square = decode(stored, size=256, square=True)
    assert square.size == (256, 256)
    assert np.abs(np.asarray(centre, int) - np.asarray(square, int)).mean() < 3
    for size in (64, 1000):
        for fit in ({}, {"square": True}, {"cover": True}):
            assert decoding.fitted_size(covered.source_size, size, **fit) == decode(
                stored, size=size, **fit).size


def test_a_cover_fit_never_upscales_and_is_not_square_too():
    small = encode_image(photo("coffee").resize((300, 200)), "PNG")
    assert decode(small, size=512, cover=True).size == (300, 200)
    assert decode(small, size=100, cover=True).size == (150, 100)
    with pytest.raises(ValueError):
        decode(small, size=100, cover=True, square=True)


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


@pytest.mark.parametrize("size,square", [(512, False), (512, True), (256, False), (1024, False)])
def test_a_fit_is_one_lanczos_resize_of_its_box(size, square):
    image = photo("astronaut").resize((1080, 1350), Image.Resampling.LANCZOS)
    side = min(image.size)
    box = ((0, (image.height - side) // 2, side, (image.height + side) // 2) if square
           else (0, 0, *image.size))
    target = decoding.output_size(box[2] - box[0], box[3] - box[1], size)
    whole = image.resize(target, Image.Resampling.LANCZOS, box=box, reducing_gap=3.0)
    assert decoding.fit(image, size, square=square).tobytes() == whole.tobytes()


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


@pytest.mark.parametrize("fit", [{}, {"square": True}, {"cover": True}],
                         ids=["long side", "square", "cover"])
@pytest.mark.parametrize("name,make,fmt,source_size", UPLOADS, ids=[u[0] for u in UPLOADS])
def test_a_helper_process_gives_the_same_decoded_upload_as_this_thread(decoders, name, make,
                                                                       fmt, source_size, fit):
    data = make()
    helper = decoders["process"].decode(data, size=48, **fit)
    thread = decoders["thread"].decode(data, size=48, **fit)
    assert isinstance(helper, DecodedUpload)
    assert (helper.source_size, helper.format) == (thread.source_size, thread.format)
    assert (helper.source_size, helper.format) == (source_size, fmt)
    assert isinstance(helper.source_size, tuple)  # not JSON's list
    assert helper.image.mode == thread.image.mode == "RGB"
    assert helper.image.size == thread.image.size
    assert helper.image.tobytes() == thread.image.tobytes()


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
