"""The decode budgets through every entry point: JPEG scan limits, the decode gate and its
helper processes (time and memory), byte, area and aspect budgets, odd pixel formats."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time

import pytest
import torch
from conftest import convert, encode_image, open_image, photo_bytes
from PIL import Image

from bench.servers import child_pids
from flask_animegan.errors import ImageTooLarge, Overloaded
from flask_animegan.inputs.decoding import DecodeLimits, decode_cost, jpeg_layout
from flask_animegan.inputs.helper import NICENESS
from flask_animegan.inputs.isolation import Decoder
from flask_animegan.gate import Gate


def progressive_jpeg(size=(2000, 1500), extra_scans: int = 0) -> bytes:
    """A progressive gray JPEG whose last scan is repeated ``extra_scans`` times."""
    buffer = io.BytesIO()
    Image.new("L", size, 128).save(buffer, "JPEG", progressive=True)
    data = buffer.getvalue()
    last, eoi = data.rfind(b"\xff\xda"), data.rfind(b"\xff\xd9")
    return data[:eoi] + data[last:eoi] * extra_scans + data[eoi:]


# -- JPEG scans ---------------------------------------------------------------------------
# -- JPEG scans ---------------------------------------------------------------------------
def test_scan_count_of_real_files():
    assert jpeg_layout(photo_bytes("astronaut")).scans == 1  # baseline
    progressive = jpeg_layout(photo_bytes("astronaut", progressive=True)).scans
    assert 6 <= progressive <= 12  # libjpeg's standard progression
    assert jpeg_layout(progressive_jpeg(extra_scans=1000)).scans > 1000


def test_scans_inside_an_exif_thumbnail_are_not_counted():
    # an EXIF block full of SOS marker bytes is skipped by its length
    exif = Image.Exif()
    exif[0x9286] = b"ASCII\x00\x00\x00" + b"\xff\xda" * 5000  # UserComment
    data = photo_bytes("coffee", exif=exif.tobytes())
    assert jpeg_layout(data).scans == 1


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


def test_a_helper_that_got_no_cpu_blames_the_load_not_the_file():
    """A decode that timed out while its helper hardly ran (a busy machine: helpers run
    niced below the server) is a 503 to try again, not a 413 for the file; here the helper
    is stopped outright for the whole timeout."""
    decoder = Decoder(limits=DecodeLimits(), isolation="process", timeout=1.0, slots=1,
                      max_queue=1, queue_timeout=10)
    decoder.start()  # its helper is running before the upload arrives
    helpers = [pid for pid in child_pids(os.getpid()) if _is_helper(pid)]
    assert helpers, "no decode helper started"
    for pid in helpers:
        os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(Overloaded, match="too busy to read the upload") as refused:
            decoder.decode(photo_bytes(), size=64)
    finally:
        for pid in helpers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert refused.value.status == 503 and refused.value.retry_after >= 1
    assert decoder.decode(photo_bytes(), size=64).image.size == (64, 43)  # a fresh helper


def _is_helper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"flask_animegan.inputs.helper" in cmdline.read()
    except OSError:
        return False


def test_helpers_run_below_the_server_s_priority():
    decoder = Decoder(limits=DecodeLimits(), isolation="process", timeout=5, slots=1,
                      max_queue=1, queue_timeout=10)
    assert decoder.decode(photo_bytes(), size=64).image.size == (64, 43)
    helpers = [pid for pid in child_pids(os.getpid()) if _is_helper(pid)]
    assert helpers and all(os.getpriority(os.PRIO_PROCESS, pid) >= os.getpriority(
        os.PRIO_PROCESS, 0) + NICENESS for pid in helpers)


def test_a_decode_past_its_time_budget_is_killed_and_the_helper_replaced():
    decoder = Decoder(limits=DecodeLimits(max_scans=10_000), isolation="process", timeout=1.5,
                      slots=1, max_queue=1, queue_timeout=10)
    # about 15 s of decoding on the CI Xeon, 10x the budget (300 scans took 1.56 s there:
    # too close to 1.5 s to tell a killed decode from a fast machine)
    slow = progressive_jpeg(size=(4000, 2500), extra_scans=3000)
    for _attempt in range(5):
        killed = decoder.pool.killed
        started = time.perf_counter()
        try:
            decoder.decode(slow, size=64)
        except Overloaded:
            # the helper hardly ran (a neighbour test took the cores): a 503, and a new try
            assert decoder.pool.killed == killed + 1
            continue
        except ImageTooLarge as error:
            assert "took more than 1.5 s" in str(error)
            break
        raise AssertionError("a decode ten times its budget finished")
    else:
        pytest.fail("the helper was starved of CPU on every try")
    assert time.perf_counter() - started < 6
    assert decoder.pool.killed == killed + 1
    assert decoder.decode(photo_bytes(), size=64).image.size == (64, 43)  # a fresh helper


def test_a_decode_past_its_memory_budget_fails_in_the_helper_not_the_server():
    from dataclasses import asdict

    from flask_animegan.inputs.isolation import HelperPool
    from flask_animegan.inputs.media import MediaLimits

    big = encode_image(Image.effect_noise((3000, 3000), 64).convert("RGB"), "PNG")
    pool = HelperPool()
    helper = pool.take()
    try:
        # the header check is lifted (max_bytes 1 GiB) to reach the address-space
        # limit the helper sets itself: 16 MiB for a 36 MB decode
        header = {"op": "decode", "size": 64, "square": False, "cover": False,
                  "memory": 16 << 20, "decode": asdict(DecodeLimits(max_bytes=1 << 30)),
                  "media": asdict(MediaLimits())}
        answer, _ = helper.request(header, big, timeout=30)
        assert not answer["ok"] and answer["error"] == "ImageTooLarge", answer
        header["memory"] = 256 << 20  # the same helper goes on working
        answer, pixels = helper.request(header, big, timeout=30)
        assert answer["ok"] and len(pixels) == answer["width"] * answer["height"] * 3
    finally:
        pool.discard(helper)


@pytest.mark.parametrize("cache", [False, True], ids=["cache off", "cache on"])
def test_byte_budget_counts_copies(make_app, cache):
    # an RGBA image is stored in 4 bytes a pixel and pasted onto a white RGB copy (8 in
    # all); an 8-bit gray one needs 1 and its RGB copy (5); the cache changes nothing.
    gray = encode_image(Image.new("L", (1400, 1400), 100), "PNG")
    rgba = encode_image(Image.new("RGBA", (1400, 1400), (9, 9, 9, 99)), "PNG")
    gray_cost, rgba_cost = (decode_cost(data, size=128) for data in (gray, rgba))
    assert rgba_cost > 1.5 * gray_cost
    wide = encode_image(Image.new("L", (4000, 1000), 100), "PNG")
    assert decode_cost(wide, size=900, cover=True) > 1.5 * decode_cost(wide, size=900)
    client = make_app(ANIMEGAN_MAX_DECODE_BYTES=(gray_cost + rgba_cost) // 2,
                      ANIMEGAN_CACHE_TTL=3600 if cache else 0).test_client()
    assert convert(client, gray).status_code == 200
    response = convert(client, rgba)
    assert response.status_code == 413 and "MiB" in response.json["error"]


def _resident() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) << 10 for line in status if line.startswith("VmRSS:"))


@pytest.mark.parametrize("segments", [500_000, 1_500_000])
def test_a_jpeg_full_of_segments_is_walked_in_the_helper_not_the_worker(client, segments):
    """Everything the server does with an upload's bytes runs in its helper process: a
    JPEG of a million empty comments costs the request's own thread (the Flask client
    runs the request in this one) no walking, and this process no memory."""
    photo = photo_bytes("astronaut")
    data = photo[:2] + b"\xff\xfe\x00\x02" * segments + photo[2:]
    convert(client, photo_bytes("coffee"))  # a helper is up
    resident, started = _resident(), time.thread_time()
    response = convert(client, data)
    cpu = time.thread_time() - started
    # 503: on a loaded machine the helper (at nice 10) got under half its timeout in CPU
    # before it was killed, so the load, not the file, is blamed (isolation.STARVED_SHARE)
    assert response.status_code in (200, 413, 503), response.status_code
    assert cpu < 1, f"{cpu:.2f} s of this thread's CPU"  # walking it takes seconds
    assert _resident() - resident < 50 << 20  # Pillow keeps ~100 bytes a segment
@pytest.mark.parametrize("size", [(1, 4000), (4000, 1), (30, 1000)])
def test_extreme_aspect_ratios_are_refused(client, size):
    response = convert(client, encode_image(Image.new("L", size, 9), "PNG"))
    assert response.status_code == 413 and "times the other" in response.json["error"]


def test_the_gate_bounds_concurrency_and_answers_503_when_full():
    gate = Gate(slots=1, max_queue=0, queue_timeout=5, work="reading other uploads")
    entered, release = threading.Event(), threading.Event()

    def hold():
        with gate.slot():
            entered.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(5)
    with pytest.raises(Overloaded, match="reading other uploads") as refused, gate.slot():
        pass
    assert refused.value.retry_after >= 1 and gate.status() == {
        "in_flight": 1, "queued": 0, "max_queue": 0}
    gate.max_queue, gate.queue_timeout = 1, 0.2
    with pytest.raises(Overloaded, match="timed out"), gate.slot():
        pass
    release.set()
    holder.join()
    with gate.slot():
        pass  # free again
    assert gate.status()["in_flight"] == gate.pending == 0


def test_float_images_are_scaled_by_their_range(client):
    ramp = torch.linspace(0, 1, 64 * 48).reshape(48, 64).numpy().astype("float32")
    response = convert(client, encode_image(Image.fromarray(ramp, "F"), "TIFF"))
    assert response.status_code == 200
    gray = open_image(response.data).convert("L")
    assert gray.getextrema()[1] > 100  # not black: [0, 1] maps to [0, 255]


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
