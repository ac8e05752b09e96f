"""Issue 11's classes that are not about file formats: the decode gate and its helper
processes, the default style, style names, weights, routing errors, headers, health."""

from __future__ import annotations

import io
import logging
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import open_image, photo, photo_bytes, save_random_generator
from PIL import Image

from flask_animegan.errors import ImageTooLarge, Overloaded
from flask_animegan.inputs.decoding import DecodeLimits, count_jpeg_scans
from flask_animegan.inputs.isolation import DecodeGate, Decoder
from flask_animegan.runtime.generator import Generator


def convert(client, data: bytes, query: str = "", **kwargs):
    return client.post(f"/animegan/convert{query}", data=data, content_type="image/jpeg",
                       **kwargs)


def progressive_jpeg(size=(2000, 1500), extra_scans: int = 0) -> bytes:
    """A progressive gray JPEG whose last scan is repeated ``extra_scans`` times."""
    buffer = io.BytesIO()
    Image.new("L", size, 128).save(buffer, "JPEG", progressive=True)
    data = buffer.getvalue()
    last, eoi = data.rfind(b"\xff\xda"), data.rfind(b"\xff\xd9")
    return data[:eoi] + data[last:eoi] * extra_scans + data[eoi:]


# -- JPEG scans ---------------------------------------------------------------------------
def test_scan_count_of_real_files():
    assert count_jpeg_scans(photo_bytes("astronaut")) == 1  # baseline
    progressive = count_jpeg_scans(photo_bytes("astronaut", progressive=True))
    assert 6 <= progressive <= 12  # libjpeg's standard progression
    assert count_jpeg_scans(progressive_jpeg(extra_scans=1000)) > 1000


def test_scans_inside_an_exif_thumbnail_are_not_counted():
    # an EXIF block full of SOS marker bytes is skipped by its length
    exif = Image.Exif()
    exif[0x9286] = b"ASCII\x00\x00\x00" + b"\xff\xda" * 5000  # UserComment
    data = photo_bytes("coffee", exif=exif.tobytes())
    assert count_jpeg_scans(data) == 1


def test_a_scan_bomb_is_refused_before_decoding(client):
    bomb = progressive_jpeg(size=(4000, 2500), extra_scans=1000)
    started = time.perf_counter()
    response = convert(client, bomb)
    assert response.status_code == 413 and "scans" in response.json["error"]
    assert time.perf_counter() - started < 2  # decoding it would take tens of seconds


# -- the decode's budgets -------------------------------------------------------------------
@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_decoders_agree_on_real_photos(isolation):
    decoder = Decoder(limits=DecodeLimits(), isolation=isolation, timeout=10, slots=1,
                      max_queue=1, queue_timeout=10)
    reference = Decoder(limits=DecodeLimits(), isolation="thread", timeout=10, slots=1,
                        max_queue=1, queue_timeout=10)
    for name, fmt in (("astronaut", "JPEG"), ("coffee", "PNG"), ("chelsea", "WEBP")):
        data = photo_bytes(name, fmt)
        a, b = decoder.decode(data, size=96), reference.decode(data, size=96)
        assert (a.source_size, a.format) == (b.source_size, b.format)
        assert a.image.mode == "RGB" and a.image.size == b.image.size
        assert a.image.tobytes() == b.image.tobytes()


def test_a_decode_past_its_time_budget_is_killed_and_the_helper_replaced():
    decoder = Decoder(limits=DecodeLimits(max_scans=10_000), isolation="process", timeout=0.5,
                      slots=1, max_queue=1, queue_timeout=10)
    slow = progressive_jpeg(size=(4000, 2500), extra_scans=300)  # about 5 s of decoding
    killed = decoder.pool.killed
    started = time.perf_counter()
    with pytest.raises(ImageTooLarge, match="took more than 0.5 s"):
        decoder.decode(slow, size=64)
    assert time.perf_counter() - started < 3
    assert decoder.pool.killed == killed + 1
    assert decoder.decode(photo_bytes(), size=64).image.size == (64, 43)  # a fresh helper


def test_a_decode_past_its_memory_budget_fails_in_the_helper_not_the_server():
    from dataclasses import asdict

    from flask_animegan.inputs.isolation import HelperPool

    big = photo_bytes_of(Image.effect_noise((3000, 3000), 64).convert("RGB"), "PNG")
    pool = HelperPool()
    helper = pool.take()
    try:
        # the header check is lifted (max_bytes 1 GiB) to reach the address-space
        # limit the helper sets itself: 16 MiB for a 36 MB decode
        header = {"size": 64, "square": False, "memory": 16 << 20,
                  "limits": asdict(DecodeLimits(max_bytes=1 << 30))}
        answer, _ = helper.request(header, big, timeout=30)
        assert not answer["ok"] and answer["error"] == "ImageTooLarge", answer
        header["memory"] = 256 << 20  # the same helper goes on working
        answer, pixels = helper.request(header, big, timeout=30)
        assert answer["ok"] and len(pixels) == answer["width"] * answer["height"] * 3
    finally:
        pool.discard(helper)


def test_byte_budget_counts_bit_depth_and_bands(make_app):
    client = make_app(ANIMEGAN_MAX_DECODE_BYTES=10 << 20).test_client()
    # 1400 x 1400: 8-bit gray needs 9.4 MiB with its RGB copy, 16-bit 11.2 MiB
    gray8 = Image.new("L", (1400, 1400), 100)
    gray16 = Image.new("I;16", (1400, 1400), 30000)
    assert convert(client, photo_bytes_of(gray8, "PNG")).status_code == 200
    response = convert(client, photo_bytes_of(gray16, "PNG"))
    assert response.status_code == 413 and "MiB" in response.json["error"]


def photo_bytes_of(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("size", [(1, 4000), (4000, 1), (30, 1000)])
def test_extreme_aspect_ratios_are_refused(client, size):
    response = convert(client, photo_bytes_of(Image.new("L", size, 9), "PNG"))
    assert response.status_code == 413 and "times the other" in response.json["error"]


def test_the_decode_gate_bounds_concurrency_and_answers_503_when_full():
    gate = DecodeGate(slots=1)
    entered, release = threading.Event(), threading.Event()

    def hold():
        with gate.slot(max_queue=0, queue_timeout=5):
            entered.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(5)
    with pytest.raises(Overloaded) as refused, gate.slot(max_queue=0, queue_timeout=5):
        pass
    assert refused.value.retry_after >= 1
    with pytest.raises(Overloaded, match="timed out"), gate.slot(max_queue=1,
                                                                 queue_timeout=0.2):
        pass
    release.set()
    holder.join()
    with gate.slot(max_queue=0, queue_timeout=1):
        pass  # free again


def test_float_images_are_scaled_by_their_range(client):
    ramp = torch.linspace(0, 1, 64 * 48).reshape(48, 64).numpy().astype("float32")
    response = convert(client, photo_bytes_of(Image.fromarray(ramp, "F"), "TIFF"))
    assert response.status_code == 200
    gray = open_image(response.data).convert("L")
    assert gray.getextrema()[1] > 100  # not black: [0, 1] maps to [0, 255]


# -- styles ---------------------------------------------------------------------------------
def test_the_default_style_is_fixed_at_startup_and_each_model_keeps_its_name(make_app, tmp_path):
    save_random_generator(tmp_path / "toon_demo.pt", seed=0)
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path))
    client = app.test_client()
    data = photo_bytes("astronaut")
    before = convert(client, data, "?size=64")
    assert before.headers["X-AnimeGAN-Style"] == "toon_demo"
    # `flask animegan pull paprika` writes a file that is a preferred default
    save_random_generator(tmp_path / "paprika.pt", seed=1)
    default = convert(client, data, "?size=64")
    paprika = convert(client, data, "?size=64&style=paprika")
    assert default.headers["X-AnimeGAN-Style"] == "toon_demo"
    assert default.data == before.data
    assert paprika.headers["X-AnimeGAN-Style"] == "paprika"
    assert paprika.data != default.data  # its own weights, not the default's
    health = client.get("/animegan/healthz").json
    assert health["default_style"] == "toon_demo" and health["loaded"][0] == "toon_demo"
    service = app.extensions["animegan"]
    assert service.model is service.engine.model(None)  # runtime state, not in app.config
    assert "ANIMEGAN_MODEL" not in app.config


def test_style_names_must_match_in_full(make_app, tmp_path, caplog):
    save_random_generator(tmp_path / "good.pt", seed=0)
    save_random_generator(tmp_path / "nl\n.pt", seed=1)
    save_random_generator(tmp_path / "Upper.pt", seed=1)
    with caplog.at_level(logging.WARNING, logger="flask_animegan"):
        app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_SHIPPED_STYLES=False)
    assert "'nl\\n.pt'" in caplog.text or "nl\n.pt" in caplog.text
    client = app.test_client()
    assert [s["name"] for s in client.get("/animegan/styles").json["styles"]
            if s["installed"]] == ["good"]
    for name in ("nl%0A", "nl\n", "good%0A"):
        response = convert(client, photo_bytes(), f"?style={name}")
        assert response.status_code == 404, name
    listing = app.test_cli_runner().invoke(args=["animegan", "styles"]).output
    assert "SKIPPED" in listing and "Upper.pt" in listing


def test_weights_full_of_nan_are_refused_at_load(make_app, tmp_path):
    save_random_generator(tmp_path / "good.pt", seed=0)
    state = Generator().state_dict()
    state = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
             for k, v in state.items()}
    torch.save(state, tmp_path / "nan.pt")
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_DEFAULT_STYLE="good")
    client = app.test_client()
    for _ in range(2):  # and it is not cached
        response = convert(client, photo_bytes(), "?style=nan")
        assert response.status_code == 503 and "'nan'" in response.json["error"]
    assert app.extensions["animegan"].cache.stats()["entries"] == 0


def test_a_network_that_outputs_nan_is_never_returned_or_cached(make_app, tmp_path):
    # finite weights whose output overflows: a huge final convolution
    torch.manual_seed(0)
    model = Generator()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1e30)
    torch.save(model.state_dict(), tmp_path / "overflow.pt")
    save_random_generator(tmp_path / "good.pt", seed=0)
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_DEFAULT_STYLE="good",
                   ANIMEGAN_PRECISION="fp32")
    client = app.test_client()
    response = convert(client, photo_bytes(), "?style=overflow")
    assert response.status_code == 503
    assert app.extensions["animegan"].cache.stats()["entries"] == 0
    assert client.get("/animegan/healthz").json["status"] == "degraded"


# -- cache scope ---------------------------------------------------------------------------
def test_the_cache_is_scoped_to_the_client_by_default(make_app):
    client = make_app().test_client()
    data = photo_bytes("astronaut")
    a = {"environ_base": {"REMOTE_ADDR": "10.0.0.1"}}
    b = {"environ_base": {"REMOTE_ADDR": "10.0.0.2"}}
    assert convert(client, data, **a).headers["X-Cache"] == "MISS"
    assert convert(client, data, **a).headers["X-Cache"] == "HIT"
    assert convert(client, data, **b).headers["X-Cache"] == "MISS"


def test_a_global_cache_is_an_opt_in(make_app):
    client = make_app(ANIMEGAN_CACHE_SCOPE="global").test_client()
    data = photo_bytes("astronaut")
    assert convert(client, data, environ_base={"REMOTE_ADDR": "10.0.0.1"}).headers[
        "X-Cache"] == "MISS"
    assert convert(client, data, environ_base={"REMOTE_ADDR": "10.0.0.2"}).headers[
        "X-Cache"] == "HIT"


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
    data = photo_bytes_of(photo("astronaut"), "PNG")  # much larger than the limit
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


def test_a_gif_whose_screen_dwarfs_its_frame_is_refused(client):
    import struct

    def gif(screen: tuple[int, int]) -> bytes:
        return (b"GIF89a" + struct.pack("<HH", *screen) + b"\x80\x00\x00\x00\x00\x00\xff\xff\xff"
                + b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02\x44\x01\x00;")

    for screen in ((6000, 6000), (4000, 1000), (2000, 2000)):
        response = convert(client, gif(screen))
        assert response.status_code == 413 and "first frame" in response.json["error"], screen
    # a small screen around a small frame is an ordinary (odd) GIF
    assert convert(client, gif((40, 30))).status_code == 200


def test_the_cli_refuses_the_same_hostile_files_cleanly(make_app, tmp_path):
    """The CLI's `convert` sees a seeded sample of the generated uploads: every file is
    either converted or reported on one line, and the command never crashes."""
    import random
    import re

    from upload_variants import GROUPS, variants

    rng = random.Random(11)
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    count = 0
    for group in GROUPS:
        chosen = variants(group)
        if group != "specials":
            chosen = chosen[:1] + rng.sample(chosen[1:], 12)
        for variant in chosen:
            (folder / f"{count:04d}.png").write_bytes(variant.body)  # the name lies
            count += 1
    app = make_app(ANIMEGAN_MAX_SIDE=64)
    result = app.test_cli_runner().invoke(args=["animegan", "convert", str(folder), "-o",
                                                str(out), "--size", "16"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    summary = re.search(r"converted (\d+), skipped 0 already converted, failed (\d+)",
                        result.output)
    assert summary, result.output[-2000:]
    converted, failed = map(int, summary.groups())
    assert converted + failed == count and converted > 0 and failed > 0
    assert result.exit_code == 1  # some files failed
    assert len(list(out.iterdir())) == converted
    reported = re.findall(r"^\S+\.png: (.+)$", result.output, re.MULTILINE)
    assert len(reported) == failed and all(reported)
