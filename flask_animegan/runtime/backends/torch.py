"""torch eager: the reference backend, and the fallback for every other one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..generator import in_layout
from ..precision import DTYPES, native_bf16


def to_batch(pixels: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """uint8 (H, W, 3) -> (1, 3, H, W) in [-1, 1], channels-last (seen so, it is: no copy)."""
    batch = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
    return batch.to(torch.float32).div_(127.5).sub_(1.0).to(dtype)


class TorchRunner:
    """The generator in eager mode, channels-last in ``precision``, converted in place
    (for the default style it is also ``service.model``)."""

    backend = "torch"

    def __init__(self, network: nn.Module, precision: str) -> None:
        self.precision = precision
        self.dtype = DTYPES[precision]
        self.network = in_layout(network.to(dtype=self.dtype), torch.channels_last)

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out: torch.Tensor = self.network(to_batch(pixels, self.dtype))
            return out[0].permute(1, 2, 0).to(torch.float32).numpy()


class TorchBackend:
    name = "torch"

    def precisions(self) -> tuple[str, ...]:
        return ("fp32", "bf16") if native_bf16() else ("fp32",)

    def runner(self, network: nn.Module, precision: str, weights: Path) -> TorchRunner:
        return TorchRunner(network, precision)
