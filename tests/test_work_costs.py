"""One cost for every kind of work (convert/costs.py): a photo by its output pixels, one
more per face portrait mode converts apart, frames by the frames decoded (test_job_charges.py);
refusals made before decoding cost nothing."""

from __future__ import annotations

import pytest
from conftest import encode_image
from media import photo
from PIL import Image

from flask_animegan.convert.costs import COST_RULE, work_cost

LIMIT = 20


def group(faces: int) -> Image.Image:
    """A 1000 x 500 scene with ``faces`` copies of the astronaut's face in rows of four."""
    scene = photo("coffee").resize((1000, 500))
    face = photo("astronaut").crop((150, 30, 330, 240)).resize((154, 180))
    for index in range(faces):
        row, column = divmod(index, 4)
        scene.paste(face, (40 + column * 240, 40 + row * 230))
    return scene


def _remaining(client) -> int:
    """The limit left, read from a refusal that costs nothing (a body that is no image)."""
    response = client.post("/animegan/convert", data=b"not an image", content_type="image/jpeg")
    assert response.status_code in (400, 429)
    return int(response.headers["X-RateLimit-Remaining"])


def test_the_cost_rule():
    assert work_cost(side=512, cap=20, size=(512, 341)) == 1
    assert work_cost(side=512, cap=20, size=(1024, 683)) == 3
    assert work_cost(side=512, cap=20, size=(512, 256), faces=8) == 9
    assert work_cost(side=512, cap=5, size=(512, 256), faces=8) == 5  # never refused forever
    assert work_cost(side=512, cap=5, frames=26) == 2
    assert work_cost(side=512, cap=5, frames=0) == 0


def test_portrait_mode_with_8_faces_is_charged_an_inference_each(make_app):
    client = make_app(ANIMEGAN_RATE_LIMIT=f"{LIMIT} per minute").test_client()
    response = client.post("/animegan/convert?portrait=on",
                           data=encode_image(group(8), quality=92), content_type="image/jpeg")
    assert response.status_code == 200, response.get_json()
    faces = int(response.headers["X-Faces"])
    assert faces == 8
    # the default size is one conversion, and each face is one more inference
    assert response.headers["X-RateLimit-Remaining"] == str(LIMIT - 1 - faces)
    assert _remaining(client) == LIMIT - 1 - faces
    plain = client.post("/animegan/convert?portrait=off",
                        data=encode_image(group(3), quality=92), content_type="image/jpeg")
    assert plain.status_code == 200 and "X-Faces" not in plain.headers
    assert _remaining(client) == LIMIT - 1 - faces - 1


def test_a_413_from_the_header_leaves_the_limit_unchanged(make_app):
    client = make_app(ANIMEGAN_RATE_LIMIT="10 per minute",
                      ANIMEGAN_MAX_DECODE_BYTES=16 * 1024 * 1024).test_client()
    # a PNG decodes whole (no reduced JPEG draft): 36 MiB of RGB, said by its header
    camera = encode_image(Image.new("RGB", (4000, 3000), (90, 120, 150)), "PNG")
    response = client.post("/animegan/convert", data=camera, content_type="image/png")
    assert response.status_code == 413, response.get_json()
    assert "needs" in response.get_json()["error"] and "MiB" in response.get_json()["error"]
    assert response.headers["X-RateLimit-Remaining"] == "10"
    assert _remaining(client) == 10


@pytest.mark.parametrize("body, content_type, status", [
    (b"GIF89a" + b"\0" * 10, "image/gif", 400),
    (b"plain text", "text/plain", 415),
])
def test_other_refusals_before_decoding_cost_nothing(make_app, body, content_type, status):
    client = make_app(ANIMEGAN_RATE_LIMIT="10 per minute").test_client()
    response = client.post("/animegan/convert", data=body, content_type=content_type)
    assert response.status_code == status
    assert response.headers["X-RateLimit-Remaining"] == "10"


def test_the_openapi_document_states_the_rule(client):
    document = client.get("/animegan/openapi.json").get_data(as_text=True)
    assert COST_RULE.replace("²", "\\u00b2") in document or COST_RULE in document


def test_the_http_docs_state_the_rule_in_one_sentence():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "http-api.md").read_text()
    assert f"**The rule, in one sentence: {COST_RULE}.**" in text


def test_a_photo_job_in_tiles_is_charged_its_faces_too(make_app):
    from test_jobs_api import wait_for

    client = make_app(ANIMEGAN_RATE_LIMIT="50 per minute",
                      ANIMEGAN_MAX_OUTPUT_SIDE=1536).test_client()
    response = client.post("/animegan/jobs?portrait=on&size=1000",
                           data=encode_image(group(8), quality=92), content_type="image/jpeg")
    assert response.status_code == 202, response.get_json()
    pixels = work_cost(side=128, cap=50, size=(1000, 500))  # the test app's 128-px side
    assert response.headers["X-RateLimit-Remaining"] == str(50 - pixels)
    job = wait_for(client, response.headers["Location"])[-1]
    assert job["state"] == "done", job
    assert _remaining(client) == 50 - pixels - 8
