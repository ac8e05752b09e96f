"""The near-duplicate cache: re-encodes and small resizes hit, edited or other photos never do."""

from __future__ import annotations

import importlib.util
import io
import sys
import time

import numpy as np
import pytest
from conftest import (
    COLOR_PHOTOS,
    PHOTOS,
    REPO,
    encode_image,
    open_image,
    photo,
    photo_bytes,
    pixelated,
)
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

from flask_animegan.cache import jpeg_grid
from flask_animegan.cache.near_duplicate import (
    NearDuplicateCache,
    ResultStore,
    StoredResult,
    encode_source,
)
from flask_animegan.cache.storage import MemoryStorage
from flask_animegan.inputs import decoding


def load_privacy_bench():
    """``bench/cache_privacy.py``: the photos, local edits and copies its report measures."""
    spec = importlib.util.spec_from_file_location("cache_privacy",
                                                  REPO / "bench" / "cache_privacy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


privacy = load_privacy_bench()

SIDE = 512  # the default ANIMEGAN_MAX_SIDE: fingerprints are taken of the fitted input


def fitted(image: Image.Image, size: int = SIDE) -> Image.Image:
    """What the service fingerprints: the upload decoded and fitted, via a lossless PNG."""
    data = encode_image(image, "PNG", compress_level=0)  # stored, not deflated: faster
    return decoding.fit(decoding.decode_upload(data, decoding.DecodeLimits(max_pixels=10**8), size=size), size)


def jpeg_copy(image: Image.Image, quality: int) -> Image.Image:
    return open_image(encode_image(image, "JPEG", quality=quality)).convert("RGB")


def hue_shift(image: Image.Image, degrees: int) -> Image.Image:
    h, s, v = image.convert("HSV").split()
    h = h.point(lambda x: (x + round(degrees * 255 / 360)) % 256)
    return Image.merge("HSV", (h, s, v)).convert("RGB")


def resized(image: Image.Image, factor: float) -> Image.Image:
    return image.resize((round(image.width * factor), round(image.height * factor)),
                        Image.Resampling.LANCZOS)


SAME_PHOTO = {
    "jpeg q70": lambda im: jpeg_copy(im, 70),
    "jpeg q85": lambda im: jpeg_copy(im, 85),
    "jpeg q95": lambda im: jpeg_copy(im, 95),
    "resize -5%": lambda im: resized(im, 0.95),
    "resize +5%": lambda im: resized(im, 1.05),
}
OTHER_PHOTO = {
    "mirrored": ImageOps.mirror,
    "flipped": ImageOps.flip,
    "inverted": ImageOps.invert,
    "brightness +10%": lambda im: ImageEnhance.Brightness(im).enhance(1.10),
    "brightness -10%": lambda im: ImageEnhance.Brightness(im).enhance(0.90),
    "brightness +5%": lambda im: ImageEnhance.Brightness(im).enhance(1.05),
    "centre crop 80%": lambda im: im.crop((im.width // 10, im.height // 10,
                                           im.width * 9 // 10, im.height * 9 // 10)),
}
HUE_SHIFTS = {"hue +30": lambda im: hue_shift(im, 30), "hue +90": lambda im: hue_shift(im, 90),
              "hue +180": lambda im: hue_shift(im, 180)}


def make_cache(**options) -> NearDuplicateCache:
    # every distinct photo shares one namespace here: keep them all as candidates
    return NearDuplicateCache(MemoryStorage(10**8), ttl=3600, index_cap=64, **options)


CROPS = {  # crops of a photo are different photos (and must not get its result)
    "astronaut-face": ("astronaut", (150, 20, 350, 220)),
    "coffee-cup": ("coffee", (150, 20, 450, 320)),
    "retina-centre": ("retina", (300, 300, 1100, 1100)),
    "rocket-top": ("rocket", (0, 0, 640, 300)),
}
DISTINCT = PHOTOS + tuple(CROPS)


def distinct_photo(name: str) -> Image.Image:
    if name in CROPS:
        source, box = CROPS[name]
        return photo(source).crop(box)
    return photo(name)


@pytest.fixture(scope="module")
def filled_cache():
    """A cache holding one entry per distinct photo, with the photo's name as its result."""
    cache = make_cache()
    for name in DISTINCT:
        image = fitted(distinct_photo(name))
        cache.put(("style", SIDE, "jpeg"), cache.fingerprint(image), name.encode(), image.size)
    return cache


def lookup(cache: NearDuplicateCache, image: Image.Image) -> bytes | None:
    image = fitted(image)
    found = cache.get(("style", SIDE, "jpeg"), cache.fingerprint(image))
    return found.data if found else None


@pytest.fixture(scope="module")
def privacy_matrix(filled_cache):
    """Look up every variant of every distinct photo: (photo, change, expected, got)."""
    rows = []
    for name in DISTINCT:
        original = distinct_photo(name)
        colour = name in COLOR_PHOTOS or CROPS.get(name, ("",))[0] in COLOR_PHOTOS
        rows.append((name, "same file", name.encode(), lookup(filled_cache, original)))
        for label, change in SAME_PHOTO.items():
            rows.append((name, label, name.encode(), lookup(filled_cache, change(original))))
        for label, change in dict(OTHER_PHOTO, **(HUE_SHIFTS if colour else {})).items():
            rows.append((name, label, None, lookup(filled_cache, change(original))))
    return rows


def test_no_photo_ever_gets_another_photos_result(privacy_matrix):
    """Edited copies (mirror, flip, invert, brightness, hue, crop) and other photos: zero hits."""
    false_hits = [(n, label, got) for n, label, expected, got in privacy_matrix
                  if got is not None and got != expected]
    negatives = sum(1 for row in privacy_matrix if row[2] is None)
    print(f"\nfalse hits: {len(false_hits)} of {negatives} edited copies "
          f"(over {len(DISTINCT)} distinct photos)")
    assert negatives >= 150 and len(DISTINCT) >= 20
    assert false_hits == []


def test_re_encodes_and_small_resizes_hit(privacy_matrix):
    """JPEG q70-95 re-encodes and +-5 % resizes of the same photo share its result.

    A few of them on near-black or finely textured photos differ from the original
    as much as a slight edit would, and miss on purpose: privacy wins over hit rate.
    """
    positives = [row for row in privacy_matrix if row[2] is not None]
    misses = [(n, label) for n, label, expected, got in positives if got != expected]
    rate = 1 - len(misses) / len(positives)
    print(f"\ntrue hits: {len(positives) - len(misses)} of {len(positives)} ({rate:.1%}); "
          f"missed: {misses}")
    assert all(got == expected for _, label, expected, got in positives if label == "same file")
    assert rate >= 0.95


def test_namespace_separates_style_size_and_format():
    cache = make_cache()
    image = fitted(photo("astronaut"))
    fingerprint = cache.fingerprint(image)
    cache.put(("a", SIDE, "jpeg"), fingerprint, b"a-result", image.size)
    assert cache.get(("a", SIDE, "jpeg"), fingerprint).data == b"a-result"
    for other in (("b", SIDE, "jpeg"), ("a", 256, "jpeg"), ("a", SIDE, "png")):
        assert cache.get(other, fingerprint) is None
    assert cache.stats()["hits"] == 1 and cache.stats()["misses"] == 3


def test_entries_expire_after_the_ttl():
    cache = NearDuplicateCache(MemoryStorage(10**6), ttl=0.3)
    image = fitted(photo("coffee"), 64)
    fingerprint = cache.fingerprint(image)
    cache.put(("s", 64, "jpeg"), fingerprint, b"x" * 100, image.size)
    assert cache.get(("s", 64, "jpeg"), fingerprint) is not None
    time.sleep(0.4)
    assert cache.get(("s", 64, "jpeg"), fingerprint) is None
    assert cache.stats()["entries"] == 0


def test_the_byte_budget_evicts_least_recently_used_results():
    """Each client's namespace is its own index: the budget drops the least recently used."""
    names = ("astronaut", "coffee", "rocket", "retina")
    prints = {n: make_cache().fingerprint(fitted(photo(n), 64)) for n in names}
    # room for three entries (an index of one fingerprint + about 7 KB of result + the
    # kept input) each
    kept = max(len(encode_source(p.source, p.jpeg)) for p in prints.values())
    cache = NearDuplicateCache(MemoryStorage(3 * (prints["coffee"].nbytes + 9_000 + kept)),
                               ttl=3600)
    for name in names[:2]:
        cache.put((name, "s", 64, "jpeg"), prints[name], name.encode() * 800, (64, 64))
    assert cache.get(("astronaut", "s", 64, "jpeg"), prints["astronaut"]) is not None
    for name in names[2:]:
        cache.put((name, "s", 64, "jpeg"), prints[name], name.encode() * 800, (64, 64))
    stats = cache.stats()
    assert stats["bytes"] <= stats["max_bytes"]
    assert cache.get(("coffee", "s", 64, "jpeg"), prints["coffee"]) is None  # least recent
    assert cache.get(("astronaut", "s", 64, "jpeg"), prints["astronaut"]) is not None
    assert cache.get(("retina", "s", 64, "jpeg"), prints["retina"]) is not None


def test_an_entry_costs_under_64_kb_beside_its_result_and_its_kept_input():
    """The entry keeps its input losslessly (for the exact JPEG re-save check): in less
    than the raw pixels, and nothing else of size beside the result."""
    cache = make_cache()
    image = fitted(photo("astronaut"))
    fingerprint = cache.fingerprint(image)
    kept = len(encode_source(fingerprint.source, fingerprint.jpeg))
    cache.put(("s", SIDE, "jpeg"), fingerprint, b"", image.size)
    print(f"\nthe kept input: {kept / 1024:.0f} KiB; the raw pixels: "
          f"{image.width * image.height * 3 / 1024:.0f} KiB")
    assert kept < image.width * image.height * 3 * 0.6
    assert cache.stats()["bytes"] - kept < 64 * 1024


# -- local edits: one small changed region is a different photo ----------------------

def blurred(image: Image.Image, box: tuple[int, int, int, int], radius: float) -> Image.Image:
    copy = image.copy()
    copy.paste(image.filter(ImageFilter.GaussianBlur(radius)).crop(box), box[:2])
    return copy


ASTRONAUT_FACE = (180, 60, 290, 190)  # in the 512 px photo; the trial hid a face


@pytest.mark.parametrize("hide", [lambda im: pixelated(im, ASTRONAUT_FACE, 12),
                                  lambda im: blurred(im, ASTRONAUT_FACE, 6)],
                         ids=["pixelated", "blurred"])
def test_a_hidden_face_misses_whichever_copy_came_first(hide):
    """The issue's trial: B's redacted copy must not get A's result, nor A B's planted one."""
    original = fitted(photo("astronaut"))
    redacted = fitted(hide(photo("astronaut")))
    for first, second in ((original, redacted), (redacted, original)):
        cache = make_cache()
        cache.put(("s", SIDE, "jpeg"), cache.fingerprint(first), b"first", first.size)
        assert cache.get(("s", SIDE, "jpeg"), cache.fingerprint(second)) is None
        assert cache.get(("s", SIDE, "jpeg"), cache.fingerprint(first)) is not None


def test_no_locally_edited_copy_gets_the_originals_result():
    """Blur, pixelation, an overlay or a pasted patch on 1 % of the area: zero hits.

    Every photo x edit kind x output size, one seeded edit each on the picture the
    service converts, uploaded losslessly and as JPEG q90, each looked up in a cache
    holding the other copy too: every one misses, visible or not. Some blur or pixelate
    a flat region (a night sky) and change their box by under a level on average, less
    than re-encoding changes it. Saved losslessly, those miss because the rest of the
    copy is bit-identical (``Fingerprint.edited_losslessly``); saved as JPEG, because
    re-encoding the original with the copy's tables reproduces the copy exactly except
    there (``flask_animegan.cache.jpeg_grid``). No re-encoded or resized copy is either.
    """
    trials = privacy.edit_trials(privacy.PHOTOS, privacy.SIZES, seeds=[0],
                                 saved=("PNG", "JPEG"))
    assert len(privacy.PHOTOS) >= 20 and len(trials) == len(privacy.PHOTOS) * 4 * 2 * 2
    unseen = [t for t in trials if not t.visible]
    print(f"\n{sum(t.hit for t in trials)} hits among {len(trials)} edited copies; "
          f"{len(unseen)} edits changed their box by < {privacy.VISIBLE} levels")
    assert unseen, "the trials must include edits that show nothing (the hard case)"
    assert [t for t in trials if t.hit] == []


def test_a_faint_edit_of_a_flat_region_misses_when_saved_losslessly():
    """Blurring part of the rocket photo's night sky changes it by under a level: the
    noise model excuses that much (a JPEG q90 re-encode changes it as much), but the
    rest of the copy is bit-identical to the original, so it is an edit."""
    original = fitted(photo("rocket"), 512)
    box = (224, 32, 275, 66)  # night sky, 1 % of the picture
    faint = blurred(original, box, 5)
    change = np.abs(np.asarray(faint.crop(box), np.float32)
                    - np.asarray(original.crop(box), np.float32)).mean()
    assert 0 < change < 1, change  # levels, on average over the box
    cache = make_cache()
    prints = {name: cache.fingerprint(image) for name, image in
              (("original", original), ("faint", faint), ("again", original.copy()),
               ("jpeg", jpeg_copy(original, 90)))}
    assert prints["original"].edited_losslessly(prints["faint"])
    assert prints["faint"].edited_losslessly(prints["original"])
    assert not prints["original"].edited_losslessly(prints["again"])  # identical: no edit
    assert not prints["original"].edited_losslessly(prints["jpeg"])  # nothing bit-identical
    cache.put(("s", 512, "jpeg"), prints["original"], b"first", original.size)
    assert cache.get(("s", 512, "jpeg"), prints["faint"]) is None
    assert cache.get(("s", 512, "jpeg"), prints["again"]) is not None
    assert cache.get(("s", 512, "jpeg"), prints["jpeg"]) is not None


def test_a_faint_edit_of_a_flat_region_misses_when_saved_as_jpeg():
    """The same blur of the night sky, saved as JPEG q90: it changes its box by about
    what the JPEG itself changes there, yet misses whichever copy came first, because
    re-encoding the other copy with its tables reproduces it exactly except there; a
    plain q90 re-save of the original, reproduced everywhere, hits."""
    original = fitted(photo("rocket"), 512)
    box = (224, 32, 275, 66)
    faint = upload_as(blurred(original, box, 5), "JPEG", 512, quality=90)
    plain = upload_as(original, "JPEG", 512, quality=90)
    change, noise = (np.abs(np.asarray(copy.crop(box), np.float32)
                            - np.asarray(original.crop(box), np.float32)).mean()
                     for copy in (faint, plain))
    assert 0 < change < 2 * noise, (change, noise)  # no statistic tells it from the JPEG
    for first, second, hit in ((original, faint, False), (faint, original, False),
                               (original, plain, True), (plain, original, True)):
        cache = make_cache()
        cache.put(("s", 512, "jpeg"), cache.fingerprint(first), b"first", first.size)
        assert (cache.get(("s", 512, "jpeg"), cache.fingerprint(second)) is not None) == hit


def test_a_lossy_webp_shares_a_result_only_with_identical_pixels():
    """Lossy WebP has no exact check, and a pixelated patch of a dark region hides in its
    noise: so a faint edit saved as WebP misses either way, the same WebP sent again
    hits, and a WebP re-save of a cached photo misses (a cost, not a leak)."""
    original = fitted(photo("rocket"), 512)
    faint = upload_as(blurred(original, (224, 32, 275, 66), 5), "WEBP", 512, quality=80)
    plain = upload_as(original, "WEBP", 512, quality=80)
    again = upload_as(original, "WEBP", 512, quality=80)
    for first, second, hit in ((original, faint, False), (faint, original, False),
                               (plain, again, True), (original, plain, False),
                               (plain, original, False)):
        cache = make_cache()
        cache.put(("s", 512, "jpeg"), cache.fingerprint(first), b"first", first.size)
        assert (cache.get(("s", 512, "jpeg"), cache.fingerprint(second)) is not None) == hit


def upload_as(image: Image.Image, fmt: str, size: int, **params) -> Image.Image:
    """``image`` saved as ``fmt``, then decoded and fitted as the service does."""
    data = encode_image(image, fmt, **params)
    return decoding.decode_upload(data, decoding.DecodeLimits(max_pixels=10**8), size=size)


def send_each(client, files: dict[str, bytes], multipart: bool) -> dict[str, tuple[str, bytes]]:
    """POST each file in turn (raw body or multipart): its ``X-Cache`` and result."""
    answers = {}
    for name, data in files.items():
        if multipart:
            response = client.post("/animegan/convert",
                                   data={"image": (io.BytesIO(data), "photo")},
                                   content_type="multipart/form-data")
        else:
            response = post(client, data)
        assert response.status_code == 200, response.json
        answers[name] = (response.headers["X-Cache"], response.data)
    return answers


def faint_edit_files(case: str) -> dict[str, bytes]:
    """A photo, a copy with a faint blur of its night sky saved as JPEG, and a plain JPEG
    re-save of it: at the size it is converted at, or larger (the service shrinks it)."""
    if case == "converted at its size":
        original = fitted(photo("rocket"), 512)
        return {"original": encode_image(original, "PNG"),
                "faint edit": encode_image(blurred(original, (224, 32, 275, 66), 5), "JPEG",
                                           quality=90),
                "re-saved": encode_image(original, "JPEG", quality=90)}
    original = encode_image(photo("rocket"), "JPEG", quality=90)  # 640 px, served at 512
    image = Image.open(io.BytesIO(original)).convert("RGB")
    return {"original": original,
            "faint edit": encode_image(blurred(image, (280, 40, 344, 83), 6), "JPEG",
                                       quality=75),
            "re-saved": encode_image(image, "JPEG", quality=75)}


@pytest.mark.parametrize("multipart", [False, True], ids=["raw body", "multipart"])
@pytest.mark.parametrize("case", ["converted at its size", "shrunk by the service"])
def test_api_a_faint_jpeg_edit_misses_and_a_jpeg_re_save_hits(make_app, case, multipart):
    """Through the API (decoded in the helper process, which hands the JPEG grid back):
    the original, then the faintly edited JPEG (MISS, its own result), then a plain JPEG
    re-save of the original (HIT, the original's result). Shrunk by the service (the
    usual case: a phone-style JPEG larger than the output, edited at full size and saved
    at q75), the edit changes the fitted picture by less than the JPEG's own noise; it
    misses because A's file was kept and is compared at its own size."""
    client = make_app(ANIMEGAN_MAX_SIDE=512).test_client()
    files = faint_edit_files(case)
    answers = send_each(client, files, multipart)
    assert [answers[name][0] for name in files] == ["MISS", "MISS", "HIT"]
    assert answers["re-saved"][1] == answers["original"][1]
    assert answers["faint edit"][1] != answers["original"][1]


@pytest.fixture(scope="module")
def phone_jpeg() -> bytes:
    return encode_image(privacy.large_photo("coffee"), "JPEG", quality=90)


@pytest.mark.parametrize("size", [256, 512])
def test_api_a_phone_size_jpeg_is_compared_whole(make_app, phone_jpeg, size):
    """A 12-megapixel JPEG, as a phone takes (upscaled with grain), served at 256 or
    512 px: a faint blur of its wall saved at q75 changes the fitted picture by less than
    the JPEG's noise, and misses because A's file is kept and compared at its own size;
    a q75 re-save and a 5 % smaller copy hit (the smaller one only since JPEGs are decoded
    at a DCT scale of at least 3x the output: just above it, the block grid aliased)."""
    client = make_app(ANIMEGAN_MAX_SIDE=512).test_client()
    original = phone_jpeg
    image = Image.open(io.BytesIO(original)).convert("RGB")
    width, height = image.size
    assert width * height > 11_000_000
    box = (width // 20, height // 20, width // 20 + width // 10, height // 20 + height // 10)
    smaller = image.resize((round(width * 0.95), round(height * 0.95)), Image.Resampling.LANCZOS)
    files = {"original": original,
             "faint edit": encode_image(blurred(image, box, 6), "JPEG", quality=75),
             "re-saved": encode_image(image, "JPEG", quality=75),
             "smaller": encode_image(smaller, "JPEG", quality=90)}
    answers = {name: post(client, data, size=size) for name, data in files.items()}
    assert all(r.status_code == 200 for r in answers.values())
    assert [r.headers["X-Cache"] for r in answers.values()] == ["MISS", "MISS", "HIT", "HIT"]
    assert answers["re-saved"].data == answers["original"].data


def test_a_resized_upload_over_the_keeping_limits_shares_only_identical_pixels(monkeypatch):
    """An upload the service resizes and cannot keep whole (here: the limit set to 0
    bytes; by default over 8 MiB or 12.6 megapixels) leaves a faint edit saved as JPEG
    to the statistics, which cannot see it. So it shares a result only with identical
    fitted pixels, whichever came first: the same file again hits; a faint edit and a
    plain re-save miss (a cost, never a leak)."""
    monkeypatch.setattr(jpeg_grid, "UPLOAD_MAX_BYTES", 0)
    original = encode_image(photo("rocket"), "JPEG", quality=90)  # 640 px, served at 256
    image = Image.open(io.BytesIO(original)).convert("RGB")
    files = {"again": original,
             "faint edit": encode_image(blurred(image, (280, 40, 344, 83), 6), "JPEG",
                                        quality=75),
             "re-saved": encode_image(image, "JPEG", quality=75)}
    cache = make_cache()

    def fingerprint(data: bytes):
        return cache.fingerprint(decoding.decode_upload(data, decoding.DecodeLimits(max_pixels=10**8), size=256), data)

    first = fingerprint(original)
    assert first.strict and first.upload == b""
    for name, data in files.items():
        for stored, asked in ((first, fingerprint(data)), (fingerprint(data), first)):
            cache = make_cache()
            cache.put(("s", 256, "jpeg"), stored, b"first", (256, 171))
            assert (cache.get(("s", 256, "jpeg"), asked) is not None) == (name == "again"), name
    monkeypatch.undo()
    assert not fingerprint(original).strict  # within the limits: kept, compared whole
    lossless = encode_image(photo("rocket"), "WEBP", lossless=True)
    assert fingerprint(lossless).strict  # resized, and only JPEG and PNG files are kept
    assert not fingerprint(encode_image(fitted(photo("rocket"), 256), "WEBP",
                                        lossless=True)).strict  # not resized


def test_edits_of_a_jpeg_at_its_own_size_miss():
    """The third protocol of bench/cache_privacy.py, one seed: A uploads each photo as
    JPEG q90; B edits that file at its own resolution and saves it at q90 or q75. Among
    them, faint blurs of flat regions that the service's shrinking hides in JPEG noise:
    small uploads are compared whole, so every one misses."""
    trials = privacy.edit_trials(privacy.PHOTOS, privacy.SIZES, seeds=[0],
                                 saved=("JPEG", "JPEG q75"), from_jpeg=True)
    assert len(trials) == len(privacy.PHOTOS) * 4 * 2 * 2
    assert [t for t in trials if not t.visible], "the trials must include faint edits"
    assert [f"{t.photo} {t.size} {t.detail}" for t in trials if t.hit] == []


def test_re_encoded_and_resized_copies_hit_at_both_sizes():
    """JPEG q70-95 re-encodes and +-5 % resizes of a JPEG upload, at 256 and 512 px."""
    trials = privacy.benign_trials(privacy.PHOTOS, privacy.SIZES, ["jpeg/jpeg"])
    rate = sum(t.hit for t in trials) / len(trials)
    print(f"\n{sum(t.hit for t in trials)} of {len(trials)} same-photo copies hit ({rate:.1%})")
    assert rate >= 0.95


def test_a_disabled_cache_stores_nothing():
    cache = NearDuplicateCache(MemoryStorage(10**6), ttl=0)
    image = fitted(photo("coffee"), 64)
    cache.put(("s", 64, "jpeg"), cache.fingerprint(image), b"x", image.size)
    assert cache.get(("s", 64, "jpeg"), cache.fingerprint(image)) is None
    assert cache.stats()["entries"] == 0


def test_result_ids_are_unguessable_and_expire():
    store = ResultStore(MemoryStorage(10**6), ttl=0.5, max_bytes=10**6)
    result = StoredResult(b"o", b"r", "image/jpeg", "s", (1, 1))
    tokens = {store.add(result) for _ in range(50)}
    assert len(tokens) == 50
    assert all(len(t) >= 32 for t in tokens)  # 24 random bytes, base64url: 192 bits
    token = tokens.pop()
    assert store.get(token) == result
    time.sleep(0.6)
    assert store.get(token) is None


# -- through the API ---------------------------------------------------------------

def post(client, data: bytes, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return client.post(f"/animegan/convert?{query}", data=data, content_type="image/jpeg")


def test_api_reports_miss_then_hit_for_a_re_encoded_photo(client):
    first = post(client, photo_bytes("astronaut", quality=95))
    again = post(client, photo_bytes("astronaut", quality=75))
    assert first.status_code == again.status_code == 200
    assert (first.headers["X-Cache"], again.headers["X-Cache"]) == ("MISS", "HIT")
    assert again.data == first.data


def test_api_recoloured_copy_is_a_miss_with_its_own_result(client):
    original = photo("coffee")
    first = post(client, encode_image(original, "JPEG", quality=95))
    recoloured = post(client, encode_image(hue_shift(original, 120), "JPEG", quality=95))
    assert recoloured.headers["X-Cache"] == "MISS"
    assert recoloured.data != first.data


def test_api_hit_at_a_different_size_is_resized_to_the_request(make_app):
    client = make_app(ANIMEGAN_MAX_SIDE=512).test_client()
    original = photo("chelsea")  # 451 x 300: below 512, so a 5 % larger copy is larger
    first = post(client, encode_image(original, "PNG"))
    bigger = post(client, encode_image(resized(original, 1.05), "PNG"))
    assert (first.headers["X-Cache"], bigger.headers["X-Cache"]) == ("MISS", "HIT")
    assert open_image(first.data).size == (451, 300)
    assert open_image(bigger.data).size == (474, 315)


def test_api_cache_can_be_disabled(make_app):
    client = make_app(ANIMEGAN_CACHE_TTL=0).test_client()
    data = photo_bytes("rocket")
    assert post(client, data).headers["X-Cache"] == "MISS"
    assert post(client, data).headers["X-Cache"] == "MISS"
    assert client.get("/animegan/healthz").json["cache"]["enabled"] is False


def test_format_is_part_of_the_key(client):
    data = photo_bytes("rocket")
    assert post(client, data, format="png").headers["X-Cache"] == "MISS"
    response = post(client, data, format="webp")
    assert response.headers["X-Cache"] == "MISS"
    assert open_image(response.data).format == "WEBP"
    assert io.BytesIO(response.data).read(4) == b"RIFF"
