"""Raw bodies: every type the page's picker offers (one list, web/uploads.py) is read from
a raw body by /convert and /jobs alike, and its content routes it (a moving file is a job,
a still a photo); any other type is a clear 415. The page and the OpenAPI document name
the same list. Through the Flask test client, on the embedded local queue."""

from __future__ import annotations

import io

import pytest
from media import apng, decoded_video, gif_from_photos, video_clip, webp_animation
from PIL import Image
from test_jobs_api import SIZE, jclient, jobs_app, wait_for  # noqa: F401 (fixtures)

from flask_animegan.web.uploads import PICKER_ACCEPT, UPLOAD_TYPES


def still(fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 90, 30)).save(buffer, fmt)
    return buffer.getvalue()


#: A moving file of each type that can carry one, and what its job's result is.
MOVING = {
    "image/gif": (lambda: gif_from_photos(6), "image/gif"),
    "image/apng": (lambda: apng(6), "image/apng"),
    "image/png": (lambda: apng(6), "image/apng"),
    "image/webp": (lambda: webp_animation(6), "image/webp"),
    "video/mp4": (lambda: video_clip(0.6, fps=10, container="mp4"), "video/mp4"),
    "video/quicktime": (lambda: video_clip(0.6, fps=10, container="mov"), "video/mp4"),
    "video/webm": (lambda: video_clip(0.6, fps=10, container="webm"), "video/mp4"),
    "video/x-matroska": (lambda: video_clip(0.6, fps=10, container="mkv"), "video/mp4"),
}
#: A still of each type that can carry one.
STILL = {"image/jpeg": "JPEG", "image/png": "PNG", "image/apng": "PNG", "image/webp": "WEBP",
         "image/gif": "GIF", "image/bmp": "BMP", "image/tiff": "TIFF"}


def post(client, path: str, body: bytes, mimetype: str):
    return client.post(f"/animegan/{path}", query_string={"size": str(SIZE)}, data=body,
                       content_type=mimetype)


def test_every_offered_type_has_a_file_to_send():
    # a type added to the list without a file here would go untested
    assert set(UPLOAD_TYPES) == set(MOVING) | set(STILL)


@pytest.mark.parametrize("mimetype", sorted(MOVING))
def test_a_moving_file_as_a_raw_body_is_a_job_that_converts(jclient, mimetype):  # noqa: F811
    make, result_type = MOVING[mimetype]
    body = make()
    response = post(jclient, "jobs", body, mimetype)
    assert response.status_code == 202, response.get_json()
    done = wait_for(jclient, response.headers["Location"])[-1]
    assert done["state"] == "done", done
    result = jclient.get(done["result_url"])
    assert result.mimetype == done["result_mimetype"] == result_type
    frames = (decoded_video(result.data)["frames"] if result_type == "video/mp4"
              else Image.open(io.BytesIO(result.data)).n_frames)
    assert frames == done["frames_total"] == 6
    # the same body at /convert is read too, and pointed to the job API
    refused = post(jclient, "convert", body, mimetype)
    assert refused.status_code == 415 and refused.get_json()["jobs_url"] == "/animegan/jobs"


@pytest.mark.parametrize("mimetype", sorted(STILL))
def test_a_still_as_a_raw_body_is_a_photo(jclient, mimetype):  # noqa: F811
    body = still(STILL[mimetype])
    converted = post(jclient, "convert", body, mimetype)
    assert converted.status_code == 200, converted.get_json()
    assert converted.mimetype.startswith("image/")
    refused = post(jclient, "jobs", body, mimetype)
    assert refused.status_code == 415
    assert refused.get_json()["convert_url"] == "/animegan/convert"


@pytest.mark.parametrize("mimetype", ["text/plain", "application/json", "application/pdf",
                                      "text/html", "audio/mpeg"])
@pytest.mark.parametrize("path", ["jobs", "convert"])
def test_any_other_type_is_a_415_naming_what_to_send(jclient, path, mimetype):  # noqa: F811
    response = post(jclient, path, video_clip(0.3, fps=10), mimetype)
    assert response.status_code == 415
    error = response.get_json()["error"]
    assert f"Content-Type {mimetype} is not an image or a video" in error
    assert "video/mp4" in error and "application/octet-stream" in error and "'image'" in error


def test_the_page_and_the_openapi_document_offer_the_same_list(jclient):  # noqa: F811
    page = jclient.get("/animegan/").get_data(as_text=True)
    assert f'accept="{PICKER_ACCEPT}"' in page
    document = jclient.get("/animegan/openapi.json").get_json()
    for path in ("/animegan/jobs", "/animegan/convert"):
        content = document["paths"][path]["post"]["requestBody"]["content"]
        assert set(content) == {"multipart/form-data", "application/octet-stream",
                                *UPLOAD_TYPES}, path
