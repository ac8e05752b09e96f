"""The OpenAPI 3.1 document (web/openapi.py): it describes exactly the blueprint's routes,
and schemathesis, run against the real gunicorn, finds no 5xx and no answer that does not
conform to it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from flask import Flask

from flask_animegan.web.openapi import openapi_path

REPO = Path(__file__).resolve().parent.parent
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
#: Examples per operation (the issue asks at least 25).
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


def test_the_errors_the_document_promises_are_the_ones_sent(client):
    answer = client.post("/animegan/convert", query_string={"style": "nope"}, data=b"x",
                         content_type="image/jpeg")
    assert answer.status_code == 404 and set(answer.json) == {"error", "status"}


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
        done = subprocess.run(
            [str(SCHEMATHESIS), "--config-file", str(REPO / "tests" / "schemathesis.toml"),
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


def client_document(models_dir: Path) -> dict:
    from conftest import build_app

    app = build_app(models_dir, models_dir.parent / "openvino", ANIMEGAN_SAMPLE_SIZE=0)
    return app.test_client().get("/animegan/openapi.json").json
