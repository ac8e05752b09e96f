"""Limits that fit a site: a request is charged after it answers, by the pixels the model
converted, so a cache hit, a refusal and a failure cost nothing; ANIMEGAN_RATE_LIMIT_KEY
keys the limit and the cache's scope (here the user Flask-Login logged in); the default
limit holds a visitor's busy minute on the page (docs/http-api.md).
"""

from __future__ import annotations

import io
import re

import pytest
import torch
from conftest import (
    TEST_CONFIG,
    encode_image,
    photo,
    photo_bytes,
    save_random_generator,
)
from flask import Flask
from host_site import add_login, create_app
from servers import Server

from flask_animegan.config import DEFAULTS
from flask_animegan.runtime.generator import Generator

TOKEN = re.compile(r'<form id="animegan-form".*?name="csrf_token" value="([^"]+)"', re.DOTALL)
#: One office behind one NAT: every client below comes from this address.
OFFICE = {"REMOTE_ADDR": "203.0.113.7"}


def user_or_address() -> str | None:
    """docs/configuration.md's ANIMEGAN_RATE_LIMIT_KEY: the logged-in user, else None (the
    address)."""
    from flask_login import current_user

    return f"user:{current_user.get_id()}" if current_user.is_authenticated else None


def another_style(app: Flask) -> str:
    """An installed style other than the default (a request that names it is a miss)."""
    default = app.extensions["animegan"].engine.default_style
    return next(name for name in ("test_style", "other_style") if name != default)


def remaining(response) -> int:
    return int(response.headers["X-RateLimit-Remaining"])


def api(client, data: bytes, prefix: str = "/animegan", **query: str):
    return client.post(f"{prefix}/convert", query_string=query, data=data,
                       content_type="image/jpeg", environ_base=OFFICE)


def form(client, data: bytes, prefix: str = "/animegan", **fields: str):
    """POST the upload form as a browser does, with the token of the page it came from."""
    page = client.get(f"{prefix}/", environ_base=OFFICE).get_data(as_text=True)
    found = TOKEN.search(page)
    token = {"csrf_token": found.group(1)} if found else {}
    return client.post(f"{prefix}/upload", data={
        "image": (io.BytesIO(data), "photo.jpg"), **token, **fields}, environ_base=OFFICE)


def result_image(client, page) -> bytes:
    """The converted picture of a form upload's result page."""
    html = client.get(page.headers["Location"], environ_base=OFFICE).get_data(as_text=True)
    url = re.search(r'id="animegan-result"[^>]* src="([^"]+)"', html).group(1)
    return client.get(url, environ_base=OFFICE).data


# -- what a request costs ---------------------------------------------------------------------
@pytest.mark.parametrize("send", [api, form], ids=["api", "form"])
def test_five_cache_hits_in_a_row_leave_the_limit_unchanged(make_app, send):
    app = make_app(ANIMEGAN_RATE_LIMIT="10 per minute", SECRET_KEY="k")
    client = app.test_client()
    data = photo_bytes("coffee")
    miss = send(client, data)
    assert miss.status_code in (200, 303), miss.get_data(as_text=True)
    assert remaining(miss) == 9
    hits = [send(client, data) for _ in range(5)]
    assert [r.status_code for r in hits] == [miss.status_code] * 5
    if send is api:
        assert [r.headers["X-Cache"] for r in hits] == ["HIT"] * 5
    assert [remaining(r) for r in hits] == [9] * 5
    # the header told the truth: the next miss (another style) takes the tenth point's place
    assert remaining(send(client, data, style=another_style(app))) == 8


def test_refusals_and_failures_cost_nothing_and_a_miss_costs_one(make_app, tmp_path):
    # a style whose network overflows: the model runs, its result is refused (503)
    torch.manual_seed(0)
    model = Generator()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1e30)
    torch.save(model.state_dict(), tmp_path / "overflow.pt")
    save_random_generator(tmp_path / "good.pt", seed=0)
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_DEFAULT_STYLE="good",
                   ANIMEGAN_RATE_LIMIT="3 per minute", ANIMEGAN_MAX_UPLOAD_BYTES=200_000)
    client = app.test_client()
    coffee = photo_bytes("coffee")
    answers = {
        "bad size": api(client, coffee, size="huge"),
        "too large": api(client, b"\xff" * 300_000),
        "not an image type": client.post("/animegan/convert", data="x",
                                         content_type="text/plain", environ_base=OFFICE),
        "corrupt, decoded": api(client, coffee[:600]),
        "form, corrupt": form(client, coffee[:600]),
        "inference failed": api(client, coffee, style="overflow"),
    }
    assert {name: r.status_code for name, r in answers.items()} == {
        "bad size": 400, "too large": 413, "not an image type": 415, "corrupt, decoded": 400,
        "form, corrupt": 400, "inference failed": 503}
    assert {name: remaining(r) for name, r in answers.items()} == dict.fromkeys(answers, 3)
    assert remaining(api(client, coffee)) == 2  # a miss
    assert remaining(form(client, photo_bytes("astronaut"))) == 1  # a miss through the form


def test_a_conversion_costs_the_pixels_it_made(make_app):
    # ANIMEGAN_MAX_SIDE is 128 in the tests: one point per 128 x 128 pixels begun
    client = make_app(ANIMEGAN_RATE_LIMIT="30 per minute", ANIMEGAN_MAX_OUTPUT_SIDE=512
                      ).test_client()
    coffee = photo_bytes("coffee")  # 600 x 400
    assert remaining(api(client, coffee, size="256")) == 27  # 256 x 171: 2.67 -> 3
    assert remaining(api(client, coffee, size="512")) == 16  # 512 x 341: 10.7 -> 11
    # a photo smaller than the size asked for is converted, and charged, at its own size
    small = encode_image(photo("astronaut").resize((120, 120)))
    assert remaining(api(client, small, size="512")) == 15


# -- the site's key: users behind one address -------------------------------------------------
def office_app(make_app, **config: object) -> Flask:
    """An app with Flask-Login (users ``ann`` and ``admin``) whose conversions are keyed by
    the user, else the address; the extension's own Limiter counts."""
    app = make_app(SECRET_KEY="office", ANIMEGAN_RATE_LIMIT_KEY=user_or_address, **config)
    add_login(app)
    return app


def log_in(app: Flask, user: str):
    client = app.test_client()
    assert client.post(f"/login?user={user}&next=/", environ_base=OFFICE).status_code == 302
    return client


@pytest.mark.parametrize("send", [api, form], ids=["api", "form"])
def test_two_users_behind_one_address_each_get_their_own_limit(make_app, send):
    app = office_app(make_app, ANIMEGAN_RATE_LIMIT="2 per minute")
    ann, admin, visitor = log_in(app, "ann"), log_in(app, "admin"), app.test_client()
    photos = [photo_bytes(name) for name in ("coffee", "astronaut", "rocket")]
    assert [send(ann, data).status_code for data in photos] == (
        [200, 200, 429] if send is api else [303, 303, 429])
    # ann has spent hers; admin and the visitor, from the same address, have theirs
    first = send(admin, photos[0])
    assert first.status_code in (200, 303) and remaining(first) == 1
    assert send(visitor, photos[0]).status_code in (200, 303)
    assert send(admin, photos[1]).status_code in (200, 303)
    assert send(admin, photos[2]).status_code == 429


def test_two_users_behind_one_address_each_get_their_own_cache(make_app):
    app = office_app(make_app, ANIMEGAN_RATE_LIMIT="10 per minute")
    ann, admin = log_in(app, "ann"), log_in(app, "admin")
    data = photo_bytes("coffee")
    assert api(ann, data).headers["X-Cache"] == "MISS"
    assert api(ann, data).headers["X-Cache"] == "HIT"
    # admin sends ann's photo: converted for admin, never ann's stored result
    theirs = api(admin, data)
    assert theirs.headers["X-Cache"] == "MISS" and remaining(theirs) == 9
    assert api(admin, data).headers["X-Cache"] == "HIT"
    # and through the form: ann's second upload is hers from the cache, free
    page = form(ann, data)
    assert page.status_code == 303 and remaining(page) == 9
    assert result_image(ann, page)


def test_the_key_keys_the_host_sites_limiter_too(models_dir):
    """A site with its own Limiter (keyed by address) and Flask-Login, the key given as a
    dotted path: our limit and cache go by the user, the site's own limits by address."""
    fast = {key: value for key, value in TEST_CONFIG.items() if key.startswith("ANIMEGAN_")}
    app = create_app(models_dir, login=True, **{
        **fast, "ANIMEGAN_RATE_LIMIT": "1 per minute",
        "ANIMEGAN_RATE_LIMIT_KEY": "test_site_limits.user_or_address"})
    assert app.extensions["animegan"].limiter is app.extensions["site"]["limiter"]
    ann, admin = log_in(app, "ann"), log_in(app, "admin")
    data = photo_bytes("coffee")
    assert api(ann, data, prefix="/studio").status_code == 200
    assert api(ann, photo_bytes("rocket"), prefix="/studio").status_code == 429
    answer = api(admin, data, prefix="/studio")
    assert answer.status_code == 200 and answer.headers["X-Cache"] == "MISS"


@pytest.mark.parametrize(("value", "words"), [
    ("no_such_module.client_key", "cannot be imported"),
    ("flask_animegan.config.PREFIX", "not a callable"),
    ("not a path", "neither a callable nor the dotted path"),
])
def test_a_key_that_cannot_be_used_stops_the_app_naming_it(make_app, value, words):
    with pytest.raises(RuntimeError, match="ANIMEGAN_RATE_LIMIT_KEY") as error:
        make_app(ANIMEGAN_RATE_LIMIT_KEY=value)
    assert words in str(error.value)


# -- the default limit and the page ------------------------------------------------------------
def page_script(client, data: bytes, prefix: str = "/animegan", **fields: str):
    """POST as animegan.js does: the form's fields as multipart to the API."""
    return client.post(f"{prefix}/convert", data={
        "image": (io.BytesIO(data), "photo.jpg"), **fields}, environ_base=OFFICE)


def test_a_visitors_busy_minute_on_the_page_fits_the_default_limit(make_app):
    """The minute docs/http-api.md counts: two photos (one with the page's script, one
    with the plain form), each converted, then in the other style, with each colour option
    and at another size, each result downloaded, and each photo sent again unchanged (a
    hit): 2 x 5 conversions."""
    default = DEFAULTS["ANIMEGAN_RATE_LIMIT"]
    app = make_app(ANIMEGAN_RATE_LIMIT=default, SECRET_KEY="k")
    client = app.test_client()
    changes = [{}, {"style": another_style(app)}, {"colors": "luma"}, {"colors": "keep"},
               {"size": "96"}]
    answers = []
    for name, send in (("coffee", page_script), ("astronaut", form)):
        data = photo_bytes(name)
        for change in changes:
            answer = send(client, data, **change)
            assert answer.status_code in (200, 303), answer.get_data(as_text=True)
            if send is form:
                assert result_image(client, answer)  # shown and downloaded: free
            answers.append(answer)
        again = send(client, data)
        assert again.status_code in (200, 303)
        answers.append(again)
    assert remaining(answers[-1]) == int(default.split()[0]) - 10


def test_a_host_limiters_own_headers_see_hits_as_free(models_dir):
    """With the site's Limiter sending its own X-RateLimit-* headers (taken after its
    deduction), five hits leave its Remaining unchanged too."""
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address

    from flask_animegan import AnimeGAN

    app = Flask("site_with_headers")
    app.config.update(TEST_CONFIG, ANIMEGAN_MODELS_DIR=str(models_dir),
                      ANIMEGAN_RATE_LIMIT="10 per minute")
    Limiter(get_remote_address, app=app, storage_uri="memory://", headers_enabled=True)
    AnimeGAN(app)
    client = app.test_client()
    data = photo_bytes("coffee")
    answers = [api(client, data) for _ in range(6)]
    assert [r.headers["X-Cache"] for r in answers] == ["MISS"] + ["HIT"] * 5
    assert [r.headers["X-RateLimit-Remaining"] for r in answers] == ["9"] * 6


@pytest.mark.server
def test_through_the_real_server_hits_are_free_under_the_default_limit(models_dir, tmp_path):
    """What a client of gunicorn sees, with the limit left at its default."""
    import requests

    server = Server({"ANIMEGAN_MODELS_DIR": str(models_dir), "ANIMEGAN_MAX_SIDE": "128",
                     "ANIMEGAN_ACCESS_LOG": "", "ANIMEGAN_BACKEND": "torch",
                     "ANIMEGAN_PRECISION": "fp32", "ANIMEGAN_SAMPLE_SIZE": "0"},
                    log=tmp_path / "gunicorn.log")
    try:
        data = photo_bytes("coffee")
        answers = [requests.post(f"{server.url}/animegan/convert", data=data, timeout=60,
                                 headers={"Content-Type": "image/jpeg"}) for _ in range(6)]
    finally:
        server.stop()
    assert [r.headers["X-Cache"] for r in answers] == ["MISS"] + ["HIT"] * 5
    limit = int(DEFAULTS["ANIMEGAN_RATE_LIMIT"].split()[0])
    assert {r.headers["X-RateLimit-Limit"] for r in answers} == {str(limit)}
    assert [r.headers["X-RateLimit-Remaining"] for r in answers] == [str(limit - 1)] * 6
