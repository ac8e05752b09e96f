"""Every route and every error status, through the Flask test client."""

from __future__ import annotations

import io
import os
import re
import threading

import pytest
import torch
from conftest import encode_image, open_image, photo, photo_bytes, save_random_generator


def convert(client, data: bytes, query: str = "", **kwargs):
    return client.post(f"/animegan/convert{query}", data={"image": (io.BytesIO(data), "p.jpg")},
                       **kwargs)


# -- the page and the form ---------------------------------------------------------------

def test_page_has_a_form_that_works_without_javascript(client):
    page = client.get("/animegan/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert re.search(r'<form[^>]+method="post"[^>]+action="/animegan/upload"[^>]+'
                     r'enctype="multipart/form-data"', html)
    assert 'type="file" name="image"' in html
    assert re.search(r'type="radio" name="style" value="other_style"[^>]* checked', html)
    assert 'type="radio" name="style" value="test_style"' in html
    assert re.search(r'<select id="animegan-size" name="size">', html)
    # the page's own CSS and JS come from the package (no CDN, nothing inline)
    assert re.findall(r'(?:src|href)="(https?:)?//', html) == []
    assert re.findall(r"<script[^>]*>", html) == [
        '<script src="/animegan/animegan-static/animegan.js" defer>']
    for asset, marker in (("animegan.css", b".animegan"), ("animegan.js", b"animegan-form")):
        with client.get(f"/animegan/animegan-static/{asset}") as response:
            assert response.status_code == 200 and marker in response.data


def test_form_upload_redirects_to_a_result_page_with_both_pictures(client):
    response = client.post("/animegan/upload", data={
        "image": (io.BytesIO(photo_bytes("astronaut")), "me.jpg"), "style": "other_style",
        "size": "96"})
    assert response.status_code == 303
    page_url = response.headers["Location"]
    token = page_url.rsplit("/", 1)[1]
    assert len(token) >= 32
    page = client.get(page_url)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f"/animegan/result/{token}/original" in html
    assert f"/animegan/result/{token}/anime" in html
    original = client.get(f"/animegan/result/{token}/original")
    anime = client.get(f"/animegan/result/{token}/anime")
    assert open_image(original.data).size == open_image(anime.data).size == (96, 96)
    assert original.data != anime.data
    download = client.get(f"/animegan/result/{token}/anime?download=1")
    assert download.headers["Content-Disposition"] == 'attachment; filename="anime-other_style.jpg"'


def test_unknown_or_expired_result_is_a_404_page(client):
    response = client.get("/animegan/result/not-a-real-token")
    assert response.status_code == 404
    assert "expired" in response.get_data(as_text=True)
    assert client.get("/animegan/result/not-a-real-token/anime").status_code == 404


def test_form_errors_are_shown_on_the_page(client):
    response = client.post("/animegan/upload",
                           data={"image": (io.BytesIO(b"hello, not a picture"), "x.jpg")})
    assert response.status_code == 400
    assert response.mimetype == "text/html"
    assert "not an image" in response.get_data(as_text=True)


# -- the API ------------------------------------------------------------------------------

def test_convert_multipart_returns_a_jpeg_of_the_configured_size(client):
    response = convert(client, photo_bytes("coffee"))  # 600 x 400
    assert response.status_code == 200
    assert response.mimetype == "image/jpeg"
    assert response.headers["X-AnimeGAN-Style"] == "other_style"  # first alphabetically
    assert response.headers["X-AnimeGAN-Face-Crop"] == "none"
    image = open_image(response.data)
    assert image.format == "JPEG" and image.size == (128, 85)


def test_convert_raw_body_with_parameters_in_the_query(client):
    response = client.post("/animegan/convert?style=test_style&size=64&format=png",
                           data=photo_bytes("rocket"), content_type="application/octet-stream")
    assert response.status_code == 200 and response.mimetype == "image/png"
    assert response.headers["X-AnimeGAN-Style"] == "test_style"
    assert open_image(response.data).size == (64, 43)


def test_styles_give_different_results(client):
    data = photo_bytes("astronaut")
    a = convert(client, data, "?style=test_style&size=64")
    b = convert(client, data, "?style=other_style&size=64")
    assert a.status_code == b.status_code == 200
    assert a.data != b.data


def test_format_is_decided_by_content_not_by_name_or_content_type(client):
    png = encode_image(photo("chelsea"), "PNG")
    response = client.post("/animegan/convert", content_type="multipart/form-data",
                           data={"image": (io.BytesIO(png), "holiday.jpg", "image/jpeg")})
    assert response.status_code == 200
    response = client.post("/animegan/convert", data=png, content_type="image/gif")
    assert response.status_code == 200


def test_outputs_carry_no_metadata_from_the_upload(client):
    image = photo("astronaut")
    exif = image.getexif()
    exif[0x010F] = "SecretCam"  # Make
    exif.get_ifd(0x8825)[2] = (48.0, 51.0, 30.0)  # GPSLatitude
    data = encode_image(image, "JPEG", exif=exif.tobytes())
    for fmt in ("jpeg", "png", "webp"):
        response = convert(client, data, f"?format={fmt}&size=64")
        result = open_image(response.data)
        assert not result.getexif(), fmt
        assert b"SecretCam" not in response.data
        assert "exif" not in result.info


@pytest.mark.parametrize("body,kwargs,status,message", [
    (None, {"data": {}}, 400, "field 'image'"),
    (None, {"data": {"picture": (io.BytesIO(b"x"), "p.jpg")}}, 400, "field 'image'"),
    (None, {"data": b"", "content_type": "image/jpeg"}, 400, "no image"),
    (None, {"data": b"just text", "content_type": "image/jpeg"}, 400, "not an image"),
    (None, {"data": b"{}", "content_type": "application/json"}, 415, "not an image"),
    (None, {"data": b"%PDF-1.4\n", "content_type": "application/pdf"}, 415, "not an image"),
])
def test_missing_or_undecodable_uploads(client, body, kwargs, status, message):
    response = client.post("/animegan/convert", **kwargs)
    assert response.status_code == status
    assert response.is_json and message in response.json["error"]


def test_truncated_image_is_a_400(client):
    data = photo_bytes("coffee")
    response = client.post("/animegan/convert", data=data[: len(data) // 2],
                           content_type="image/jpeg")
    assert response.status_code == 400
    assert "truncated or corrupt" in response.json["error"]


def test_an_image_format_we_do_not_accept_is_a_415(client):
    response = client.post("/animegan/convert", data=encode_image(photo("coffee"), "PPM"),
                           content_type="image/x-portable-pixmap")
    assert response.status_code == 415
    assert "PPM" in response.json["error"]


def test_unknown_style_is_a_404(client):
    response = convert(client, photo_bytes(), "?style=nope")
    assert response.status_code == 404
    assert "not installed" in response.json["error"]
    response = convert(client, photo_bytes(), "?style=paprika")
    assert response.status_code == 404
    assert "flask animegan pull paprika" in response.json["error"]
    response = convert(client, photo_bytes(), "?style=../../etc/passwd")
    assert response.status_code == 404


@pytest.mark.parametrize("query", ["?size=0", "?size=-5", "?size=100000", "?size=abc",
                                   "?size=1.5", "?format=bmp", "?format=../x"])
def test_bad_parameters_are_a_400(client, query):
    response = convert(client, photo_bytes(), query)
    assert response.status_code == 400
    assert "must be" in response.json["error"]


def test_body_larger_than_the_limit_is_a_413(make_app):
    client = make_app(ANIMEGAN_MAX_UPLOAD_BYTES=10_000).test_client()
    response = convert(client, photo_bytes("astronaut", "PNG"))
    assert response.status_code == 413
    assert "too large" in response.json["error"]
    page = client.post("/animegan/upload",
                       data={"image": (io.BytesIO(photo_bytes("astronaut", "PNG")), "a.png")})
    assert page.status_code == 413 and "too large" in page.get_data(as_text=True)


def test_too_many_pixels_is_a_413_before_decoding(make_app):
    client = make_app(ANIMEGAN_MAX_PIXELS=100_000).test_client()
    response = convert(client, photo_bytes("astronaut"))  # 512 x 512 = 262,144 pixels
    assert response.status_code == 413
    assert "262,144 pixels" in response.json["error"]


def test_rate_limit_gives_429_with_retry_after(make_app):
    client = make_app(ANIMEGAN_RATE_LIMIT="2 per minute").test_client()
    data = photo_bytes("coffee")
    assert convert(client, data).status_code == 200
    # each a miss (another photo): a cache hit would take nothing
    assert client.post("/animegan/upload", data={
        "image": (io.BytesIO(photo_bytes("astronaut")), "a.jpg")}).status_code == 303
    limited = convert(client, photo_bytes("rocket"))
    assert limited.status_code == 429
    assert 0 < int(limited.headers["Retry-After"]) <= 60
    assert "try again in" in limited.json["error"]
    page = client.post("/animegan/upload", data={"image": (io.BytesIO(data), "a.jpg")})
    assert page.status_code == 429 and "try again in" in page.get_data(as_text=True)
    # pages, styles and health are not limited
    for url in ("/animegan/", "/animegan/styles", "/animegan/healthz"):
        assert client.get(url).status_code == 200
    # another client address has its own budget
    other = convert(client, data, environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert other.status_code == 200


def test_x_forwarded_for_is_not_trusted_by_default(make_app):
    client = make_app(ANIMEGAN_RATE_LIMIT="1 per minute").test_client()
    data = photo_bytes("coffee")
    assert convert(client, data, headers={"X-Forwarded-For": "1.1.1.1"}).status_code == 200
    assert convert(client, data, headers={"X-Forwarded-For": "2.2.2.2"}).status_code == 429


def test_no_weights_at_all_page_explains_and_api_is_503(make_app, tmp_path):
    client = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path),
                      ANIMEGAN_SHIPPED_STYLES=False).test_client()
    page = client.get("/animegan/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    # visitors read that nothing can be converted; the admin's commands are in the log
    # (and on the page in debug mode only)
    assert "not available yet: no style is installed" in html and "flask animegan" not in html
    client.application.debug = True
    assert "flask --app host_app animegan pull paprika" in client.get(
        "/animegan/").get_data(as_text=True)
    response = convert(client, photo_bytes())
    assert response.status_code == 503
    assert "flask animegan pull paprika" in response.json["error"]
    assert int(response.headers["Retry-After"]) > 0
    health = client.get("/animegan/healthz")
    assert health.status_code == 503 and health.json["status"] == "no_model"


def test_a_broken_style_is_503_and_the_others_keep_working(make_app, tmp_path, caplog):
    save_random_generator(tmp_path / "good.pt", seed=0)
    (tmp_path / "broken.pt").write_bytes(b"\x00" * 1000)
    torch.save({"only": torch.zeros(3)}, tmp_path / "wrongkeys.pt")
    client = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_DEFAULT_STYLE="good").test_client()
    for style in ("broken", "wrongkeys"):
        response = convert(client, photo_bytes(), f"?style={style}")
        assert response.status_code == 503
        # visitors learn which style, never where the server keeps its files ...
        assert f"'{style}'" in response.json["error"]
        assert str(tmp_path) not in response.get_data(as_text=True)
        # ... the log has the details
        assert str(tmp_path / f"{style}.pt") in caplog.text
    assert convert(client, photo_bytes(), "?style=good").status_code == 200
    health = client.get("/animegan/healthz").json
    assert health["status"] == "degraded"
    assert set(health["broken"]) == {"broken", "wrongkeys"}
    styles = {s["name"]: s for s in client.get("/animegan/styles").json["styles"]}
    assert styles["broken"]["usable"] is False and styles["good"]["usable"] is True
    for public in (client.get("/animegan/styles"), client.get("/animegan/healthz"),
                   client.get("/animegan/"), convert(client, photo_bytes(), "?style=broken")):
        assert str(tmp_path) not in public.get_data(as_text=True)


def test_overload_gives_503_with_retry_after(make_app):
    app = make_app(ANIMEGAN_MAX_QUEUE=0)
    client = app.test_client()
    engine = app.extensions["animegan"].engine
    with engine.gate.slot():  # another conversion holds the model
        response = convert(client, photo_bytes())
        assert response.status_code == 503
        assert int(response.headers["Retry-After"]) >= 1
        assert "busy" in response.json["error"]
    assert convert(client, photo_bytes()).status_code == 200


def test_requests_queue_for_the_model_up_to_the_bound(make_app):
    app = make_app(ANIMEGAN_MAX_QUEUE=1)
    engine = app.extensions["animegan"].engine
    statuses: list[int] = []
    release = threading.Event()

    def hold() -> None:
        with engine.gate.slot():
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    while not engine.status()["in_flight"]:
        pass
    waiter = threading.Thread(
        target=lambda: statuses.append(convert(app.test_client(), photo_bytes()).status_code))
    waiter.start()
    while engine.status()["queued"] < 1:
        pass
    assert convert(app.test_client(), photo_bytes()).status_code == 503  # queue full
    release.set()
    holder.join()
    waiter.join()
    assert statuses == [200]


def test_face_styles_convert_the_centre_square(make_app, tmp_path):
    save_random_generator(tmp_path / "celeba_distill.pt", seed=2)
    client = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path)).test_client()
    response = convert(client, photo_bytes("coffee"))  # 600 x 400
    assert response.status_code == 200
    assert response.headers["X-AnimeGAN-Face-Crop"] == "centre-square"
    assert open_image(response.data).size == (128, 128)
    assert "centre square" in client.get("/animegan/").get_data(as_text=True)


def test_styles_lists_installed_and_pullable_with_licences(client):
    body = client.get("/animegan/styles").json
    styles = {s["name"]: s for s in body["styles"]}
    assert body["default"] == "other_style"
    assert styles["test_style"]["installed"] and styles["other_style"]["default"]
    assert not styles["paprika"]["installed"]
    assert styles["paprika"]["licence"] == "LicenseRef-AnimeGANv2-NonCommercial"
    assert "non-commercial" in styles["paprika"]["licence_note"]
    assert styles["paprika"]["licence_url"].startswith("https://github.com/TachibanaYoshino/")
    assert styles["test_style"]["licence"] == "own" and styles["test_style"]["licence_url"] is None
    assert styles["celeba_distill"]["licence_url"] == "https://spdx.org/licenses/MIT.html"
    assert styles["face_paint_512_v2"]["face_crop"] is True
    assert {"paprika", "celeba_distill", "face_paint_512_v1", "face_paint_512_v2"} <= set(styles)


def test_healthz_reports_threads_queue_and_cache(make_app):
    app = make_app(ANIMEGAN_TORCH_THREADS=1, ANIMEGAN_SAMPLE_SIZE=0)  # samples load every style
    client = app.test_client()
    try:
        health = client.get("/animegan/healthz").json
        assert health["status"] == "ok"
        assert health["torch_threads"] == torch.get_num_threads()
        assert health["in_flight"] == health["queued"] == 0
        assert health["loaded"] == ["other_style"]
        assert set(health["cache"]) >= {"hits", "misses", "entries", "bytes"}
        convert(client, photo_bytes())
        assert client.get("/animegan/healthz").json["cache"]["entries"] == 1
    finally:
        torch.set_num_threads(len(os.sched_getaffinity(0)))


def test_x_forwarded_for_is_used_only_behind_configured_proxies(make_app):
    client = make_app(ANIMEGAN_RATE_LIMIT="1 per minute", ANIMEGAN_TRUSTED_PROXIES=1).test_client()
    data = photo_bytes("coffee")

    def send(chain: str) -> int:
        return convert(client, data, headers={"X-Forwarded-For": chain}).status_code

    assert send("1.1.1.1") == 200
    assert send("1.1.1.1") == 429  # the same client
    assert send("2.2.2.2") == 200  # another client behind the same proxy
    # a client forging the header cannot escape: the proxy appends what it saw
    assert send("9.9.9.9, 2.2.2.2") == 429


def test_responses_carry_security_headers(client):
    for response in (client.get("/animegan/"), convert(client, photo_bytes())):
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'self'" in response.headers["Content-Security-Policy"]


def test_server_timing_and_one_structured_log_line_per_conversion(client, caplog):
    import json
    import logging

    with caplog.at_level(logging.INFO):
        response = convert(client, photo_bytes("coffee"), "?size=64")
        convert(client, b"not an image")
    stages = dict(part.strip().split(";dur=") for part in
                  response.headers["Server-Timing"].split(","))
    assert list(stages) == ["lookup", "decode", "cache", "infer", "encode"]
    assert all(float(ms) >= 0 for ms in stages.values())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("animegan.")]
    assert len(lines) == 2
    ok, failed = (json.loads(line.split(" ", 1)[1]) for line in lines)
    assert ok["status"] == 200 and ok["cache"] == "miss" and ok["size"] == [64, 43]
    assert set(ok["ms"]) == set(stages)
    assert failed == {"endpoint": "animegan.convert", "status": 400, "error": "BadImage"}
    assert "p.jpg" not in " ".join(lines)  # no client file names
