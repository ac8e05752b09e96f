"""The generator is parameter-for-parameter compatible with the public PyTorch port.

The oracle here is independent of flask_animegan.runtime.generator: it lists the upstream
architecture (bryandlee/animegan2-pytorch ``model.py``) layer by layer, builds a
state dict with upstream's key names from that list, and computes the forward
pass with plain ``torch.nn.functional`` calls.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from flask_animegan import Generator, load_generator
from flask_animegan.runtime.generator import PARAMETER_COUNT
from flask_animegan.runtime.weights import WeightsError

# (key prefix, in channels, out channels, kernel, stride) of each ConvNormLReLU,
# and "irb" entries for InvertedResBlock(in, out, expansion 2).
UPSTREAM_LAYOUT = [
    ("block_a.0", 3, 32, 7, 1), ("block_a.1", 32, 64, 3, 2), ("block_a.2", 64, 64, 3, 1),
    ("block_b.0", 64, 128, 3, 2), ("block_b.1", 128, 128, 3, 1),
    ("block_c.0", 128, 128, 3, 1),
    ("irb", "block_c.1", 128, 256), ("irb", "block_c.2", 256, 256),
    ("irb", "block_c.3", 256, 256), ("irb", "block_c.4", 256, 256),
    ("block_c.5", 256, 128, 3, 1),
    ("block_d.0", 128, 128, 3, 1), ("block_d.1", 128, 128, 3, 1),
    ("block_e.0", 128, 64, 3, 1), ("block_e.1", 64, 64, 3, 1), ("block_e.2", 64, 32, 7, 1),
]


def upstream_shapes() -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}

    def conv_norm(prefix: str, cin: int, cout: int, k: int, groups: int = 1,
                  bias: bool = False) -> None:
        shapes[f"{prefix}.1.weight"] = (cout, cin // groups, k, k)
        if bias:
            shapes[f"{prefix}.1.bias"] = (cout,)
        shapes[f"{prefix}.2.weight"] = (cout,)
        shapes[f"{prefix}.2.bias"] = (cout,)

    for entry in UPSTREAM_LAYOUT:
        if entry[0] == "irb":
            _, prefix, cin, cout = entry
            mid = cin * 2
            conv_norm(f"{prefix}.layers.0", cin, mid, 1)
            conv_norm(f"{prefix}.layers.1", mid, mid, 3, groups=mid, bias=True)
            shapes[f"{prefix}.layers.2.weight"] = (cout, mid, 1, 1)
            shapes[f"{prefix}.layers.3.weight"] = (cout,)
            shapes[f"{prefix}.layers.3.bias"] = (cout,)
        else:
            prefix, cin, cout, k, _ = entry
            conv_norm(prefix, cin, cout, k)
    shapes["out_layer.0.weight"] = (3, 32, 1, 1)
    return shapes


def upstream_state_dict(seed: int) -> dict[str, torch.Tensor]:
    """Random weights with upstream's keys; norms get non-trivial scales and shifts."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in upstream_shapes().items():
        if len(shape) == 4:
            fan_in = shape[1] * shape[2] * shape[3]
            state[key] = torch.randn(shape, generator=gen) / fan_in ** 0.5
        elif key.endswith("weight"):
            state[key] = 1 + 0.2 * torch.randn(shape, generator=gen)
        else:
            state[key] = 0.1 * torch.randn(shape, generator=gen)
    return state


def oracle_forward(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    def conv_norm(prefix: str, x: torch.Tensor, k: int, stride: int, groups: int = 1):
        pad = (0, 1, 0, 1) if stride == 2 else (k // 2,) * 4
        x = F.pad(x, pad, mode="reflect")
        x = F.conv2d(x, state[f"{prefix}.1.weight"], state.get(f"{prefix}.1.bias"),
                     stride=stride, groups=groups)
        x = F.group_norm(x, 1, state[f"{prefix}.2.weight"], state[f"{prefix}.2.bias"])
        return F.leaky_relu(x, 0.2)

    def run(block: str, x: torch.Tensor) -> torch.Tensor:
        for entry in UPSTREAM_LAYOUT:
            if entry[0] == "irb" and entry[1].startswith(block):
                _, prefix, cin, cout = entry
                out = conv_norm(f"{prefix}.layers.0", x, 1, 1)
                out = conv_norm(f"{prefix}.layers.1", out, 3, 1, groups=cin * 2)
                out = F.conv2d(out, state[f"{prefix}.layers.2.weight"])
                out = F.group_norm(out, 1, state[f"{prefix}.layers.3.weight"],
                                   state[f"{prefix}.layers.3.bias"])
                x = x + out if cin == cout else out
            elif entry[0].startswith(block):
                prefix, _, _, k, stride = entry
                x = conv_norm(prefix, x, k, stride)
        return x

    out = run("block_a", x)
    half = out.shape[-2:]
    out = run("block_c", run("block_b", out))
    out = F.interpolate(out, size=half, mode="bilinear", align_corners=True)
    out = run("block_d", out)
    out = F.interpolate(out, size=x.shape[-2:], mode="bilinear", align_corners=True)
    out = run("block_e", out)
    return torch.tanh(F.conv2d(out, state["out_layer.0.weight"]))


def test_parameter_count_keys_and_shapes_match_upstream() -> None:
    model = Generator()
    shapes = upstream_shapes()
    assert sum(p.numel() for p in model.parameters()) == PARAMETER_COUNT == 2_143_552
    assert sum(torch.Size(s).numel() for s in shapes.values()) == PARAMETER_COUNT
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == shapes


@pytest.mark.parametrize("height,width", [(64, 64), (75, 101), (16, 40)])
def test_upstream_state_dict_loads_strictly_and_gives_the_same_output(height, width) -> None:
    state = upstream_state_dict(seed=3)
    model = Generator()
    model.load_state_dict(state, strict=True)
    model.eval()
    x = torch.rand(1, 3, height, width) * 2 - 1
    with torch.inference_mode():
        ours = model(x)
        theirs = oracle_forward(state, x)
    assert ours.shape == x.shape
    assert (ours - theirs).abs().max().item() < 1e-5


def test_state_dict_file_loads_with_weights_only(tmp_path) -> None:
    path = tmp_path / "upstream.pt"
    torch.save(upstream_state_dict(seed=4), path)
    model = load_generator(path)
    x = torch.rand(1, 3, 48, 48) * 2 - 1
    with torch.inference_mode():
        assert torch.allclose(model(x), oracle_forward(torch.load(path), x), atol=1e-5)


def test_fp16_state_dict_is_upcast(tmp_path) -> None:
    state = upstream_state_dict(seed=5)
    path = tmp_path / "half.pt"
    torch.save({k: v.half() for k, v in state.items()}, path)
    model = load_generator(path)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    x = torch.rand(1, 3, 32, 32) * 2 - 1
    with torch.inference_mode():
        expected = oracle_forward({k: v.half().float() for k, v in state.items()}, x)
        assert torch.allclose(model(x), expected, atol=1e-5)


@pytest.mark.parametrize("export", ["script", "trace"])
def test_torchscript_round_trip_gives_identical_output(tmp_path, export) -> None:
    model = Generator()
    model.load_state_dict(upstream_state_dict(seed=6))
    model.eval()
    example = torch.rand(1, 3, 64, 64) * 2 - 1
    with warnings.catch_warnings():
        # torch's own functional code trips the tracer's "tensor to bool" warning
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        scripted = (torch.jit.script(model) if export == "script"
                    else torch.jit.trace(model, example))
    path = tmp_path / "scripted.pt"
    torch.jit.save(scripted, str(path))
    loaded = load_generator(path)
    assert isinstance(loaded, torch.jit.ScriptModule)
    with torch.inference_mode():
        assert torch.equal(loaded(example), model(example))


def test_wrong_keys_or_shapes_name_the_file(tmp_path) -> None:
    state = upstream_state_dict(seed=7)
    missing = tmp_path / "missing.pt"
    torch.save({k: v for k, v in state.items() if not k.startswith("block_e")}, missing)
    with pytest.raises(WeightsError, match=r"missing\.pt.*missing"):
        load_generator(missing)
    reshaped = tmp_path / "reshaped.pt"
    torch.save({**state, "out_layer.0.weight": torch.zeros(3, 16, 1, 1)}, reshaped)
    with pytest.raises(WeightsError, match=r"reshaped\.pt.*wrong shape.*out_layer"):
        load_generator(reshaped)


@pytest.mark.parametrize("content", [b"", b"not a model at all", b"PK\x03\x04broken zip"])
def test_a_file_that_is_neither_kind_is_a_clear_error(tmp_path, content) -> None:
    path = tmp_path / "junk.pt"
    path.write_bytes(content)
    with pytest.raises(WeightsError, match=r"junk\.pt"):
        load_generator(path)


def test_a_pickle_with_code_is_refused(tmp_path) -> None:
    """weights_only=True: a file that would run code on load is rejected, not executed."""
    import os

    path = tmp_path / "evil.pt"
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"block_a.0.1.weight": Evil()}, path)
    with pytest.raises(WeightsError, match=r"evil\.pt"):
        load_generator(path)
    assert not marker.exists()
