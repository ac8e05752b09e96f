"""The conversions' rate limit charges a client for the conversions it gets: a refusal
takes nothing; a photo takes one per ANIMEGAN_MAX_SIDE squared pixels of its result,
at most the whole window (tests/test_site_limits.py: hits, failures, per-user keys).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from conftest import photo_bytes

FLASK_LIMITER_PRIVATE = re.compile(r"\._(?!_)[a-z]\w*")


def remaining(response) -> int:
    return int(response.headers["X-RateLimit-Remaining"])


def convert(client, data: bytes | None = None, **query: str):
    return client.post("/animegan/convert", query_string=query,
                       data=photo_bytes("coffee") if data is None else data,
                       content_type="image/jpeg")


def test_refusals_leave_the_limit_unchanged(make_app):
    app = make_app(ANIMEGAN_RATE_LIMIT="3 per minute", SECRET_KEY="k",
                   ANIMEGAN_MAX_UPLOAD_BYTES=200_000)
    client = app.test_client()
    first = convert(client, size="64")
    assert first.status_code == 200 and remaining(first) == 2
    refusals = {
        "unknown style": convert(client, style="no_such_style"),
        "bad size": convert(client, size="huge"),
        "size too large": convert(client, size="99999"),
        "bad format": convert(client, format="bmp"),
        "bad colors": convert(client, colors="sepia"),
        "too large": convert(client, data=b"\xff" * 300_000),
        "csrf": client.post("/animegan/upload", data={
            "image": (io.BytesIO(photo_bytes("coffee")), "a.jpg")}),
        "not an image type": client.post("/animegan/convert", data="x",
                                         content_type="text/plain"),
    }
    statuses = {name: response.status_code for name, response in refusals.items()}
    assert statuses == {"unknown style": 404, "bad size": 400, "size too large": 400,
                        "bad format": 400, "bad colors": 400, "too large": 413, "csrf": 400,
                        "not an image type": 415}
    # a form its CSRF check refuses is not even looked at by the limit (web/limits.py)
    assert "X-RateLimit-Remaining" not in refusals.pop("csrf").headers
    assert {name: remaining(response) for name, response in refusals.items()} == dict.fromkeys(
        refusals, 2)
    # an image refused once decoded converted nothing: it takes nothing either
    broken = convert(client, data=photo_bytes("coffee")[:600])
    assert broken.status_code == 400 and remaining(broken) == 2
    for left, size in ((1, "96"), (0, "32")):  # other sizes: misses, each counted
        answer = convert(client, size=size)
        assert answer.status_code == 200 and remaining(answer) == left
    assert convert(client, size="64").status_code == 429  # a hit: refused once spent


def test_a_large_output_costs_its_pixels(make_app):
    # ANIMEGAN_MAX_SIDE is 128 in the tests: a point per 128 x 128 pixels begun
    app = make_app(ANIMEGAN_RATE_LIMIT="10 per minute", ANIMEGAN_MAX_OUTPUT_SIDE=256)
    client = app.test_client()
    square = photo_bytes("astronaut")  # 512 x 512
    double = convert(client, data=square, size="256")  # 256 x 256: 4
    assert double.status_code == 200, double.get_data(as_text=True)
    assert remaining(double) == 6
    one_and_a_half = convert(client, size="192")  # coffee at 192 x 128: 1.5 -> 2
    assert one_and_a_half.status_code == 200 and remaining(one_and_a_half) == 4
    normal = convert(client, size="128")
    assert normal.status_code == 200 and remaining(normal) == 3
    # a size whose most (ceil((256 / 128)^2) = 4) does not fit in what is left is refused
    # whole, before anything runs
    refused = convert(client, data=photo_bytes("rocket"), size="256")
    assert refused.status_code == 429 and remaining(refused) == 3
    # the form field counts as the query string does
    form = client.post("/animegan/convert", data={
        "image": (io.BytesIO(photo_bytes("coffee")), "a.jpg"), "size": "256"})
    assert form.status_code == 429


def test_the_cost_is_capped_at_the_whole_window(make_app):
    app = make_app(ANIMEGAN_RATE_LIMIT="3 per minute; 100 per day",
                   ANIMEGAN_MAX_OUTPUT_SIDE=512)
    client = app.test_client()
    largest = convert(client, size="512")  # 11 points, capped at 3: never refused for ever
    assert largest.status_code == 200, largest.get_data(as_text=True)
    assert remaining(largest) == 0
    assert convert(client, size="64").status_code == 429


def test_the_limits_reach_flask_limiter_through_its_public_api():
    source = (Path(__file__).resolve().parent.parent / "flask_animegan" / "web"
              / "limits.py").read_text(encoding="utf-8")
    uses = {match.group(0) for match in FLASK_LIMITER_PRIVATE.finditer(source)}
    # our own private names only (limits.py's helpers), none of flask-limiter's
    ours = {"._call", "._conversion_limit", "._not_counting", "._form_post_to_refuse",
            "._settle_limiter", "._configured", "._configuring", "._CHARGE"}
    assert uses <= ours, uses - ours
