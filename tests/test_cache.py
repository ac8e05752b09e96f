"""The near-duplicate cache: re-encodes and small resizes hit, edited or other photos never do."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageEnhance, ImageOps

from conftest import COLOR_PHOTOS, PHOTOS, encode_image, open_image, photo, photo_bytes
from flask_animegan import imaging
from flask_animegan.cache import NearDuplicateCache, ResultStore, StoredResult

SIDE = 512  # the default ANIMEGAN_MAX_SIDE: fingerprints are taken of the fitted input


def fitted(image: Image.Image, size: int = SIDE) -> Image.Image:
    """What the service fingerprints: the upload decoded and fitted, via a lossless PNG."""
    data = encode_image(image, "PNG")
    return imaging.fit(imaging.decode_upload(data, max_pixels=10**8, size=size), size)


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
    return NearDuplicateCache(max_bytes=10**8, ttl=3600, **options)


@pytest.fixture(scope="module")
def filled_cache():
    """A cache holding one entry per photo, keyed by the photo's name as its result."""
    cache = make_cache()
    for name in PHOTOS:
        image = fitted(photo(name))
        cache.put(("style", SIDE, "jpeg"), cache.fingerprint(image), name.encode(), image.size)
    return cache


def lookup(cache: NearDuplicateCache, image: Image.Image) -> bytes | None:
    image = fitted(image)
    found = cache.get(("style", SIDE, "jpeg"), cache.fingerprint(image))
    return found.data if found else None


@pytest.mark.parametrize("name", PHOTOS)
def test_each_photo_and_its_re_encodes_and_resizes_hit_its_own_result(filled_cache, name):
    original = photo(name)
    assert lookup(filled_cache, original) == name.encode()
    for label, change in SAME_PHOTO.items():
        assert lookup(filled_cache, change(original)) == name.encode(), label


@pytest.mark.parametrize("name", PHOTOS)
def test_edited_copies_never_get_the_original_result(filled_cache, name):
    original = photo(name)
    changes = dict(OTHER_PHOTO, **(HUE_SHIFTS if name in COLOR_PHOTOS else {}))
    for label, change in changes.items():
        assert lookup(filled_cache, change(original)) is None, label


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
    now = [0.0]
    cache = NearDuplicateCache(max_bytes=10**6, ttl=10, timer=lambda: now[0])
    image = fitted(photo("coffee"), 64)
    fingerprint = cache.fingerprint(image)
    cache.put(("s", 64, "jpeg"), fingerprint, b"x" * 100, image.size)
    now[0] = 9.0
    assert cache.get(("s", 64, "jpeg"), fingerprint) is not None
    now[0] = 20.0
    assert cache.get(("s", 64, "jpeg"), fingerprint) is None
    assert cache.stats()["entries"] == 0


def test_the_byte_budget_evicts_least_recently_used_results():
    cache = NearDuplicateCache(max_bytes=3 * 10_000, ttl=3600)
    names = ("astronaut", "coffee", "rocket", "retina")
    prints = {n: cache.fingerprint(fitted(photo(n), 64)) for n in names}
    for name in names[:2]:
        cache.put(("s", 64, "jpeg"), prints[name], name.encode() * 800, (64, 64))
    assert cache.get(("s", 64, "jpeg"), prints["astronaut"]) is not None  # now most recent
    for name in names[2:]:
        cache.put(("s", 64, "jpeg"), prints[name], name.encode() * 800, (64, 64))
    stats = cache.stats()
    assert stats["bytes"] <= stats["max_bytes"]
    assert cache.get(("s", 64, "jpeg"), prints["coffee"]) is None  # least recently used
    assert cache.get(("s", 64, "jpeg"), prints["retina"]) is not None


def test_a_disabled_cache_stores_nothing():
    cache = NearDuplicateCache(max_bytes=10**6, ttl=0)
    image = fitted(photo("coffee"), 64)
    cache.put(("s", 64, "jpeg"), cache.fingerprint(image), b"x", image.size)
    assert cache.get(("s", 64, "jpeg"), cache.fingerprint(image)) is None
    assert cache.stats()["entries"] == 0


def test_result_ids_are_unguessable_and_expire():
    now = [0.0]
    store = ResultStore(max_bytes=10**6, ttl=60, timer=lambda: now[0])
    result = StoredResult(b"o", b"r", "image/jpeg", "s", (1, 1))
    tokens = {store.add(result) for _ in range(50)}
    assert len(tokens) == 50
    assert all(len(t) >= 32 for t in tokens)  # 24 random bytes, base64url: 192 bits
    token = tokens.pop()
    assert store.get(token) is result
    now[0] = 61.0
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
