"""The near-duplicate cache: one rule, re-encodes hit, edited or other photos never do."""

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
    convert,
    encode_image,
    open_image,
    photo,
    photo_bytes,
    pixelated,
)
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

from flask_animegan.cache import NearDuplicateCache, ResultStore, StoredResult
from flask_animegan.cache.fingerprint import (
    DETAIL_LEVELS,
    DETAIL_SHARE,
    OTHER_SIZE,
    SAME_JPEG_SHARE,
    SAME_SIZE,
    Fingerprint,
)
from flask_animegan.cache.storage import MemoryStorage
from flask_animegan.inputs.decoding import DecodeLimits
from flask_animegan.inputs.isolation import Decoder
from flask_animegan.cache.samples import (
    CELLS_SHAPE,
    LUMA_SHAPE,
    SAMPLE_SIDE,
    Samples,
    describe,
    of_picture,
    resampled,
)


def load_rule_bench():
    """``bench/cache_rule.py``: the photos, edits and copies its report measures."""
    spec = importlib.util.spec_from_file_location("cache_rule", REPO / "bench" / "cache_rule.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


rule = load_rule_bench()

SIDE = 512  # the default ANIMEGAN_MAX_SIDE
#: Photos for the measured cases here (the bench runs all of rule.PHOTOS).
SOME_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "camera", "stereo_motorcycle")


def uploaded(image: Image.Image, size: int = SIDE) -> Fingerprint:
    """What the service fingerprints of ``image`` uploaded as a lossless PNG for ``size``:
    the statistics the decoder takes of it."""
    return rule.fingerprint(encode_image(image, "PNG", compress_level=0), size)


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
        fingerprint = uploaded(distinct_photo(name))
        cache.put(("style", SIDE, "jpeg"), fingerprint, name.encode(), fingerprint.size)
    return cache


def lookup(cache: NearDuplicateCache, image: Image.Image) -> bytes | None:
    found = cache.get(("style", SIDE, "jpeg"), uploaded(image))
    return found.data if found else None


def test_no_photo_ever_gets_another_photos_result(filled_cache):
    """Mirrored, flipped, inverted, brightened, hue-shifted, cropped copies and other
    photos: zero hits."""
    false_hits, negatives = [], 0
    for name in DISTINCT:
        original = distinct_photo(name)
        colour = name in COLOR_PHOTOS or CROPS.get(name, ("",))[0] in COLOR_PHOTOS
        for label, change in dict(OTHER_PHOTO, **(HUE_SHIFTS if colour else {})).items():
            negatives += 1
            got = lookup(filled_cache, change(original))
            if got is not None:
                false_hits.append((name, label, got))
    assert negatives >= 140
    assert false_hits == []


def test_the_same_file_and_plain_copies_hit_the_right_entry(filled_cache):
    """Among every distinct photo in one namespace, each copy gets its own photo's result."""
    wrong = []
    for name in ("astronaut", "coffee", "astronaut-face", "camera"):
        original = distinct_photo(name)
        for label, change in {"same file": lambda im: im, **SAME_PHOTO}.items():
            got = lookup(filled_cache, change(original))
            if got not in (name.encode(), None) or (label == "same file" and got is None):
                wrong.append((name, label, got))
    assert wrong == []


def test_re_encodes_and_small_resizes_hit_at_both_sizes():
    """JPEG q70-95 re-encodes and +-5 % resizes (then JPEG q75/q90), from a lossless file
    or a JPEG, at 256 and 512 px: at least 95 % share the result."""
    trials = rule.reencode_trials(SOME_PHOTOS, rule.SIZES)
    copies = [t for t in trials if t.group == "re-encode"]
    rate = sum(t.hit for t in copies) / len(copies)
    print(f"\n{sum(t.hit for t in copies)} of {len(copies)} same-photo copies hit ({rate:.1%})")
    assert len(copies) >= 150 and rate >= 0.95


def test_another_client_never_gets_the_result():
    """By construction: the namespace holds the client's scope."""
    trials = [t for t in rule.reencode_trials(SOME_PHOTOS[:3], (SIDE,))
              if t.group == "other client"]
    assert trials and not any(t.hit for t in trials)


@pytest.fixture(scope="module")
def edit_trials():
    """Blur, pixelate, a text box or a pasted patch over 1, 2 or 5 % of a JPEG (at the
    photo's own size, saved as JPEG q90), on the most detailed spot and at random."""
    trials = rule.edit_trials(SOME_PHOTOS, rule.SIZES, [0])
    assert len(trials) == len(SOME_PHOTOS) * 2 * 3 * 2 * 4
    return trials


def visible_leaks(trials) -> list[str]:
    """The edits that changed their box by 2 levels or more on average and still hit."""
    return [f"{t.kind} {t.area:.0%} {t.place} @ {t.size} px, {t.photo}: change {t.change:.1f}"
            for t in trials if t.hit and t.change >= rule.VISIBLE]


def test_visible_edits_of_two_percent_or_more_on_detail_miss(edit_trials):
    assert visible_leaks([t for t in edit_trials if t.place == "detail" and t.area >= 0.02]) == []


def test_text_boxes_and_pasted_patches_on_detail_miss_from_one_percent(edit_trials):
    assert visible_leaks([t for t in edit_trials if t.place == "detail"
                          and t.kind in ("text box", "paste")]) == []


def test_visible_one_percent_blurs_and_mosaics_on_detail_miss(edit_trials):
    """A mosaic keeps local means but has no detail inside its blocks; a blur lowers the
    detail too: the coarse grid's detail statistic sees both."""
    assert visible_leaks([t for t in edit_trials if t.place == "detail" and t.area < 0.02
                          and t.kind in ("blur", "pixelate")]) == []


def test_visible_edits_at_random_spots_miss(edit_trials):
    """At random spots (flat sky, smooth skin, a dark background) a blur or mosaic changes
    little more than a coarse JPEG does; but an edit keeps the photo's pixel size, so
    saved with the photo's own JPEG tables it is held to SAME_JPEG_SHARE of the allowance."""
    assert visible_leaks([t for t in edit_trials if t.place == "random"]) == []


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("square", [False, True])
def test_the_helper_and_this_thread_take_the_same_statistics(monkeypatch, fmt, square):
    """Whichever isolation decodes it, with or without a side thread for the resampling's
    bands, an upload gets the same statistics, sizes and tables (a JPEG comes unfitted,
    any other format fitted too)."""
    from flask_animegan import process

    data = encode_image(photo("coffee"), fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    limits = DecodeLimits(max_pixels=10**8)
    answers = []
    for isolation in ("process", "thread"):
        decoder = Decoder(limits=limits, isolation=isolation, timeout=30, slots=1,
                          max_queue=0, queue_timeout=30)
        answers.append(decoder.sample(data, size=256, square=square))
    monkeypatch.setattr(process, "side_thread", lambda: None)
    answers.append(decoder.sample(data, size=256, square=square))
    first = answers[0]
    assert (first.fitted is None) is (fmt == "JPEG")
    for other in answers[1:]:
        assert other.samples.to_bytes() == first.samples.to_bytes()
        assert (other.source_size, other.format, other.jpeg_tables) == (
            first.source_size, first.format, first.jpeg_tables)
        assert (other.fitted is None) is (first.fitted is None)
        if first.fitted is not None:
            assert other.fitted.image.tobytes() == first.fitted.image.tobytes()
    assert first.source_size == (600, 400)
    assert (first.jpeg_tables != 0) is (fmt == "JPEG")


def test_the_rule_is_symmetric_and_needs_every_cell():
    """One cell off by more than the rule allows, in one statistic, is a different photo."""
    first = uploaded(photo("astronaut"))
    assert first.luma.shape == LUMA_SHAPE and first.cells.shape == CELLS_SHAPE
    assert first.excess(first) == 0 and first.same_photo(first, 0)
    mean, deviation = (int(v) for v in first.luma[7, 9])
    colour = int(first.cells[3, 4, 0])
    # an upload of the same pixel size gets the tight allowance, one of another size (a
    # resized copy) the wider one
    for source, allowance in ((first.source, SAME_SIZE),
                              ((first.source[0] - 1, first.source[1]), OTHER_SIZE)):
        allowed = int(allowance.mean_levels + allowance.mean_per_deviation * deviation)
        sign = 1 if mean + allowed + 1 <= 255 else -1
        for change, same in ((allowed, True), (allowed + 1, False)):
            luma = first.luma.copy()
            luma[7, 9, 0] = mean + sign * change
            copy = Fingerprint(first.phash, first.size, luma, first.cells, source)
            assert first.same_photo(copy, 6) is same and copy.same_photo(first, 6) is same
        levels = int(allowance.colour_levels)
        colour_sign = 1 if colour + levels + 1 <= 255 else -1
        for change, same in ((levels, True), (levels + 1, False)):
            cells = first.cells.copy()
            cells[3, 4, 0] = colour + colour_sign * change
            copy = Fingerprint(first.phash, first.size, first.luma, cells, source)
            assert first.same_photo(copy, 6) is same and copy.same_photo(first, 6) is same
    # a mosaic's flat blocks: the detail of one cell cut by more than DETAIL_SHARE is a
    # different photo
    detailed = np.unravel_index(np.argmax(first.cells[..., 2]), first.cells.shape[:2])
    detail = int(first.cells[detailed + (2,)])
    assert detail * DETAIL_SHARE >= DETAIL_LEVELS + 1
    for cut, same in ((int(detail * DETAIL_SHARE), True), (int(detail * DETAIL_SHARE) + 1, False)):
        cells = first.cells.copy()
        cells[detailed + (2,)] = detail - cut
        copy = Fingerprint(first.phash, first.size, first.luma, cells, first.source)
        assert first.same_photo(copy, 6) is same and copy.same_photo(first, 6) is same
    wider = (round(first.size[0] * 1.05), first.size[1])
    other_aspect = Fingerprint(first.phash, wider, first.luma, first.cells, first.source)
    assert not first.same_photo(other_aspect, 6)


def test_two_jpegs_of_one_size_and_one_set_of_tables_get_a_share_of_the_allowance():
    """An edit, or a copy saved again at the photo's own quality (the same pixel size and
    JPEG tables), is held to SAME_JPEG_SHARE of the allowance; other tables, another
    format, a resized copy (another pixel size) or unknown sizes to all of it."""
    statistics = of_picture(photo("astronaut"))
    mean, deviation = (int(v) for v in statistics.luma[7, 9])

    def allowed(allowance) -> float:
        return allowance.mean_levels + allowance.mean_per_deviation * deviation

    q90, q70 = 0x1234, 0x5678  # two JPEG tables' digests (DecodedUpload.jpeg_tables)

    def same(change: int, first: tuple[tuple[int, int], int],
             second: tuple[tuple[int, int], int]) -> bool:
        a = Fingerprint.of(statistics, 16, size=(512, 512), source=first[0],
                           jpeg_tables=first[1])
        luma = a.luma.copy()
        luma[7, 9, 0] = mean - change if mean >= 128 else mean + change
        b = Fingerprint(a.phash, a.size, luma, a.cells, source=second[0],
                        jpeg_tables=second[1])
        assert a.same_photo(b, 6) is b.same_photo(a, 6)  # symmetric
        return a.same_photo(b, 6)

    size, resized = (512, 512), (538, 538)
    full, least = int(allowed(SAME_SIZE)), int(allowed(SAME_SIZE) * SAME_JPEG_SHARE)
    assert least < full
    assert same(least, (size, q90), (size, q90)) and not same(least + 1, (size, q90), (size, q90))
    for other in (((size, q90), (size, q70)),  # saved at another quality
                  ((size, q90), (size, 0)),  # a PNG beside a JPEG
                  ((size, 0), (size, 0)),  # two PNGs
                  (((0, 0), q90), ((0, 0), q90))):  # sizes not known
        assert same(full, *other) and not same(full + 1, *other), other
    wider = int(allowed(OTHER_SIZE))  # a resized copy: another pixel size
    assert same(wider, (size, q90), (resized, q90))
    assert not same(wider + 1, (size, q90), (resized, q90))


def test_the_index_keeps_the_uploads_size_and_jpeg_tables():
    cache = NearDuplicateCache(MemoryStorage(10**8), ttl=60)
    stored = cache.fingerprint(of_picture(photo("coffee")), size=(512, 341), source=(600, 400),
                               jpeg_tables=0xFEDCBA98)
    cache.put(("s", SIDE, "jpeg"), stored, b"result", stored.size)
    member = cache.lookup(("s", SIDE, "jpeg")).members[0].fingerprint
    assert (member.source, member.jpeg_tables) == ((600, 400), 0xFEDCBA98)


def test_an_entry_is_its_result_and_a_few_kib_and_a_lookup_reads_under_128_kib():
    """The entry keeps no pixels of its input: only its fingerprint (in the index)."""
    figures = rule.footprint(MemoryStorage(10**8))
    assert figures["hit_found"] and not figures["miss_found"]
    assert figures["memory_entry_over_result"] <= 32 * 1024
    assert figures["index_read_bytes"] <= 128 * 1024
    assert figures["hit_read_bytes"] <= 128 * 1024 + figures["result_bytes"] + 64
    assert (figures["miss_trips"], figures["hit_trips"]) == (1, 2)


# -- a face hidden: the first upload may be either copy ------------------------------

ASTRONAUT_FACE = (170, 40, 330, 200)  # about 10 % of the picture


def blurred(image: Image.Image, box: tuple[int, int, int, int], radius: float) -> Image.Image:
    copy = image.copy()
    copy.paste(copy.crop(box).filter(ImageFilter.GaussianBlur(radius)), box[:2])
    return copy


@pytest.mark.parametrize("hide", [lambda im: pixelated(im, ASTRONAUT_FACE, 12),
                                  lambda im: blurred(im, ASTRONAUT_FACE, 6)],
                         ids=["pixelated", "blurred"])
def test_a_hidden_face_misses_whichever_copy_came_first(hide):
    original = photo("astronaut")
    for first, second in ((original, hide(original)), (hide(original), original)):
        cache = make_cache()
        stored = uploaded(first)
        cache.put(("s", SIDE, "jpeg"), stored, b"first", stored.size)
        assert cache.get(("s", SIDE, "jpeg"), uploaded(second)) is None


# -- storage behaviour -----------------------------------------------------------------

def test_namespace_separates_style_size_and_format():
    cache = make_cache()
    fingerprint = uploaded(photo("astronaut"))
    cache.put(("a", SIDE, "jpeg"), fingerprint, b"a-result", fingerprint.size)
    assert cache.get(("a", SIDE, "jpeg"), fingerprint).data == b"a-result"
    for other in (("b", SIDE, "jpeg"), ("a", 256, "jpeg"), ("a", SIDE, "png")):
        assert cache.get(other, fingerprint) is None
    assert cache.stats()["hits"] == 1 and cache.stats()["misses"] == 3


def test_entries_expire_after_the_ttl():
    cache = NearDuplicateCache(MemoryStorage(10**6), ttl=0.3)
    fingerprint = uploaded(photo("coffee"), 64)
    cache.put(("s", 64, "jpeg"), fingerprint, b"x" * 100, fingerprint.size)
    assert cache.get(("s", 64, "jpeg"), fingerprint) is not None
    time.sleep(0.4)
    assert cache.get(("s", 64, "jpeg"), fingerprint) is None
    assert cache.stats()["entries"] == 0


def test_the_byte_budget_evicts_least_recently_used_results():
    """Each client's namespace is its own index: the budget drops the least recently used."""
    names = ("astronaut", "coffee", "rocket", "retina")
    prints = {n: uploaded(photo(n), 64) for n in names}
    # room for three entries: an index of one member (about 11.9 KB) + 4.8 KB of result
    # (astronaut's is 2.4 KB longer)
    budget = 3 * (11_900 + 4_800 + 2 * 256 + 100) + 2_400
    cache = NearDuplicateCache(MemoryStorage(budget), ttl=3600)
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


def test_a_disabled_cache_stores_nothing():
    cache = NearDuplicateCache(MemoryStorage(10**6), ttl=0)
    fingerprint = uploaded(photo("coffee"), 64)
    cache.put(("s", 64, "jpeg"), fingerprint, b"x", fingerprint.size)
    assert cache.get(("s", 64, "jpeg"), fingerprint) is None
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


def test_api_a_pixelated_face_is_a_miss(client):
    original = photo("astronaut")
    assert post(client, encode_image(original, "JPEG", quality=90)).headers["X-Cache"] in (
        "MISS", "HIT")  # another test may have sent it first
    hidden = post(client, encode_image(pixelated(original, ASTRONAUT_FACE, 12), "JPEG",
                                       quality=90))
    assert hidden.status_code == 200 and hidden.headers["X-Cache"] == "MISS"


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


# -- cache scope ---------------------------------------------------------------------------
def test_the_cache_is_scoped_to_the_client_by_default(make_app):
    client = make_app().test_client()
    data = photo_bytes("astronaut")
    a = {"environ_base": {"REMOTE_ADDR": "10.0.0.1"}}
    b = {"environ_base": {"REMOTE_ADDR": "10.0.0.2"}}
    assert convert(client, data, **a).headers["X-Cache"] == "MISS"
    assert convert(client, data, **a).headers["X-Cache"] == "HIT"
    assert convert(client, data, **b).headers["X-Cache"] == "MISS"


def test_a_global_cache_is_an_opt_in(make_app):
    client = make_app(ANIMEGAN_CACHE_SCOPE="global").test_client()
    data = photo_bytes("astronaut")
    assert convert(client, data, environ_base={"REMOTE_ADDR": "10.0.0.1"}).headers[
        "X-Cache"] == "MISS"
    assert convert(client, data, environ_base={"REMOTE_ADDR": "10.0.0.2"}).headers[
        "X-Cache"] == "HIT"


def test_through_the_api_a_faint_mosaic_saved_like_the_photo_misses_and_a_resave_hits(make_app):
    """The case the rule let through before it knew JPEG tables: a 1 % mosaic of the
    rocket's sky (bench/cache_rule.py's seed 0, at 256 px), saved as JPEG q90 like the
    photo. It changes its box by about 3 levels, no more than a copy at quality 70 moves
    it, so only the tables (the same as the photo's) tell it apart."""
    import random

    client = make_app(ANIMEGAN_MAX_SIDE=256).test_client()
    image = open_image(photo_bytes("rocket", quality=90)).convert("RGB")
    donor = photo(rule.PHOTOS[rule.PHOTOS.index("rocket") + 1])
    rng = random.Random("0/rocket/256/pixelate/0.01/random")
    mosaic, box = rule.edited(image, "pixelate", 0.01, "random", rng, donor)
    query = "?style=test_style&size=256"
    first = convert(client, photo_bytes("rocket", quality=90), query)
    assert first.status_code == 200, first.get_data(as_text=True)
    assert first.headers["X-Cache"] == "MISS"
    resaved = encode_image(image, "JPEG", quality=90)  # the photo saved again as it was
    edited = encode_image(mosaic, "JPEG", quality=90)
    assert np.abs(np.asarray(mosaic.crop(box), np.float32)
                  - np.asarray(image.crop(box), np.float32)).mean() >= rule.VISIBLE
    answer = convert(client, resaved, query)
    assert answer.status_code == 200 and answer.headers["X-Cache"] == "HIT"
    assert open_image(answer.data).size == (256, 171)
    assert convert(client, edited, query).headers["X-Cache"] == "MISS"


@pytest.mark.parametrize("name, factor", [("chelsea", 0.95), ("coins", 0.95), ("page", 1.05)])
def test_through_the_api_a_resized_copy_of_a_photo_smaller_than_the_output_hits(
        make_app, name, factor):
    """A photo under the output's size is never upscaled, so a 5 % smaller copy of it is
    fitted to another size. The grids see both through one Lanczos resampling to the
    same samples (box-filtered, their rows and columns were repeated at other places,
    and these copies, JPEG q90 as the photo, missed)."""
    client = make_app(ANIMEGAN_MAX_SIDE=SIDE).test_client()
    image = open_image(photo_bytes(name, quality=90)).convert("RGB")
    assert max(image.size) < SIDE
    query = f"?style=test_style&size={SIDE}"
    first = convert(client, photo_bytes(name, quality=90), query)
    assert first.status_code == 200, first.get_data(as_text=True)
    assert first.headers["X-Cache"] == "MISS"
    copy = convert(client, encode_image(resized(image, factor), "JPEG", quality=90), query)
    assert copy.status_code == 200 and copy.headers["X-Cache"] == "HIT"
    copy_size = (round(image.width * factor), round(image.height * factor))
    assert open_image(copy.data).size == copy_size  # the hit resized to this request's size


def test_the_statistics_are_of_the_lanczos_samples_and_nothing_else():
    """A fingerprint keeps the statistics of the picture resampled with Lanczos to
    SAMPLE_SIDE x SAMPLE_SIDE: each fine cell's luma mean and deviation over its 8 x 8
    samples, as they are; describe() refuses anything but the samples."""
    image = photo("chelsea")
    sampled = resampled(image)
    assert sampled.size == (SAMPLE_SIDE, SAMPLE_SIDE) and sampled.mode == "RGB"
    statistics = describe(sampled)
    assert statistics.to_bytes() == of_picture(image).to_bytes()
    assert Samples.from_bytes(statistics.to_bytes()).to_bytes() == statistics.to_bytes()
    fingerprint = Fingerprint.of(statistics, 16, size=image.size)
    assert np.array_equal(fingerprint.luma, statistics.luma)
    assert np.array_equal(fingerprint.cells, statistics.cells)
    luma = np.asarray(sampled.convert("YCbCr").getchannel(0), np.float64)
    for row, column in ((0, 0), (7, 9), (40, 63)):
        cell = luma[row * 8:row * 8 + 8, column * 8:column * 8 + 8]
        mean, deviation = statistics.luma[row, column]
        assert abs(int(mean) - cell.mean()) <= 0.5 and abs(int(deviation) - cell.std()) <= 0.5
    with pytest.raises(ValueError, match="samples"):
        describe(image)  # the photo itself is not the samples
    with pytest.raises(ValueError):
        Samples(statistics.luma[:-1], statistics.cells, statistics.thumb)


def test_a_fit_is_skipped_by_a_jpeg_hit_and_done_once_by_any_other(make_app):
    """A re-encoded JPEG that hits is decoded once, at its DCT scale, and never fitted;
    a PNG is fitted from the decode that takes its statistics, so a miss decodes it once."""
    client = make_app().test_client()
    query = "?style=test_style&size=128"

    def stages(data: bytes) -> tuple[str, set[str]]:
        response = convert(client, data, query)
        assert response.status_code == 200, response.get_data(as_text=True)
        timing = response.headers["Server-Timing"]
        return response.headers["X-Cache"], {part.split(";")[0] for part in timing.split(", ")}

    image = photo("coffee")
    assert stages(encode_image(image, "JPEG", quality=90)) == (
        "MISS", {"lookup", "sample", "cache", "decode", "infer", "encode"})
    assert stages(encode_image(image, "JPEG", quality=80)) == (
        "HIT", {"lookup", "sample", "cache"})
    mirrored = ImageOps.mirror(image)
    assert stages(encode_image(mirrored, "PNG")) == (
        "MISS", {"lookup", "sample", "cache", "infer", "encode"})
    assert stages(encode_image(mirrored, "JPEG", quality=85)) == (
        "HIT", {"lookup", "sample", "cache"})
