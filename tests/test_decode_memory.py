"""The decode's memory budget against the real peak: ANIMEGAN_MAX_DECODE_BYTES bounds what
one decode takes in the server process (``thread`` isolation), for every format, mode and
path, and a helper process's address-space limit lets every decode under it through.

Each decode runs in a fresh Python process, after its imports and a small decode of the same
kind, and its peak is the growth of the resident size (VmHWM after the decode minus VmRSS
before it). The corpus is made for a small budget (48 MiB) so it is quick: each file is sized
so that its estimate is just under the budget, and made larger until it is over."""

from __future__ import annotations

import io
import json
import math
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image, ImageCms

from flask_animegan.inputs.decoding import DecodeLimits, decode_cost, storage_bytes
from flask_animegan.inputs.isolation import Decoder

pytestmark = pytest.mark.slow  # about a minute: two fresh processes a case

MiB = 1 << 20
BUDGET = 48 * MiB
#: What a measured peak may exceed the estimate by, whatever the image's size: the
#: allocator's rounding and the interpreter's own small objects.
SLACK = 8 * MiB
#: A refused file may cost no more than this: its header was read, not its pixels.
REFUSED_PEAK = 4 * MiB

LIMITS = DecodeLimits(max_pixels=10**9, max_bytes=BUDGET, max_aspect=50, max_scans=1000)


# -- the corpus ---------------------------------------------------------------------------
def _save(image: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def _picture(mode: str, width: int, height: int) -> Image.Image:
    """A cheap picture with structure (gradients), so no decoder can skip its rows."""
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :]
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    ramp = (x * 0.7 + y * 0.3)
    rgb = np.stack([ramp, 1 - ramp, np.abs(x - y) + 0 * ramp], axis=-1)
    image = Image.fromarray((rgb * 255).astype(np.uint8), "RGB")
    if mode == "RGBA":
        image.putalpha(Image.fromarray((ramp * 255).astype(np.uint8), "L"))
    elif mode == "LA":
        image = image.convert("L")
        image.putalpha(Image.fromarray((ramp * 255).astype(np.uint8), "L"))
    elif mode == "I;16":
        image = Image.fromarray((ramp * 65535).astype(np.uint16))
    elif mode == "I":
        image = Image.fromarray((ramp * 4e6 - 1e6).astype(np.int32), "I")
    elif mode == "F":
        image = Image.fromarray(ramp * 300 - 20, "F")
    elif mode != "RGB":
        image = image.convert(mode)
    return image


def _srgb_icc() -> bytes:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def _transparent_p(width: int, height: int) -> Image.Image:
    image = _picture("P", width, height)
    image.info["transparency"] = 0
    return image


def _frames(mode: str, width: int, height: int) -> list[Image.Image]:
    first = _picture(mode, width, height)
    return [first, first.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]


def _animated(fmt: str, mode: str, **params: object) -> Callable[[int, int], bytes]:
    def make(width: int, height: int) -> bytes:
        first, *rest = _frames(mode, width, height)
        return _save(first, fmt, save_all=True, append_images=rest, duration=100, **params)
    return make


def _rle8_bmp(width: int, height: int) -> bytes:
    """An 8-bit run-length-encoded BMP (Pillow writes none): runs of 255 of a colour."""
    rows = []
    for y in range(height):
        row, left = bytearray(), width
        while left:
            run = min(255, left)
            row += bytes((run, (y + left) & 0xFF))
            left -= run
        rows.append(bytes(row) + b"\x00\x00")
    pixels = b"".join(rows) + b"\x00\x01"
    palette = b"".join(bytes((i, 255 - i, i // 2, 0)) for i in range(256))
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8, 1, len(pixels), 2835, 2835,
                       256, 0)
    offset = 14 + len(info) + len(palette)
    header = struct.pack("<2sIHHI", b"BM", offset + len(pixels), 0, 0, offset)
    return header + info + palette + pixels


def _plain(mode: str, fmt: str, **params: object) -> Callable[[int, int], bytes]:
    return lambda width, height: _save(_picture(mode, width, height), fmt, **params)


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[int, int], bytes]
    size: int = 128
    square: bool = False
    cover: bool = False


#: Every format, mode and path of the decode. JPEGs get a size large enough to decode
#: them whole (a baseline JPEG decoded at a reduced scale would need 800 megapixels to
#: reach the budget), except the progressive ones, whose coefficients are kept at full
#: size whatever the scale.
CASES = [
    Case("JPEG RGB", _plain("RGB", "JPEG"), size=4096),
    Case("JPEG RGB 4:4:4", _plain("RGB", "JPEG", subsampling=0), size=4096),
    Case("JPEG L", _plain("L", "JPEG"), size=4096),
    Case("JPEG CMYK", _plain("CMYK", "JPEG"), size=4096),
    Case("JPEG ICC", _plain("RGB", "JPEG", icc_profile=_srgb_icc()), size=4096),
    Case("JPEG EXIF turn", _plain("RGB", "JPEG", exif=_exif(6)), size=4096),
    Case("JPEG square crop", _plain("RGB", "JPEG"), size=4096, square=True),
    Case("JPEG progressive", _plain("RGB", "JPEG", progressive=True), size=4096),
    # decoded whole (under 2 x DRAFT_MARGIN the output) then fitted, and a cover fit's
    # larger picture
    Case("JPEG RGB fitted under 2.5x", _plain("RGB", "JPEG"), size=1536),
    Case("JPEG square crop fitted under 2.5x", _plain("RGB", "JPEG"), size=1536, square=True),
    Case("JPEG cover", _plain("RGB", "JPEG"), size=1536, cover=True),
    Case("JPEG progressive drafted", _plain("RGB", "JPEG", progressive=True), size=128),
    Case("JPEG progressive CMYK drafted", _plain("CMYK", "JPEG", progressive=True),
         size=128),
    Case("PNG RGB", _plain("RGB", "PNG", compress_level=1)),
    Case("PNG RGB fitted under 6x", _plain("RGB", "PNG", compress_level=1), size=1024),
    Case("PNG RGB cover", _plain("RGB", "PNG", compress_level=1), size=1024, cover=True),
    Case("PNG RGBA cover", _plain("RGBA", "PNG", compress_level=1), size=512, cover=True),
    Case("PNG RGBA", _plain("RGBA", "PNG", compress_level=1)),
    Case("PNG RGBA square crop", _plain("RGBA", "PNG", compress_level=1), square=True),
    Case("PNG LA", _plain("LA", "PNG", compress_level=1)),
    Case("PNG L", _plain("L", "PNG", compress_level=1)),
    Case("PNG 1", _plain("1", "PNG", compress_level=1)),
    Case("PNG P", _plain("P", "PNG", compress_level=1)),
    Case("PNG P transparency",
         lambda w, h: _save(_transparent_p(w, h), "PNG", compress_level=1, transparency=0)),
    Case("PNG I;16", _plain("I;16", "PNG", compress_level=1)),
    Case("PNG ICC", _plain("RGB", "PNG", compress_level=1, icc_profile=_srgb_icc())),
    Case("PNG RGBA ICC", _plain("RGBA", "PNG", compress_level=1, icc_profile=_srgb_icc())),
    Case("PNG interlaced", lambda w, h: _interlaced_png(w, h)),
    Case("APNG RGBA", _animated("PNG", "RGBA", compress_level=1)),
    Case("GIF P", _plain("P", "GIF")),
    Case("GIF transparency", lambda w, h: _save(_transparent_p(w, h), "GIF", transparency=0)),
    Case("GIF animated", _animated("GIF", "P")),
    Case("WebP lossy", _plain("RGB", "WEBP", quality=50, method=0)),
    Case("WebP lossless RGBA", _plain("RGBA", "WEBP", lossless=True, quality=0, method=0)),
    Case("WebP animated RGBA", _animated("WEBP", "RGBA", lossless=True, quality=0, method=0)),
    Case("WebP animated square crop", _animated("WEBP", "RGB", quality=50, method=0),
         square=True),
    Case("BMP RGB", _plain("RGB", "BMP")),
    Case("BMP RLE8", _rle8_bmp),
    Case("TIFF RGB raw", _plain("RGB", "TIFF")),
    Case("TIFF RGB LZW", _plain("RGB", "TIFF", compression="tiff_lzw")),
    Case("TIFF LZW one strip", _plain("RGB", "TIFF", compression="tiff_lzw",
                                      strip_size=1 << 40)),
    Case("TIFF CMYK", _plain("CMYK", "TIFF", compression="tiff_lzw")),
    Case("TIFF I;16", _plain("I;16", "TIFF")),
    Case("TIFF I", _plain("I", "TIFF")),
    Case("TIFF F", _plain("F", "TIFF")),
    Case("TIFF F deflate", _plain("F", "TIFF", compression="tiff_adobe_deflate")),
]


def _interlaced_png(width: int, height: int) -> bytes:
    """An Adam7-interlaced RGB PNG (Pillow writes none), its rows filtered with None."""
    import zlib

    pixels = np.asarray(_picture("RGB", width, height))
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
              (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = bytearray()
    for x0, y0, dx, dy in passes:
        sub = pixels[y0::dy, x0::dx]
        if sub.size:
            rows = np.concatenate([np.zeros((sub.shape[0], 1), np.uint8),
                                   sub.reshape(sub.shape[0], -1)], axis=1)
            raw += rows.tobytes()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height,
                                                              8, 2, 0, 0, 1))
            + chunk(b"IDAT", zlib.compress(bytes(raw), 1)) + chunk(b"IEND", b""))


def old_estimate(data: bytes, case: Case) -> int:
    """The estimate before it counted the copies: the storage plus one RGB copy."""
    image = Image.open(io.BytesIO(data))
    width, height = image.size
    if image.format == "JPEG":
        side = min(width, height) if case.square or case.cover else max(width, height)
        scale = 3 * case.size / side
        if scale < 1:
            image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
    width, height = image.size
    return width * height * (storage_bytes(image.mode) + (0 if image.mode == "RGB" else 4))


def sized(case: Case, share: float) -> bytes:
    """The case's file at a 4:3 size whose estimate is about ``share`` of the budget."""
    width, height = 400, 300
    for _ in range(8):
        data = case.make(width, height)
        cost = decode_cost(data, size=case.size, square=case.square, cover=case.cover)
        if abs(cost / BUDGET - share) < 0.04:
            break
        scale = math.sqrt(share * BUDGET / cost)
        width, height = max(8, round(width * scale)), max(6, round(height * scale))
    return data


# -- measuring in a fresh process -----------------------------------------------------------
CHILD = r"""
import gc, json, sys, threading
from flask_animegan.errors import ConversionError
from flask_animegan.inputs.decoding import DecodeLimits, decode_upload
from flask_animegan.inputs.isolation import Decoder
from flask_animegan.process import configure_decoding

configure_decoding()
job = json.loads(sys.stdin.read())
limits = DecodeLimits(**job["limits"])

def status(key):
    with open("/proc/self/status") as lines:
        return next(int(l.split()[1]) * 1024 for l in lines if l.startswith(key + ":"))

def decode(data, decoder=None):
    try:
        fit = {"size": job["size"], "square": job["square"], "cover": job["cover"]}
        if decoder is None:
            decode_upload(data, limits, **fit)
        else:
            decoder.decode(data, **fit)
        return 200
    except ConversionError as exc:
        return exc.status

def read(path):
    with open(path, "rb") as file:
        return file.read()

for warm in job["warm"]:
    decode(read(warm))  # the plugins, their libraries and NumPy are loaded now
uploads = [read(path) for path in job["paths"]]  # the uploads are not the decode's
decoder = Decoder(limits=limits, isolation="thread", timeout=60, slots=2, max_queue=0,
                  queue_timeout=60)
gc.collect()
before = status("VmRSS")
if len(uploads) == 1:
    statuses = [decode(uploads[0])]
else:  # at once, through the decode gate's two slots
    statuses = [None] * len(uploads)
    start = threading.Barrier(len(uploads))
    def run(i):
        start.wait()
        statuses[i] = decode(uploads[i], decoder)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(uploads))]
    for t in threads: t.start()
    for t in threads: t.join()
print(json.dumps({"peak": status("VmHWM") - before, "statuses": statuses}))
"""


def measure(tmp_path, cases: list[Case], *files: bytes) -> tuple[int, list[int]]:
    """The peak resident growth of decoding ``files`` (two or more: at once) in a fresh
    process that has decoded a small file of each of ``cases`` first, and each decode's
    HTTP status."""
    paths = []
    for i, data in enumerate((*(case.make(40, 30) for case in cases), *files)):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(data)
        paths.append(str(path))
    job = {"warm": paths[:len(cases)], "paths": paths[len(cases):], "size": cases[0].size,
           "square": cases[0].square, "cover": cases[0].cover, "limits": LIMITS.__dict__}
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(job), text=True,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    return answer["peak"], answer["statuses"]


@pytest.fixture(scope="module")
def report():
    rows: list[tuple[str, int, int, int]] = []
    yield rows
    if rows:
        print("\n| case | old estimate | new estimate | measured peak |")
        print("|---|---:|---:|---:|")
        for name, old, new, peak in rows:
            print(f"| {name} | {old / MiB:.1f} MiB | {new / MiB:.1f} MiB | "
                  f"{peak / MiB:.1f} MiB |")


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_decode_just_under_the_budget_stays_within_it(case, tmp_path, report):
    data = sized(case, 0.92)
    estimate = decode_cost(data, size=case.size, square=case.square, cover=case.cover)
    assert 0.8 * BUDGET < estimate <= BUDGET, estimate / MiB
    peak, statuses = measure(tmp_path, [case], data)
    report.append((case.name, old_estimate(data, case), estimate, peak))
    assert statuses == [200]
    assert peak <= BUDGET + SLACK, (f"{case.name}: peak {peak / MiB:.1f} MiB, estimate "
                                    f"{estimate / MiB:.1f} MiB")


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_decode_over_the_budget_is_refused_before_its_pixels(case, tmp_path):
    data = sized(case, 1.15)
    assert decode_cost(data, size=case.size, square=case.square, cover=case.cover) > BUDGET
    peak, statuses = measure(tmp_path, [case], data)
    assert statuses == [413]
    assert peak <= REFUSED_PEAK, f"{case.name}: {peak / MiB:.1f} MiB before the refusal"


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_helper_process_decodes_every_file_under_the_budget(case):
    """The helper's address-space limit, which follows the budget, lets the largest
    decode the budget allows through."""
    decoder = Decoder(limits=LIMITS, isolation="process", timeout=60, slots=1, max_queue=0,
                      queue_timeout=60)
    decoded = decoder.decode(sized(case, 0.97), size=case.size, square=case.square,
                             cover=case.cover)
    assert decoded.image.mode == "RGB"


@pytest.mark.parametrize("names", [("WebP animated RGBA", "PNG RGBA"),
                                   ("JPEG progressive drafted", "TIFF F")])
def test_two_decodes_at_once_stay_within_two_budgets(names, tmp_path):
    """Two decode slots in thread mode (ANIMEGAN_DECODE_SLOTS=2): each decode keeps to its
    own budget while the other runs."""
    cases = [next(case for case in CASES if case.name == name) for name in names]
    assert len({(case.size, case.square) for case in cases}) == 1
    peak, statuses = measure(tmp_path, cases, *(sized(case, 0.92) for case in cases))
    assert statuses == [200, 200]
    assert peak <= 2 * BUDGET + SLACK, f"{peak / MiB:.1f} MiB"
