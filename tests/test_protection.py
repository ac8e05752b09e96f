"""A site's own checks on our routes, with a real Flask-Login site (tests/host_site):
ANIMEGAN_PAGE_DECORATORS / ANIMEGAN_API_DECORATORS with ``login_required``, the
administrator's box (ANIMEGAN_ADMIN_CHECK), and the site's own error handlers, which
never answer for us.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TEST_CONFIG, photo_bytes
from flask import Flask
from host_site import SITE_ERROR, SITE_EXCEPTION, SITE_NOT_FOUND, create_app

from flask_animegan import AnimeGAN

ADMIN_BOX = "For the site's administrator"
LOGIN_REQUIRED = "flask_login.login_required"


@pytest.fixture
def site(models_dir: Path) -> Callable[..., Flask]:
    def make(**options: object) -> Flask:
        fast = {key: value for key, value in TEST_CONFIG.items() if key.startswith("ANIMEGAN_")}
        return create_app(models_dir, **{**fast, "login": True, "error_handlers": True,
                                         **options})

    return make


def logged_in(app: Flask, user: str = "ann"):
    client = app.test_client()
    assert client.post(f"/login?user={user}").status_code == 302
    return client


def convert(client, **query: str):
    return client.post("/studio/convert", query_string={"size": "64", **query},
                       data=photo_bytes("coffee"), content_type="image/jpeg")


def test_login_required_on_the_pages_sends_visitors_to_the_login_page(site):
    app = site(ANIMEGAN_PAGE_DECORATORS=[LOGIN_REQUIRED])
    visitor = app.test_client()
    page = visitor.get("/studio/")
    assert page.status_code == 302
    assert page.headers["Location"].startswith("/login?next=")
    form = visitor.post("/studio/upload", data={"image": (io.BytesIO(b"x"), "a.jpg")})
    assert form.status_code == 302 and form.headers["Location"].startswith("/login")
    # the API and the health check were not asked to be guarded
    assert convert(visitor).status_code == 200
    assert visitor.get("/studio/healthz").status_code == 200
    member = logged_in(app)
    assert member.get("/studio/").status_code == 200


def test_login_required_on_the_api_answers_401_json_with_the_login_page(site):
    app = site(ANIMEGAN_API_DECORATORS=[LOGIN_REQUIRED])
    visitor = app.test_client()
    refused = convert(visitor)
    assert refused.status_code == 401 and refused.is_json
    assert refused.json["status"] == 401 and "log in" in refused.json["error"]
    assert refused.json["login_url"].startswith("/login?next=")
    assert visitor.get("/studio/styles").status_code == 401
    # the pages, the health check and the API's description stay open
    assert visitor.get("/studio/").status_code == 200
    assert visitor.get("/studio/healthz").status_code == 200
    assert visitor.get("/studio/openapi.json").status_code == 200
    member = logged_in(app)
    assert convert(member).status_code == 200
    assert member.get("/studio/styles").status_code == 200


def test_a_refused_visitor_takes_nothing_from_the_rate_limit(site):
    app = site(ANIMEGAN_API_DECORATORS=[LOGIN_REQUIRED], ANIMEGAN_RATE_LIMIT="2 per minute")
    visitor = app.test_client()
    assert [convert(visitor).status_code for _ in range(3)] == [401] * 3
    member = logged_in(app)  # the same address, counted by the site's Limiter
    # three sizes: each a miss (a cache hit would take nothing)
    assert [convert(member, size=size).status_code for size in ("64", "48", "32")] == [
        200, 200, 429]


def test_without_a_login_view_login_required_gives_our_401_on_both(models_dir):
    from flask_login import LoginManager

    app = Flask("no_login_view")
    app.config.update({key: value for key, value in TEST_CONFIG.items()
                       if key.startswith("ANIMEGAN_")}, SECRET_KEY="k",
                      ANIMEGAN_MODELS_DIR=str(models_dir),
                      ANIMEGAN_PAGE_DECORATORS=[LOGIN_REQUIRED],
                      ANIMEGAN_API_DECORATORS=[LOGIN_REQUIRED])
    LoginManager(app).user_loader(lambda user_id: None)

    @app.errorhandler(401)
    def site_401(error):
        return "Site: who are you?", 401

    AnimeGAN(app)
    client = app.test_client()
    api = client.post("/animegan/convert", data=b"x", content_type="image/jpeg")
    assert api.status_code == 401 and api.is_json and "Site:" not in api.get_data(as_text=True)
    page = client.get("/animegan/")
    assert page.status_code == 401 and page.mimetype == "text/html"
    assert "Site:" not in page.get_data(as_text=True) and "animegan-form" in page.get_data(
        as_text=True)


def test_decorators_are_listed_outermost_first_and_may_be_functions(site):
    calls: list[str] = []

    def named(name: str):
        def decorator(view):
            def wrapped(*args, **kwargs):
                calls.append(name)
                return view(*args, **kwargs)
            return wrapped
        return decorator

    app = site(ANIMEGAN_PAGE_DECORATORS=[named("outer"), named("inner")])
    assert app.test_client().get("/studio/").status_code == 200
    assert calls == ["outer", "inner"]


def test_a_decorator_that_cannot_be_imported_stops_the_start(site):
    with pytest.raises(RuntimeError, match="ANIMEGAN_PAGE_DECORATORS: 'site.nowhere.guard' "
                                           "cannot be imported"):
        site(ANIMEGAN_PAGE_DECORATORS=["site.nowhere.guard"])
    with pytest.raises(RuntimeError, match="ANIMEGAN_ADMIN_CHECK: 'host_site.USERS' is a dict, "
                                           "not a callable"):
        site(ANIMEGAN_ADMIN_CHECK="host_site.USERS")


def test_the_admin_box_shows_only_to_the_sites_administrators(site):
    app = site(ANIMEGAN_ADMIN_CHECK="host_site:is_site_admin", ANIMEGAN_SHIPPED_STYLES=True)
    app.debug = True  # debug mode no longer shows it to everyone
    assert ADMIN_BOX not in app.test_client().get("/studio/").get_data(as_text=True)
    assert ADMIN_BOX not in logged_in(app, "ann").get("/studio/").get_data(as_text=True)
    assert ADMIN_BOX in logged_in(app, "admin").get("/studio/").get_data(as_text=True)


def test_without_a_check_the_admin_box_is_for_debug_mode_on_loopback_only(site):
    app = site()
    assert ADMIN_BOX not in app.test_client().get("/studio/").get_data(as_text=True)
    app.debug = True
    local = app.test_client().get("/studio/", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert ADMIN_BOX in local.get_data(as_text=True)
    remote = app.test_client().get("/studio/", environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert ADMIN_BOX not in remote.get_data(as_text=True)


# -- the site's error handlers never answer for us ----------------------------------------

def test_the_sites_404_handler_does_not_answer_our_404s(site):
    app = site()
    client = app.test_client()
    expired = client.get("/studio/result/no-such-token")
    assert expired.status_code == 404 and SITE_NOT_FOUND not in expired.get_data(as_text=True)
    assert "has expired or never existed" in expired.get_data(as_text=True)
    assert 'id="animegan-form"' in expired.get_data(as_text=True)  # our page, in the layout
    style = convert(client, style="no_such_style")
    assert style.status_code == 404 and style.is_json and "no_such_style" in style.json["error"]
    job = client.get("/studio/jobs/nothing")
    assert job.status_code == 404 and job.is_json
    # unknown paths and methods under the prefix: ours too
    for path in ("/studio/nowhere", "/studio/result/x/y/z", "/studio/styles/x"):
        answer = client.get(path)
        assert answer.status_code == 404 and answer.is_json, path
        assert answer.json["status"] == 404 and SITE_NOT_FOUND not in answer.get_data(
            as_text=True)
    wrong_method = client.get("/studio/convert")
    assert wrong_method.status_code == 405 and wrong_method.is_json
    assert "POST" in wrong_method.headers["Allow"]
    # the site's own paths keep the site's handlers
    assert client.get("/nowhere").get_data(as_text=True) == SITE_NOT_FOUND
    assert client.get("/site/broken").get_data(as_text=True) == SITE_EXCEPTION


def test_a_bug_of_ours_is_our_500_not_the_sites_exception_page(site):
    app = site()
    app.testing = False  # as served: the exception is handled, not raised to the client
    app.config["PROPAGATE_EXCEPTIONS"] = False
    service = app.extensions["animegan"]

    def broken(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    service.styles_info = broken  # the view's own call fails
    client = app.test_client()
    api = client.get("/studio/styles")
    assert api.status_code == 500 and api.is_json
    text = api.get_data(as_text=True)
    assert SITE_EXCEPTION not in text and SITE_ERROR not in text and "a bug of ours" not in text
    assert api.headers["X-Content-Type-Options"] == "nosniff"
