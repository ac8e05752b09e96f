"""``flask animegan styles`` and ``flask animegan convert``, and the commands' help.

Run through ``app.test_cli_runner()`` against the seeded test styles and real
photographs from scikit-image; outputs are kept at 64 px so the suite stays fast.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import Result
from conftest import open_image, photo, photo_bytes
from flask import Flask

from flask_animegan import load_generator
from flask_animegan.runtime.catalog import (
    NONCOMMERCIAL,
    OFFICIAL_STYLES,
    SHIPPED_STYLES,
)

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
    assert blocks["toon_demo"] == ["installed", f"licence: {SHIPPED_STYLES['toon_demo'].licence}"]
    for name in ("test_style", "other_style"):
        assert blocks[name][1] == "licence: unknown (a file you installed)"
    for name, known in OFFICIAL_STYLES.items():
        assert blocks[name][0].startswith(f"pull with: flask animegan pull {name}")
        assert blocks[name][1] == f"licence: {known.licence}"
        assert ("[faces: centre square]" in blocks[name][0]) is known.face
    assert blocks["paprika"][1] == f"licence: {NONCOMMERCIAL}"


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
    monkeypatch.setattr("flask_animegan.web.cli._bench_root", lambda: None)
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
