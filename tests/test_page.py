"""The upload page's extras: style samples, size and format choices, the CSRF token."""

from __future__ import annotations

import io
import re

import numpy as np
from conftest import open_image, photo_bytes


def test_the_style_picker_shows_a_sample_of_each_style_made_at_startup(make_app):
    app = make_app()
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


def test_samples_can_be_turned_off_and_unknown_styles_have_none(make_app):
    client = make_app(ANIMEGAN_SAMPLE_SIZE=0).test_client()
    assert "sample.jpg" not in client.get("/animegan/").get_data(as_text=True)
    assert client.get("/animegan/styles/test_style/sample.jpg").status_code == 404
    unknown = make_app().test_client().get("/animegan/styles/nope/sample.jpg")
    assert unknown.status_code == 404 and "not installed" in unknown.json["error"]


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


def test_without_a_secret_key_there_is_no_token(make_app):
    client = make_app().test_client()
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
    # the before/after slider is hidden until the script shows it
    assert re.search(r'class="animegan-compare" data-animegan-compare hidden', html)
    assert 'type="range"' in html
