"""AnimeGAN added to a site as people build them (tests/host_site): an app factory, the
site's own Limiter and layout, Flask-WTF's global CSRFProtect, a custom prefix, two apps
in one process. Through the Flask client, and in Chromium against a real server
(werkzeug's server in a thread, serving the apps made in this process).
"""

from __future__ import annotations

import io
import logging
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import TEST_CONFIG, need, open_image, photo_bytes
from flask import Flask
from host_site import create_app

# the browser fixtures, shared with the upload page's own browser tests
from test_browser import (  # noqa: F401
    CHROMEDRIVER,
    CHROMIUM,
    astronaut_file,
    browser,
    by_id,
    choose_size,
    coffee_file,
    natural_size,
    not_a_photo,
    save_screenshot,
    shipped_toon_demo,
    wait_for,
)
from werkzeug.serving import make_server

REFUSED = ("The form has expired or was sent from another site: reload the page and send "
           "the photo again.")
OUR_FORM = re.compile(r'<form id="animegan-form".*?name="csrf_token" value="([^"]+)"', re.S)
LOGOUT_FORM = re.compile(r'<form id="site-logout".*?name="csrf_token" value="([^"]+)"', re.S)


@pytest.fixture
def site(models_dir: Path) -> Callable[..., Flask]:
    """create_app with the seeded test styles, small images and no conversion limit."""

    def make(**options: object) -> Flask:
        # the suite's fast settings (torch fp32, no samples, only the test styles)
        fast = {key: value for key, value in TEST_CONFIG.items() if key.startswith("ANIMEGAN_")}
        return create_app(models_dir, **{**fast, **options})

    return make


def wrong(token: str) -> str:
    """``token`` with one character of its signature changed. Not the last ones: the last
    character of unpadded base64 carries padding bits, so "...ab" -> "...xx" can decode to
    the same signature (this test failed 1 run in about 256 that way)."""
    middle = len(token) - 8
    return token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1:]


def our_token(html: str) -> str:
    found = OUR_FORM.search(html)
    assert found, "the upload form carries no csrf_token"
    return found.group(1)


def upload(client, token: str | None = None, prefix: str = "/studio", **options):
    data = {"image": (io.BytesIO(photo_bytes("coffee")), "cup.jpg"), "size": "64"}
    if token is not None:
        data["csrf_token"] = token
    return client.post(f"{prefix}/upload", data=data, **options)


ORDERS = pytest.mark.parametrize("extensions_first", [True, False],
                                 ids=["limiter-and-csrf-first", "animegan-first"])


# -- through the Flask client ----------------------------------------------------------

@ORDERS
def test_the_page_fills_the_sites_layout_and_leaves_its_globals_alone(site, extensions_first):
    app = site(extensions_first=extensions_first)
    page = app.test_client().get("/studio/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "<title>Photo to anime · Example Studio</title>" in html
    main = html[html.index('<main id="site-main">'):html.index("</main>")]
    assert '<div class="animegan">' in main and '<form id="animegan-form"' in main
    # the layout's logout form calls Flask-WTF's csrf_token(); the upload form carries
    # the same token (one per request), under Flask-WTF's field name
    assert LOGOUT_FORM.search(html).group(1) == our_token(html)
    # the site's policy is the one sent, and its nonce is the one in the layout
    policy = page.headers["Content-Security-Policy"]
    nonce = re.search(r"'nonce-([^']+)'", policy).group(1)
    assert html.count(f'nonce="{nonce}"') == 2  # the inline <style> and <script>
    # for visitors: no admin commands, no note about face styles (none is installed)
    assert "flask animegan" not in html and "animegan-face-note" not in html


@ORDERS
def test_the_form_posts_with_the_sites_token_and_the_result_is_in_the_layout(
        site, extensions_first):
    client = site(extensions_first=extensions_first).test_client()
    token = our_token(client.get("/studio/").get_data(as_text=True))
    posted = upload(client, token)
    assert posted.status_code == 303
    result = client.get(posted.headers["Location"])
    html = result.get_data(as_text=True)
    assert result.status_code == 200 and "<title>Your anime picture · Example Studio" in html
    assert 'id="site-logout"' in html
    image_url = re.search(r'id="animegan-result"[^>]* src="([^"]+)"', html).group(1)
    image = open_image(client.get(image_url).data)
    assert image.size == (64, 43)


@ORDERS
def test_a_post_without_the_sites_token_is_refused_with_the_page_and_a_clear_message(
        site, extensions_first):
    app = site(extensions_first=extensions_first)
    # another site's form: no token, and no session either
    refused = upload(app.test_client())
    assert refused.status_code == 400
    html = refused.get_data(as_text=True)
    assert f'role="alert">{REFUSED}</p>' in html  # once, with one full stop
    assert 'id="site-logout"' in html and our_token(html)  # in the layout, with a new form
    # a browser with a session, and a token that is wrong or from another session
    client = app.test_client()
    token = our_token(client.get("/studio/").get_data(as_text=True))
    assert upload(client, wrong(token)).status_code == 400
    stranger = app.test_client()
    stranger.get("/studio/")
    assert upload(stranger, token).status_code == 400
    assert upload(client, token).status_code == 303


def test_the_form_stays_checked_where_the_site_relaxed_flask_wtf(site):
    # a site that checks forms one by one (WTF_CSRF_CHECK_DEFAULT = False)
    app = site(WTF_CSRF_CHECK_DEFAULT=False)
    assert upload(app.test_client()).status_code == 400
    client = app.test_client()
    assert upload(client, our_token(client.get("/studio/").get_data(as_text=True))
                  ).status_code == 303
    # a site that followed the old advice: the blueprint exempted, ANIMEGAN_CSRF off
    from flask_animegan.web.views import blueprint

    app = site(ANIMEGAN_CSRF=False)
    app.extensions["site"]["csrf"].exempt(blueprint)
    assert upload(app.test_client()).status_code == 400
    # a site that turned Flask-WTF off (as in its own tests) turned it off for us too
    off = site(WTF_CSRF_ENABLED=False).test_client()
    assert 'name="csrf_token"' not in off.get("/studio/").get_data(as_text=True).split(
        '<form id="animegan-form"')[1]
    assert upload(off).status_code == 303


@ORDERS
def test_the_api_works_for_clients_without_cookies(site, extensions_first):
    api = site(extensions_first=extensions_first).test_client(use_cookies=False)
    raw = api.post("/studio/convert?size=64", data=photo_bytes("coffee"),
                   content_type="image/jpeg")
    assert raw.status_code == 200 and raw.mimetype == "image/jpeg"
    assert "Set-Cookie" not in raw.headers
    form = api.post("/studio/convert", data={
        "image": (io.BytesIO(photo_bytes("coffee")), "cup.jpg"), "size": "64"})
    assert form.status_code == 200 and open_image(form.data).size == (64, 43)


def test_the_sites_own_pages_csrf_and_limits_are_unaffected(site):
    app = site(default_limits=("3 per minute",), ANIMEGAN_RATE_LIMIT="2 per minute")
    client = app.test_client()
    home = client.get("/")
    assert home.status_code == 200 and "Welcome to Example Studio" in home.get_data(as_text=True)
    # the site's forms keep Flask-WTF's check and its own answers
    logout = client.post("/logout")
    assert logout.status_code == 400 and "The CSRF token is missing." in logout.get_data(
        as_text=True)
    token = LOGOUT_FORM.search(home.get_data(as_text=True)).group(1)
    assert client.post("/logout", data={"csrf_token": token}).status_code == 302
    # the site's default limit (3 per minute, per route) counts its own pages, not ours
    for _ in range(5):
        assert client.get("/studio/").status_code == 200
        assert client.get("/studio/healthz").status_code == 200
    assert [client.get("/").status_code for _ in range(3)] == [200, 200, 429]
    # its route limit is its own; our conversions have theirs, in the site's Limiter
    pings = [client.get("/api/ping").status_code for _ in range(4)]
    assert pings == [200, 200, 200, 429]
    # three sizes: each a miss (a cache hit would take nothing)
    convert = [client.post(f"/studio/convert?size={size}", data=photo_bytes("coffee"),
                           content_type="image/jpeg") for size in (32, 48, 64)]
    assert [r.status_code for r in convert] == [200, 200, 429]
    assert int(convert[2].headers["Retry-After"]) > 0


def test_two_sites_in_one_process_keep_their_tokens_prefixes_and_limits(site):
    studio = site(prefix="/studio", secret="studio secret", ANIMEGAN_RATE_LIMIT="1 per minute")
    toons = site(prefix="/toons", secret="toons secret", extensions_first=False,
                 site_policy=False, ANIMEGAN_RATE_LIMIT="1 per minute")
    assert studio.extensions["animegan"] is not toons.extensions["animegan"]
    a, b = studio.test_client(), toons.test_client()
    assert a.get("/toons/").status_code == 404 and b.get("/studio/").status_code == 404
    token_a = our_token(a.get("/studio/").get_data(as_text=True))
    token_b = our_token(b.get("/toons/").get_data(as_text=True))
    # another site's token is refused, and a refused post spends none of the visitor's
    # conversions (a page on another site must not use up their budget)
    assert upload(b, token_a, "/toons").status_code == 400
    assert upload(b, token_b, "/toons").status_code == 303
    # the toons site has used its conversion; the studio's is untouched
    assert upload(b, token_b, "/toons").status_code == 429
    assert upload(a, token_a).status_code == 303


def test_the_policy_is_the_sites_with_its_layout_and_ours_with_the_built_in_one(site,
                                                                               make_app):
    # the built-in base template: the strict default, as it is
    strict = make_app().test_client().get("/animegan/").headers["Content-Security-Policy"]
    assert strict.startswith("default-src 'self'") and "nonce" not in strict
    # the site's layout and no policy of its own: none from us either
    bare = site(site_policy=False).test_client().get("/studio/")
    assert "Content-Security-Policy" not in bare.headers
    # a policy set for the site's layout is sent (and wins over the site's setdefault)
    mine = "default-src 'self'; img-src 'self' blob:"
    sent = site(ANIMEGAN_CONTENT_SECURITY_POLICY=mine).test_client().get("/studio/")
    assert sent.headers["Content-Security-Policy"] == mine


def test_a_layout_that_cannot_render_still_gets_an_error_page(site, caplog):
    app = site(ANIMEGAN_BASE_TEMPLATE="broken_layout.html")
    client = app.test_client()
    with caplog.at_level(logging.ERROR, logger="flask_animegan"):
        page = client.get("/studio/")
        refused = upload(client)
    assert page.status_code == 500
    assert "internal error" in page.get_data(as_text=True)
    assert refused.status_code == 400 and REFUSED in refused.get_data(as_text=True)
    # both answered in the built-in layout, and the log says why
    assert 'class="animegan-page"' in refused.get_data(as_text=True)
    assert "could not be rendered with the site's layout" in caplog.text
    assert "site_name_helper" in caplog.text


def test_the_content_block_is_checked_at_startup(make_app):
    with pytest.raises(RuntimeError, match="ANIMEGAN_CONTENT_BLOCK='main content'"):
        make_app(ANIMEGAN_BASE_TEMPLATE="layout.html", ANIMEGAN_CONTENT_BLOCK="main content")
    with pytest.raises(RuntimeError, match="set ANIMEGAN_BASE_TEMPLATE"):
        make_app(ANIMEGAN_CONTENT_BLOCK="content")


# -- in Chromium, against a real server ------------------------------------------------

class ThreadedServer:
    """werkzeug's threaded server on a free loopback port, in a thread of this process."""

    def __init__(self, app: Flask, host: str = "127.0.0.1") -> None:
        self.server = make_server(host, 0, app, threaded=True)
        self.url = f"http://{host}:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(10)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ThreadedServer]]:
    """Three sites in this process, each on its own server, with the shipped toon_demo:

    - studio: Limiter and CSRFProtect before AnimeGAN, the site's nonce policy;
    - toons: Limiter and CSRFProtect after AnimeGAN, no policy of the site's;
    - strict: like toons, but with a strict ANIMEGAN_CONTENT_SECURITY_POLICY sent with
      the site's layout: its inline script and style are refused (the control that shows
      the tests see violations)."""
    need(CHROMIUM is not None and CHROMEDRIVER is not None,
         "the browser tests need Debian's chromium and chromium-driver")
    models = tmp_path_factory.mktemp("site-models")
    shutil.copy(shipped_toon_demo(), models)
    common = {"ANIMEGAN_DEFAULT_STYLE": "toon_demo", "ANIMEGAN_PRECISION": "fp32",
              "ANIMEGAN_MAX_SIDE": 512, "ANIMEGAN_RATE_LIMIT": ""}
    apps = {
        "studio": create_app(models, prefix="/studio", secret="studio", **common),
        "toons": create_app(models, prefix="/toons", secret="toons", extensions_first=False,
                            site_policy=False, **common),
        "strict": create_app(models, prefix="/strict", secret="strict", site_policy=False,
                             ANIMEGAN_CONTENT_SECURITY_POLICY="default-src 'self'; "
                             "img-src 'self' blob:", **common),
    }
    running = {name: ThreadedServer(app) for name, app in apps.items()}
    # another site (localhost is not 127.0.0.1) with a form that posts to the studio
    evil = Flask("evil")

    @evil.get("/")
    def forged_form():
        return (f'<form id="forged" method="post" enctype="multipart/form-data" '
                f'action="{running["studio"].url}/studio/upload">'
                '<input type="hidden" name="style" value="toon_demo">'
                '<button id="send">Win a prize</button></form>')

    running["evil"] = ThreadedServer(evil, host="localhost")
    yield running
    for server in running.values():
        server.stop()


#: Records every CSP violation of the page, from its first byte (the console says the same;
#: both are read).
RECORD_VIOLATIONS = """
window.cspViolations = [];
document.addEventListener('securitypolicyviolation', function (event) {
  window.cspViolations.push(event.violatedDirective + ' ' + event.blockedURI);
});
"""


def open_page(driver, url: str) -> None:
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_VIOLATIONS})
    driver.get(url)


def policy_problems(driver) -> list[str]:
    """CSP violations on this page, and console errors of any page so far."""
    violations = driver.execute_script("return window.cspViolations || []")
    console = [entry["message"] for entry in driver.get_log("browser")
               if entry["level"] == "SEVERE" or "Content Security Policy" in entry["message"]]
    return violations + console


def site_styles_and_script_applied(driver) -> bool:
    header = driver.find_element("css selector", ".site-header")
    background = driver.execute_script(
        "return getComputedStyle(arguments[0]).backgroundColor", header)
    ran = driver.execute_script("return document.documentElement.dataset.siteScript")
    return background == "rgb(18, 52, 86)" and ran == "ran"


@pytest.mark.server
@pytest.mark.browser
def test_in_chromium_the_page_converts_inside_the_sites_layout_with_javascript(
        servers, browser, astronaut_file):
    driver = browser(height=2300)  # the whole page, layout to result, in the screenshot
    studio = servers["studio"].url
    open_page(driver, f"{studio}/studio/")
    assert driver.title == "Photo to anime · Example Studio"
    assert site_styles_and_script_applied(driver)
    assert "animegan-js" in driver.find_element("tag name", "html").get_attribute("class")
    # our stylesheet applies inside the site's <main>
    box = driver.find_element("css selector", "#site-main > .animegan")
    assert driver.execute_script("return getComputedStyle(arguments[0]).maxWidth", box) == "1120px"

    by_id(driver, "animegan-image").send_keys(str(astronaut_file))
    wait_for(lambda: by_id(driver, "animegan-preview").is_displayed(), 10, "the preview")
    choose_size(driver, 384)
    by_id(driver, "animegan-submit").click()
    result = by_id(driver, "animegan-result")
    wait_for(lambda: by_id(driver, "animegan-result-panel").is_displayed()
             and natural_size(driver, result) == (384, 384), what="the result")
    assert driver.current_url == f"{studio}/studio/"  # converted without leaving the page
    assert policy_problems(driver) == []
    save_screenshot(driver, "host_layout.png", top=driver.find_element("tag name", "body"))

    # the site's own form in the header still works from our page (Flask-WTF's token)
    driver.find_element("css selector", "#site-logout button").click()
    wait_for(lambda: "logged_out=1" in driver.current_url, 10, "the site's logout")
    assert "Welcome to Example Studio" in driver.page_source


@pytest.mark.server
@pytest.mark.browser
def test_in_chromium_the_form_posts_inside_the_sites_layout_without_javascript(
        servers, browser, coffee_file):
    driver = browser(javascript=False)
    toons = servers["toons"].url
    open_page(driver, f"{toons}/toons/")
    assert driver.title == "Photo to anime · Example Studio"
    by_id(driver, "animegan-image").send_keys(str(coffee_file))
    choose_size(driver, 384)
    by_id(driver, "animegan-submit").click()
    wait_for(lambda: "/toons/result/" in driver.current_url, what="the result page")
    assert driver.title == "Your anime picture · Example Studio"
    result = by_id(driver, "animegan-result")
    assert natural_size(driver, result) == (384, 256)
    assert driver.find_element("css selector", ".site-header").is_displayed()
    assert policy_problems(driver) == []


@pytest.mark.server
@pytest.mark.browser
def test_in_chromium_a_form_posted_from_another_site_is_refused(servers, browser):
    driver = browser()
    driver.get(servers["evil"].url)
    by_id(driver, "send").click()
    wait_for(lambda: "/studio/upload" in driver.current_url, what="the forged post's answer")
    error = wait_for(lambda: by_id(driver, "animegan-error"), what="the error")
    assert error.text == REFUSED
    assert driver.title == "Photo to anime · Example Studio"  # the page, in the layout


@pytest.mark.server
@pytest.mark.browser
def test_in_chromium_the_same_error_words_with_and_without_javascript_and_no_broken_preview(
        servers, browser, not_a_photo):
    texts = []
    for javascript in (True, False):
        driver = browser(javascript=javascript)
        driver.get(f"{servers['toons'].url}/toons/")
        by_id(driver, "animegan-image").send_keys(str(not_a_photo))
        preview = by_id(driver, "animegan-preview")
        if javascript:  # the browser could not draw it: the preview stays hidden
            wait_for(lambda: preview.get_attribute("src") is None, 10, "the failed preview")
            assert not preview.is_displayed()
        by_id(driver, "animegan-submit").click()
        error = wait_for(lambda d=driver: by_id(d, "animegan-error").is_displayed()
                         and by_id(d, "animegan-error"), what="the error")
        texts.append(error.text)
    assert texts[0] == texts[1]
    assert texts[0].startswith("The file is not an image this server can read")
    assert not texts[0].endswith("..")


@pytest.mark.server
@pytest.mark.browser
def test_in_chromium_the_control_a_strict_policy_with_the_sites_layout_is_seen(servers,
                                                                              browser):
    """The tests above would see a violation: here our policy refuses the layout's inline
    style and script, and both the event and the console report it."""
    driver = browser()
    open_page(driver, f"{servers['strict'].url}/strict/")
    assert not site_styles_and_script_applied(driver)
    problems = policy_problems(driver)
    assert any("style-src" in p for p in problems) and any("script-src" in p for p in problems)


@pytest.mark.server
def test_against_the_real_server_the_api_needs_no_cookie(servers):
    import requests

    for name in ("studio", "toons"):
        answer = requests.post(f"{servers[name].url}/{name}/convert?size=128",
                               data=photo_bytes("coffee"),
                               headers={"Content-Type": "image/jpeg"}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert open_image(answer.content).size == (128, 85)
        assert "Set-Cookie" not in answer.headers
