"""The strength option (``flask_animegan.convert.strength``): a milder style mixed from the
cached full-strength result and the fitted photo, through the API, the result page and the
CLI; a change of strength is a cache hit and costs no rate-limit point."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from conftest import convert, encode_image, open_image, photo, photo_bytes
from PIL import Image

from flask_animegan.convert.colors import lab_from_rgb
from flask_animegan.convert.strength import mix_strength
from flask_animegan.inputs.decoding import fit

PHOTOS = ("astronaut", "chelsea", "coffee")


def distance(picture: Image.Image, reference: Image.Image) -> float:
    """Mean CIELAB distance (Delta E 1976) between two pictures of the same size."""
    a, b = (lab_from_rgb(np.asarray(p.convert("RGB"))) for p in (picture, reference))
    return float(np.sqrt(((a - b) ** 2).sum(axis=-1)).mean())


def random_picture(seed: int, width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), np.uint8))


def test_the_ends_are_the_photo_and_the_result():
    result, source = random_picture(0, 40, 24), random_picture(1, 40, 24)
    assert mix_strength(result, source, 100) is result
    at_zero = np.asarray(mix_strength(result, source, 0)).astype(int)
    assert np.abs(at_zero - np.asarray(source)).max() <= 1  # Lab round trip: one level
    with pytest.raises(ValueError, match="from 0 to 100"):
        mix_strength(result, source, 101)
    with pytest.raises(ValueError, match="not the same picture"):
        mix_strength(result, random_picture(1, 24, 40), 50)


@pytest.mark.parametrize("name", PHOTOS)
def test_strength_moves_the_result_from_the_photo_to_the_style(client, name):
    """0, 50, 100 through the API: the distance to the fitted photo grows with strength,
    0 gives the photo back, and only the first request runs the network."""
    data = photo_bytes(name, "PNG")
    fitted = fit(photo(name), 128)
    answers = {strength: convert(client, data, f"?format=png&strength={strength}")
               for strength in (100, 50, 0)}
    assert [a.status_code for a in answers.values()] == [200] * 3
    assert [a.headers["X-Cache"] for a in answers.values()] == ["MISS", "HIT", "HIT"]
    assert [a.headers["X-AnimeGAN-Strength"] for a in answers.values()] == ["100", "50", "0"]
    assert all("infer" not in answers[s].headers["Server-Timing"] for s in (50, 0))
    assert "strength;dur=" in answers[50].headers["Server-Timing"]
    far = {s: distance(open_image(a.data), fitted) for s, a in answers.items()}
    assert far[0] < 1.0 < far[50] < far[100], far
    # halfway in distance, give or take: neither the photo nor the style wins at 50
    assert 0.25 < far[50] / far[100] < 0.75, far


@pytest.mark.parametrize("raw", ["101", "-1", "abc", "50.5", "", " 1000", "\u0665\u0660", "1e2"])
def test_a_strength_outside_0_to_100_is_refused_naming_it(client, raw):
    answer = convert(client, photo_bytes("coffee"), "", query_string={"strength": raw})
    if raw == "":  # empty: the default, as for every parameter
        assert answer.status_code == 200 and answer.headers["X-AnimeGAN-Strength"] == "100"
        return
    assert answer.status_code == 400
    assert re.search(r"strength must be a whole percent from 0 to 100", answer.json["error"])


def test_portrait_faces_with_a_strength_is_refused(client):
    answer = convert(client, photo_bytes("astronaut"), "?portrait=faces&strength=50")
    assert answer.status_code == 400 and "strength" in answer.json["error"]


def test_a_change_of_strength_is_a_hit_and_costs_nothing(make_app):
    app = make_app(ANIMEGAN_RATE_LIMIT="3 per minute")
    client = app.test_client()
    first = convert(client, photo_bytes("chelsea"), "?strength=40")
    assert first.headers["X-Cache"] == "MISS"
    left = int(first.headers["X-RateLimit-Remaining"])
    assert left == 2
    # the same file, then the same pixels in other bytes (found by the fingerprint)
    again = [convert(client, photo_bytes("chelsea"), f"?strength={s}") for s in (100, 70, 0)]
    again.append(convert(client, photo_bytes("chelsea", comment=b"other bytes"), "?strength=55"))
    assert [a.headers["X-Cache"] for a in again] == ["HIT"] * 4
    assert [int(a.headers["X-RateLimit-Remaining"]) for a in again] == [left] * 4
    # the full-strength result the cache kept is what a strength of 100 returns
    assert open_image(again[0].data).size == open_image(first.data).size


def test_the_form_result_page_mixes_its_stored_result_without_converting(make_app):
    app = make_app(ANIMEGAN_RATE_LIMIT="3 per minute")
    client = app.test_client()
    posted = client.post("/animegan/upload", data={
        "image": (io.BytesIO(photo_bytes("coffee", "PNG")), "coffee.png"), "format": "png",
        "strength": "30"})
    assert posted.status_code == 303 and posted.headers["Location"].endswith("?strength=30")
    page = client.get(posted.headers["Location"])
    html = page.get_data(as_text=True)
    token = re.search(r"/result/([\w-]+)/anime\?strength=30", html).group(1)
    assert 'value="30"' in html and f"/result/{token}/anime?download=1&amp;strength=30" in html
    full = open_image(client.get(f"/animegan/result/{token}/anime").data)
    original = open_image(client.get(f"/animegan/result/{token}/original").data)
    mixed = {s: open_image(client.get(f"/animegan/result/{token}/anime?strength={s}").data)
             for s in (0, 30, 70)}
    far = [distance(mixed[s], original) for s in (0, 30, 70)] + [distance(full, original)]
    assert far == sorted(far) and far[0] < 1.0, far
    # none of it was a conversion: the next photo takes the second of three
    assert convert(client, photo_bytes("astronaut")).headers["X-RateLimit-Remaining"] == "1"
    bad = client.get(f"/animegan/result/{token}/anime?strength=200")
    assert bad.status_code == 400 and "strength must be" in bad.get_data(as_text=True).lower()


def test_cli_strength(app, tmp_path):
    source = tmp_path / "coffee.png"
    source.write_bytes(encode_image(photo("coffee"), "PNG"))
    fitted = fit(photo("coffee"), 128)
    far = {}
    for strength in ("0", "60", "100"):
        out = tmp_path / f"out{strength}"
        result = app.test_cli_runner().invoke(args=[
            "animegan", "convert", str(source), "-o", str(out), "--format", "png",
            "--strength", strength])
        assert result.exit_code == 0, result.output
        (written,) = out.iterdir()
        far[strength] = distance(Image.open(written), fitted)
    assert far["0"] < 1.0 < far["60"] < far["100"], far
    refused = app.test_cli_runner().invoke(args=[
        "animegan", "convert", str(source), "-o", str(tmp_path / "x"), "--strength", "101"])
    assert refused.exit_code == 2 and "--strength" in refused.output


def test_frames_photos_and_images_are_mixed_alike(app):
    """One infer stage: a GIF's frames at a strength and each frame converted alone at it
    give the same pixels; AnimeGANService.convert takes it too."""
    from media import gif_from_photos

    from flask_animegan.convert.request import ConvertRequest, Options

    service = app.extensions["animegan"]
    converter = service.converter
    gif = gif_from_photos(3, size=(96, 64))
    frames = list(converter.decoder.frames(gif, converter.decoder.probe(gif), size=96))
    style = service.engine.style("test_style")
    request = ConvertRequest(style, 96, "png", Options(portrait="off", strength=40))
    for frame, picture, _ in converter.frames(iter(frames), style.name, "off", strength=40):
        alone = converter.image(frame.image, request)
        assert np.array_equal(np.asarray(alone), np.asarray(picture))
    with app.app_context():
        zero = service.convert(photo("coffee"), style="test_style", size=96, strength=0)
        full = service.convert(photo("coffee"), style="test_style", size=96)
    fitted = fit(photo("coffee"), 96)
    assert distance(zero, fitted) < 1.0 < distance(full, fitted)


def test_a_job_mixes_every_frame(make_app):
    from media import gif_from_photos
    from test_jobs_api import post_job, wait_for

    client = make_app().test_client()
    gif = gif_from_photos(3, size=(64, 48))
    firsts = {}
    for strength in ("0", "100"):
        answer = post_job(client, gif, strength=strength, size="64")
        assert answer.status_code == 202, answer.get_json()
        done = wait_for(client, answer.headers["Location"])[-1]
        assert done["state"] == "done", done
        with Image.open(io.BytesIO(client.get(done["result_url"]).data)) as result:
            firsts[strength] = result.convert("RGB")
    with Image.open(io.BytesIO(gif)) as source:
        frame = source.convert("RGB")
    # GIF's palette on both sides: the photo within a few units, the style far from it
    assert distance(firsts["0"], frame) < 4.0 < distance(firsts["100"], frame)
    bad = post_job(client, gif, strength="x")
    assert bad.status_code == 400 and "strength" in bad.get_json()["error"]
