"""The extension object: init patterns, per-app state, config, the Python API."""

from __future__ import annotations

import io
import logging
import re

import pytest
from conftest import TEST_CONFIG, encode_image, photo, photo_bytes
from flask import Flask, current_app
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from PIL import Image

from flask_animegan import AnimeGAN, Generator, get_service
from flask_animegan.config import SETTINGS


def base_app(models_dir, **config) -> Flask:
    app = Flask("host")
    # the suite's fast settings (torch fp32, no samples, only the test styles)
    fast = {key: value for key, value in TEST_CONFIG.items() if key.startswith("ANIMEGAN_")}
    app.config.update({**fast, "ANIMEGAN_MODELS_DIR": str(models_dir), **config})
    return app


def test_app_factory_pattern_and_the_model_on_the_service(models_dir):
    animegan = AnimeGAN()
    app = base_app(models_dir)
    animegan.init_app(app)
    service = app.extensions["animegan"]
    # init_app loads nothing (CLI commands stay quick); the warm-up loads the default
    assert service.model is None
    assert service.engine.status()["loaded"] == []
    AnimeGAN.warm_up(app)
    assert isinstance(service.model, Generator)
    assert service.model is service.engine.model(None)
    # runtime state stays out of app.config
    assert not {key for key in app.config if key.startswith("ANIMEGAN_")} - {
        s.name for s in SETTINGS}
    assert app.extensions["animegan"].engine.status()["loaded"][0] == "other_style"
    assert app.extensions["animegan"].engine.default_style == "other_style"
    assert app.config["ANIMEGAN_URL_PREFIX"] == "/animegan"  # defaults set on the real config
    assert not hasattr(animegan, "app")


def test_without_a_warm_up_the_first_conversion_loads_the_model(models_dir):
    app = base_app(models_dir, ANIMEGAN_RATE_LIMIT="")
    AnimeGAN(app)
    response = app.test_client().post("/animegan/convert", data=photo_bytes("coffee"),
                                      content_type="image/jpeg")
    assert response.status_code == 200
    assert isinstance(app.extensions["animegan"].model, Generator)
    assert app.extensions["animegan"].warmed_up


def test_torch_threads_are_set_once_per_process_not_by_the_last_app(models_dir, caplog):
    import torch

    before = torch.get_num_threads()
    with caplog.at_level(logging.WARNING, logger="flask_animegan"):
        AnimeGAN(base_app(models_dir, ANIMEGAN_TORCH_THREADS=before + 1))
    assert torch.get_num_threads() == before
    assert any("torch threads are per process" in r.getMessage() for r in caplog.records)


def test_init_app_twice_on_one_app_is_an_error(models_dir):
    app = base_app(models_dir)
    AnimeGAN(app)
    with pytest.raises(RuntimeError, match="already initialised"):
        AnimeGAN().init_app(app)


def test_two_apps_in_one_process_do_not_share_state(models_dir):
    animegan = AnimeGAN()
    limited = base_app(models_dir, ANIMEGAN_RATE_LIMIT="1 per minute",
                       ANIMEGAN_DEFAULT_STYLE="test_style")
    free = base_app(models_dir, ANIMEGAN_RATE_LIMIT="", ANIMEGAN_URL_PREFIX="/anime")
    animegan.init_app(limited)
    animegan.init_app(free)
    assert limited.extensions["animegan"] is not free.extensions["animegan"]
    data = photo_bytes("coffee")
    a, b = limited.test_client(), free.test_client()
    assert a.post("/animegan/convert", data=data, content_type="image/jpeg").status_code == 200
    assert a.post("/animegan/convert", data=data, content_type="image/jpeg").status_code == 429
    for _ in range(3):  # the other app has no limit and its own cache
        response = b.post("/anime/convert", data=data, content_type="image/jpeg")
        assert response.status_code == 200
    assert response.headers["X-AnimeGAN-Style"] == "other_style"
    assert limited.extensions["animegan"].cache.stats()["entries"] == 1
    assert free.extensions["animegan"].cache.stats()["hits"] == 2


def test_options_are_defaults_and_app_config_wins(models_dir):
    app = base_app(models_dir, ANIMEGAN_MAX_SIDE=96)
    AnimeGAN(app, max_side=64, output_format="png")
    assert app.config["ANIMEGAN_MAX_SIDE"] == 96
    assert app.config["ANIMEGAN_OUTPUT_FORMAT"] == "png"
    with pytest.raises(TypeError, match="ANIMEGAN_NOT_A_SETTING"):
        AnimeGAN(not_a_setting=1)


@pytest.mark.parametrize("key,value,message", [
    ("ANIMEGAN_MAX_SIDE", 0, "ANIMEGAN_MAX_SIDE"),
    ("ANIMEGAN_OUTPUT_FORMAT", "gif", "ANIMEGAN_OUTPUT_FORMAT"),
    ("ANIMEGAN_URL_PREFIX", "animegan", "must start with '/'"),
    ("ANIMEGAN_TORCH_THREADS", 0, "ANIMEGAN_TORCH_THREADS"),
    ("ANIMEGAN_EXTRA_STYLES", {"Bad Name": {}}, "not a valid style name"),
    ("ANIMEGAN_EXTRA_STYLES", {"mine": {"url": "http://x"}}, "sha1"),
])
def test_bad_config_fails_at_startup_naming_the_key(models_dir, key, value, message):
    with pytest.raises(RuntimeError, match=message):
        AnimeGAN(base_app(models_dir, **{key: value}))


def test_a_models_dir_that_is_a_file_fails_at_startup_and_a_missing_one_does_not(
        models_dir, tmp_path):
    a_file = tmp_path / "styles.pt"
    a_file.write_bytes((models_dir / "test_style.pt").read_bytes())
    with pytest.raises(RuntimeError, match=r"ANIMEGAN_MODELS_DIR=.*is a file, not a folder"):
        AnimeGAN(base_app(models_dir, ANIMEGAN_MODELS_DIR=str(a_file)))
    # a folder still to be made (`flask animegan pull` makes it) starts, and says what to do
    app = base_app(models_dir, ANIMEGAN_MODELS_DIR=str(tmp_path / "later"))
    AnimeGAN(app)
    response = app.test_client().post("/animegan/convert", data=photo_bytes(),
                                      content_type="image/jpeg")
    assert response.status_code == 503 and "flask animegan pull" in response.json["error"]


def root_site(models_dir, tmp_path) -> Flask:
    """A site with its own static folder and 404 page, the converter at its root."""
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "site.css").write_text("body { margin: 0 }")
    app = Flask("host", root_path=str(tmp_path))
    app.config.update(base_app(models_dir, ANIMEGAN_URL_PREFIX="/").config)

    @app.errorhandler(404)
    def not_found(error):
        return "<h1>The site's own 404</h1>", 404

    @app.get("/about")
    def about():
        return "about us"

    AnimeGAN(app)
    return app


def test_mounted_at_the_sites_root_the_page_has_its_css_and_script(models_dir, tmp_path):
    client = root_site(models_dir, tmp_path).test_client()
    html = client.get("/").get_data(as_text=True)
    assets = re.findall(r'(?:href|src)="(/[^"]+\.(?:css|js))"', html)
    assert len(assets) == 2, html
    for path in assets:  # the site's own /static/ route must not answer these
        with client.get(path) as response:
            assert response.status_code == 200 and b"animegan" in response.data, path
    with client.get("/static/site.css") as response:  # the site's own still works
        assert response.status_code == 200


def test_mounted_at_the_sites_root_the_sites_404s_stay_the_sites(models_dir, tmp_path):
    client = root_site(models_dir, tmp_path).test_client()
    for path in ("/no-such-page", "/about/more", "/static/none.css"):
        response = client.get(path)
        assert response.status_code == 404 and "own 404" in response.get_data(as_text=True)
    assert client.get("/about").get_data(as_text=True) == "about us"
    # a path of the converter's own routes keeps the converter's JSON errors
    for path, status in (("/convert", 405), ("/jobs/nope/unknown", 404), ("/styles/x", 404)):
        response = client.get(path)
        assert response.status_code == status and response.json["status"] == status, path
    ok = client.post("/convert", data=photo_bytes(), content_type="image/jpeg")
    assert ok.status_code == 200


@pytest.mark.parametrize("prefix,route", [("/", "/"), ("/", "/healthz"),
                                           ("/tools", "/tools/convert")])
def test_a_prefix_that_puts_a_route_over_the_sites_own_fails_at_startup(models_dir, prefix,
                                                                       route):
    app = base_app(models_dir, ANIMEGAN_URL_PREFIX=prefix)
    methods = ["POST"] if route.endswith("convert") else ["GET"]
    app.add_url_rule(route, "sites_own", lambda: "the site's", methods=methods)
    with pytest.raises(RuntimeError, match=rf"ANIMEGAN_URL_PREFIX='{prefix}' puts {route} "
                                           r"\(animegan\.\w+\) where the app already has a "
                                           r"route \(sites_own\)"):
        AnimeGAN(app)
    # the same route with other methods shadows nothing
    other = base_app(models_dir, ANIMEGAN_URL_PREFIX=prefix)
    other.add_url_rule(route, "sites_own", lambda: "the site's", methods=["PUT"])
    AnimeGAN(other)


def test_service_outside_an_initialised_app_says_what_to_do():
    app = Flask("bare")
    with app.app_context(), pytest.raises(RuntimeError, match=r"forget AnimeGAN\(app\)"):
        get_service()


@pytest.mark.parametrize("order", ["limiter first", "animegan first"])
def test_one_limiter_whatever_the_order_and_healthz_is_never_limited(models_dir, order):
    """The host's Limiter counts our conversions; its default, application-wide limits
    touch none of our routes; /healthz answers every time. Made before or after us."""
    app = base_app(models_dir, ANIMEGAN_RATE_LIMIT="2 per minute")

    def host_limiter() -> Limiter:
        return Limiter(get_remote_address, app=app, storage_uri="memory://",
                       default_limits=["2 per minute"], application_limits=["30 per minute"])

    @app.get("/own")
    def own() -> str:
        return "host page"

    if order == "limiter first":
        limiter = host_limiter()
        AnimeGAN(app)
        assert app.extensions["limiter"] == {limiter}
    else:
        AnimeGAN(app)
        limiter = host_limiter()
    client = app.test_client()
    assert [client.get("/animegan/healthz").status_code for _ in range(12)] == [200] * 12
    assert app.extensions["animegan"].limiter is limiter
    # three photos: each a miss (a cache hit would take nothing)
    statuses = [client.post("/animegan/convert", data=photo_bytes(name),
                            content_type="image/jpeg").status_code
                for name in ("coffee", "astronaut")]
    form = client.post("/animegan/upload", data={
        "image": (io.BytesIO(photo_bytes("rocket")), "a.jpg")})
    assert statuses == [200, 200] and form.status_code == 429  # one budget for both routes
    assert int(form.headers["Retry-After"]) > 0
    # the host's default limit still applies to its own routes, not to our pages
    assert [client.get("/own").status_code for _ in range(3)] == [200, 200, 429]
    for _ in range(3):
        assert client.get("/animegan/styles").status_code == 200
        assert client.get("/animegan/").status_code == 200
    assert client.get("/animegan/healthz").status_code == 200
    # our view functions are the blueprint's own, not wrapped by a limiter
    from flask_animegan.web import views

    assert app.view_functions["animegan.convert"] is views.convert


def test_python_api_converts_pil_images_of_any_mode(app):
    with app.app_context():
        service = current_app.extensions["animegan"]
        rgba = photo("astronaut").convert("RGBA")
        result = service.convert(rgba)
        assert isinstance(result, Image.Image)
        assert result.mode == "RGB" and result.size == (128, 128)
        small = service.convert(photo("coffee").convert("L"), style="test_style", size=60)
        assert small.size == (60, 40)


def test_a_style_added_after_startup_is_found(make_app, tmp_path):
    from conftest import save_random_generator

    save_random_generator(tmp_path / "first.pt", seed=0)
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path))
    save_random_generator(tmp_path / "later.pt", seed=1)
    response = app.test_client().post("/animegan/convert?style=later", data=photo_bytes(),
                                      content_type="image/jpeg")
    assert response.status_code == 200 and response.headers["X-AnimeGAN-Style"] == "later"


def test_loaded_styles_are_bounded_and_the_default_stays(make_app, tmp_path):
    from conftest import save_random_generator

    for seed, name in enumerate(("a", "b", "c", "d")):
        save_random_generator(tmp_path / f"{name}.pt", seed=seed)
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_MAX_LOADED_STYLES=2,
                   ANIMEGAN_DEFAULT_STYLE="a")
    client = app.test_client()
    for name in ("b", "c", "d"):
        assert client.post(f"/animegan/convert?style={name}", data=photo_bytes(),
                           content_type="image/jpeg").status_code == 200
    loaded = client.get("/animegan/healthz").json["loaded"]
    assert loaded[0] == "a" and sorted(loaded[1:]) == ["c", "d"]


def test_startup_logs_the_load_and_warns_without_weights(make_app, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        make_app()
        make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_SHIPPED_STYLES=False)
    messages = [r.getMessage() for r in caplog.records]
    assert any("loaded (" in m and "warmed up" in m for m in messages)
    assert any("flask animegan pull paprika" in m for m in messages)


def test_example_app_adds_the_extension_to_an_existing_site(models_dir, monkeypatch):
    monkeypatch.setenv("ANIMEGAN_MODELS_DIR", str(models_dir))
    monkeypatch.setenv("ANIMEGAN_MAX_SIDE", "64")
    monkeypatch.setenv("ANIMEGAN_WARMUP_SIZE", "0")
    # the site, not the backend choice: auto's timings (INT8 quantising included) cost 4 s
    monkeypatch.setenv("ANIMEGAN_BACKEND", "torch")
    monkeypatch.setenv("ANIMEGAN_PRECISION", "fp32")
    from example_app import create_app

    app = create_app()
    client = app.test_client()
    assert b"/animegan/" in client.get("/").data
    assert client.get("/about").json["converter"] == "/animegan/"
    response = client.post("/animegan/convert", data={"image": (io.BytesIO(photo_bytes()), "a.jpg")})
    assert response.status_code == 200
    assert max(Image.open(io.BytesIO(response.data)).size) == 64


@pytest.mark.parametrize("raw,expected", [("1", True), ("true", True), ("On", True),
                                          ("0", False), ("no", False), ("", False)])
def test_switches_read_from_the_environment(raw, expected):
    from flask_animegan.config import from_environ

    assert from_environ({"ANIMEGAN_METRICS": raw}) == {"ANIMEGAN_METRICS": expected}


def test_a_switch_with_an_unclear_value_says_which_values_work():
    from flask_animegan.config import from_environ

    with pytest.raises(ValueError, match="ANIMEGAN_CSRF='maybe' must be one of 1, true"):
        from_environ({"ANIMEGAN_CSRF": "maybe"})


def test_an_unreadable_form_costs_nothing_and_leaves_the_limit_storage_alone(models_dir):
    """A form too large to read gets 413 and, having cost no CPU, takes nothing from the
    limit; reading it for the CSRF check and the cost must not look like a storage failure
    to flask-limiter (which would then fall back to per-process counts)."""
    app = base_app(models_dir, ANIMEGAN_RATE_LIMIT="2 per minute", SECRET_KEY="s",
                   ANIMEGAN_MAX_UPLOAD_BYTES=1000)
    AnimeGAN(app)
    client = app.test_client()
    big = {"image": (io.BytesIO(b"x" * 5000), "a.jpg")}
    refused = client.post("/animegan/upload", data=big)
    assert refused.status_code == 413 and refused.headers["X-RateLimit-Remaining"] == "2"
    tiny = [encode_image(photo(name).resize((40, 30)), quality=50)
            for name in ("coffee", "moon")]
    assert max(map(len, tiny)) < 1000
    remaining = [client.post("/animegan/convert", data=data, content_type="image/jpeg")
                 .headers["X-RateLimit-Remaining"] for data in tiny]
    assert remaining == ["1", "0"]  # the 413 took nothing: both conversions were left


def test_init_app_imports_nothing_it_does_not_need_until_the_warm_up(models_dir):
    """`flask` commands pay for init_app: it loads no weights and imports neither the
    optional backends nor the cache's image libraries (a fresh interpreter tells)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from flask import Flask\n"
        "from flask_animegan import AnimeGAN\n"
        "app = Flask('site')\n"
        f"app.config.update(ANIMEGAN_MODELS_DIR={str(models_dir)!r}, ANIMEGAN_BACKEND='auto',"
        " SECRET_KEY='s')\n"
        "AnimeGAN(app)\n"
        "heavy = ('openvino', 'scipy.ndimage', 'imagehash')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "print(app.extensions['animegan'].engine.status()['loaded'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["[]", "[]"]


def test_a_later_host_limiter_keys_the_cache_scope_with_its_own_key_function(models_dir):
    """The cache scope is the key the counting Limiter used (read from its public
    ``current_limits``): here the host's, one key for two addresses, so they share."""
    app = base_app(models_dir, ANIMEGAN_RATE_LIMIT="10 per minute")
    AnimeGAN(app)
    host = Limiter(lambda: "site-user-1", app=app, storage_uri="memory://")
    client = app.test_client()
    data = photo_bytes("coffee")
    first = client.post("/animegan/convert", data=data, content_type="image/jpeg",
                        environ_base={"REMOTE_ADDR": "10.0.0.1"})
    second = client.post("/animegan/convert", data=data, content_type="image/jpeg",
                         environ_base={"REMOTE_ADDR": "10.0.0.2"})
    assert (first.headers["X-Cache"], second.headers["X-Cache"]) == ("MISS", "HIT")
    assert app.extensions["animegan"].limiter is host
    # the host's Limiter was made with its headers off: no X-RateLimit-* of ours either
    assert "X-RateLimit-Limit" not in second.headers


def test_the_package_reads_no_private_attribute_of_flask_limiter():
    """Only flask-limiter's public API: a minor release may change its internals."""
    import re
    from pathlib import Path

    import flask_animegan

    private = re.compile(r"\b(limiter|host|own|existing|counted)\._[a-z]\w*")
    for path in Path(flask_animegan.__file__).parent.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        found = private.findall(text) + re.findall(r"_key_func|_headers_enabled|_storage_dead",
                                                   text)
        assert not found, f"{path.name} reads flask-limiter internals: {found}"


def test_csrf_on_and_no_secret_key_refuses_to_start_naming_the_fix(models_dir):
    """Fail closed: the form would otherwise go out without a CSRF token, silently."""
    app = base_app(models_dir, ANIMEGAN_CSRF=True)
    with pytest.raises(RuntimeError, match="ANIMEGAN_CSRF .* no SECRET_KEY") as error:
        AnimeGAN(app)
    message = str(error.value)
    assert "app.config['SECRET_KEY']" in message and "FLASK_SECRET_KEY" in message
    assert "secrets.token_hex" in message and "ANIMEGAN_CSRF = False" in message
    assert "animegan" not in app.extensions and not app.blueprints


def test_csrf_starts_with_a_secret_key_or_turned_off(models_dir):
    keyed = base_app(models_dir, ANIMEGAN_CSRF=True, SECRET_KEY="site key")
    AnimeGAN(keyed)
    page = keyed.test_client().get("/animegan/").get_data(as_text=True)
    assert 'name="csrf_token"' in page
    tokenless = keyed.test_client().post(
        "/animegan/upload", data={"image": (io.BytesIO(photo_bytes("coffee")), "a.jpg")})
    assert tokenless.status_code == 400
    off = base_app(models_dir, ANIMEGAN_CSRF=False)
    AnimeGAN(off)  # turned off by the site: its choice, and it starts
    assert 'name="csrf_token"' not in off.test_client().get("/animegan/").get_data(as_text=True)


def test_flask_wtf_with_its_own_key_needs_no_secret_key(models_dir):
    from flask_wtf.csrf import CSRFProtect

    app = base_app(models_dir, ANIMEGAN_CSRF=True, WTF_CSRF_SECRET_KEY="wtf key")
    CSRFProtect(app)
    AnimeGAN(app)
    assert "animegan" in app.extensions


def test_the_example_app_starts_without_a_key_in_its_environment(monkeypatch):
    """example_app makes a random SECRET_KEY when FLASK_SECRET_KEY is not set (one worker)."""
    import example_app

    monkeypatch.delenv("FLASK_SECRET_KEY", raising=False)
    app = example_app.create_app({"ANIMEGAN_WARMUP_SIZE": 0, "ANIMEGAN_SAMPLE_SIZE": 0})
    assert app.secret_key and app.extensions["animegan"].settings.csrf
