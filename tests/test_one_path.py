"""One conversion path: settings reach every part that derives from them, frames and photos
share the infer stage, and the CLI converts without the job store."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import photo
from PIL import Image

from flask_animegan.convert.request import ConvertRequest, Options
from flask_animegan.jobs.records import JobState
from tests.media import gif_from_photos, video_clip


def _audio_seconds(data: bytes) -> float:
    """How long the audio of an MP4 plays: its last decoded frame's end."""
    end = 0.0
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(container.streams.audio[0]):
            end = max(end, float(frame.time) + frame.samples / frame.sample_rate)
    return end


def _finish(service, job_id: str, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = service.jobs.get(job_id)
        if record.finished:
            return record
        time.sleep(0.05)
    pytest.fail(f"job {job_id} did not finish in {timeout} s")


@pytest.mark.slow
def test_a_video_longer_than_the_default_keeps_all_its_audio(make_app):
    """ANIMEGAN_MAX_SECONDS=60 admits a 45 s video, and its result has 45 s of audio:
    the audio is read within the same media limits as the frames."""
    app = make_app(ANIMEGAN_MAX_SECONDS=60)
    service = app.extensions["animegan"]
    clip = video_clip(45.0, fps=2, size=(64, 48))
    response = app.test_client().post("/animegan/jobs?size=64", data=clip,
                                      content_type="video/mp4")
    assert response.status_code == 202, response.get_json()
    record = _finish(service, response.get_json()["id"])
    assert record.state == JobState.DONE, record.error
    result = service.jobs.store.get_result(record.id)
    assert abs(_audio_seconds(result) - 45.0) <= 0.5


def _faces(count: int, side: int = 110) -> Image.Image:
    """A scene with ``count`` copies of the astronaut's face, four a row."""
    face = photo("astronaut").crop((150, 30, 330, 240)).resize((side * 180 // 210, side))
    rows = -(-count // 4)
    scene = photo("coffee").resize((4 * (face.width + 20) + 20, rows * (side + 20) + 20))
    for index in range(count):
        row, column = divmod(index, 4)
        scene.paste(face, (20 + column * (face.width + 20), 20 + row * (side + 20)))
    return scene


@pytest.mark.parametrize("cap, found", [(12, 12), (9, 9), (3, 3)])
def test_portrait_mode_converts_as_many_faces_as_the_setting_allows(make_app, cap, found):
    app = make_app(ANIMEGAN_PORTRAIT_MAX_FACES=cap, ANIMEGAN_MAX_SIDE=512)
    picture = _faces(12)
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    response = app.test_client().post(f"/animegan/convert?portrait=on&size={max(picture.size)}",
                                      data=buffer.getvalue(), content_type="image/png")
    assert response.status_code == 200, response.get_json()
    assert response.headers["X-Faces"] == str(found)


_OLD_PREFIX = re.compile(rb"/animegan(?=[/\s\"'?]|$)")


def test_no_response_names_the_default_prefix_under_another(make_app):
    """With ANIMEGAN_URL_PREFIX=/toon, no page, error or job message points at /animegan."""
    app = make_app(ANIMEGAN_URL_PREFIX="/toon")
    service = app.extensions["animegan"]
    client = app.test_client()
    jpeg = io.BytesIO()
    photo().resize((96, 64)).save(jpeg, "JPEG")
    gif = gif_from_photos(3)
    responses = [
        client.get("/toon/"), client.get("/toon/styles"), client.get("/toon/openapi.json"),
        client.get("/toon/healthz"), client.get("/toon/nowhere"),
        client.post("/toon/convert", data=gif, content_type="image/gif"),
        client.post("/toon/jobs", data=jpeg.getvalue(), content_type="image/jpeg"),
        client.post("/toon/convert", data=b"not an image", content_type="image/jpeg"),
        client.post("/toon/upload", data={"image": (io.BytesIO(gif), "a.gif")}),
    ]
    for response in responses:
        assert not _OLD_PREFIX.search(response.get_data()), response.get_data()[:300]
    # a job whose file turns out to be a still in the worker: its error names /toon
    record = service.jobs.store.create(jpeg.getvalue(), client="c", style="test_style", size=64,
                                       kind="animation", format="GIF", frames_total=1)
    service.jobs.queue.enqueue(record.id)
    ended = _finish(service, record.id)
    assert ended.state == JobState.FAILED and "POST /toon/convert" in ended.error


def test_frames_and_photos_go_through_the_same_infer_stage(app):
    """A GIF's frames and a photo of the same pixels give identical pixels before encoding,
    colours kept included: the job runner and the photo path share Converter.stylize."""
    service = app.extensions["animegan"]
    converter = service.converter
    gif = gif_from_photos(3, size=(96, 64))
    info = converter.decoder.probe(gif)
    style = service.engine.style("test_style")
    frames = list(converter.decoder.frames(gif, info, size=96))
    for colors in ("off", "keep", "luma"):
        converted = [picture for _, picture, _ in converter.frames(iter(frames), style.name,
                                                                   colors)]
        for frame, picture in zip(frames, converted, strict=True):
            request = ConvertRequest(style, 96, "png", Options(colors=colors, portrait="off"))
            alone = converter.image(frame.image, request)
            assert np.array_equal(np.asarray(alone), np.asarray(picture))


@pytest.mark.redis
def test_the_cli_converts_an_animation_with_redis_stopped(make_app, tmp_path: Path,
                                                           redis_server):
    """The CLI converts media through the converter in its own process: the job store's
    Redis being down changes nothing."""
    app = make_app(ANIMEGAN_STORAGE_URI=redis_server.uri, ANIMEGAN_JOB_QUEUE="rq")
    redis_server.stop()
    source = tmp_path / "clip.gif"
    source.write_bytes(gif_from_photos(4))
    result = app.test_cli_runner().invoke(args=["animegan", "convert", str(source), "-o",
                                                str(tmp_path / "out"), "--size", "64"])
    assert result.exit_code == 0, result.output
    written = list((tmp_path / "out").iterdir())
    assert len(written) == 1 and written[0].suffix == ".gif"
    with Image.open(written[0]) as out:
        assert out.n_frames == 4
