"""What every answer carries: health details and status, routing errors under the prefix,
security headers, Retry-After, oversized forms and bodies, forwarded addresses, no server paths."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from conftest import convert, encode_image, photo, photo_bytes, save_random_generator


# -- JPEG scans ---------------------------------------------------------------------------
# -- what anonymous clients see ---------------------------------------------------------------
def test_healthz_details_only_for_loopback_by_default(make_app):
    client = make_app().test_client()
    outside = client.get("/animegan/healthz", environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert outside.status_code == 200 and outside.json == {"status": "ok"}
    inside = client.get("/animegan/healthz").json  # the test client is 127.0.0.1
    assert inside["status"] == "ok" and "pid" in inside and "cache" in inside
    everyone = make_app(ANIMEGAN_HEALTH_DETAILS="all").test_client()
    assert "pid" in everyone.get("/animegan/healthz",
                                 environ_base={"REMOTE_ADDR": "203.0.113.9"}).json
    nobody = make_app(ANIMEGAN_HEALTH_DETAILS="none").test_client()
    assert nobody.get("/animegan/healthz").json == {"status": "ok"}


def test_healthz_status_without_a_model_is_503_for_everyone(make_app, tmp_path):
    client = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path)).test_client()
    response = client.get("/animegan/healthz", environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert response.status_code == 503 and response.json == {"status": "no_model"}


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/animegan/convert", 405), ("GET", "/animegan/nope", 404),
    ("POST", "/animegan/styles", 405), ("GET", "/animegan/result/x/y/z", 404),
])
def test_routing_errors_under_the_prefix_get_json_and_security_headers(client, method, path,
                                                                       status):
    response = client.open(path, method=method)
    assert response.status_code == status
    assert response.is_json and response.json["status"] == status and response.json["error"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]


def test_the_prefix_without_its_slash_redirects_with_security_headers(client):
    response = client.get("/animegan")
    assert response.status_code == 308
    assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_routing_errors_outside_the_prefix_are_the_host_apps(client):
    response = client.get("/elsewhere")
    assert response.status_code == 404 and not response.is_json
    assert "Content-Security-Policy" not in response.headers


def test_a_form_with_too_many_parts_says_so(client):
    fields = {f"f{i}": "x" for i in range(1100)}
    response = client.post("/animegan/convert", data={
        "image": (io.BytesIO(photo_bytes()), "a.jpg"), **fields})
    assert response.status_code == 413
    assert "parts" in response.json["error"] and "MiB" not in response.json["error"]


def test_retry_after_only_where_it_means_something(make_app):
    client = make_app(ANIMEGAN_RATE_LIMIT="1 per minute").test_client()
    ok = convert(client, photo_bytes())
    assert ok.status_code == 200 and "Retry-After" not in ok.headers
    assert ok.headers["X-RateLimit-Limit"] == "1" and ok.headers["X-RateLimit-Remaining"] == "0"
    limited = convert(client, photo_bytes())
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1


def test_malformed_forwarded_addresses_do_not_buy_a_fresh_bucket(make_app):
    client = make_app(ANIMEGAN_RATE_LIMIT="1 per minute", ANIMEGAN_TRUSTED_PROXIES=1
                      ).test_client()
    assert convert(client, photo_bytes(), headers={"X-Forwarded-For": "junk-1"}).status_code == 200
    for junk in ("junk-2", "1.2.3", "<script>", "::ffff:zz"):
        response = convert(client, photo_bytes(), headers={"X-Forwarded-For": junk})
        assert response.status_code == 429, junk


def test_a_chunked_raw_body_over_the_limit_is_a_413(make_app):
    client = make_app(ANIMEGAN_MAX_UPLOAD_BYTES=50_000).test_client()
    data = encode_image(photo("astronaut"), "PNG")  # much larger than the limit
    assert len(data) > 50_000
    response = client.post("/animegan/convert", input_stream=io.BytesIO(data),
                           content_type="image/png",
                           environ_overrides={"wsgi.input_terminated": True},
                           headers={"Transfer-Encoding": "chunked"})
    assert response.status_code == 413 and "limit" in response.json["error"]


def test_the_page_and_api_never_show_server_paths(make_app, tmp_path):
    (tmp_path / "broken.pt").write_bytes(b"junk")
    save_random_generator(tmp_path / "good.pt", seed=0)
    client = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_DEFAULT_STYLE="good"
                      ).test_client()
    convert(client, photo_bytes(), "?style=broken")
    outside = {"environ_base": {"REMOTE_ADDR": "198.51.100.7"}}
    for response in (client.get("/animegan/", **outside), client.get("/animegan/styles", **outside),
                     client.get("/animegan/healthz", **outside),
                     convert(client, photo_bytes(), "?style=broken", **outside)):
        assert str(Path(tmp_path)) not in response.get_data(as_text=True)
