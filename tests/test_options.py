"""The colour option (``colors``) and portrait mode (``portrait``) on every entry point:
the API, the form and its result page, the CLI, ``AnimeGANService.convert`` and jobs; the
cache keeping conversions with other options apart; the settings failing closed.

The detector and the colour transfer have tests of their own (test_portrait*.py,
test_colors.py); these check that each entry point passes the options through and says
what was done (``X-Faces``, ``X-AnimeGAN-Colors``, the result page's note).
"""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import convert, encode_image, open_image, photo, save_random_generator
from PIL import Image
from skimage.color import rgb2lab

from flask_animegan.errors import BadParameter

SIDE = 256  # the apps' ANIMEGAN_MAX_SIDE: a face of the picture below is 128 px there


def group_photo(faces: int = 1) -> Image.Image:
    """A 400 x 300 scene (coffee) with ``faces`` copies of the astronaut's face, 200 px
    (one) or 120 px (more), pasted side by side."""
    scene = photo("coffee").resize((400, 300))
    face = photo("astronaut").crop((150, 30, 330, 240))  # her face, with some hair
    side = 200 if faces == 1 else 120
    face = face.resize((side * 180 // 210, side))
    for index in range(faces):
        scene.paste(face, (20 + index * (face.width + 10), (300 - side) // 2))
    return scene


@pytest.fixture(scope="module")
def face_models(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test styles and a face style (``celeba_distill``, a seeded random generator)."""
    folder = tmp_path_factory.mktemp("face-models")
    for name in ("test_style.pt", "other_style.pt"):
        shutil.copy(models_dir / name, folder / name)
    save_random_generator(folder / "celeba_distill.pt", seed=2)
    return folder


@pytest.fixture(scope="module")
def face_app(face_models, models_dir, openvino_cache):
    from conftest import OwnAddressClient, build_app

    app = build_app(models_dir, openvino_cache, ANIMEGAN_MODELS_DIR=str(face_models),
                    ANIMEGAN_DEFAULT_STYLE="test_style", ANIMEGAN_MAX_SIDE=SIDE)
    app.test_client_class = OwnAddressClient  # no cached result passes between tests
    return app


@pytest.fixture
def client(face_app):
    return face_app.test_client()


def post(client, image: Image.Image, query: str):
    return convert(client, encode_image(image, quality=95), query)


def chroma_error(result: Image.Image, source: Image.Image) -> float:
    """Mean distance between the a*b* of ``result`` and of ``source`` (resized to it)."""
    ours = rgb2lab(np.asarray(result.convert("RGB")))
    theirs = rgb2lab(np.asarray(source.convert("RGB").resize(result.size)))
    return float(np.mean(np.hypot(*(ours[..., 1:] - theirs[..., 1:]).transpose(2, 0, 1))))


# -- the API ------------------------------------------------------------------------------
@pytest.mark.parametrize("colors", ["off", "luma", "keep", "KEEP", " Luma "])
def test_each_colour_option_is_answered_and_named(client, colors):
    response = post(client, photo("chelsea"), f"?style=test_style&colors={colors}")
    assert response.status_code == 200, response.json
    assert response.headers["X-AnimeGAN-Colors"] == colors.strip().lower()
    assert "X-Faces" not in response.headers  # a scene style: portrait mode is off
    pixels = np.asarray(open_image(response.data), np.float32)
    assert np.isfinite(pixels).all() and pixels.std() > 1


def test_keep_brings_the_photos_colours_back(client):
    source = photo("coffee")
    off, keep = (open_image(post(client, source, f"?style=test_style&colors={mode}").data)
                 for mode in ("off", "keep"))
    assert chroma_error(keep, source) < 0.5 * chroma_error(off, source)


@pytest.mark.parametrize("query, name", [("?colors=purple", "colors"),
                                         ("?portrait=maybe", "portrait"),
                                         ("?colors=%D9%A6", "colors")])
def test_an_unknown_option_is_a_400_that_names_it(client, query, name):
    response = post(client, photo("chelsea"), query)
    assert response.status_code == 400
    assert name in response.json["error"] and "must be one of" in response.json["error"]


def test_a_face_style_finds_the_face_and_keeps_the_picture(client):
    response = post(client, group_photo(1), "?style=celeba_distill")
    assert response.status_code == 200, response.json
    assert response.headers["X-Faces"] == "1"
    assert response.headers["X-AnimeGAN-Face-Crop"] == "none"
    assert open_image(response.data).size == (SIDE, SIDE * 3 // 4)  # the whole picture


def test_a_face_style_without_a_face_converts_the_centre_square_and_says_so(client):
    response = post(client, photo("coffee"), "?style=celeba_distill")
    assert response.status_code == 200
    assert response.headers["X-Faces"] == "0"
    assert response.headers["X-AnimeGAN-Face-Crop"] == "centre-square"
    assert open_image(response.data).size == (SIDE, SIDE)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_a_face_style_that_finds_no_face_decodes_once(client, fmt):
    """The fit that portrait mode looks at and the centre square it falls back to come
    from one decode: Server-Timing names one decoding stage."""
    buffer = io.BytesIO()
    photo("coffee").save(buffer, fmt)
    response = client.post("/animegan/convert?style=celeba_distill", data=buffer.getvalue(),
                           content_type=f"image/{fmt.lower()}")
    assert response.status_code == 200 and response.headers["X-Faces"] == "0"
    stages = [part.split(";")[0].strip()
              for part in response.headers["Server-Timing"].split(",")]
    assert stages.count("decode") == 1 and "sample" not in stages
    assert open_image(response.data).size == (SIDE, SIDE)


def test_portrait_mode_on_request_for_a_scene_style(client):
    picture = group_photo(1)
    plain = post(client, picture, "?style=test_style")
    on = post(client, picture, "?style=test_style&portrait=on")
    assert "X-Faces" not in plain.headers and on.headers["X-Faces"] == "1"
    assert open_image(on.data).size == open_image(plain.data).size == (SIDE, SIDE * 3 // 4)
    difference = np.abs(np.asarray(open_image(on.data), np.float32)
                        - np.asarray(open_image(plain.data), np.float32)).mean(axis=2)
    right, left = difference[:, SIDE // 2:].mean(), difference[:, :SIDE // 2].mean()
    assert right < 4  # the right half, no face, is the same
    assert left > right + 0.5  # the half with the face, converted on its own, is not


def test_portrait_off_is_todays_behaviour(client):
    response = post(client, group_photo(1), "?style=celeba_distill&portrait=off")
    assert "X-Faces" not in response.headers
    assert response.headers["X-AnimeGAN-Face-Crop"] == "centre-square"


def test_only_the_faces_side_by_side(client):
    response = post(client, group_photo(1), "?style=celeba_distill&portrait=faces")
    assert response.status_code == 200
    faces = int(response.headers["X-Faces"])
    assert faces == 1
    assert open_image(response.data).size == (512 * faces, 512)


def test_the_options_are_part_of_the_cache_key(client):
    """The same photo is one cache entry per colour option and portrait mode: a result
    converted with other options is never served for these."""
    data = encode_image(group_photo(1), quality=95)
    client.environ_base["REMOTE_ADDR"] = "127.0.9.9"  # a cache scope no other test used
    seen = []
    for query in ("colors=off", "colors=off", "colors=keep", "colors=keep", "colors=luma",
                  "portrait=on", "portrait=on", "portrait=faces"):
        response = convert(client, data, f"?style=test_style&{query}")
        assert response.status_code == 200
        seen.append((query, response.headers["X-Cache"], response.headers.get("X-Faces")))
    assert [cache for _, cache, _ in seen] == ["MISS", "HIT", "MISS", "HIT", "MISS", "MISS",
                                               "HIT", "MISS"]
    assert seen[6][2] == "1"  # a hit says how many faces, as its miss did


# -- the form and its page ----------------------------------------------------------------
def test_the_form_offers_both_options(client):
    page = client.get("/animegan/").get_data(as_text=True)
    for value in ("off", "luma", "keep"):
        assert f'<option value="{value}">' in page
    assert 'name="colors"' in page and 'name="portrait"' in page
    assert 'value="faces"' in page


def test_the_result_page_says_what_was_done(client):
    response = client.post("/animegan/upload", data={
        "image": (io.BytesIO(encode_image(group_photo(1), quality=95)), "group.jpg"),
        "style": "celeba_distill", "colors": "keep"})
    assert response.status_code == 303
    page = client.get(response.headers["Location"]).get_data(as_text=True)
    assert "1 face found and converted on their own." in page
    assert "The photo&#39;s colours were kept." in page


def test_a_bad_option_from_the_form_is_a_400_page(client):
    response = client.post("/animegan/upload", data={
        "image": (io.BytesIO(encode_image(photo("chelsea"))), "cat.jpg"), "colors": "sepia"})
    assert response.status_code == 400
    assert "Colors must be one of off, luma, keep" in response.get_data(as_text=True)


# -- the CLI and the Python API ------------------------------------------------------------
def test_the_cli_takes_both_options(face_app, tmp_path):
    source = tmp_path / "group.jpg"
    group_photo(1).save(source, quality=95)
    result = face_app.test_cli_runner().invoke(args=[
        "animegan", "convert", str(source), "-o", str(tmp_path / "out"),
        "--style", "celeba_distill", "--colors", "keep", "--portrait", "faces"])
    assert result.exit_code == 0, result.output
    assert "1 face(s) found" in result.output
    with Image.open(tmp_path / "out" / "group.celeba_distill.jpeg") as out:
        assert out.size == (512, 512)
    refused = face_app.test_cli_runner().invoke(args=[
        "animegan", "convert", str(source), "-o", str(tmp_path / "out"), "--colors", "x"])
    assert refused.exit_code == 2 and "--colors" in refused.output


def test_service_convert_takes_both_options(face_app):
    service = face_app.extensions["animegan"]
    with face_app.app_context():
        crops = service.convert(group_photo(1), "celeba_distill", portrait="faces")
        kept = service.convert(photo("coffee"), "test_style", colors="keep")
        plain = service.convert(photo("coffee"), "test_style")
        with pytest.raises(BadParameter, match="colors must be one of"):
            service.convert(photo("coffee"), colors="vivid")
    assert crops.size == (512, 512)
    assert kept.size == plain.size
    assert chroma_error(kept, photo("coffee")) < 0.5 * chroma_error(plain, photo("coffee"))


# -- jobs --------------------------------------------------------------------------------
def test_a_job_keeps_colours_and_refuses_portrait_mode(client, face_app):
    from media import gif_from_photos

    data = gif_from_photos(4, size=(96, 64), durations=50)
    accepted = client.post("/animegan/jobs?colors=keep", data=data,
                           content_type="image/gif")
    assert accepted.status_code == 202, accepted.json
    job_id = accepted.json["id"]
    jobs = face_app.extensions["animegan"].jobs
    deadline = time.monotonic() + 60
    while not (record := jobs.get(job_id)).finished:  # the in-process worker runs it
        assert time.monotonic() < deadline, record
        time.sleep(0.05)
    assert record.colors == "keep" and record.state == "done", record
    refused = client.post("/animegan/jobs?portrait=on", data=data, content_type="image/gif")
    assert refused.status_code == 400 and "portrait mode is for photos" in refused.json["error"]


# -- settings --------------------------------------------------------------------------
def test_a_scene_style_that_is_not_installed_stops_the_app_at_start(make_app, face_models):
    with pytest.raises(RuntimeError, match="ANIMEGAN_PORTRAIT_SCENE_STYLE='paprika' is not an "
                                           "installed style.*flask animegan pull paprika"):
        make_app(ANIMEGAN_MODELS_DIR=str(face_models), ANIMEGAN_PORTRAIT_SCENE_STYLE="paprika")


@pytest.mark.parametrize("key, value", [("ANIMEGAN_PORTRAIT_MAX_FACES", 0),
                                        ("ANIMEGAN_PORTRAIT_MAX_FACES", "8"),
                                        ("ANIMEGAN_PORTRAIT_SCENE_STYLE", "")])
def test_portrait_settings_fail_closed(make_app, key, value):
    with pytest.raises(RuntimeError, match=key):
        make_app(**{key: value})


# -- a file sent again ---------------------------------------------------------------------
@pytest.mark.parametrize("style, picture, portrait", [
    ("test_style", "group", "off"), ("celeba_distill", "group", "on"),
    ("celeba_distill", "coffee", "on"),  # no face: the centre square
    ("celeba_distill", "coffee", "off")])
def test_a_file_sent_again_answers_what_its_first_conversion_did_undecoded(
        client, style, picture, portrait):
    """Each way a picture is converted: the same bytes again are answered from the cache
    before any decode (no ``decode`` stage), with the first answer's picture and
    headers."""
    said = ("X-AnimeGAN-Style", "X-AnimeGAN-Face-Crop", "X-AnimeGAN-Colors", "X-Faces",
            "Content-Type")
    data = encode_image(group_photo(1) if picture == "group" else photo(picture), quality=90)
    query = f"?style={style}&portrait={portrait}&colors=keep"
    first, again = convert(client, data, query), convert(client, data, query)
    assert first.status_code == again.status_code == 200, first.json
    assert (first.headers["X-Cache"], again.headers["X-Cache"]) == ("MISS", "HIT")
    assert "decode;" in first.headers["Server-Timing"]
    assert "decode;" not in again.headers["Server-Timing"]
    assert again.data == first.data
    assert [again.headers.get(h) for h in said] == [first.headers.get(h) for h in said]


def test_the_form_shows_the_input_of_a_file_sent_again(client):
    """The result page of a file answered undecoded from the cache still shows its input:
    decoded then, for the page, as its first conversion's page showed it."""
    data = encode_image(photo("coffee"), quality=90)
    pages = []
    for _ in range(2):
        response = client.post("/animegan/upload", data={
            "image": (io.BytesIO(data), "coffee.jpg"), "style": "celeba_distill"})
        assert response.status_code == 303
        page = response.headers["Location"]
        assert "No face was found: the centre square" in client.get(page).get_data(as_text=True)
        pages.append([client.get(f"{page}/{kind}").data for kind in ("original", "anime")])
    assert pages[0] == pages[1]
    assert open_image(pages[1][0]).size == open_image(pages[1][1]).size == (SIDE, SIDE)
