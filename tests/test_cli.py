"""``flask animegan styles`` and ``flask animegan convert``, and the commands' help.

Run through ``app.test_cli_runner()`` against the seeded test styles and real
photographs from scikit-image; outputs are kept at 64 px so the suite stays fast.
"""

from __future__ import annotations

import dataclasses
import os
import pty
import random
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import Result
from conftest import REPO, encode_image, need, open_image, photo, photo_bytes
from flask import Flask
from media import gif_from_photos
from upload_variants import bit_flips

from flask_animegan import load_generator
from flask_animegan.runtime.catalog import OFFICIAL_STYLES, SHIPPED_STYLES

SIZE = 64
FOLDER_PHOTOS = ("chelsea", "coffee", "astronaut")
SINGLE_PHOTO = "rocket"


def invoke(app: Flask, *args: str) -> Result:
    return app.test_cli_runner().invoke(args=["animegan", *args])


def parse_styles(output: str) -> dict[str, list[str]]:
    """``styles`` output as name -> [state line, indented detail lines...]."""
    blocks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            name, _, rest = line.partition(" ")
            current = blocks.setdefault(name, [])
            current.append(rest.strip())
        else:
            current.append(line.strip())
    return blocks


# -- styles -------------------------------------------------------------------------

def test_styles_lists_installed_and_pullable_styles(make_app: Callable[..., Flask]) -> None:
    result = invoke(make_app(ANIMEGAN_SHIPPED_STYLES=True), "styles")
    assert result.exit_code == 0, result.output
    blocks = parse_styles(result.output)
    assert set(blocks) == {"test_style", "other_style", "toon_demo", *OFFICIAL_STYLES}
    # no ANIMEGAN_DEFAULT_STYLE and no paprika: the models folder's first name is the
    # default, before the shipped toon_demo
    assert blocks["other_style"][0] == "installed, default"
    assert blocks["test_style"][0] == "installed"
    toon = SHIPPED_STYLES["toon_demo"]
    assert blocks["toon_demo"] == ["installed", (f"licence: MIT ({toon.licence_note}) "
                                                 "<https://spdx.org/licenses/MIT.html>")]
    for name in ("test_style", "other_style"):
        assert blocks[name][1] == "licence: own (a file you installed)"
    for name, known in OFFICIAL_STYLES.items():
        assert blocks[name][0].startswith(f"pull with: flask animegan pull {name}")
        assert blocks[name][1].startswith(f"licence: {known.licence} ({known.licence_note}) <")
        assert ("[faces: centre square]" in blocks[name][0]) is known.face
    assert blocks["paprika"][1] == (
        "licence: LicenseRef-AnimeGANv2-NonCommercial (non-commercial use only: converted "
        "from the original AnimeGANv2 weights by TachibanaYoshino) "
        "<https://github.com/TachibanaYoshino/AnimeGANv2#license>")
    assert blocks["celeba_distill"][1] == ("licence: MIT (bryandlee/animegan2-pytorch) "
                                           "<https://spdx.org/licenses/MIT.html>")


def test_styles_honours_the_configured_default(make_app: Callable[..., Flask]) -> None:
    blocks = parse_styles(invoke(make_app(ANIMEGAN_DEFAULT_STYLE="test_style"), "styles").output)
    assert blocks["test_style"][0] == "installed, default"
    assert blocks["other_style"][0] == "installed"


@pytest.fixture
def broken_folder(tmp_path: Path, models_dir: Path) -> Path:
    """A good style plus two files that are not weights at all."""
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(models_dir / "test_style.pt", folder / "test_style.pt")
    (folder / "aa_broken.pt").write_bytes(b"this is not a weights file")
    (folder / "zz_broken.pt").write_bytes(b"neither is this one")
    return folder


def test_styles_shows_a_broken_default_as_broken(make_app: Callable[..., Flask],
                                                 broken_folder: Path) -> None:
    app = make_app(ANIMEGAN_MODELS_DIR=str(broken_folder), ANIMEGAN_DEFAULT_STYLE="aa_broken")
    result = invoke(app, "styles")
    assert result.exit_code == 0, result.output
    blocks = parse_styles(result.output)
    assert blocks["aa_broken"][0] == "BROKEN"
    error = next(line for line in blocks["aa_broken"] if line.startswith("error:"))
    assert str(broken_folder / "aa_broken.pt") in error
    assert "flask animegan pull" in error  # says what to do
    assert blocks["test_style"][0] == "installed"


def test_styles_shows_a_broken_non_default_style_as_broken(make_app: Callable[..., Flask],
                                                           broken_folder: Path) -> None:
    app = make_app(ANIMEGAN_MODELS_DIR=str(broken_folder), ANIMEGAN_DEFAULT_STYLE="test_style")
    blocks = parse_styles(invoke(app, "styles").output)
    assert blocks["test_style"][0] == "installed, default"
    assert blocks["zz_broken"][0] == "BROKEN"


# -- convert ------------------------------------------------------------------------

@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A folder of three JPEG photos (plus things convert must ignore) and one PNG photo."""
    folder = tmp_path / "holiday"
    folder.mkdir()
    for name in FOLDER_PHOTOS:
        (folder / f"{name}.jpg").write_bytes(photo_bytes(name))
    (folder / "notes.txt").write_text("not a photo, and not named like one")
    nested = folder / "nested"
    nested.mkdir()
    (nested / "camera.jpg").write_bytes(photo_bytes("camera"))  # not recursive
    single = tmp_path / f"{SINGLE_PHOTO}.png"
    single.write_bytes(photo_bytes(SINGLE_PHOTO, "PNG"))
    return folder, single


def expected_outputs(out: Path, style: str = "other_style", fmt: str = "jpeg") -> list[Path]:
    return sorted(out / f"{name}.{style}.{fmt}" for name in (*FOLDER_PHOTOS, SINGLE_PHOTO))


def assert_converted(path: Path, source: str, fmt: str) -> None:
    image = open_image(path.read_bytes())
    assert image.format == fmt
    assert image.mode == "RGB"
    width, height = photo(source).size
    assert max(image.size) == SIZE
    assert image.size[0] / image.size[1] == pytest.approx(width / height, rel=0.05)


def test_convert_folder_and_file(app: Flask, inputs: tuple[Path, Path], tmp_path: Path) -> None:
    folder, single = inputs
    out = tmp_path / "anime" / "deeper"  # created on demand
    result = invoke(app, "convert", str(folder), str(single), "-o", str(out),
                    "--size", str(SIZE))
    assert result.exit_code == 0, result.output
    assert sorted(out.iterdir()) == expected_outputs(out)
    for name in (*FOLDER_PHOTOS, SINGLE_PHOTO):
        assert_converted(out / f"{name}.other_style.jpeg", name, "JPEG")
    assert f"converted 4, skipped 0 already converted, failed 0; output in {out}" in result.output


@pytest.mark.parametrize("fmt,colors,portrait,written", [
    ("PNG", "KEEP", "Off", "png"), ("Jpg", "Luma", "AUTO", "jpeg"),
    ("webp", "off", "auto", "webp")])
def test_convert_takes_the_apis_words_in_any_case(app: Flask, tmp_path: Path, fmt: str,
                                                 colors: str, portrait: str,
                                                 written: str) -> None:
    source = tmp_path / "chelsea.jpg"
    source.write_bytes(photo_bytes("chelsea"))
    out = tmp_path / "out"
    result = invoke(app, "convert", str(source), "-o", str(out), "--size", str(SIZE),
                    "--format", fmt, "--colors", colors, "--portrait", portrait)
    assert result.exit_code == 0, result.output
    assert_converted(out / f"chelsea.other_style.{written}", "chelsea",
                     {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}[written])
    refused = invoke(app, "convert", str(source), "-o", str(out), "--colors", "kelvin")
    assert refused.exit_code == 2 and "'kelvin' is not one of 'off', 'luma', 'keep'" in \
        refused.output


def test_convert_defaults_to_max_side(make_app: Callable[..., Flask], tmp_path: Path) -> None:
    source = tmp_path / "chelsea.jpg"
    source.write_bytes(photo_bytes("chelsea"))
    app = make_app(ANIMEGAN_MAX_SIDE=SIZE)
    result = invoke(app, "convert", str(source), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert_converted(tmp_path / "out" / "chelsea.other_style.jpeg", "chelsea", "JPEG")


def test_convert_skips_done_files_unless_overwrite(app: Flask, inputs: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    folder, single = inputs
    out = tmp_path / "anime"
    args = ("convert", str(folder), str(single), "-o", str(out), "--size", str(SIZE))
    assert invoke(app, *args).exit_code == 0
    marked = out / "coffee.other_style.jpeg"
    marked.write_bytes(b"an earlier result")

    again = invoke(app, *args)
    assert again.exit_code == 0, again.output
    assert "converted 0, skipped 4 already converted, failed 0" in again.output
    assert marked.read_bytes() == b"an earlier result"

    overwritten = invoke(app, *args, "--overwrite")
    assert overwritten.exit_code == 0, overwritten.output
    assert "converted 4, skipped 0 already converted, failed 0" in overwritten.output
    assert_converted(marked, "coffee", "JPEG")


def test_convert_reports_a_bad_file_and_converts_the_rest(app: Flask,
                                                          inputs: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    folder, single = inputs
    notes = folder / "notes.txt"
    out = tmp_path / "anime"
    result = invoke(app, "convert", str(notes), str(folder), str(single), "-o", str(out),
                    "--size", str(SIZE))
    assert result.exit_code == 1, result.output
    assert f"{notes}: the file is not an image" in result.output
    assert "converted 4, skipped 0 already converted, failed 1" in result.output
    assert sorted(out.iterdir()) == expected_outputs(out)
    for name in (*FOLDER_PHOTOS, SINGLE_PHOTO):
        assert_converted(out / f"{name}.other_style.jpeg", name, "JPEG")


@pytest.mark.parametrize(("fmt", "pil_format"), [("png", "PNG"), ("webp", "WEBP")])
def test_convert_format(app: Flask, inputs: tuple[Path, Path], tmp_path: Path, fmt: str,
                        pil_format: str) -> None:
    _, single = inputs
    out = tmp_path / "anime"
    result = invoke(app, "convert", str(single), "-o", str(out), "--size", str(SIZE),
                    "--format", fmt)
    assert result.exit_code == 0, result.output
    assert list(out.iterdir()) == [out / f"{SINGLE_PHOTO}.other_style.{fmt}"]
    assert_converted(out / f"{SINGLE_PHOTO}.other_style.{fmt}", SINGLE_PHOTO, pil_format)


#: A converted file's line off a terminal: ``INPUT [(N frames)] -> OUTPUT  SECONDS s``.
CONVERTED_LINE = re.compile(
    r"(?P<source>.+?)(?: \((?P<frames>\d+) frames\))? -> (?P<output>.+)  (?P<seconds>\d+\.\d\d) s")


def converted_lines(stderr: str) -> dict[str, re.Match[str]]:
    """The line of each converted file, by the input's name (one line each)."""
    found: dict[str, re.Match[str]] = {}
    for line in stderr.splitlines():
        if match := CONVERTED_LINE.fullmatch(line):
            name = Path(match["source"]).name
            assert name not in found, f"two lines for {name}:\n{stderr}"
            found[name] = match
    return found


def failure_lines(stderr: str, folder: Path) -> list[str]:
    """The lines about files of ``folder`` other than converted files' lines."""
    return [line for line in stderr.splitlines()
            if str(folder) in line and not CONVERTED_LINE.fullmatch(line)]


def test_convert_off_a_terminal_prints_a_line_per_file_with_its_time(
        make_app: Callable[..., Flask], inputs: tuple[Path, Path], tmp_path: Path) -> None:
    """In a log or a pipe (the runner's output is no terminal), where a progress bar
    shows only its label, each photo and animation gets a line: input, output, time."""
    folder, single = inputs
    (folder / "cat.gif").write_bytes(gif_from_photos(6, size=(64, 48)))
    app, out = make_app(), tmp_path / "anime"
    args = ("convert", str(folder), str(single), "-o", str(out), "--size", str(SIZE))
    started = time.perf_counter()
    result = invoke(app, *args)
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    lines = converted_lines(result.stderr)
    assert sorted(lines) == sorted([*(f"{name}.jpg" for name in FOLDER_PHOTOS), "cat.gif",
                                    single.name]), result.stderr
    for name, line in lines.items():
        assert Path(line["source"]) == (single if name == single.name else folder / name)
        assert Path(line["output"]).parent == out and Path(line["output"]).is_file()
        assert line["frames"] == ("6" if name == "cat.gif" else None), line[0]
    assert Path(lines["cat.gif"]["output"]).name == "cat.other_style.gif"
    # each file's own time, not the time since the start
    assert sum(float(line["seconds"]) for line in lines.values()) <= elapsed + 0.005 * len(lines)
    assert "converting" not in result.stderr  # the bar's label, alone on its line before
    assert "converted 5, skipped 0 already converted, failed 0" in result.stdout

    again = invoke(app, *args)
    assert again.exit_code == 0 and converted_lines(again.stderr) == {}, again.output
    skipped = [line for line in again.stderr.splitlines() if ": skipped, " in line]
    assert sorted(line.split(": skipped, ")[0] for line in skipped) == sorted(
        line["source"] for line in lines.values())
    assert all(line.endswith("exists (--overwrite converts it again)") for line in skipped)


@pytest.mark.slow  # a command of its own: torch's import and the app's start
def test_convert_on_a_terminal_shows_its_progress_bars(models_dir: Path,
                                                       tmp_path: Path) -> None:
    """On a terminal (a pseudo-terminal here) the batch and each animation have their
    progress bar, and no line per file."""
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    (folder / "chelsea.jpg").write_bytes(photo_bytes("chelsea"))
    (folder / "cat.gif").write_bytes(gif_from_photos(6, size=(64, 48)))
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANIMEGAN_")}
    env.update(CLI_ENV, PYTHONPATH=str(REPO), HOME=str(tmp_path), COLUMNS="100",
               ANIMEGAN_MODELS_DIR=str(models_dir),
               ANIMEGAN_MODEL_CACHE_DIR=str(tmp_path / "model-cache"))
    terminal, its_side = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", "example_app", "animegan", "convert",
         str(folder), "-o", str(out), "--size", str(SIZE)],
        stdin=subprocess.DEVNULL, stdout=its_side, stderr=its_side, env=env, cwd=REPO)
    os.close(its_side)
    screen, deadline = b"", time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if select.select([terminal], [], [], 1)[0]:
                try:
                    chunk = os.read(terminal, 65536)
                except OSError:  # EIO: the command has ended and closed its side
                    break
                if not chunk:
                    break
                screen += chunk
    finally:
        os.close(terminal)
    text = screen.decode(errors="replace")
    try:
        code = process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"still running after 300 s:\n{text}") from None
    assert code == 0, text
    assert "converting  [" in text and "cat.gif (6 frames)  [" in text, text
    assert " -> " not in text and ": skipped, " not in text, text
    assert "converted 2, skipped 0 already converted, failed 0" in text, text
    assert sorted(p.name for p in out.iterdir()) == ["cat.other_style.gif",
                                                     "chelsea.other_style.jpeg"]


def test_convert_with_another_style(app: Flask, tmp_path: Path) -> None:
    source = tmp_path / "chelsea.jpg"
    source.write_bytes(photo_bytes("chelsea"))
    out = tmp_path / "anime"
    for style in ("test_style", "other_style"):
        result = invoke(app, "convert", str(source), "-o", str(out), "--size", str(SIZE),
                        "--format", "png", "--style", style)
        assert result.exit_code == 0, result.output
    first = open_image((out / "chelsea.test_style.png").read_bytes())
    second = open_image((out / "chelsea.other_style.png").read_bytes())
    assert first.size == second.size
    assert first.tobytes() != second.tobytes()  # the style's weights were used


@pytest.mark.parametrize(("style", "message"), [
    ("nosuch", "style 'nosuch' is not installed"),
    ("paprika", "run `flask animegan pull paprika`"),
    ("../test_style", "not a valid style name"),
])
def test_convert_unknown_style(app: Flask, inputs: tuple[Path, Path], tmp_path: Path,
                               style: str, message: str) -> None:
    _, single = inputs
    out = tmp_path / "anime"
    result = invoke(app, "convert", str(single), "-o", str(out), "--style", style)
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Error: " in result.output
    assert message in result.output
    assert not out.exists()


def test_convert_rejects_a_size_above_max_side(app: Flask, inputs: tuple[Path, Path],
                                               tmp_path: Path) -> None:
    _, single = inputs
    out = tmp_path / "anime"
    result = invoke(app, "convert", str(single), "-o", str(out), "--size", "4096")
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit), result.exception
    assert "size must be a whole number of pixels from 16 to 128" in result.output
    assert not out.exists()


# -- convert: hostile entries ---------------------------------------------------------
#
# Each kind of entry that is not a readable regular file within the upload limit is
# refused unread, on one line, and the batch goes on. Builders take the folder to put
# the entry in and return its path and a fragment of the refusal line.

def _dangling(folder: Path) -> tuple[Path, str]:
    link = folder / "dangling.jpg"
    link.symlink_to(folder.parent / "gone.jpg")
    return link, "gone.jpg', which does not exist"


def _folder(folder: Path) -> tuple[Path, str]:
    (folder / "x.jpg").mkdir()
    return folder / "x.jpg", "not a regular file (a folder)"


def _fifo(folder: Path) -> tuple[Path, str]:
    os.mkfifo(folder / "pipe.jpg")
    return folder / "pipe.jpg", "not a regular file (a FIFO)"


def _socket(folder: Path) -> tuple[Path, str]:
    with socket.socket(socket.AF_UNIX) as server:  # the file stays after the close
        server.bind(str(folder / "sock.png"))
    return folder / "sock.png", "not a regular file (a socket)"


def _device(folder: Path) -> tuple[Path, str]:
    (folder / "zero.jpg").symlink_to("/dev/zero")
    return folder / "zero.jpg", "not a regular file (a character device)"


def _loop(folder: Path) -> tuple[Path, str]:
    (folder / "loop.jpg").symlink_to(folder / "loop2.jpg")
    (folder / "loop2.jpg").symlink_to(folder / "loop.jpg")  # refused too, in a folder
    return folder / "loop.jpg", "cannot be opened: Too many levels of symbolic links"


def _huge(folder: Path) -> tuple[Path, str]:
    with open(folder / "huge.jpg", "wb") as file:
        file.truncate(3 * 2**30)  # sparse: no disk used
    return folder / "huge.jpg", f"3,221,225,472 bytes, over the {DEFAULT_UPLOAD_LIMIT:,}-byte"


def _over_limit(folder: Path) -> tuple[Path, str]:
    with open(folder / "big.png", "wb") as file:
        file.truncate(DEFAULT_UPLOAD_LIMIT + 1)
    return folder / "big.png", "ANIMEGAN_MAX_UPLOAD_BYTES); shrink it or raise the limit"


def _missing(folder: Path) -> tuple[Path, str]:
    return folder / "typo.jpg", "no such file"


DEFAULT_UPLOAD_LIMIT = 16 * 2**20
BAD_ENTRIES: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "dangling symlink": _dangling, "folder named x.jpg": _folder, "FIFO": _fifo,
    "socket": _socket, "symlink to /dev/zero": _device, "symlink loop": _loop,
    "3 GiB sparse file": _huge, "one byte over the limit": _over_limit,
}
#: A missing path can only be an argument: a folder lists what exists.
ARGUMENT_ONLY = {"no such file": _missing}
#: The kinds that once hung the command or were read whole: tested in a process of
#: their own (run_cli), with a timeout and its peak memory.
UNBOUNDED = {"FIFO", "symlink to /dev/zero", "3 GiB sparse file"}


def refusals(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ": refused: " in line]


#: Each kind in a folder and given as an argument, except a missing path in a folder (a
#: folder lists what exists) and a folder given as an argument (its entries are inputs).
PLACEMENTS = [(kind, "in a folder") for kind in BAD_ENTRIES] + [
    (kind, "as an argument") for kind in (*BAD_ENTRIES, *ARGUMENT_ONLY)
    if kind != "folder named x.jpg"]


def _bad_entries(folder: Path, kinds: list[str], placement: str) -> dict[Path, str]:
    """Each kind of bad entry made in ``folder``: the paths refused -> the reason given."""
    made: dict[Path, str] = {}
    for kind in kinds:
        bad, reason = {**BAD_ENTRIES, **ARGUMENT_ONLY}[kind](folder)
        made[bad] = reason
        if kind == "symlink loop" and placement == "in a folder":
            made[folder / "loop2.jpg"] = reason
    return made


def _refused_on_one_line_each_and_went_on(result: Any, refused: dict[Path, str],
                                          out: Path) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = refusals(result.stderr)
    assert sorted(line.split(": refused: ")[0] for line in lines) == sorted(map(str, refused))
    for bad, reason in refused.items():
        assert reason in next(line for line in lines if line.startswith(f"{bad}: ")), lines
    assert (f"converted 1, skipped 0 already converted, failed {len(refused)} "
            f"({len(refused)} of them refused unread); output in {out}") in result.stdout
    assert sorted(out.iterdir()) == [out / "chelsea.other_style.jpeg"]
    assert_converted(out / "chelsea.other_style.jpeg", "chelsea", "JPEG")


@pytest.mark.parametrize(("kind", "placement"),
                         [(kind, place) for kind, place in PLACEMENTS if kind not in UNBOUNDED])
def test_convert_refuses_a_bad_entry_on_one_line_and_goes_on(app: Flask, tmp_path: Path,
                                                             kind: str,
                                                             placement: str) -> None:
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    (folder / "chelsea.jpg").write_bytes(photo_bytes("chelsea"))
    refused = _bad_entries(folder, [kind], placement)
    args = [str(folder)] if placement == "in a folder" else [str(folder / "chelsea.jpg"),
                                                             *map(str, refused)]
    result = invoke(app, "convert", *args, "-o", str(out), "--size", str(SIZE))
    _refused_on_one_line_each_and_went_on(result, refused, out)


@pytest.mark.parametrize("placement", ["in a folder", "as an argument"])
def test_convert_refuses_the_entries_that_once_hung_or_were_read_whole(
        models_dir: Path, tmp_path: Path, placement: str) -> None:
    """The FIFO, the symlink to /dev/zero and the 3 GiB sparse file together, in a
    process of their own (a regression would hang or fill memory), with a timeout and
    its peak memory: each refused unread on its own line, the photo beside them
    converted."""
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    (folder / "chelsea.jpg").write_bytes(photo_bytes("chelsea"))
    refused = _bad_entries(folder, sorted(UNBOUNDED), placement)
    args = [str(folder)] if placement == "in a folder" else [str(folder / "chelsea.jpg"),
                                                             *map(str, refused)]
    run = run_cli(models_dir, tmp_path, "convert", *args, "-o", str(out), "--size", str(SIZE),
                  timeout=120)
    assert run.peak_rss < 2**31, "an entry was read whole"
    result = SimpleNamespace(exit_code=run.code, output=run.stdout + run.stderr,
                             stdout=run.stdout, stderr=run.stderr)
    _refused_on_one_line_each_and_went_on(result, refused, out)


def test_convert_follows_an_input_symlink_to_a_photo(app: Flask, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "rocket.png").write_bytes(photo_bytes("rocket", "PNG"))
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    (folder / "alias.jpg").symlink_to(tmp_path / "elsewhere" / "rocket.png")
    result = invoke(app, "convert", str(folder), "-o", str(out), "--size", str(SIZE))
    assert result.exit_code == 0, result.output
    assert_converted(out / "alias.other_style.jpeg", "rocket", "JPEG")


def small_jpeg() -> bytes:
    return encode_image(photo("coffee").resize((48, 32)), "JPEG", quality=80)


def test_convert_holds_the_upload_limit_from_the_settings(make_app: Callable[..., Flask],
                                                          tmp_path: Path) -> None:
    """ANIMEGAN_MAX_UPLOAD_BYTES is the limit: a file of exactly that size converts, one
    byte more is refused, and a file that says it is empty (fstat) but reads longer,
    like /proc/self/maps, is cut at the limit and refused, never read whole."""
    data = small_jpeg()
    maps = Path("/proc/self/maps")
    assert len(maps.read_bytes()) > 4 * len(data)  # torch maps many libraries
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    (folder / "exact.jpg").write_bytes(data)
    (folder / "over.jpg").write_bytes(data + b"\0")  # a trailing byte JPEG decoders ignore
    (folder / "growing.jpg").symlink_to(maps)
    app = make_app(ANIMEGAN_MAX_UPLOAD_BYTES=len(data))
    result = invoke(app, "convert", str(folder), "-o", str(out), "--size", "16")
    assert result.exit_code == 1, result.output
    assert sorted(refusals(result.stderr)) == [
        (f"{folder / 'growing.jpg'}: refused: grew past the {len(data):,}-byte upload limit "
        "(ANIMEGAN_MAX_UPLOAD_BYTES) while it was read; convert it once it is complete"),
        (f"{folder / 'over.jpg'}: refused: {len(data) + 1:,} bytes, over the {len(data):,}-byte "
        "upload limit (ANIMEGAN_MAX_UPLOAD_BYTES); shrink it or raise the limit"),
    ]
    assert [p.name for p in out.iterdir()] == ["exact.other_style.jpeg"]


# The real `flask animegan convert` in a process of its own, for what must not hang
# the test run, measure its memory, or run as another user.

CLI_ENV = {
    "ANIMEGAN_SHIPPED_STYLES": "0", "ANIMEGAN_BACKEND": "torch", "ANIMEGAN_PRECISION": "fp32",
    "ANIMEGAN_WARMUP_SIZE": "32", "ANIMEGAN_SAMPLE_SIZE": "0", "ANIMEGAN_MAX_SIDE": "128",
    "ANIMEGAN_RATE_LIMIT": "",
}


@dataclasses.dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes, the command's own process


def run_cli(models: Path, work: Path, *args: str, prefix: Sequence[str] = (),
            timeout: float = 300) -> Run:
    """``flask --app example_app animegan ARGS`` with the test styles (after the command
    ``prefix``), killed (and the test failed) after ``timeout`` seconds; its output and
    HOME in ``work``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANIMEGAN_")}
    peak = work / "own-peak"
    env.update(CLI_ENV, PYTHONPATH=str(REPO), HOME=str(work), ANIMEGAN_MODELS_DIR=str(models),
               ANIMEGAN_MODEL_CACHE_DIR=str(work / "model-cache"), OWN_PEAK_FILE=str(peak))
    with open(work / "stdout", "w+") as stdout, open(work / "stderr", "w+") as stderr:
        # its own peak memory (own_peak.py: not ru_maxrss, which carries pytest's)
        process = subprocess.Popen([*prefix, sys.executable, str(REPO / "tests" / "own_peak.py"),
                                    "flask", "--app", "example_app", "animegan", *args],
                                   stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                   env=env, cwd=REPO)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        stdout.seek(0)
        stderr.seek(0)
        run = Run(process.returncode, stdout.read(), stderr.read(),
                  int(peak.read_text()) if peak.exists() else 0)
    assert process.returncode != -signal.SIGKILL, f"hung for {timeout} s:\n{run.stderr}"
    assert run.peak_rss > 0, f"the command did not report its peak memory:\n{run.stderr}"
    return run


def tree(root: Path, leave_out: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` (symlinks not followed) with its kind, size and mtime."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            if path == leave_out or leave_out in path.parents:
                continue
            info = path.lstat()
            found[str(path)] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns)
    return found


@pytest.mark.parametrize("overwrite", [False, True], ids=["keep", "overwrite"])
def test_convert_survives_a_hostile_folder(models_dir: Path, tmp_path: Path,
                                           overwrite: bool) -> None:
    """A hostile input folder: a photo, a symlink to a photo, and every bad kind in one
    folder, plus output symlinks pointing outside -o: the command finishes, converts the
    photos, prints one line per bad entry, writes nothing outside -o, exits 1, and never
    holds the 3 GiB file in memory."""
    world = tmp_path / "world"  # the command's own output and HOME stay out of it
    folder, out, outside = world / "in", world / "out", world / "outside"
    for made in (folder, out, outside):
        made.mkdir(parents=True)
    (folder / "chelsea.jpg").write_bytes(photo_bytes("chelsea"))
    (outside / "rocket.png").write_bytes(photo_bytes("rocket", "PNG"))
    (folder / "linked.jpg").symlink_to(outside / "rocket.png")
    bad = [builder(folder)[0] for builder in BAD_ENTRIES.values()] + [folder / "loop2.jpg"]
    (outside / "victim.jpeg").write_bytes(b"precious")
    (out / "linked.other_style.jpeg").symlink_to(outside / "victim.jpeg")
    (out / "pipe.other_style.jpeg").symlink_to(outside / "escape.jpeg")  # dangling
    (out / "x.other_style.jpeg").symlink_to(outside / "escape2.jpeg")  # dangling
    before = tree(world, leave_out=out)
    run = run_cli(models_dir, tmp_path, "convert", str(folder), "-o", str(out),
                  "--size", str(SIZE), *(["--overwrite"] if overwrite else []))
    assert run.code == 1, run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    lines = refusals(run.stderr)
    for path in bad:
        if not overwrite and path.name in ("pipe.jpg", "x.jpg"):
            continue  # its output name exists: skipped before it is opened
        assert sum(line.startswith(f"{path}: refused: ") for line in lines) == 1, run.stderr
    assert len(lines) == len(bad) - (0 if overwrite else 2), run.stderr
    assert tree(world, leave_out=out) == before  # nothing outside -o changed
    assert (outside / "victim.jpeg").read_bytes() == b"precious"
    assert_converted(out / "chelsea.other_style.jpeg", "chelsea", "JPEG")
    linked = out / "linked.other_style.jpeg"
    if overwrite:
        assert not linked.is_symlink()
        assert_converted(linked, "rocket", "JPEG")
        assert f"converted 2, skipped 0 already converted, failed {len(bad)}" in run.stdout
    else:
        assert linked.is_symlink()
        assert f"converted 1, skipped 3 already converted, failed {len(bad) - 2}" in run.stdout
    assert not [p for p in out.iterdir() if p.name.endswith(".part")]
    assert run.peak_rss < 2**31, "the 3 GiB file was read"


def test_convert_refuses_an_unreadable_file(models_dir: Path, tmp_path: Path) -> None:
    """A chmod 000 file is refused on one line. Root reads any file, so as root the
    command runs without the capabilities that bypass permissions (setpriv)."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        need(shutil.which("setpriv") is not None, "setpriv (util-linux) is not installed")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    (folder / "chelsea.jpg").write_bytes(photo_bytes("chelsea"))
    (folder / "secret.jpg").write_bytes(photo_bytes("coffee"))
    (folder / "secret.jpg").chmod(0)
    run = run_cli(models_dir, tmp_path, "convert", str(folder), "-o", str(out), "--size",
                  str(SIZE), prefix=prefix)
    assert run.code == 1, run.stderr
    assert refusals(run.stderr) == [
        (f"{folder / 'secret.jpg'}: refused: cannot be opened: permission denied (check "
        "its permissions, or run as a user who may read it)")], run.stderr
    assert [p.name for p in out.iterdir()] == ["chelsea.other_style.jpeg"]


# -- convert: contents, names, outputs -------------------------------------------------

def test_convert_reports_truncated_and_bit_flipped_photos_one_line_each(
        app: Flask, tmp_path: Path) -> None:
    """Seeded truncations and bit flips of a JPEG and a PNG go through the web's Decoder:
    each file is converted or named on one line, never a traceback."""
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    rng = random.Random(26)
    for fmt in ("JPEG", "PNG"):
        data = encode_image(photo("astronaut").resize((64, 64)), fmt)
        cuts = [0, 1, 7, 8, 100, len(data) // 2, len(data) - 1] + rng.sample(
            range(9, len(data) - 1), 5)
        for cut in cuts:
            (folder / f"{fmt}-cut-{cut}.{fmt.lower()}").write_bytes(data[:cut])
        for index, (_, flipped) in enumerate(bit_flips(data, seed=26, count=12)):
            (folder / f"{fmt}-flip-{index}.{fmt.lower()}").write_bytes(flipped)
    names = sorted(p.name for p in folder.iterdir())
    result = invoke(app, "convert", str(folder), "-o", str(out), "--size", "32")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    made = {p.name.split(".other_style")[0] for p in out.iterdir()}
    reported = {}
    done = converted_lines(result.stderr)
    for line in result.stderr.splitlines():
        if line.startswith(str(folder)) and not CONVERTED_LINE.fullmatch(line):
            path, _, message = line.partition(": ")
            assert message and Path(path).name not in reported | done, line
            reported[Path(path).name] = message
    assert {Path(n).stem for n in done} == made  # a converted file's line names it
    assert {Path(n).stem for n in reported} | made == {Path(n).stem for n in names}
    assert not {Path(n).stem for n in reported} & made
    assert any(name.startswith("JPEG-cut-0") for name in reported)  # an empty file fails
    assert result.exit_code == (1 if reported else 0)
    assert (f"converted {len(made)}, skipped 0 already converted, failed {len(reported)}"
            in result.stdout)


def test_convert_gives_colliding_stems_distinct_names(app: Flask, tmp_path: Path) -> None:
    """A stem shared in the batch keeps its source extension; the same file name from
    another folder gets -2. Each output is its own source's picture, and a second run
    finds every one done."""
    first, second, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    first.mkdir()
    second.mkdir()
    sources = {"p.jpg": "rocket", "p.png": "astronaut", "P.webp": "chelsea", "q.jpg": "coffee"}
    for name, source in sources.items():
        fmt = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[name.rsplit(".", 1)[1]]
        (first / name).write_bytes(photo_bytes(source, fmt))
    (second / "p.jpg").write_bytes(photo_bytes("hubble_deep_field"))
    args = ("convert", str(first), str(second), "-o", str(out), "--size", str(SIZE))
    result = invoke(app, *args)
    assert result.exit_code == 0, result.output
    expected = {"P.webp.other_style.jpeg": "chelsea", "p.jpg.other_style.jpeg": "rocket",
                "p.png.other_style.jpeg": "astronaut", "q.other_style.jpeg": "coffee",
                "p.jpg-2.other_style.jpeg": "hubble_deep_field"}
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)
    for name, source in expected.items():
        assert_converted(out / name, source, "JPEG")
    assert "converted 5, skipped 0 already converted, failed 0" in result.stdout
    again = invoke(app, *args)
    assert "converted 0, skipped 5 already converted, failed 0" in again.stdout


@pytest.mark.parametrize("outside_exists", [True, False], ids=["to a file", "dangling"])
def test_convert_never_writes_through_an_output_symlink(app: Flask, tmp_path: Path,
                                                        outside_exists: bool) -> None:
    """Without --overwrite an output symlink counts as done; with it, the link itself is
    replaced by the result. The file it points to is never written or created."""
    source, out, outside = tmp_path / "chelsea.jpg", tmp_path / "out", tmp_path / "outside"
    source.write_bytes(photo_bytes("chelsea"))
    out.mkdir()
    outside.mkdir()
    victim = outside / "victim.jpeg"
    if outside_exists:
        victim.write_bytes(b"precious")
    link = out / "chelsea.other_style.jpeg"
    link.symlink_to(victim)
    args = ("convert", str(source), "-o", str(out), "--size", str(SIZE))
    kept = invoke(app, *args)
    assert kept.exit_code == 0, kept.output
    assert "converted 0, skipped 1 already converted, failed 0" in kept.stdout
    assert link.is_symlink()
    replaced = invoke(app, *args, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert "converted 1, skipped 0 already converted, failed 0" in replaced.stdout
    assert not link.is_symlink()
    assert_converted(link, "chelsea", "JPEG")
    assert [p.name for p in out.iterdir()] == [link.name]  # no temporary file left
    assert ([p.read_bytes() for p in outside.iterdir()] ==
            ([b"precious"] if outside_exists else []))


def test_convert_reports_an_output_it_cannot_write_and_goes_on(app: Flask,
                                                               tmp_path: Path) -> None:
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    for name in ("chelsea", "coffee"):
        (folder / f"{name}.jpg").write_bytes(photo_bytes(name))
    (out / "chelsea.other_style.jpeg").mkdir(parents=True)  # in the way, even for replace
    result = invoke(app, "convert", str(folder), "-o", str(out), "--size", str(SIZE),
                    "--overwrite")
    assert result.exit_code == 1, result.output
    assert failure_lines(result.stderr, folder) == [
        (f"{folder / 'chelsea.jpg'}: cannot write {out / 'chelsea.other_style.jpeg'}: "
        "Is a directory; check the output folder")]
    assert list(converted_lines(result.stderr)) == ["coffee.jpg"]
    assert "converted 1, skipped 0 already converted, failed 1; output in" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["chelsea.other_style.jpeg",
                                                     "coffee.other_style.jpeg"]
    assert_converted(out / "coffee.other_style.jpeg", "coffee", "JPEG")


def test_convert_reports_an_unexpected_error_as_that_files_failure(
        make_app: Callable[..., Flask], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault injected into one file's conversion (the real pipeline runs the others)
    ends as that file's line, not a traceback that ends the batch."""
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    poison = photo_bytes("coffee")
    (folder / "coffee.jpg").write_bytes(poison)
    (folder / "rocket.jpg").write_bytes(photo_bytes("rocket"))
    app = make_app()
    converter = app.extensions["animegan"].converter
    real = converter.photo

    def convert(data: bytes, *args: object, **kwargs: object) -> object:
        if data == poison:
            raise KeyError("injected")
        return real(data, *args, **kwargs)

    monkeypatch.setattr(converter, "photo", convert)
    result = invoke(app, "convert", str(folder), "-o", str(out), "--size", str(SIZE))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert failure_lines(result.stderr, folder) == [
        (f"{folder / 'coffee.jpg'}: failed unexpectedly (KeyError: 'injected'); the other "
        "files went on: please report this with the file")]
    assert list(converted_lines(result.stderr)) == ["rocket.jpg"]
    assert [p.name for p in out.iterdir()] == ["rocket.other_style.jpeg"]


# -- export -------------------------------------------------------------------------

def test_export_writes_torchscript_that_converts_like_the_style(app: Flask,
                                                                  make_app: Callable[..., Flask],
                                                                  tmp_path: Path) -> None:
    target = tmp_path / "exported" / "test_style_ts.ts"
    result = invoke(app, "export", "test_style", "--torchscript", str(target))
    assert result.exit_code == 0, result.output
    assert "exported test_style" in result.output
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp file left

    # it runs without this package's code ...
    scripted = torch.jit.load(str(target))
    probe = torch.rand(1, 3, 64, 48) * 2 - 1
    with torch.inference_mode():
        expected = load_generator(app.extensions["animegan"].engine.style("test_style").path)(probe)
        assert (scripted(probe) - expected).abs().max().item() < 1e-4
    # ... and a models folder serves it as a style of its own, converting like the original
    folder = tmp_path / "served"
    folder.mkdir()
    shutil.copy(target, folder / "exported.ts")
    served = make_app(ANIMEGAN_MODELS_DIR=str(folder)).extensions["animegan"]
    original = app.extensions["animegan"]
    with app.app_context():
        a = np.asarray(original.convert(photo("coffee"), "test_style", SIZE), np.float32)
    b = np.asarray(served.convert(photo("coffee"), "exported", SIZE), np.float32)
    assert np.abs(a - b).max() <= 1


def test_export_of_an_unknown_style_fails_cleanly(app: Flask, tmp_path: Path) -> None:
    result = invoke(app, "export", "nope", "--torchscript", str(tmp_path / "x.ts"))
    assert result.exit_code != 0
    assert "style 'nope' is not installed" in result.stderr and result.stdout == ""
    assert not (tmp_path / "x.ts").exists()


def test_bench_outside_a_source_checkout_explains(app: Flask, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("flask_animegan.cli.commands._bench_root", lambda: None)
    result = invoke(app, "bench", "--quick")
    assert result.exit_code != 0
    assert "source repository's bench/ folder" in result.output


# -- help ---------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["styles", "pull", "convert", "export", "bench"])
def test_command_help_has_an_example(app: Flask, command: str) -> None:
    result = invoke(app, command, "--help")
    assert result.exit_code == 0, result.output
    assert f"Usage: host_app animegan {command}" in result.output
    example = result.output.split("Example", 1)[1]
    assert f"flask --app example_app animegan {command}" in example


def test_group_help_lists_the_commands(app: Flask) -> None:
    result = invoke(app, "--help")
    assert result.exit_code == 0, result.output
    commands = result.output.split("Commands:", 1)[1]
    for command in ("styles", "pull", "convert", "export", "bench"):
        assert f"  {command} " in commands


def test_group_help_has_an_example(app: Flask) -> None:
    result = invoke(app, "--help")
    assert result.exit_code == 0, result.output
    assert "Example" in result.output
    assert "flask --app example_app animegan" in result.output
