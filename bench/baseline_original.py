"""REFERENCE CODE FOR THE BENCHMARK, NOT THE PRODUCT: the articles' "original" recipe.

This reproduces how the two articles this project grew from first served AnimeGANv2,
so ``python -m bench`` can measure the product against it in the same run. It is
deliberately naive; do not deploy it. On every request it builds ``Generator()`` and
loads the weights with ``torch.load``, converts with torchvision transforms (Resize to
the long side, ToTensor, Normalize) and leaves torch's threads at their default; the
bench serves it with ``gunicorn --workers 1 --threads 4``.

The network is the package's ``Generator`` and the weights are the bench's file
(``BENCH_WEIGHTS``), so only the serving recipe differs from the product's.
"""

from __future__ import annotations

import io
import os

import torch
from flask import Flask, Response, request
from PIL import Image
from torchvision import transforms

from flask_animegan.runtime.generator import Generator

WEIGHTS = os.environ["BENCH_WEIGHTS"]
SIZE = int(os.environ.get("BENCH_SIZE", "512"))  # long side of the output

app = Flask(__name__)


@app.get("/healthz")
def healthz() -> dict:
    """Readiness for the bench: the app imports without loading anything."""
    return {"status": "ok"}


@app.post("/convert")
def convert() -> Response:
    """Convert the multipart field ``image`` and answer a JPEG, the articles' way."""
    image = Image.open(request.files["image"].stream).convert("RGB")
    model = Generator()
    model.load_state_dict(torch.load(WEIGHTS, map_location="cpu"))
    model.eval()
    scale = min(1.0, SIZE / max(image.size))
    preprocess = transforms.Compose([
        transforms.Resize((round(image.height * scale), round(image.width * scale))),
        transforms.ToTensor(),
        transforms.Normalize([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
    ])
    with torch.no_grad():
        out = model(preprocess(image).unsqueeze(0))[0]
    result = transforms.ToPILImage()((out * 0.5 + 0.5).clamp(0, 1))
    buffer = io.BytesIO()
    result.save(buffer, "JPEG", quality=90)
    return Response(buffer.getvalue(), mimetype="image/jpeg")
