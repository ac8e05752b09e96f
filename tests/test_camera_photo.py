"""A 24-megapixel camera photo (6000×4000 JPEG) at the largest size the site allows: the
default decode budget admits it, it runs in tiles as a job, and the process's peak memory
stays bounded (docs/large-photos.md has the figures). In a fresh process, so that its
peak (VmHWM) is its own, not pytest's."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import photo
from PIL import Image, ImageCms

from flask_animegan.config import DEFAULTS
from flask_animegan.inputs.decoding import decode_cost

pytestmark = pytest.mark.slow
LARGEST = 4096
TESTS = Path(__file__).resolve().parent
#: Generous: the decode's budget plus the tiles' working set plus the 4096-px result and
#: its encodings, over the warmed-up app (measured figures: docs/large-photos.md).
PEAK_BOUND_MIB = 1536

CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from conftest import build_app

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) // 1024

app = build_app(Path(sys.argv[2]), Path(sys.argv[3]), ANIMEGAN_MAX_SIDE=512,
                ANIMEGAN_MAX_OUTPUT_SIDE=int(sys.argv[4]), ANIMEGAN_DECODE_ISOLATION="thread")
client = app.test_client()
data = Path(sys.argv[5]).read_bytes()
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak from here: the warmed-up app's resident memory
before, began = status("VmRSS"), time.monotonic()
response = client.post("/animegan/convert", query_string={"size": sys.argv[4]}, data=data,
                       content_type="image/jpeg")
answer = {"status": response.status_code, "before_mib": before}
if response.status_code == 202:
    url = response.get_json()["url"]
    while True:
        job = client.get(url).get_json()
        if job["state"] in ("done", "failed", "cancelled") or time.monotonic() - began > 1500:
            break
        time.sleep(0.5)
    answer.update(state=job["state"], tiles=job.get("tiles_total"), error=job.get("error"))
    if job["state"] == "done":
        result = client.get(job["result_url"])
        answer.update(result_bytes=len(result.data), mimetype=result.mimetype)
else:
    answer["body"] = response.get_data(as_text=True)
answer.update(peak_mib=status("VmHWM"), seconds=round(time.monotonic() - began, 1))
print(json.dumps(answer))
"""


def camera_photo() -> bytes:
    """A 6000×4000 progressive JPEG, 4:4:4, with an ICC profile and EXIF: the dearest kind
    of camera JPEG of that size to decode."""
    picture = photo("chelsea").resize((6000, 4000), Image.Resampling.BICUBIC)
    exif = Image.Exif()
    exif[0x010F] = "Camera"
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", quality=92, progressive=True, subsampling=0,
                 icc_profile=icc, exif=exif.tobytes())
    return buffer.getvalue()


def test_the_default_decode_budget_admits_a_24_megapixel_photo_at_any_size():
    data = camera_photo()
    costs = {size: decode_cost(data, size=size) for size in (512, 2048, LARGEST, 6000, 8192)}
    assert max(costs.values()) <= DEFAULTS["ANIMEGAN_MAX_DECODE_BYTES"], costs


def test_a_camera_photo_converts_at_the_largest_size_in_bounded_memory(
        models_dir, openvino_cache, tmp_path):
    path = tmp_path / "camera.jpg"
    path.write_bytes(camera_photo())
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(TESTS), str(models_dir), str(openvino_cache),
         str(LARGEST), str(path)],
        capture_output=True, text=True, timeout=1800, cwd=TESTS.parent)
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"\n6000x4000 JPEG at {LARGEST} px: {answer}")
    assert answer["status"] == 202, answer
    assert answer["state"] == "done", answer
    assert answer["mimetype"] == "image/jpeg" and answer["result_bytes"] > 0
    assert answer["peak_mib"] - answer["before_mib"] < PEAK_BOUND_MIB, answer
