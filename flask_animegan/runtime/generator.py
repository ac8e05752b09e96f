"""The AnimeGANv2 generator network, key-for-key compatible with the public PyTorch port
(bryandlee/animegan2-pytorch, MIT), so its published state dicts load with ``strict=True``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

_Module = TypeVar("_Module", bound=nn.Module)


def in_layout(network: _Module, memory_format: torch.memory_format) -> _Module:
    """``network`` with its weights in ``memory_format``, in place (some stubs lack it)."""
    to: Callable[..., nn.Module] = network.to
    to(memory_format=memory_format)
    return network

#: Number of parameters of the published generator (all styles share it).
PARAMETER_COUNT = 2_143_552


class ConvNormLReLU(nn.Sequential):
    """Reflection pad, convolution, GroupNorm(1 group), LeakyReLU(0.2)."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int = 3, stride: int = 1,
                 padding: int | tuple[int, int, int, int] = 1, groups: int = 1,
                 bias: bool = False) -> None:
        super().__init__(
            nn.ReflectionPad2d(padding),
            nn.Conv2d(in_ch, out_ch, kernel_size, stride=stride, padding=0,
                      groups=groups, bias=bias),
            nn.GroupNorm(num_groups=1, num_channels=out_ch, affine=True),
            nn.LeakyReLU(0.2, inplace=True),
        )


class InvertedResBlock(nn.Module):
    """MobileNetV2-style block: 1x1 expand, 3x3 depthwise, 1x1 project (+ residual)."""

    def __init__(self, in_ch: int, out_ch: int, expansion_ratio: int = 2) -> None:
        super().__init__()
        self.use_res_connect = in_ch == out_ch
        bottleneck = int(round(in_ch * expansion_ratio))
        layers: list[nn.Module] = []
        if expansion_ratio != 1:
            layers.append(ConvNormLReLU(in_ch, bottleneck, kernel_size=1, padding=0))
        layers += [
            ConvNormLReLU(bottleneck, bottleneck, groups=bottleneck, bias=True),
            nn.Conv2d(bottleneck, out_ch, kernel_size=1, padding=0, bias=False),
            nn.GroupNorm(num_groups=1, num_channels=out_ch, affine=True),
        ]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return x + out if self.use_res_connect else out


class Generator(nn.Module):
    """Maps an RGB batch in [-1, 1] (N, 3, H, W) to an anime-style batch of the same size."""

    def __init__(self) -> None:
        super().__init__()
        self.block_a = nn.Sequential(
            ConvNormLReLU(3, 32, kernel_size=7, padding=3),
            ConvNormLReLU(32, 64, stride=2, padding=(0, 1, 0, 1)),
            ConvNormLReLU(64, 64),
        )
        self.block_b = nn.Sequential(
            ConvNormLReLU(64, 128, stride=2, padding=(0, 1, 0, 1)),
            ConvNormLReLU(128, 128),
        )
        self.block_c = nn.Sequential(
            ConvNormLReLU(128, 128),
            InvertedResBlock(128, 256, 2),
            InvertedResBlock(256, 256, 2),
            InvertedResBlock(256, 256, 2),
            InvertedResBlock(256, 256, 2),
            ConvNormLReLU(256, 128),
        )
        self.block_d = nn.Sequential(
            ConvNormLReLU(128, 128),
            ConvNormLReLU(128, 128),
        )
        self.block_e = nn.Sequential(
            ConvNormLReLU(128, 64),
            ConvNormLReLU(64, 64),
            ConvNormLReLU(64, 32, kernel_size=7, padding=3),
        )
        self.out_layer = nn.Sequential(
            nn.Conv2d(32, 3, kernel_size=1, stride=1, padding=0, bias=False),
            nn.Tanh(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block_a(x)
        half_size = out.shape[-2:]
        out = self.block_c(self.block_b(out))
        out = F.interpolate(out, size=half_size, mode="bilinear", align_corners=True)
        out = self.block_d(out)
        out = F.interpolate(out, size=x.shape[-2:], mode="bilinear", align_corners=True)
        result: torch.Tensor = self.out_layer(self.block_e(out))
        return result
