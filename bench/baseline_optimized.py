"""REFERENCE CODE FOR THE BENCHMARK, NOT THE PRODUCT: the articles' "optimized" recipe.

The model is loaded once, traced with ``torch.jit.trace`` and capped at two threads; do not
deploy it. Same network and weights as ours.
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

torch.set_num_threads(2)
_model = Generator()
_model.load_state_dict(torch.load(WEIGHTS, map_location="cpu"))
_model.eval()
with torch.no_grad():
    MODEL = torch.jit.trace(_model, torch.zeros(1, 3, SIZE, SIZE))
TO_TENSOR = transforms.Compose([
    transforms.ToTensor(),
    transforms.Normalize([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
])

app = Flask(__name__)


@app.get("/healthz")
def healthz() -> dict:
    """Readiness for the bench: the model is loaded and traced at import."""
    return {"status": "ok"}


@app.post("/convert")
def convert() -> Response:
    """Convert the multipart field ``image`` with the traced model and answer a JPEG."""
    image = Image.open(request.files["image"].stream).convert("RGB")
    scale = min(1.0, SIZE / max(image.size))
    image = transforms.Resize((round(image.height * scale), round(image.width * scale)))(image)
    with torch.no_grad():
        out = MODEL(TO_TENSOR(image).unsqueeze(0))[0]
    result = transforms.ToPILImage()((out * 0.5 + 0.5).clamp(0, 1))
    buffer = io.BytesIO()
    result.save(buffer, "JPEG", quality=90)
    return Response(buffer.getvalue(), mimetype="image/jpeg")
