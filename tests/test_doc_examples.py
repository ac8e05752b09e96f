"""Every shell example in the README and docs/ runs, against the real gunicorn.

A ```sh block is run unless its first line is a comment that says why not: it needs
internet or official weights, takes minutes, or sets up a machine (the two commands at
the top of the README: CI runs `bash .ci/run` itself, and tests/test_shipped_style.py
serves the example app as the first one does). Each page's runnable blocks run in one
bash session, in order (the /upload example's `$page` feeds the result examples), in a
folder holding `photo.jpg`, `me.png` and `holiday/`, with the address replaced by the
test server's. `curl` fails on any HTTP error there, so an example that gets a 4xx
fails the test instead of saving a JSON error as an image.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, open_image, photo, photo_bytes
from servers import Server

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
YAML_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.MULTILINE | re.DOTALL)
WHY_NOT_RUN = ("needs internet", "needs official weights", "takes minutes", "takes an hour",
               "sets up")
DOCUMENTED_ADDRESS = "http://127.0.0.1:8000"


def blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


def reason_not_run(block: str) -> str | None:
    first = block.lstrip().splitlines()[0]
    if not first.startswith("#"):
        return None
    return next((why for why in WHY_NOT_RUN if why in first), None)


def test_every_example_runs_or_says_why_not() -> None:
    found = {page.name: blocks(page) for page in PAGES}
    assert sum(map(len, found.values())) >= 10
    runnable = [b for page in found.values() for b in page if reason_not_run(b) is None]
    assert any("/animegan/upload" in b for b in runnable)
    assert any("animegan convert" in b for b in runnable)


def test_examples_with_official_weights_say_so_and_fail_with_body() -> None:
    for page in PAGES:
        for block in blocks(page):
            uses_official = re.search(r"\b(paprika|face_paint_512_v\d|celeba_distill)\b", block)
            if uses_official and "pull" not in block:
                assert reason_not_run(block) == "needs official weights", (page.name, block)
            if reason_not_run(block) == "needs official weights":
                for call in re.findall(r"^curl .*$", block, re.MULTILINE):
                    assert "--fail-with-body" in call, (page.name, call)


def test_every_yaml_example_parses_and_the_scalers_read_the_job_queue() -> None:
    """The KEDA examples: valid YAML, on RQ's list of the queue and on metrics we serve."""
    import redis
    import yaml
    from rq import Queue

    from flask_animegan.jobs.queues import QUEUE_NAME

    documents = [document for page in PAGES
                 for block in YAML_BLOCK.findall(page.read_text(encoding="utf-8"))
                 for document in yaml.safe_load_all(block)]
    scaled = [d for d in documents if isinstance(d, dict) and d.get("kind") == "ScaledObject"]
    assert scaled, "no KEDA ScaledObject in the docs"
    triggers = [t for d in documents for t in (d.get("spec", d).get("triggers") or [])]
    lists = [t["metadata"] for t in triggers if t["type"] == "redis"]
    # RQ's own name of the list of waiting jobs, not a guess (no Redis is reached)
    assert [m["listName"] for m in lists] == [Queue(QUEUE_NAME, connection=redis.Redis()).key]
    assert all(int(m["listLength"]) >= 1 for m in lists)
    queries = [t["metadata"]["query"] for t in triggers if t["type"] == "prometheus"]
    served = set(re.findall(r'"(animegan_job_[a-z_]+)"', (REPO / "flask_animegan" /
                                                           "metrics.py").read_text()))
    assert queries and all(set(re.findall(r"animegan_job_[a-z_]+", q)) <= served
                           for q in queries), (queries, served)


@pytest.mark.server
def test_the_runnable_examples_work_against_the_real_gunicorn(tmp_path: Path) -> None:
    server = Server({"ANIMEGAN_METRICS": "1", "ANIMEGAN_RATE_LIMIT": "100 per minute",
                     "ANIMEGAN_ACCESS_LOG": ""}, log=tmp_path / "gunicorn.log")
    work = tmp_path / "work"
    (work / "holiday").mkdir(parents=True)
    (work / "photo.jpg").write_bytes(photo_bytes("astronaut"))
    photo("chelsea").save(work / "me.png")
    (work / "holiday" / "beach.jpg").write_bytes(photo_bytes("coffee"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO), "ANIMEGAN_MAX_SIDE": "512"}
    prelude = ("set -euo pipefail\n"
               'curl() { command curl --silent --show-error --fail-with-body "$@"; }\n')
    try:
        for page in PAGES:
            runnable = [b for b in blocks(page) if reason_not_run(b) is None]
            if not runnable:
                continue
            script = prelude + "\n".join(runnable).replace(DOCUMENTED_ADDRESS, server.url)
            done = subprocess.run(["bash", "-c", script], cwd=work, env=env, text=True,
                                  capture_output=True, timeout=600)
            assert done.returncode == 0, (f"{page.name}: exit {done.returncode}\n"
                                          f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    finally:
        server.stop()
    # what the examples say they make
    for name, fmt in (("anime.jpg", "JPEG"), ("anime.png", "PNG"), ("anime.webp", "WEBP"),
                      ("anime-toon_demo.jpg", "JPEG"), ("anime/me.toon_demo.png", "PNG"),
                      ("anime/beach.toon_demo.png", "PNG")):
        assert open_image((work / name).read_bytes()).format == fmt, name
    assert max(open_image((work / "anime.png").read_bytes()).size) == 384
    assert (work / "toon_demo.ts").stat().st_size > 1_000_000
    assert (work / "sample.jpg").exists()
    # the raw MP4 body, with its type, was taken as a job
    video_job = json.loads((work / "video-job.json").read_text())
    assert video_job["kind"] == "video" and video_job["frames_total"] == 12, video_job
