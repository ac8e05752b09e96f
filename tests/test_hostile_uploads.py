"""Hostile and odd uploads through the real routes: a clear 4xx JSON error or a correct image."""

from __future__ import annotations

import io
import resource

import pytest
from conftest import open_image, photo_bytes
from hostile_corpus import corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CASES = corpus()


@pytest.fixture(scope="module")
def hostile_client(models_dir):
    from flask import Flask

    from flask_animegan import AnimeGAN

    app = Flask("hostile")
    app.config.update(ANIMEGAN_MODELS_DIR=str(models_dir), ANIMEGAN_WARMUP_SIZE=0,
                      ANIMEGAN_RATE_LIMIT="", ANIMEGAN_MAX_SIDE=64,
                      # the cache on: every file is decoded once, then looked up by what
                      # was fitted (test_upload_transports sends its variants with it off)
                      ANIMEGAN_CACHE_TTL=3600,
                      ANIMEGAN_MAX_PIXELS=20_000_000, ANIMEGAN_CSRF=False,
                      # the uploads, not the backend choice (auto's timings cost seconds)
                      ANIMEGAN_BACKEND="torch", ANIMEGAN_PRECISION="fp32",
                      # every hostile file goes through the helper processes
                      ANIMEGAN_DECODE_ISOLATION="process")
    AnimeGAN(app)
    return app.test_client()


def check(response, expected: set[int], label: str) -> None:
    assert response.status_code in expected, (label, response.status_code,
                                              response.get_data()[:200])
    if response.status_code == 200:
        image = open_image(response.data)
        assert image.mode == "RGB" and max(image.size) <= 64, label
    else:
        assert response.is_json and response.json["error"], label


@pytest.mark.parametrize("name,body,expected", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("transport", ["multipart", "raw"])
def test_hostile_upload(hostile_client, name, body, expected, transport):
    if transport == "multipart":
        # the file name and declared type lie: decided by content
        response = hostile_client.post("/animegan/convert", data={
            "image": (io.BytesIO(body), "innocent.jpg", "image/jpeg")})
    else:
        response = hostile_client.post("/animegan/convert", data=body, content_type="image/png")
    check(response, expected, name)


def test_memory_stays_bounded_over_the_corpus(hostile_client):
    """Bombs are refused from their headers: the whole corpus costs little memory."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    for name, body, expected in CASES:
        check(hostile_client.post("/animegan/convert", data=body, content_type="image/jpeg"),
              expected, name)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    # a single decoded 50000 x 50000 RGB bomb alone would need 7 GiB
    assert grown_mib < 300, grown_mib


def test_the_service_keeps_working_after_the_corpus(hostile_client):
    response = hostile_client.post("/animegan/convert", data=photo_bytes("astronaut"),
                                   content_type="image/jpeg")
    assert response.status_code == 200
    decoder = hostile_client.application.extensions["animegan"].decoder
    assert decoder.isolation == "process" and decoder.pool.started >= 1  # the corpus went there


@pytest.mark.parametrize("field,value", [
    ("style", "../../etc/passwd"), ("style", "..%2F..%2Fetc%2Fpasswd"), ("style", "/etc/passwd"),
    ("style", "test_style\x00.pt"), ("style", "TEST_STYLE"), ("style", "a" * 500),
    ("format", "../../x"), ("format", "gif"), ("format", "JPEG2000"),
    ("size", "-1"), ("size", "0"), ("size", "1e9"), ("size", "NaN"), ("size", "12px"),
    ("size", "99999999999999999999999"),
])
def test_hostile_parameters(hostile_client, field, value):
    response = hostile_client.post("/animegan/convert", data={
        "image": (io.BytesIO(photo_bytes()), "a.jpg"), field: value})
    assert response.status_code in {400, 404}
    assert response.is_json and response.json["error"]


SEED_FILES = [photo_bytes("coffee"), photo_bytes("chelsea", "PNG"), photo_bytes("rocket", "WEBP"),
              photo_bytes("astronaut", "GIF")]


@st.composite
def mutated_upload(draw) -> bytes:
    """A real image file with random byte flips, truncation, insertion or a swapped header."""
    data = bytearray(draw(st.sampled_from(SEED_FILES)))
    for _ in range(draw(st.integers(0, 8))):
        position = draw(st.integers(0, len(data) - 1))
        data[position] = draw(st.integers(0, 255))
    operation = draw(st.sampled_from(["none", "truncate", "insert", "header"]))
    if operation == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif operation == "insert":
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=64))
    elif operation == "header":
        data[:16] = draw(st.binary(min_size=16, max_size=16))
    return bytes(data)


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=st.one_of(mutated_upload(), st.binary(max_size=2048)),
       size=st.one_of(st.none(), st.text(max_size=6), st.integers(-10, 10_000).map(str)))
def test_fuzzed_uploads_never_crash(hostile_client, body, size):
    query = {} if size is None else {"size": size}
    response = hostile_client.post("/animegan/convert", query_string=query, data=body,
                                   content_type="application/octet-stream")
    assert response.status_code in {200, 400, 404, 413, 415}, response.get_data()[:200]
    if response.status_code != 200:
        assert response.is_json and response.json["error"]
