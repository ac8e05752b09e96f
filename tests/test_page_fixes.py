"""The page's details through the Flask client: the title in a layout that writes its own,
how long results are kept, the command the administrator's box names, the photo beside a
``portrait=faces`` result, and faces found at a small output size with the real detector.
The same in Chromium: tests/test_browser_page_fixes.py."""

from __future__ import annotations

import io
import json
import re
import shutil
import click
import numpy as np
import pytest
from flask import Flask
from conftest import TEST_CONFIG, OwnAddressClient, encode_image, open_image
from faces_corpus import corpus

from flask_animegan import AnimeGAN
from flask_animegan.web.views import duration

#: A layout like FlaskBB's: its title block holds the whole title and reads ``page_title``.
FORUM_LAYOUT = """<!doctype html><html lang="en"><head><title>
  {% block title %}{%- if not page_title -%}Studio Forum - a place to talk
  {%- else -%}{{ page_title }} - Studio Forum{%- endif -%}{% endblock %}</title></head>
<body>{% block content %}{% endblock %}</body></html>
"""


@pytest.fixture(scope="module")
def group_picture() -> tuple[bytes, int]:
    """A generated group photo (1280 x 960) with five faces, 55 to 307 px."""
    picture = corpus(5)[4]
    assert len(picture.faces) == 5, "the corpus changed: pick a picture with five faces"
    return encode_image(picture.image, quality=92), len(picture.faces)


@pytest.fixture(scope="module")
def face_app(models_dir, openvino_cache, tmp_path_factory):
    """max side 1024, result pages kept ten minutes, a face style; made under a Flask CLI
    named ``studio`` (as ``studio run`` makes its app)."""
    folder = tmp_path_factory.mktemp("page-fixes")
    shutil.copy(models_dir / "test_style.pt", folder)
    shutil.copy(models_dir / "other_style.pt", folder / "face_paint_512_v2.pt")
    (folder / "templates").mkdir()
    (folder / "templates" / "forum.html").write_text(FORUM_LAYOUT)
    app = Flask("host_app", template_folder=str(folder / "templates"))
    app.config.update(TEST_CONFIG, ANIMEGAN_MODELS_DIR=str(folder),
                      ANIMEGAN_MODEL_CACHE_DIR=str(openvino_cache),
                      ANIMEGAN_DEFAULT_STYLE="test_style", ANIMEGAN_MAX_SIDE=1024,
                      ANIMEGAN_RESULT_TTL=600, ANIMEGAN_BASE_TEMPLATE="forum.html",
                      ANIMEGAN_CONTENT_BLOCK="content", ANIMEGAN_ADMIN_CHECK=lambda: True)
    with click.Context(click.Group("studio"), info_name="studio"):
        AnimeGAN(app)
    AnimeGAN.warm_up(app)
    app.test_client_class = OwnAddressClient  # no cached result passes between tests
    return app


def test_a_layout_whose_title_block_holds_the_site_name_keeps_it(face_app):
    html = face_app.test_client().get("/animegan/").get_data(as_text=True)
    title = re.search(r"<title>\s*(.*?)\s*</title>", html, re.S).group(1)
    assert title == "Photo to anime - Studio Forum"


def test_pages_say_how_long_results_are_kept(face_app):
    client = face_app.test_client()
    photo = encode_image(corpus(1)[0].image.resize((320, 240)))
    posted = client.post("/animegan/upload", data={"image": (io.BytesIO(photo), "p.jpg"),
                                                   "size": "256", "portrait": "off"})
    assert posted.status_code == 303
    page = client.get(posted.headers["Location"]).get_data(as_text=True)
    assert "kept for 10 minutes, then they disappear" in page and "a while" not in page


@pytest.mark.parametrize(("seconds", "said"), [(60, "1 minute"), (600, "10 minutes"),
                                               (3600, "60 minutes"), (7200, "2 hours"),
                                               (86400, "24 hours")])
def test_durations_as_the_pages_say_them(seconds, said):
    assert duration(seconds) == said


def test_the_administrators_box_names_the_command_that_made_the_app(face_app):
    html = face_app.test_client().get("/animegan/").get_data(as_text=True)
    assert "<code>studio animegan pull paprika</code>" in html
    assert "flask animegan" not in html


def test_with_portrait_faces_the_photo_shown_is_the_faces_side_by_side(face_app,
                                                                       group_picture):
    client = face_app.test_client()
    data, _ = group_picture
    posted = client.post("/animegan/upload", data={
        "image": (io.BytesIO(data), "group.jpg"), "size": "512", "portrait": "faces"})
    assert posted.status_code == 303
    page = client.get(posted.headers["Location"]).get_data(as_text=True)
    anime = _image(client, page, "animegan-converted")
    original = _image(client, page, "animegan-compare-before")
    assert anime.size == original.size  # one square per face, side by side
    faces = anime.width // anime.height
    assert faces >= 4 and anime.width == anime.height * faces
    # the page draws both at the result's size: no stretched whole photo
    width, height = re.search(r'id="animegan-result"[^>]*width="(\d+)" height="(\d+)"',
                              page).groups()
    assert (int(width), int(height)) == anime.size

    # the API says where each face's square came from, for the page's script
    answer = face_app.test_client().post(  # another client: not its cached result
        "/animegan/convert?size=512&portrait=faces", data=data, content_type="image/jpeg")
    assert answer.status_code == 200 and answer.headers["X-Faces"] == str(faces)
    matrices = np.array(json.loads(answer.headers["X-AnimeGAN-Face-Crops"]))
    assert matrices.shape == (faces, 6)
    # each maps the centre of one of the photo's faces to its square's middle
    centres = [(face.centre[0] / 1280, face.centre[1] / 960) for face in corpus(5)[4].faces]
    hits = set()
    for a, b, c, d, e, f in matrices:
        near = [i for i, (x, y) in enumerate(centres)
                if 0.3 < a * x + b * y + c < 0.7 and 0.3 < d * x + e * y + f < 0.7]
        assert len(near) == 1, near
        hits.add(near[0])
    assert len(hits) == faces


def _image(client, page: str, css_class: str):
    """The picture of the page's first ``<img>`` of ``css_class``."""
    tag = re.search(rf'<img[^>]*class="[^"]*{css_class}[^"]*"[^>]*>', page).group(0)
    return open_image(client.get(re.search(r'src="([^"]+)"', tag).group(1)).data)


def test_faces_are_found_at_512_px_as_at_1024(face_app, group_picture):
    """Portrait mode searches the faces on a copy of at least 1024 px from the one decode:
    of the group photo's five faces (22 to 123 px at 512), a 512-px result finds as many as
    a 1024-px one (4; a search on the 512-px copy itself found 3)."""
    data, placed = group_picture
    client = face_app.test_client()
    found = {}
    for size in (512, 1024):
        answer = client.post(f"/animegan/convert?size={size}&portrait=on&format=png",
                             data=data, content_type="image/jpeg")
        assert answer.status_code == 200, answer.json
        found[size] = int(answer.headers["X-Faces"])
        assert open_image(answer.data).width == size
        # one decode: the search's copy and the network's input come from it
        assert answer.headers["Server-Timing"].count("decode") == 1
    assert found[512] == found[1024] >= placed - 1, found


def test_the_command_follows_how_the_site_runs_its_cli(monkeypatch):
    """``flask --app site run`` keeps ``--app``; a site's own CLI is named as it is; under a
    server (no CLI), FLASK_APP, else the module that made the app."""
    from flask_animegan.cli.commands import site_command

    app = Flask("studio.factory")
    monkeypatch.delenv("FLASK_APP", raising=False)
    flask_cli = click.Group("flask", params=[click.Option(["--app"])])
    with click.Context(flask_cli, info_name="flask") as context:
        context.params["app"] = "studio:create_app()"
        assert site_command(app) == "flask --app 'studio:create_app()' animegan"
    with click.Context(click.Group("flaskbb"), info_name="flaskbb"):
        assert site_command(app) == "flaskbb animegan"
    assert site_command(app) == "flask --app studio.factory animegan"
    monkeypatch.setenv("FLASK_APP", "wsgi")
    assert site_command(app) == "flask --app wsgi animegan"
