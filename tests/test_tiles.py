"""Large photos in tiles (runtime/tiles.py): the tiles' geometry, the whole picture's
upsampling and statistics, and sizes above ANIMEGAN_MAX_SIDE through the API."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import convert, encode_image, open_image, photo

from flask_animegan import Generator
from flask_animegan.runtime import tiles
from flask_animegan.runtime.backends.base import to_pixels
from flask_animegan.runtime.backends.torch import to_batch


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255 ** 2 / mse)


def seeded_network(seed: int = 0) -> Generator:
    torch.manual_seed(seed)
    return Generator().eval()


def whole(network: Generator, pixels: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        out = network(to_batch(np.array(pixels), torch.float32))[0].permute(1, 2, 0).numpy()
    result = to_pixels(out)
    assert result is not None
    return result


@pytest.mark.parametrize("height,width", [(16, 16), (17, 23), (100, 64), (203, 317),
                                          (400, 401)])
@pytest.mark.parametrize("tile,margin", [(32, 16), (64, 48), (512, 48)])
def test_the_cores_cover_every_pixel_once_from_multiples_of_4(height, width, tile, margin):
    seen = np.zeros((height, width), np.int32)
    for part in tiles.tiles(height, width, tile, margin):
        top, bottom, left, right = part.core
        seen[top:bottom, left:right] += 1
        assert part.top % 4 == 0 and part.left % 4 == 0
        assert part.top == max(0, top - margin) and part.bottom == min(height, bottom + margin)
        assert part.left == max(0, left - margin) and part.right == min(width, right + margin)
    assert (seen == 1).all()


def test_tiles_refuse_a_size_off_the_pixel_grid():
    with pytest.raises(ValueError, match="multiples of 4"):
        tiles.tiles(100, 100, 30, 16)


@pytest.mark.parametrize("source,target", [((5, 7), (9, 14)), ((32, 17), (64, 35)),
                                           ((50, 50), (100, 101))])
def test_the_upsampling_of_the_whole_picture_is_torchs(source, target):
    x = torch.randn(1, 3, *source, generator=torch.Generator().manual_seed(1))
    ours = tiles._upsample(x, source, target, (0, 0), (0, 0), target)
    theirs = F.interpolate(x, size=target, mode="bilinear", align_corners=True)
    assert torch.allclose(ours, theirs, atol=1e-4)


def test_a_tile_samples_where_the_whole_picture_does():
    x = torch.randn(1, 2, 40, 60, generator=torch.Generator().manual_seed(2))
    full = F.interpolate(x, size=(80, 120), mode="bilinear", align_corners=True)
    # the part of the output from row 24, column 36, out of input rows from 8, columns 12
    part = tiles._upsample(x[:, :, 8:, 12:], (40, 60), (80, 120), (8, 12), (24, 36), (40, 50))
    assert torch.allclose(part, full[:, :, 24:64, 36:86], atol=1e-4)


@pytest.mark.parametrize("seed,size", [(0, (203, 317)), (1, (260, 140))])
def test_with_the_whole_pictures_statistics_tiles_equal_the_untiled_output(seed, size):
    network = seeded_network(seed)
    height, width = size
    pixels = np.asarray(photo("astronaut").resize((width, height)))
    # statistics from the picture itself (stats_side >= its side): only geometry can differ
    tiled = tiles.run_tiled(network, pixels, tile=128, margin=48, stats_side=512)
    assert tiled is not None and tiled.shape == (height, width, 3)
    assert np.abs(tiled.astype(int) - whole(network, pixels)).max() <= 1


def test_tiles_normalised_on_their_own_would_differ():
    # the control: each tile's own statistics (its own GroupNorm) change the picture
    network = seeded_network(0)
    pixels = np.asarray(photo("coffee").resize((256, 170)))
    reference = whole(network, pixels)
    own = np.zeros_like(reference)
    for part in tiles.tiles(170, 256, 128, 48):
        out = whole(network, pixels[part.top:part.bottom, part.left:part.right])
        top, bottom, left, right = part.core
        own[top:bottom, left:right] = out[top - part.top:bottom - part.top,
                                          left - part.left:right - part.left]
    ours = tiles.run_tiled(network, pixels, tile=128, margin=48)
    assert ours is not None
    assert psnr(ours, reference) > psnr(own, reference) + 10


def test_statistics_from_a_smaller_scale_keep_the_picture():
    network = seeded_network(0)
    pixels = np.asarray(photo("chelsea").resize((448, 300)))
    tiled = tiles.run_tiled(network, pixels, tile=128, margin=48, stats_side=160)
    assert tiled is not None
    assert psnr(tiled, whole(network, pixels)) >= 35


def test_a_network_whose_output_is_not_finite_gives_none():
    network = seeded_network(0)
    with torch.no_grad():
        network.out_layer[0].weight.fill_(float("nan"))
    assert tiles.run_tiled(network, np.zeros((40, 40, 3), np.uint8), tile=32) is None


# -- through the API ------------------------------------------------------------------
def count_tiled_runs(monkeypatch) -> list[tuple[int, ...]]:
    """The shapes of the pictures the engine runs in tiles, from now on."""
    calls: list[tuple[int, ...]] = []
    real = tiles.run_tiled

    def counted(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr("flask_animegan.runtime.engine.run_tiled", counted)
    return calls


def job_result(client, response, deadline: float = 120) -> bytes:
    """The result of the job ``response`` (a 202) made, once it is done."""
    url = response.headers["Location"]
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        job = client.get(url).get_json()
        if job["state"] not in ("queued", "running"):
            break
        time.sleep(0.05)
    assert job["state"] == "done", job
    return client.get(job["result_url"]).data


def small_tiles_app(make_app, monkeypatch, **config):
    """An app that tiles pictures above ANIMEGAN_MAX_SIDE even within STATS_SIDE (which
    still measures the statistics), so that tiles are tested at small sizes."""
    with monkeypatch.context() as patch:
        patch.setattr(tiles, "STATS_SIDE", 16)
        return make_app(**config)


def test_a_picture_the_statistics_pass_runs_whole_is_never_tiled(make_app, monkeypatch):
    """Above ANIMEGAN_MAX_SIDE but within STATS_SIDE (512), tiles would save no memory: the
    picture runs whole, as with a larger ANIMEGAN_MAX_SIDE."""
    calls = count_tiled_runs(monkeypatch)
    upload = encode_image(photo("astronaut").resize((400, 300)), "PNG")
    with make_app(ANIMEGAN_MAX_SIDE=96, ANIMEGAN_MAX_OUTPUT_SIDE=200).test_client() as client:
        small_max_side = convert(client, upload, "?size=200&format=png")
    with make_app(ANIMEGAN_MAX_SIDE=200).test_client() as client:
        whole = convert(client, upload, "?size=200&format=png")
    assert small_max_side.status_code == whole.status_code == 200
    assert calls == [] and small_max_side.data == whole.data


def test_sizes_above_max_side_run_in_tiles_up_to_max_output_side(make_app, monkeypatch):
    monkeypatch.setattr(tiles, "TILE", 64)  # several tiles at these small sizes
    calls = count_tiled_runs(monkeypatch)
    app = small_tiles_app(make_app, monkeypatch, ANIMEGAN_MAX_SIDE=96,
                          ANIMEGAN_MAX_OUTPUT_SIDE=200)
    upload = encode_image(photo("astronaut").resize((400, 300)), "PNG")
    with app.test_client() as client:
        response = convert(client, upload, "?size=200&format=png")
        # a photo that runs in tiles is a job (tests/test_big_photos.py)
        assert response.status_code == 202, response.get_json()
        assert open_image(job_result(client, response)).size == (200, 150)
        assert calls == [(150, 200, 3)]
        response = convert(client, upload, "?size=96&format=png")  # the default: whole
        assert response.status_code == 200 and len(calls) == 1
        response = convert(client, upload, "?size=201")
        assert response.status_code == 400
        assert "from 16 to 200" in response.get_json()["error"]
        tiled = np.asarray(open_image(job_result(
            client, convert(client, upload, "?size=200&format=png"))))
    # the same picture untiled (MAX_SIDE 200): the tiles keep it
    with make_app(ANIMEGAN_MAX_SIDE=200).test_client() as client:
        untiled = np.asarray(open_image(convert(client, upload, "?size=200&format=png").data))
    assert psnr(tiled, untiled) >= 35


def test_without_max_output_side_the_largest_size_is_max_side(make_app):
    app = make_app(ANIMEGAN_MAX_SIDE=96)
    with app.test_client() as client:
        response = convert(client, encode_image(photo()), "?size=97")
        assert response.status_code == 400 and "from 16 to 96" in response.get_json()["error"]


def test_the_service_converts_large_sizes_in_tiles(make_app, monkeypatch):
    monkeypatch.setattr(tiles, "TILE", 64)
    app = small_tiles_app(make_app, monkeypatch, ANIMEGAN_MAX_SIDE=64,
                          ANIMEGAN_MAX_OUTPUT_SIDE=160)
    service = app.extensions["animegan"]
    with app.app_context():
        out = service.convert(photo("coffee"), size=160, colors="keep")
    assert out.size == (160, 107)
    assert np.isfinite(np.asarray(out, np.float64)).all()


def test_the_cli_converts_photos_up_to_max_output_side(make_app, monkeypatch, tmp_path):
    monkeypatch.setattr(tiles, "TILE", 64)
    app = small_tiles_app(make_app, monkeypatch, ANIMEGAN_MAX_SIDE=64,
                          ANIMEGAN_MAX_OUTPUT_SIDE=128)
    source = tmp_path / "cat.png"
    photo().resize((300, 200)).save(source)
    out = tmp_path / "out"
    runner = app.test_cli_runner()
    result = runner.invoke(args=["animegan", "convert", str(source), "-o", str(out),
                                 "--size", "128"])
    assert result.exit_code == 0, result.output
    (written,) = out.iterdir()
    assert open_image(written.read_bytes()).size == (128, 85)
    result = runner.invoke(args=["animegan", "convert", str(source), "-o", str(out),
                                 "--size", "129"])
    assert result.exit_code != 0 and "from 16 to 128" in result.output
