"""Train ``toon_demo``: distil a classic cartoon filter into the AnimeGANv2 generator.

The official AnimeGANv2 weights cannot be downloaded on offline machines, so the
project ships this small, honest stand-in: the same network the app serves
(flask_animegan.generator.Generator, 2,143,552 parameters), trained to imitate a
non-neural "teacher" filter:

* edge-preserving smoothing (total-variation denoising, Chambolle),
* soft quantisation of lightness into flat bands (in CIELAB) with a mild saturation lift,
* dark contour lines from the gradient of the smoothed image.

Data: photographs shipped inside package wheels (no download): scikit-image's sample
data plus three colour photos from scikit-learn and matplotlib, with random scales,
flips, crops and colour jitter. ``astronaut`` and ``coffee`` are held out for the
quality check. Loss: L1 plus L1 on image gradients (edges). Fixed seeds; resumable.

    python tools/train_demo_style.py                      # train, evaluate, write the style
    python tools/train_demo_style.py --resume             # continue from the checkpoint
    python tools/train_demo_style.py --evaluate-only      # figures for the shipped toon_demo.pt

The style and its samples go to flask_animegan/shipped_styles/ (package data).

Needs the `train` extra: pip install -e '.[train]'.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from skimage import color, data, filters, metrics, restoration

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flask_animegan import imaging  # noqa: E402
from flask_animegan.generator import Generator  # noqa: E402
from flask_animegan.styles import SHIPPED_STYLES_DIR  # noqa: E402
from flask_animegan.weights import load_generator  # noqa: E402

#: scikit-image's sample photographs (``skimage.data``); ten of them are grayscale.
TRAIN_PHOTOS = ("chelsea", "rocket", "stereo_motorcycle", "hubble_deep_field",
                "immunohistochemistry", "retina", "colorwheel", "camera", "coins", "moon",
                "clock", "grass", "gravel", "brick", "cell", "page", "text")
HELD_OUT = ("astronaut", "coffee")
#: More colour photographs from other wheels (the `train` extra installs them):
#: scikit-learn's sample images and matplotlib's sample data. Without them the network saw
#: mostly gray pictures and shifted held-out colour photos towards gray.
EXTRA_COLOUR_PHOTOS = ("sklearn:china.jpg", "sklearn:flower.jpg", "matplotlib:grace_hopper.jpg")
EVAL_SIDE = 512


# -- the teacher ----------------------------------------------------------------------

def teacher(rgb: np.ndarray) -> np.ndarray:
    """Cartoon filter: float32 HxWx3 in [0, 1] -> float32 HxWx3 in [0, 1].

    Soft on purpose: a step or a line one pixel wide that moves with the smallest change
    of the input cannot be learnt by a 2-million-parameter network in an hour of CPU,
    while broad flat regions joined by smooth steps, and lines two or three pixels wide,
    can (the first version, with hard bands and thin lines, stopped at 19.8 dB).
    """
    smooth = restoration.denoise_tv_chambolle(rgb, weight=0.3, channel_axis=-1)
    lab = color.rgb2lab(smooth)
    # lightness in flat bands of 18 units, joined by smooth steps
    bands = lab[..., 0] / 18.0
    floor = np.floor(bands)
    lab[..., 0] = (floor + 1 / (1 + np.exp(-(bands - floor - 0.5) * 4))) * 18.0
    lab[..., 1:] *= 1.2  # a mild saturation lift
    toon = np.clip(color.lab2rgb(lab), 0, 1)
    # dark contours where the smoothed image has strong edges, two or three pixels wide
    edges = filters.sobel(filters.gaussian(smooth.mean(axis=-1), sigma=2.0))
    lines = filters.gaussian(np.clip((edges - 0.03) / 0.06, 0, 1), sigma=1.5)
    return (toon * (1 - 0.6 * lines[..., None])).astype(np.float32)


# -- data -----------------------------------------------------------------------------

def load_photo(name: str) -> np.ndarray:
    if ":" in name:
        package, file_name = name.split(":")
        if package == "sklearn":
            from sklearn.datasets import load_sample_image
            array = load_sample_image(file_name)
        else:
            import matplotlib
            array = np.asarray(Image.open(Path(matplotlib.get_data_path()) / "sample_data"
                                          / file_name).convert("RGB"))
        return np.asarray(array, np.float32) / 255
    array = getattr(data, name)()
    if isinstance(array, tuple):  # stereo pairs
        array = array[0]
    image = Image.fromarray(np.asarray(array)).convert("RGB")
    return np.asarray(image, np.float32) / 255


def augment(photo: np.ndarray, rng: random.Random) -> np.ndarray:
    """Random scale (long side 320-720), flip and colour jitter of a whole photo."""
    image = Image.fromarray((photo * 255).round().astype(np.uint8))
    side = rng.uniform(320, 720)
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


def build_pairs(count_per_photo: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, teacher output) pairs in [-1, 1], CHW, computed on whole augmented photos."""
    rng = random.Random(seed)
    pairs = []
    for name in TRAIN_PHOTOS + EXTRA_COLOUR_PHOTOS:
        photo = load_photo(name)
        for _ in range(count_per_photo):
            source = augment(photo, rng)
            target = teacher(source)
            pairs.append((torch.from_numpy(source).permute(2, 0, 1) * 2 - 1,
                          torch.from_numpy(target).permute(2, 0, 1) * 2 - 1))
    return pairs


def sample_batch(pairs, batch: int, crop: int, rng: random.Random):
    inputs, targets = [], []
    for _ in range(batch):
        source, target = pairs[rng.randrange(len(pairs))]
        _, height, width = source.shape
        size = min(crop, height, width)
        top, left = rng.randrange(height - size + 1), rng.randrange(width - size + 1)
        window = (slice(None), slice(top, top + size), slice(left, left + size))
        inputs.append(F.interpolate(source[window][None], size=crop, mode="bilinear")[0]
                      if size != crop else source[window])
        targets.append(F.interpolate(target[window][None], size=crop, mode="bilinear")[0]
                       if size != crop else target[window])
    return torch.stack(inputs), torch.stack(targets)


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
    model = Generator().to(memory_format=torch.channels_last)  # 1.2x faster here
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
    pairs = build_pairs(args.per_photo, args.seed)
    print(f"{len(pairs)} pairs in {time.perf_counter() - began:.0f} s", flush=True)

    model.train()
    began, losses = time.perf_counter(), []
    for step in range(start, args.steps):
        inputs, targets = sample_batch(pairs, args.batch, args.crop, rng)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            output = model(inputs)
        output = output.float()
        loss = F.l1_loss(output, targets) + args.edge_weight * gradient_l1(output, targets)
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
            figures = held_out_figures(model)
            model.train()
            print(f"step {done}: held-out PSNR {figures['mean_psnr_db']} dB, "
                  f"SSIM {figures['mean_ssim']}", flush=True)
        if done % args.checkpoint_every == 0 or done == args.steps:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "schedule": schedule.state_dict(), "rng": rng.getstate(),
                        "torch_rng": torch.get_rng_state(), "step": done}, checkpoint)
    return model.eval()


# -- evaluation -----------------------------------------------------------------------

def held_out_figures(model: torch.nn.Module, samples: Path | None = None) -> dict:
    """PSNR/SSIM of the student against the teacher on held-out photos at 512 px."""
    figures, rows = {}, []
    for name in HELD_OUT:
        image = imaging.fit(Image.fromarray((load_photo(name) * 255).round().astype(np.uint8)),
                            EVAL_SIDE)
        source = np.asarray(image, np.float32) / 255
        target = teacher(source)
        with torch.inference_mode():
            student = imaging.to_image(model(imaging.to_tensor(image)))
        student_array = np.asarray(student, np.float32) / 255
        target_u8 = (target * 255).round() / 255
        figures[name] = {
            "psnr_db": round(float(metrics.peak_signal_noise_ratio(target_u8, student_array,
                                                                     data_range=1.0)), 2),
            "ssim": round(float(metrics.structural_similarity(target_u8, student_array,
                                                              channel_axis=-1, data_range=1.0)), 4),
        }
        rows.append(np.concatenate([source, target_u8, student_array], axis=1))
    if samples is not None:
        width = max(r.shape[1] for r in rows)
        padded = [np.pad(r, ((0, 8), (0, width - r.shape[1]), (0, 0)), constant_values=1)
                  for r in rows]
        Image.fromarray((np.concatenate(padded, 0) * 255).round().astype(np.uint8)).save(
            samples, quality=90)
    figures["mean_psnr_db"] = round(float(np.mean([figures[n]["psnr_db"] for n in HELD_OUT])), 2)
    figures["mean_ssim"] = round(float(np.mean([figures[n]["ssim"] for n in HELD_OUT])), 4)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(SHIPPED_STYLES_DIR / "toon_demo.pt"))
    parser.add_argument("--samples", default=str(SHIPPED_STYLES_DIR / "toon_demo_samples.jpg"))
    parser.add_argument("--checkpoint", default=str(REPO / "build" / "toon_demo.ckpt"))
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--crop", type=int, default=80)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--edge-weight", type=float, default=1.0)
    parser.add_argument("--per-photo", type=int, default=6, help="augmented copies per photo")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=False,
                        help="bf16 autocast (measured slower than fp32 for training here)")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=0,
                        help="report held-out PSNR/SSIM every N steps (0: only at the end)")
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
    figures = held_out_figures(model, Path(args.samples))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
