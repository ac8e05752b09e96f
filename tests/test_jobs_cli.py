"""``flask animegan convert`` with animations and videos: each converted in this process
as a job would be, with a progress bar of its own, beside the photos of the same batch."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
from conftest import build_app, open_image, photo_bytes
from media import apng, decoded_video, gif_from_photos, video_clip, webp_animation
from PIL import Image

SIZE = 32


@pytest.fixture(scope="module")
def cli_app(models_dir, openvino_cache):
    """An app of its own: the conversions leave job records in its store."""
    app = build_app(models_dir, openvino_cache, ANIMEGAN_MAX_FRAMES=40)
    app.logger.setLevel(logging.CRITICAL)
    return app


def invoke(app, *args: str):
    return app.test_cli_runner().invoke(args=["animegan", *args])


def frames_and_durations(data: bytes) -> tuple[int, list[int]]:
    image = Image.open(io.BytesIO(data))
    durations = []
    for index in range(image.n_frames):
        image.seek(index)
        durations.append(image.info.get("duration"))
    return image.n_frames, durations


def test_a_batch_of_animations_videos_and_photos(cli_app, tmp_path: Path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "cat.gif").write_bytes(gif_from_photos(12, durations=[60, 120] * 6))
    (folder / "wave.webp").write_bytes(webp_animation(6))
    (folder / "spin.png").write_bytes(apng(5))
    (folder / "beach.mp4").write_bytes(video_clip(0.8, fps=10, audio=True))
    (folder / "trip.mov").write_bytes(video_clip(0.5, fps=10, container="mov", audio=False))
    (folder / "photo.jpg").write_bytes(photo_bytes("coffee"))
    out = tmp_path / "out"
    result = invoke(cli_app, "convert", str(folder), "-o", str(out), "--size", str(SIZE))
    assert result.exit_code == 0, result.output
    style = "other_style"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{name}.{style}.{ext}" for name, ext in (("cat", "gif"), ("wave", "webp"),
                                                 ("spin", "png"), ("beach", "mp4"),
                                                 ("trip", "mp4"), ("photo", "jpeg")))
    assert frames_and_durations((out / f"cat.{style}.gif").read_bytes()) == (
        12, [60, 120] * 6)
    assert frames_and_durations((out / f"wave.{style}.webp").read_bytes())[0] == 6
    assert frames_and_durations((out / f"spin.{style}.png").read_bytes())[0] == 5
    beach = decoded_video((out / f"beach.{style}.mp4").read_bytes())
    assert beach["frames"] == 8 and beach["audio"] and max(beach["size"]) <= SIZE
    assert decoded_video((out / f"trip.{style}.mp4").read_bytes())["frames"] == 5
    assert max(open_image((out / f"photo.{style}.jpeg").read_bytes()).size) == SIZE
    # one progress bar per animation or video, labelled with the file and its frames
    for label in ("cat.gif (12 frames)", "wave.webp (6 frames)", "spin.png (5 frames)",
                  "beach.mp4 (8 frames)", "trip.mov (5 frames)"):
        assert label in result.stderr, result.stderr
    assert "converted 6, skipped 0 already converted, failed 0" in result.output


def test_converted_animations_are_skipped_unless_overwrite(cli_app, tmp_path: Path):
    source = tmp_path / "loop.gif"
    source.write_bytes(gif_from_photos(4))
    args = ("convert", str(source), "-o", str(tmp_path / "out"), "--size", str(SIZE))
    assert invoke(cli_app, *args).exit_code == 0
    again = invoke(cli_app, *args)
    assert "converted 0, skipped 1 already converted" in again.output
    assert "loop.gif (4 frames)" not in again.stderr  # skipped before converting
    overwritten = invoke(cli_app, *args, "--overwrite")
    assert "converted 1, skipped 0" in overwritten.output


def test_bad_and_oversized_files_are_reported_and_the_rest_converted(cli_app, tmp_path: Path):
    folder = tmp_path / "in"
    folder.mkdir()
    good = gif_from_photos(4)
    (folder / "good.gif").write_bytes(good)
    (folder / "long.gif").write_bytes(gif_from_photos(41))  # ANIMEGAN_MAX_FRAMES = 40
    (folder / "cut.mp4").write_bytes(video_clip(0.5, fps=10)[:600])
    (folder / "noise.webm").write_bytes(b"\x1a\x45\xdf\xa3" + bytes(range(256)) * 8)
    out = tmp_path / "out"
    result = invoke(cli_app, "convert", str(folder), "-o", str(out), "--size", str(SIZE))
    assert result.exit_code == 1
    assert [p.name for p in out.iterdir()] == ["good.other_style.gif"]
    lines = {line.split(": ", 1)[0].rsplit("/", 1)[-1]: line
             for line in result.stderr.splitlines() if ": " in line}
    assert "41 frames" in lines["long.gif"] and "40" in lines["long.gif"], lines
    for name in ("cut.mp4", "noise.webm"):
        assert name in lines and "unexpectedly" not in lines[name], lines
    assert "converted 1, skipped 0 already converted, failed 3" in result.output
