"""Large pictures in bounded memory: the generator run in overlapping tiles, each normalised
with the whole picture's GroupNorm statistics (from a first pass at ``STATS_SIDE``) and
upsampled at the whole picture's coordinates (docs/large-photos.md)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from .backends.base import to_pixels
from .backends.torch import to_batch
from .generator import Generator, InvertedResBlock, in_layout

#: Core side of a tile and the context read past it on every side (multiples of 4).
TILE = 320
MARGIN = 48
#: Long side of the first pass that measures the statistics.
STATS_SIDE = 512


#: Called with (tiles done, tiles in all); raising stops the run.
TileProgress = Callable[[int, int], None]

#: Per GroupNorm layer of one picture: the mean and variance over (C, H, W).
Norms = dict[nn.GroupNorm, tuple[float, float]]


@dataclass(frozen=True)
class _Tile:
    """The rows and columns a tile reads and the core it keeps, in input pixels."""

    top: int
    bottom: int
    left: int
    right: int
    core: tuple[int, int, int, int]  # top, bottom, left, right


def _spans(length: int, tile: int, margin: int) -> Iterator[tuple[int, int, int, int]]:
    """(read_start, read_end, core_start, core_end) along one axis."""
    for start in range(0, length, tile):
        end = min(length, start + tile)
        yield max(0, start - margin), min(length, end + margin), start, end


def tiles(height: int, width: int, tile: int = TILE, margin: int = MARGIN) -> list[_Tile]:
    """The tiles covering a ``height`` x ``width`` picture, row by row."""
    if tile % 4 or margin % 4:
        raise ValueError("tile and margin must be multiples of 4 pixels")
    return [_Tile(top, bottom, left, right, (c_top, c_bottom, c_left, c_right))
            for top, bottom, c_top, c_bottom in _spans(height, tile, margin)
            for left, right, c_left, c_right in _spans(width, tile, margin)]


def _half(side: int) -> int:
    """A side after the generator's stride-2 convolutions (pad 0 before, 1 after, k=3)."""
    return (side - 2) // 2 + 1


def _positions(n_from: int, n_to: int, offset_from: int, offset_to: int, count: int,
               limit: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Along one axis: each output position's two input positions in the tile and the
    second's weight, as ``align_corners=True`` maps ``n_from`` onto ``n_to``."""
    scale = (n_from - 1) / (n_to - 1) if n_to > 1 else 0.0
    positions = (torch.arange(count, dtype=torch.float64) + offset_to) * scale
    positions = (positions - offset_from).clamp(0, limit - 1)
    low = positions.floor().long().clamp(max=limit - 1)
    return low, (low + 1).clamp(max=limit - 1), positions - low


def _upsample(x: torch.Tensor, whole_from: tuple[int, int], whole_to: tuple[int, int],
              offset_from: tuple[int, int], offset_to: tuple[int, int],
              size_to: tuple[int, int]) -> torch.Tensor:
    """Upsample tile ``x`` where the whole picture's bilinear upsampling would sample,
    in bands of rows into one channels-last output."""
    low, high, weight = _positions(whole_from[0], whole_to[0], offset_from[0], offset_to[0],
                                   size_to[0], x.shape[2])
    c_low, c_high, c_weight = _positions(whole_from[1], whole_to[1], offset_from[1],
                                         offset_to[1], size_to[1], x.shape[3])
    c_weight_t = c_weight.to(x.dtype).view(1, 1, 1, -1)
    out = torch.empty((x.shape[0], x.shape[1], size_to[0], size_to[1]), dtype=x.dtype,
                      memory_format=torch.channels_last)
    for start in range(0, size_to[0], _BAND):
        band = slice(start, start + _BAND)
        rows = torch.lerp(x.index_select(2, low[band]), x.index_select(2, high[band]),
                          weight[band].to(x.dtype).view(1, 1, -1, 1))
        out[:, :, band] = torch.lerp(rows.index_select(3, c_low),
                                     rows.index_select(3, c_high), c_weight_t)
    return out


#: Output rows per band of :func:`_upsample`.
_BAND = 32


def _layers(module: nn.Module, x: torch.Tensor, norms: Norms, measure: bool) -> torch.Tensor:
    """``module`` on one tile with the statistics in ``norms``, or (``measure``) with its
    own, recorded into ``norms``. Norms and residuals work in place."""
    if isinstance(module, nn.GroupNorm):
        if measure:
            var_t, mean_t = torch.var_mean(x.float(), unbiased=False)
            norms[module] = float(mean_t), float(var_t)
        mean, var = norms[module]
        scale = module.weight / (var + module.eps) ** 0.5
        shift = module.bias - mean * scale
        return x.mul_(scale.view(1, -1, 1, 1)).add_(shift.view(1, -1, 1, 1))
    if isinstance(module, InvertedResBlock):
        inner = _layers(module.layers, x, norms, measure)
        return inner.add_(x) if module.use_res_connect else inner
    if isinstance(module, nn.Sequential):
        for child in module:
            x = _layers(child, x, norms, measure)
        return x
    out: torch.Tensor = module(x)
    return out


def _tile_forward(network: Generator, batch: torch.Tensor, whole: tuple[int, int],
                  tile: _Tile, norms: Norms, measure: bool = False) -> torch.Tensor:
    """The generator on one tile at the whole picture's geometry; returns its core."""
    height, width = whole
    half = (_half(height), _half(width))
    quarter = (_half(half[0]), _half(half[1]))
    run = functools.partial(_layers, norms=norms, measure=measure)
    out = run(network.block_a, batch)
    half_size = (out.shape[2], out.shape[3])
    out = run(network.block_c, run(network.block_b, out))
    out = _upsample(out, quarter, half, (tile.top // 4, tile.left // 4),
                    (tile.top // 2, tile.left // 2), half_size)
    out = run(network.block_d, out)
    out = _upsample(out, half, whole, (tile.top // 2, tile.left // 2), (tile.top, tile.left),
                    (batch.shape[2], batch.shape[3]))
    out = cast(torch.Tensor, network.out_layer(run(network.block_e, out)))
    top, bottom, left, right = tile.core
    return out[:, :, top - tile.top:bottom - tile.top, left - tile.left:right - tile.left]


def run_tiled(network: Generator, pixels: np.ndarray, *, tile: int | None = None,
              margin: int | None = None, stats_side: int | None = None,
              each: Callable[[], AbstractContextManager[object]] | None = None,
              progress: TileProgress | None = None) -> np.ndarray | None:
    """The generator on uint8 ``pixels`` tile by tile, in one tile's memory; uint8
    (H, W, 3), or None when the output is not finite. ``each()`` is entered around the
    statistics pass and around every tile (the inference slot, one tile at a time);
    ``progress(done, total)`` is called before the statistics pass (which counts as part
    of the first tile) and after each tile."""
    height, width = pixels.shape[:2]
    dtype = next(network.parameters()).dtype  # fp32, or bf16 for a torch bf16 runner
    step = each or contextlib.nullcontext
    layout = tiles(height, width, tile or TILE, margin or MARGIN)
    result = np.empty((height, width, 3), np.uint8)
    with torch.inference_mode():
        # each GroupNorm layer's input statistics, measured on the whole (shrunk) picture
        # copies: a view of a read-only array is no tensor's to share
        small = to_batch(np.array(_shrink(pixels, stats_side or STATS_SIDE)), dtype)
        rows, cols = small.shape[2], small.shape[3]
        norms: Norms = {}
        if progress is not None:
            progress(0, len(layout))
        with step():
            # channels-last: oneDNN's fast path; every torch runner keeps it too
            in_layout(network, torch.channels_last)
            _tile_forward(network, small, (rows, cols),
                          _Tile(0, rows, 0, cols, (0, rows, 0, cols)), norms, measure=True)
        for done, part in enumerate(layout, 1):
            read = np.array(pixels[part.top:part.bottom, part.left:part.right])
            with step():
                out = _tile_forward(network, to_batch(read, dtype), (height, width), part,
                                    norms)
            core = to_pixels(out[0].permute(1, 2, 0).to(torch.float32).numpy())
            if core is None:
                return None
            top, bottom, left, right = part.core
            result[top:bottom, left:right] = core
            if progress is not None:
                progress(done, len(layout))
    return result


def _shrink(pixels: np.ndarray, side: int) -> np.ndarray:
    """``pixels`` with the long side at most ``side`` (Lanczos, as inputs are fitted)."""
    height, width = pixels.shape[:2]
    if max(height, width) <= side:
        return pixels
    from PIL import Image

    scale = side / max(height, width)
    size = (max(16, round(width * scale)), max(16, round(height * scale)))
    return np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.LANCZOS))
