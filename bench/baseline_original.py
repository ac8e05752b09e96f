"""REFERENCE CODE FOR THE BENCHMARK, NOT THE PRODUCT: the articles' "original" recipe.

Deliberately naive (do not deploy): it builds ``Generator()`` and loads the weights on every
request, with torchvision transforms and default threads. Same network and weights as ours.
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
