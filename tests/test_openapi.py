"""The OpenAPI 3.1 document (web/openapi.py): it describes exactly the blueprint's routes,
and schemathesis, run against the real gunicorn, finds no 5xx and no answer that does not
conform to it.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from flask import Flask

from conftest import convert, encode_image, photo, photo_bytes
from media import gif_from_photos

from flask_animegan.web.openapi import openapi_path

REPO = Path(__file__).resolve().parent.parent
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
#: Examples per operation: enough for the fuzzer to reach each refusal.
EXAMPLES = 25


def blueprint_routes(app: Flask, prefix: str = "/animegan") -> set[tuple[str, str]]:
    return {(openapi_path(rule.rule).removeprefix(prefix), method.lower())
            for rule in app.url_map.iter_rules()
            if rule.endpoint.startswith("animegan.") and rule.endpoint != "animegan.static"
            for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}}


def test_the_document_has_every_route_of_the_blueprint_and_nothing_else(client, app):
    document = client.get("/animegan/openapi.json").json
    assert document["openapi"] == "3.1.0"
    described = {(path.removeprefix("/animegan"), method)
                 for path, operations in document["paths"].items() for method in operations}
    assert described == blueprint_routes(app)
    assert {("/convert", "post"), ("/styles", "get"), ("/healthz", "get"),
            ("/jobs/{job_id}", "delete"), ("/openapi.json", "get")} <= described
    ids = [op["operationId"] for ops in document["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))


def test_the_document_describes_errors_retry_after_and_images(client):
    document = client.get("/animegan/openapi.json").json
    convert = document["paths"]["/animegan/convert"]["post"]
    assert set(convert["responses"]["200"]["content"]) == {"image/jpeg", "image/png",
                                                           "image/webp"}
    assert convert["responses"]["429"] == {"$ref": "#/components/responses/RateLimited"}
    components = document["components"]
    assert "Retry-After" in components["responses"]["RateLimited"]["headers"]
    assert "Retry-After" in components["responses"]["Busy"]["headers"]
    assert components["schemas"]["Error"]["required"] == ["error", "status"]
    size = next(p for p in convert["parameters"] if p["name"] == "size")
    assert size["schema"] == {"type": "integer", "minimum": 16, "maximum": 128}


def test_the_document_follows_the_prefix_and_the_largest_size(make_app):
    app = make_app(ANIMEGAN_URL_PREFIX="/tools/anime", ANIMEGAN_MAX_OUTPUT_SIDE=512)
    document = app.test_client().get("/tools/anime/openapi.json").json
    described = {(path.removeprefix("/tools/anime"), method)
                 for path, operations in document["paths"].items() for method in operations}
    assert described == blueprint_routes(app, "/tools/anime")
    size = next(p for p in document["paths"]["/tools/anime/convert"]["post"]["parameters"]
                if p["name"] == "size")
    assert size["schema"]["maximum"] == 512


def test_behind_a_proxy_that_mounts_the_app_the_document_names_its_server(client):
    """A client resolves the paths against ``servers`` (relative to the document's own
    address): with the app mounted at /site (SCRIPT_NAME), that is /site, not /."""
    from urllib.parse import urljoin

    assert client.get("/animegan/openapi.json").json["servers"] == [{"url": "/"}]
    base = "http://localhost/site"
    document = client.get("/animegan/openapi.json", base_url=base).json
    assert document["servers"] == [{"url": "/site"}]
    where = urljoin(f"{base}/animegan/openapi.json", document["servers"][0]["url"])
    assert where + "/animegan/styles" == f"{base}/animegan/styles"
    assert client.get("/animegan/styles", base_url=base).status_code == 200


def test_the_errors_the_document_promises_are_the_ones_sent(client):
    answer = client.post("/animegan/convert", query_string={"style": "nope"}, data=b"x",
                         content_type="image/jpeg")
    assert answer.status_code == 404 and set(answer.json) == {"error", "status"}


@pytest.mark.server
def spellings(word: str) -> list[str]:
    """Ways to write ``word``, some of which the service reads as it and some not."""
    kelvin = word.replace("k", "\u212a")  # Python lower()s the Kelvin sign to "k"
    return [word, word.upper(), word.title(), word.swapcase().title().swapcase(),
            f" {word}", f"{word}\t", f"\t {word} ", f"\n{word}", f"{word}\r",
            f"\x1c{word}", f"\xa0{word}", f"{word}\x00", f"{word}\u3000", kelvin,
            "".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in word),  # full width
            f"{word}{word[-1]}", word[:-1], f"{word} {word}"]


def parameter_schema(document: dict, path: str, method: str, name: str) -> dict:
    """A query parameter's schema as schemathesis reads it: with allowEmptyValue, the
    empty string is one more value."""
    found = next(p for p in document["paths"][path][method]["parameters"]
                 if p["name"] == name)
    schema = found["schema"]
    return {"anyOf": [schema, {"enum": [""]}]} if found.get("allowEmptyValue") else schema


@pytest.mark.parametrize("name,words", [
    ("format", ["jpeg", "jpg", "png", "webp"]), ("colors", ["off", "luma", "keep"]),
    ("portrait", ["auto", "on", "off", "faces"]),
    ("download", ["1", "0", "true", "false", "yes", "no", "on", "off"])])
def test_a_word_parameter_is_refused_exactly_when_the_document_refuses_it(client, name,
                                                                          words):
    """Every spelling of every value (cases, spaces, control and Unicode look-alikes, the
    empty value), sent to the service and judged by the document with the validator
    schemathesis uses: a 200 exactly where the document allows the value, else a 400
    naming the parameter. (The Kelvin sign, U+212A, lower-cases to "k" in Python.)"""
    import jsonschema_rs

    document = client.get("/animegan/openapi.json").json
    if name == "download":
        page = client.post("/animegan/upload", data={
            "image": (io.BytesIO(photo_bytes("astronaut")), "me.jpg"), "size": "32"})
        assert page.status_code == 303
        token = page.headers["Location"].rstrip("/").rsplit("/", 1)[-1]
        schema = parameter_schema(document, "/animegan/result/{token}/{kind}", "get", name)
        url = f"/animegan/result/{token}/anime?{name}="
        send = lambda value: client.get(url + quote(value, safe=""))  # noqa: E731
    else:
        schema = parameter_schema(document, "/animegan/convert", "post", name)
        small = encode_image(photo("astronaut").resize((32, 32)))
        send = lambda value: convert(client, small,  # noqa: E731
                                     f"?size=32&{name}=" + quote(value, safe=""))
    allows = jsonschema_rs.validator_for(schema).is_valid
    values = [""] + [spelled for word in words for spelled in spellings(word)]
    answers = {value: send(value) for value in dict.fromkeys(values)}
    wrong = {value: response.status_code for value, response in answers.items()
             if response.status_code != (200 if allows(value) else 400)}
    assert not wrong, wrong
    refused = [r for value, r in answers.items() if not allows(value)]
    assert len(refused) >= len(words) * 6  # the class is not empty
    for response in refused:
        assert f"{name} must be" in response.get_data(as_text=True).lower()


@pytest.mark.parametrize("name", ["style", "size", "format", "colors", "portrait",
                                  "strength"])
def test_an_empty_conversion_parameter_is_its_default_as_the_document_says(client, name):
    document = client.get("/animegan/openapi.json").json
    for path in ("/animegan/convert", "/animegan/jobs"):  # (/upload: form fields)
        params = {p["name"]: p for p in document["paths"][path]["post"]["parameters"]}
        if name in params:
            assert params[name]["allowEmptyValue"] is True, (path, name)
    response = convert(client, encode_image(photo("astronaut").resize((32, 32))), f"?{name}=")
    assert response.status_code == 200, response.get_data(as_text=True)


@pytest.mark.server
def test_schemathesis_against_the_real_gunicorn_finds_no_5xx_and_conforms(models_dir,
                                                                          tmp_path):
    from servers import Server

    if not SCHEMATHESIS.exists():
        pytest.fail(f"schemathesis is not installed at {SCHEMATHESIS} (the test extra)")
    server = Server({
        "ANIMEGAN_MODELS_DIR": str(models_dir), "ANIMEGAN_MAX_SIDE": "64",
        "ANIMEGAN_DEFAULT_STYLE": "test_style", "ANIMEGAN_SHIPPED_STYLES": "false",
        "ANIMEGAN_RATE_LIMIT": "", "ANIMEGAN_ACCESS_LOG": "", "ANIMEGAN_WARMUP_SIZE": "32",
        "ANIMEGAN_SAMPLE_SIZE": "32", "ANIMEGAN_BACKEND": "torch", "ANIMEGAN_PRECISION": "fp32",
        "ANIMEGAN_METRICS": "false", "ANIMEGAN_MAX_UPLOAD_BYTES": str(1 << 20),
    }, log=tmp_path / "gunicorn.txt")
    report = tmp_path / "report"
    try:
        # a finished job and a result page to fuzz their routes with, not only random ids
        config = tmp_path / "schemathesis.toml"
        config.write_text((REPO / "tests" / "schemathesis.toml").read_text() + "\n[parameters]\n"
                          + "".join(f'"path.{name}" = "{value}"\n'
                                    for name, value in real_ids(server.url).items()))
        done = subprocess.run(
            [str(SCHEMATHESIS), "--config-file", str(config),
             "run", f"{server.url}/animegan/openapi.json",
             "--checks", "all", "--max-examples", str(EXAMPLES), "--seed", "30",
             "--phases", "examples,coverage,fuzzing", "--workers", "2",
             "--request-timeout", "30", "--max-redirects", "0",
             "--generation-deterministic", "--report", "junit", "--report-dir", str(report)],
            check=False, capture_output=True, text=True, timeout=600, cwd=tmp_path,
            env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
    finally:
        server.stop()
    summary = done.stdout[-6000:]
    assert done.returncode == 0, summary + done.stderr[-2000:]
    generated = re.search(r"(\d+) generated", summary)
    operations = len(client_document(models_dir)["paths"])
    assert generated and int(generated.group(1)) >= EXAMPLES * operations, summary
    print(json.dumps({"schemathesis": generated.group(0), "operations": operations}))
    # the job and result routes were reached with those ids (not only 404s)
    missing = re.search(r"Missing test data.*?(?:\n\n💡|\Z)", summary, re.S)
    assert not missing or not re.search(r"\{(job_id|token)\}", missing.group(0)), summary


def real_ids(url: str) -> dict[str, str]:
    """A finished job's id and a result page's token on the server at ``url``."""
    import time

    import requests

    session = requests.Session()
    job = session.post(f"{url}/animegan/jobs", data=gif_from_photos(3, (40, 30)),
                       headers={"Content-Type": "image/gif"}, timeout=30).json()["id"]
    deadline = time.monotonic() + 60
    while session.get(f"{url}/animegan/jobs/{job}", timeout=30).json()["state"] != "done":
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.2)
    page = session.get(f"{url}/animegan/", timeout=30).text
    csrf = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', page)
    upload = session.post(f"{url}/animegan/upload", data={"csrf_token": csrf.group(1) if csrf else ""},
                          files={"image": ("a.jpg", photo_bytes(), "image/jpeg")},
                          allow_redirects=False, timeout=30)
    assert upload.status_code == 303, upload.text[:500]
    return {"job_id": job, "token": upload.headers["Location"].rstrip("/").rsplit("/", 1)[-1]}


def client_document(models_dir: Path) -> dict:
    from conftest import build_app

    app = build_app(models_dir, models_dir.parent / "openvino", ANIMEGAN_SAMPLE_SIZE=0)
    return app.test_client().get("/animegan/openapi.json").json
