"""Train ``toon_demo``: the app's generator distilled from ``tools/toon_style.py``'s cartoon
filter, an offline stand-in for the official weights (the model card in shipped_styles/
gives data, loss and history). Needs the ``train`` extra; fixed seeds, resumable:
``python tools/train_demo_style.py [--resume | --evaluate-only]``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from skimage import color

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flask_animegan.runtime.generator import Generator  # noqa: E402
from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR  # noqa: E402
from flask_animegan.runtime.weights import load_generator  # noqa: E402
from tools import toon_style  # noqa: E402
from tools.toon_style import HELD_OUT, load_photo, teacher_and_lines  # noqa: E402

#: Colour photographs shipped in wheels; each gets more copies than a grayscale one, or
#: the student washes colour out.
COLOUR_PHOTOS = ("chelsea", "stereo_motorcycle", "hubble_deep_field", "immunohistochemistry",
                 "retina", "colorwheel", "sklearn:flower.jpg", "matplotlib:grace_hopper.jpg",
                 "wheel:quokka", "wheel:raccoon")
#: Grayscale ones (scikit-image): structure, text and texture.
GRAY_PHOTOS = ("camera", "coins", "moon", "clock", "grass", "gravel", "brick", "cell", "page",
               "text")
assert not set(HELD_OUT) & set(COLOUR_PHOTOS + GRAY_PHOTOS)


# -- data -----------------------------------------------------------------------------

def augment(photo: np.ndarray, rng: random.Random) -> np.ndarray:
    """Random scale (long side 224-768), flip and colour jitter of a whole photo."""
    image = Image.fromarray((photo * 255).round().astype(np.uint8))
    side = rng.uniform(224, 768)
    scale = side / max(image.size)
    image = image.resize((max(64, round(image.width * scale)), max(64, round(image.height * scale))),
                         Image.Resampling.LANCZOS)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    array = np.asarray(image, np.float32) / 255
    hsv = color.rgb2hsv(array)
    hsv[..., 0] = (hsv[..., 0] + rng.uniform(-0.08, 0.08)) % 1.0
    hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(0.7, 1.3), 0, 1)
    hsv[..., 2] = np.clip(hsv[..., 2] * rng.uniform(0.8, 1.15), 0, 1)
    return color.hsv2rgb(hsv).astype(np.float32)


def build_pairs(colour_copies: int, gray_copies: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """(input, teacher output, line map) triples in [-1, 1], CHW, from whole augmented photos."""
    rng = random.Random(seed)
    pairs = []
    for names, copies in ((COLOUR_PHOTOS, colour_copies), (GRAY_PHOTOS, gray_copies)):
        for name in names:
            photo = load_photo(name)
            for _ in range(copies):
                source = augment(photo, rng)
                target, lines = teacher_and_lines(source)
                pairs.append((torch.from_numpy(source).permute(2, 0, 1) * 2 - 1,
                              torch.from_numpy(target).permute(2, 0, 1) * 2 - 1,
                              torch.from_numpy(lines)[None]))
    return pairs


def sample_batch(pairs, batch: int, crop: int, rng: random.Random):
    """``batch`` random crops of ``crop`` px (smaller photos are scaled up to it)."""
    columns: list[list[torch.Tensor]] = [[], [], []]
    for _ in range(batch):
        triple = pairs[rng.randrange(len(pairs))]
        _, height, width = triple[0].shape
        size = min(crop, height, width)
        top, left = rng.randrange(height - size + 1), rng.randrange(width - size + 1)
        for column, tensor in zip(columns, triple):
            window = tensor[:, top:top + size, left:left + size]
            column.append(F.interpolate(window[None], size=crop, mode="bilinear")[0]
                          if size != crop else window)
    return tuple(torch.stack(column) for column in columns)


#: The weights this recipe starts from: toon_demo v4, as committed in git (the model card).
INIT_COMMIT = "d835c26"
INIT_WEIGHTS = REPO / "build" / "toon_demo_v4.pt"


def initial_weights(path: Path) -> Path:
    """``path``; toon_demo v4 is taken out of the git history the first time it is asked for."""
    if path == INIT_WEIGHTS and not path.exists():
        blob = subprocess.run(
            ["git", "-C", str(REPO), "show",
             f"{INIT_COMMIT}:flask_animegan/shipped_styles/toon_demo.pt"],
            check=True, capture_output=True).stdout
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    return path


# -- training -------------------------------------------------------------------------

def gradient_l1(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    def grads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[..., 1:, :] - x[..., :-1, :], x[..., :, 1:] - x[..., :, :-1]

    (oy, ox), (ty, tx) = grads(output), grads(target)
    return (oy - ty).abs().mean() + (ox - tx).abs().mean()


def train(args: argparse.Namespace) -> Generator:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    checkpoint = Path(args.checkpoint)
    model = Generator()
    if args.init:
        model.load_state_dict(load_generator(initial_weights(Path(args.init))).state_dict())
    model = model.to(memory_format=torch.channels_last)  # faster on oneDNN
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps,
                                                   pct_start=0.05)
    start = 0
    rng = random.Random(args.seed + 1)
    if args.resume and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)  # our own file: includes RNG state
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        start = state["step"]
        print(f"resumed at step {start}", flush=True)
    print("computing teacher outputs ...", flush=True)
    began = time.perf_counter()
    pairs = build_pairs(args.colour_copies, args.gray_copies, args.seed)
    print(f"{len(pairs)} pairs in {time.perf_counter() - began:.0f} s", flush=True)

    model.train()
    began, losses = time.perf_counter(), []
    for step in range(start, args.steps):
        inputs, targets, lines = sample_batch(pairs, args.batch, args.crop, rng)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            output = model(inputs)
        output = output.float()
        # the teacher's line pixels weigh more: missing a line costs more than a soft step
        weights = 1 + args.line_weight * lines
        error = (output - targets).abs() if args.loss == "l1" else (output - targets) ** 2
        loss = (error * weights).mean() / weights.mean() \
            + args.edge_weight * gradient_l1(output, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        done = step + 1
        if done % args.log_every == 0 or done == args.steps:
            elapsed = time.perf_counter() - began
            eta = elapsed / (done - start) * (args.steps - done)
            print(f"step {done}/{args.steps} loss {np.mean(losses[-args.log_every:]):.4f} "
                  f"lr {schedule.get_last_lr()[0]:.2e} elapsed {elapsed / 60:.1f} min "
                  f"eta {eta / 60:.1f} min", flush=True)
        if args.eval_every and done % args.eval_every == 0 and done < args.steps:
            model.eval()
            figures = toon_style.figures(model)
            model.train()
            print(f"step {done}: held-out " + "; ".join(
                f"{side} px: edge {f['mean']['edge']}, saturation {f['mean']['saturation']}, "
                f"PSNR {f['mean']['psnr_db']} dB" for side, f in figures.items()), flush=True)
        if done % args.checkpoint_every == 0 or done == args.steps:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "schedule": schedule.state_dict(), "rng": rng.getstate(),
                        "torch_rng": torch.get_rng_state(), "step": done}, checkpoint)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(SHIPPED_STYLES_DIR / "toon_demo.pt"))
    parser.add_argument("--samples", default=str(SHIPPED_STYLES_DIR / "toon_demo_samples.jpg"))
    parser.add_argument("--figures", default=str(SHIPPED_STYLES_DIR / "toon_demo.json"))
    parser.add_argument("--checkpoint", default=str(REPO / "build" / "toon_demo.ckpt"))
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--crop", type=int, default=80)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--loss", choices=("mse", "l1"), default="mse",
                        help="per-pixel loss: squared error (what PSNR measures) or L1")
    parser.add_argument("--edge-weight", type=float, default=1.0)
    parser.add_argument("--colour-copies", type=int, default=10,
                        help="augmented copies per colour photo")
    parser.add_argument("--gray-copies", type=int, default=4,
                        help="augmented copies per grayscale photo")
    parser.add_argument("--line-weight", type=float, default=2.0,
                        help="extra weight of the per-pixel loss on the teacher's line pixels")
    parser.add_argument("--init", default=str(INIT_WEIGHTS),
                        help="start from these weights ('': random weights; the default is "
                             "toon_demo v4, taken out of git)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=False,
                        help="bf16 autocast (measured slower than fp32 for training here)")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=250,
                        help="report the held-out figures every N steps (0: only at the end)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--evaluate-only", action="store_true")
    args = parser.parse_args()
    Path(args.checkpoint).parent.mkdir(parents=True, exist_ok=True)

    if args.evaluate_only:
        model = load_generator(Path(args.out))
    else:
        began = time.perf_counter()
        model = train(args)
        print(f"trained in {(time.perf_counter() - began) / 60:.1f} min", flush=True)
        # fp16 halves the file; the loader upcasts to float32
        torch.save({k: v.half() for k, v in model.state_dict().items()}, args.out)
        model = load_generator(Path(args.out))
    figures = toon_style.figures(model)
    toon_style.samples_sheet(model, Path(args.samples))
    print(json.dumps(figures, indent=2))
    print(toon_style.card_table(figures))
    if not args.evaluate_only:
        Path(args.figures).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
