"""The upload page's extras: style samples, size and format choices, the CSRF token."""

from __future__ import annotations

import io
import re
import shutil

import numpy as np
from conftest import open_image, photo_bytes


def test_the_style_picker_shows_a_sample_of_each_style_made_at_startup(make_app):
    app = make_app(ANIMEGAN_SAMPLE_SIZE=128)  # the tests' config has samples off
    service = app.extensions["animegan"]
    assert sorted(service._samples) == ["other_style", "test_style"]  # made by init_app
    client = app.test_client()
    html = client.get("/animegan/").get_data(as_text=True)
    samples = {}
    for name in ("test_style", "other_style"):
        url = f"/animegan/styles/{name}/sample.jpg"
        assert f'src="{url}"' in html
        response = client.get(url)
        assert response.status_code == 200 and response.mimetype == "image/jpeg"
        assert "max-age" in response.headers["Cache-Control"]
        image = open_image(response.data)
        assert image.format == "JPEG" and max(image.size) == 128
        samples[name] = np.asarray(image, np.float32)
    # each sample is its own style's work, not one picture served twice
    assert np.abs(samples["test_style"] - samples["other_style"]).mean() > 5
    unknown = client.get("/animegan/styles/nope/sample.jpg")
    assert unknown.status_code == 404 and "not installed" in unknown.json["error"]


def test_samples_can_be_turned_off(client):
    # the tests' config has ANIMEGAN_SAMPLE_SIZE=0
    assert "sample.jpg" not in client.get("/animegan/").get_data(as_text=True)
    off = client.get("/animegan/styles/test_style/sample.jpg")
    assert off.status_code == 404 and "ANIMEGAN_SAMPLE_SIZE" in off.json["error"]


def test_the_form_offers_sizes_up_to_the_maximum_and_every_format(make_app):
    html = make_app(ANIMEGAN_MAX_SIDE=600).test_client().get("/animegan/").get_data(as_text=True)
    sizes = re.findall(r'<option value="(\d+)"( selected)?>\d+ px</option>', html)
    assert sizes == [("256", ""), ("384", ""), ("512", ""), ("600", " selected")]
    assert re.findall(r'<option value="(\w+)"[^>]*>(?:JPEG|PNG|WEBP)', html) == [
        "jpeg", "png", "webp"]


def test_every_form_control_has_a_label(client):
    html = client.get("/animegan/").get_data(as_text=True)
    form = html[html.index("<form"):html.index("</form>")]
    for control_id in re.findall(r'<(?:input|select)[^>]* id="([\w-]+)"', form):
        assert f'for="{control_id}"' in form, control_id
    # radio buttons are labelled by the <label> around them, inside a <fieldset> with a legend
    assert form.count('type="radio"') == form.count('class="animegan-style-card"') == 2
    assert "<legend>Style</legend>" in form


def _upload(client, **fields):
    data = {"image": (io.BytesIO(photo_bytes("coffee")), "cup.jpg"), "size": "64", **fields}
    return client.post("/animegan/upload", data=data)


def test_with_a_secret_key_the_form_needs_its_csrf_token(make_app):
    client = make_app(SECRET_KEY="test secret").test_client()
    html = client.get("/animegan/").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    assert len(token) >= 32

    refused = _upload(client)  # what a form on another site would send
    assert refused.status_code == 400
    assert "reload the page" in refused.get_data(as_text=True)
    assert _upload(client, csrf_token="x" * len(token)).status_code == 400
    assert _upload(client, csrf_token=token).status_code == 303

    # another browser (another session cookie) cannot use this one's token
    stranger = make_app(SECRET_KEY="test secret").test_client()
    stranger.get("/animegan/")
    assert _upload(stranger, csrf_token=token).status_code == 400
    # the API keeps no state for the client and needs no token
    api = client.post("/animegan/convert", data={
        "image": (io.BytesIO(photo_bytes("coffee")), "cup.jpg"), "size": "64"})
    assert api.status_code == 200


def test_without_a_secret_key_there_is_no_token(make_app, client):
    assert "csrf_token" not in client.get("/animegan/").get_data(as_text=True)
    assert _upload(client).status_code == 303
    off = make_app(SECRET_KEY="s", ANIMEGAN_CSRF=False).test_client()
    assert "csrf_token" not in off.get("/animegan/").get_data(as_text=True)
    assert _upload(off).status_code == 303


def test_the_result_page_offers_a_download_and_the_comparison(client):
    page_url = _upload(client).headers["Location"]
    html = client.get(page_url).get_data(as_text=True)
    token = page_url.rsplit("/", 1)[1]
    assert re.search(rf'<a id="animegan-download"[^>]+href="/animegan/result/{token}/anime\?'
                     r'download=1" download="anime-other_style.jpg"', html)
    # one view: the result (the slider and the photo over it show with the script), and
    # the photo sent, folded away
    assert html.count("<figure") == 1 and "animegan-pair" not in html
    assert re.search(r'<figure class="animegan-compare" data-animegan-compare>\s*'
                     r'<div class="animegan-compare-frame">\s*<img id="animegan-result"', html)
    assert 'type="range"' in html
    assert re.search(r'<details class="animegan-photo-sent">\s*<summary>The photo you sent', html)


def test_a_layout_that_reads_a_title_variable_gets_the_pages_title(make_app, tmp_path):
    """The Flask Mega-Tutorial's layout: ``{% if title %}{{ title }} - Site{% endif %}``."""
    from jinja2 import DictLoader

    app = make_app(ANIMEGAN_BASE_TEMPLATE="site.html",
                   ANIMEGAN_CONTENT_BLOCK="content")
    app.jinja_loader = DictLoader({"site.html": (
        "<title>{% if title %}{{ title }} - Microblog{% else %}Microblog{% endif %}</title>"
        "{% block content %}{% endblock %}")})
    client = app.test_client()
    assert "<title>Photo to anime - Microblog</title>" in client.get(
        "/animegan/").get_data(as_text=True)
    result = client.get(_upload(client).headers["Location"]).get_data(as_text=True)
    assert "<title>Your anime picture - Microblog</title>" in result


def test_the_page_is_for_visitors_the_admin_commands_show_in_debug_mode_only(make_app):
    app = make_app()
    html = app.test_client().get("/animegan/").get_data(as_text=True)
    assert "flask animegan" not in html and "animegan-admin" not in html
    app.debug = True
    html = app.test_client().get("/animegan/").get_data(as_text=True)
    # the command as this site runs it (made outside a Flask CLI: `flask --app <its module>`)
    assert "<code>flask --app host_app animegan pull paprika</code>" in html
    assert "Only the site's administrators see this box" in html


def test_the_face_note_shows_only_when_a_face_style_is_installed(make_app, client, models_dir,
                                                                 tmp_path):
    assert "animegan-face-note" not in client.get("/animegan/").get_data(as_text=True)
    shutil.copy(models_dir / "test_style.pt", tmp_path / "test_style.pt")
    shutil.copy(models_dir / "other_style.pt", tmp_path / "face_paint_512_v2.pt")
    html = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path),
                    ANIMEGAN_DEFAULT_STYLE="test_style").test_client().get(
        "/animegan/").get_data(as_text=True)
    assert 'id="animegan-face-note"' in html
    assert re.search(r'value="face_paint_512_v2" data-face="1"', html)


def test_errors_read_as_one_sentence_on_the_page_and_stay_plain_in_the_json(client):
    bad = {"image": (io.BytesIO(b"notes, not a photo"), "notes.jpg")}
    page = client.post("/animegan/upload", data=bad).get_data(as_text=True)
    shown = re.search(r'id="animegan-error"[^>]*>([^<]*)</p>', page).group(1)
    assert shown.startswith("The file is not an image this server can read;")
    assert shown.endswith(".") and not shown.endswith("..")
    api = client.post("/animegan/convert", data=b"notes, not a photo")
    assert api.json["error"].startswith("the file is not an image")


def test_the_page_uses_one_template_variable(make_app):
    """The pages read everything from `animegan`, so a host's globals are never hidden."""
    from flask import template_rendered

    app = make_app(SECRET_KEY="s")
    seen = []

    def record(sender, template, context, **extra):
        seen.append((template.name, set(context) - set(app.jinja_env.globals)))

    with template_rendered.connected_to(record, app):
        app.test_client().get("/animegan/")
    name, variables = seen[0]
    assert name == "animegan/index.html"
    # Flask's own (request, session, g, config, ...) plus ours
    assert variables - {"request", "session", "g", "config"} == {"animegan"}
