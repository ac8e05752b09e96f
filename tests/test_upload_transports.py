"""Every class of upload through every transport: a conversion or a clear refusal, never a 5xx.

The bodies come from ``upload_variants``: a small real photo in each accepted format, every
short prefix and a sample of longer ones, seeded bit flips, and hand-built specials. Each test
sends one group of bodies through one transport and reports all offenders at once, as counts
of each status per class with a few examples, instead of thousands of test ids.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict

import numpy as np
import pytest
from conftest import encode_image, open_image, photo_bytes
from flask import Flask, got_request_exception
from PIL import Image
from upload_variants import (
    GROUPS,
    TRANSPORTS,
    Variant,
    base_file,
    contract_violation,
    float_tiff,
    jpeg_scan_bomb,
    png_strip,
    post,
    sixteen_bit_gray,
    small_photo,
    specials,
    variants,
)

from flask_animegan.errors import BadImage, ConversionError
from flask_animegan.inputs.decoding import (
    DecodedUpload,
    DecodeLimits,
    decode_upload,
    fitted_size,
)

MAX_SIDE = 64
#: Output size asked for the prefixes and bit flips: hundreds of them decode to an image,
#: and converting at 16 px costs a fraction of 64 px (the whole files and the specials use
#: the default, MAX_SIDE, so small JPEGs are decoded at full scale too).
DERIVED_SIZE = 16
EXAMPLES = 4
#: Seconds a bomb may cost before its refusal; a decoder that inflates one takes several.
BOMB_SECONDS = 1.5

# Pillow warns about corrupt TIFF/EXIF metadata and carries on decoding; a server does the
# same, so here those warnings must not become errors that end the decode early.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:PIL.TiffImagePlugin")


@pytest.fixture(scope="module")
def storm(models_dir):
    """A test client of an app with small outputs, and the exceptions its views let escape."""
    from flask_animegan import AnimeGAN

    app = Flask("upload_classes")
    app.config.update(ANIMEGAN_MODELS_DIR=str(models_dir), ANIMEGAN_WARMUP_SIZE=0,
                      ANIMEGAN_RATE_LIMIT="", ANIMEGAN_MAX_SIDE=MAX_SIDE, ANIMEGAN_CACHE_TTL=0,
                      ANIMEGAN_SAMPLE_SIZE=0, ANIMEGAN_PRECISION="fp32", ANIMEGAN_CSRF=False,
                      ANIMEGAN_BACKEND="torch",
                      # one thread converts a 64 px image fastest on a busy small machine
                      ANIMEGAN_TORCH_THREADS=1,
                      # every hostile file goes through the helper processes
                      ANIMEGAN_DECODE_ISOLATION="process")
    AnimeGAN(app)
    # a 500's traceback is recorded below and shown in the summary; thousands of logged
    # tracebacks would bury it
    app.logger.setLevel(logging.CRITICAL)
    escaped: list[BaseException] = []

    def record(sender, exception, **extra):
        escaped.append(exception)

    got_request_exception.connect(record, app)
    yield app.test_client(), escaped
    got_request_exception.disconnect(record, app)


def send_all(storm, group: list[Variant], transport: str):
    """Post every variant; return per-class status counts and per-class offenders."""
    client, escaped = storm
    counts: dict[str, Counter] = defaultdict(Counter)
    offenders: dict[str, list[str]] = defaultdict(list)
    for variant in group:
        escaped.clear()
        size = None if variant.cls in ("base", "special") else DERIVED_SIZE
        response = post(client, transport, variant.body, size)
        status = response.status_code
        counts[variant.cls][status] += 1
        problem = contract_violation(response, transport, MAX_SIDE)
        if problem is None and variant.cls == "base" and status >= 400:
            problem = f"a valid file refused: {status} {_message(response)}"
        if problem is not None:
            if escaped:
                problem += f" ({escaped[-1].__class__.__name__}: {str(escaped[-1])[:80]})"
            offenders[variant.cls].append(f"{variant.name}: {problem}")
    return counts, offenders


def _message(response) -> str:
    if response.is_json:
        return str(response.get_json().get("error"))[:100]
    return ""


def summary(group: str, transport: str, counts, offenders) -> str:
    lines = [f"{group} via {transport}: uploads that broke the contract"]
    for cls, counter in counts.items():
        table = ", ".join(f"{status}: {n}" for status, n in sorted(counter.items()))
        bad = offenders.get(cls, [])
        lines.append(f"  {cls:8} {table}  -> {len(bad)} offending")
        lines += [f"      {example}" for example in _examples(bad)]
    return "\n".join(lines)


def _examples(offenders: list[str]) -> list[str]:
    """A few offenders, different problems first (the text after the variant's name)."""
    seen, distinct = set(), []
    for offender in offenders:
        problem = offender.split(": ", 1)[1]
        if problem not in seen:
            seen.add(problem)
            distinct.append(offender)
    rest = [o for o in offenders if o not in distinct]
    return (distinct + rest)[:EXAMPLES]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("group", GROUPS)
def test_every_variant_converts_or_is_refused_clearly(storm, group, transport):
    counts, offenders = send_all(storm, variants(group), transport)
    broken = sum(len(found) for found in offenders.values())
    assert broken == 0, summary(group, transport, counts, offenders)


@pytest.mark.parametrize("group", GROUPS)
def test_every_variant_is_fitted_to_cover_or_refused_clearly(group):
    """The cover fit (a face style's one decode) of every variant, with the default
    limits: the size fitted_size says, or a ConversionError with a 4xx status, never
    another exception; and a file is refused by it exactly when the long-side fit
    refuses it as corrupt."""
    limits = DecodeLimits()
    wrong = []
    for variant in variants(group):
        size = MAX_SIDE if variant.cls in ("base", "special") else DERIVED_SIZE
        outcomes: list[DecodedUpload | ConversionError | None] = []
        for cover in (True, False):
            try:
                outcomes.append(decode_upload(variant.body, limits, size=size, cover=cover))
            except ConversionError as exc:
                outcomes.append(exc)
            except Exception as exc:  # noqa: BLE001 - the offence this test looks for
                wrong.append(f"{variant.name}: cover={cover} raised {exc!r}"[:200])
                outcomes.append(None)
        covered, fitted = outcomes
        if isinstance(covered, ConversionError) and not 400 <= covered.status < 500:
            wrong.append(f"{variant.name}: status {covered.status}")
        if isinstance(covered, BadImage) is not isinstance(fitted, BadImage):
            wrong.append(f"{variant.name}: covered {covered!r:.80}, fitted {fitted!r:.80}")
        if isinstance(covered, DecodedUpload) and isinstance(fitted, DecodedUpload):
            if fitted_size(covered.source_size, size, cover=True) != covered.image.size:
                wrong.append(f"{variant.name}: sizes {covered.source_size}, {covered.image.size}")
    assert wrong == [], "\n".join(wrong[:EXAMPLES * 3])


def _form_original(client, body: bytes) -> Image.Image:
    """The decoded input as the form's result page shows it (the image the model saw)."""
    response = post(client, "form", body)
    page = response.get_data(as_text=True)
    shown = page[page.find('id="animegan-error"'):][:300]
    assert response.status_code == 303, (response.status_code, shown)
    original = client.get(response.headers["Location"] + "/original")
    assert original.status_code == 200
    return open_image(original.data)


def _brightness(image: Image.Image) -> float:
    return float(np.asarray(image.convert("L"), dtype=np.float64).mean())


@pytest.mark.parametrize("make", [
    pytest.param(lambda: float_tiff("camera"), id="float32 TIFF in [0, 1]"),
    pytest.param(lambda: encode_image(sixteen_bit_gray("camera"), "PNG"), id="16-bit PNG"),
    pytest.param(lambda: encode_image(sixteen_bit_gray("camera"), "TIFF"), id="16-bit TIFF"),
])
def test_high_depth_samples_keep_their_brightness(storm, make):
    """A float or 16-bit grey photo decodes to the same picture as its 8-bit copy, not black."""
    client, _ = storm
    eight_bit = encode_image(small_photo("camera").convert("L"), "PNG")
    expected = _brightness(_form_original(client, eight_bit))
    got = _brightness(_form_original(client, make()))
    assert expected > 60  # the photo itself is not dark
    assert abs(got - expected) < 8, (got, expected)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: png_strip(1, 40_000_000), id="png 1x40000000"),
    pytest.param(lambda: png_strip(40_000_000, 1), id="png 40000000x1"),
    pytest.param(lambda: jpeg_scan_bomb(2000, 1500, 1000), id="jpeg scan bomb 2000x1500 x1000"),
])
def test_bombs_are_refused_before_decoding(storm, make):
    """A file that is cheap to send but dear to decode gets 413 or 400 within BOMB_SECONDS,
    on the API and on the form."""
    client, _ = storm
    body = make()
    for transport in TRANSPORTS:
        start = time.perf_counter()
        response = post(client, transport, body)
        elapsed = time.perf_counter() - start
        assert response.status_code in {400, 413}, (transport, response.status_code)
        assert contract_violation(response, transport, MAX_SIDE) is None, transport
        assert elapsed < BOMB_SECONDS, (transport, f"{elapsed:.2f} s")


def test_a_normal_photo_converts_after_the_storm(storm):
    """Hostile uploads leave nothing behind: a normal photo still converts on both routes."""
    client, _ = storm
    for variant in specials() + variants("jpeg_exif")[:60]:
        post(client, "api_raw", variant.body, DERIVED_SIZE)
    response = client.post("/animegan/convert", data=photo_bytes("astronaut"),
                           content_type="image/jpeg")
    assert response.status_code == 200
    image = open_image(response.data)
    assert image.mode == "RGB" and max(image.size) == MAX_SIDE
    response = post(client, "form", base_file("jpeg"))
    assert response.status_code == 303
    assert client.get(response.headers["Location"]).status_code == 200
    decoder = client.application.extensions["animegan"].decoder
    assert decoder.isolation == "process" and decoder.pool.started >= 1  # the storm went there
