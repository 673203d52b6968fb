"""The depthwise kernel with a whole plane in the lanes (taskmap.templates.window_plane): numerics
against torch in float64 (planes of whole and partial vectors, windows up to the image's width,
dilation, two images, with and without a bias, 16 and 8 lanes, one and two cores, odd channel
counts over the cores), infinities at the image's edges (the column masks are ANDs, never
products), where the window template offers and takes it, and a compiled block whose depthwise
conv + BatchNorm + ReLU6 + residual runs on it as one kernel."""
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskmap import ops
from taskmap.backends.base import host_cpu_target
from taskmap.templates.window import WINDOW, WindowProblem
from taskmap.templates.window_plane import PlaneConfig, build_kernel, fits
from taskmap.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.models.cnn_defs import compile_block  # noqa: E402

CPU = host_cpu_target()


def _config(n, c, hw, k, d=1, bias=True, lanes=16, cores=CPU.num_cores, w=None, registers=32):
    w = hw if w is None else w
    p = (k - 1) * d // 2
    return PlaneConfig(n, c, hw, w, k, k, p, p, d, d, bias, lanes, cores, registers)


def _reference(cfg, x, w, b):
    return F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double().reshape(cfg.c, 1, cfg.kh, cfg.kw),
                    torch.from_numpy(b).double() if cfg.bias else None, 1, (cfg.ph, cfg.pw), (cfg.dh, cfg.dw),
                    cfg.c).numpy()


def _run(cfg, seed=0, x=None):
    rng = np.random.default_rng(seed)
    if x is None:
        x = rng.standard_normal((cfg.n, cfg.c, cfg.h, cfg.w)).astype(np.float32)
    w = rng.standard_normal((cfg.c, cfg.kh * cfg.kw)).astype(np.float32)
    b = rng.standard_normal(cfg.c).astype(np.float32)
    y = np.full(x.shape, np.nan, np.float32)
    build_kernel(cfg)(*([x, w, b, y] if cfg.bias else [x, w, y]))
    return y, _reference(cfg, x, w, b)


@pytest.mark.parametrize("n, c, hw, k, d, w", [
    (1, 960, 7, 3, 1, None),         # MobileNetV2's 7x7 layers: 49 of 64 lanes
    (1, 1152, 7, 5, 1, None),        # EfficientNet-B0's
    (1, 384, 10, 3, 1, None),        # 10x10: 7 vectors of 16
    (2, 37, 11, 5, 1, None),         # two images, channels split unevenly over the cores
    (1, 6, 9, 3, 2, None),           # dilation 2
    (3, 5, 4, 3, 1, None),           # a plane shorter than a vector
    (1, 7, 5, 5, 1, None),           # a window as wide as the image: the shifts reach a whole row
    (1, 9, 6, 3, 1, 10),             # a wide plane, rows not a multiple of anything
    (1, 1, 12, 3, 1, None),          # one channel: one core idles; 144 lanes, whole vectors
    (1, 8, 2, 3, 1, None),           # planes under one vector (EfficientNet at 64x64: 2x2, 3x3)
    (2, 5, 3, 3, 1, None),
])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch(n, c, hw, k, d, w, bias):
    cfg = _config(n, c, hw, k, d, bias, w=w)
    assert fits(cfg), cfg
    y, ref = _run(cfg)
    assert_close(y, ref, rtol=1e-5, atol=1e-5 * cfg.kh * cfg.kw)


@pytest.mark.parametrize("lanes, cores", [(8, 1), (8, 2), (16, 1)])
def test_eight_lanes_and_one_core(lanes, cores):
    for cfg in (_config(2, 27, 7, 3, lanes=lanes, cores=cores), _config(1, 16, 5, 5, lanes=lanes, cores=cores, w=8)):
        y, ref = _run(cfg, seed=lanes + cores)
        assert_close(y, ref, rtol=1e-5, atol=1e-5 * cfg.kh * cfg.kw)


def test_infinities_at_the_edges_stay_in_their_windows():
    """An infinity in the last or first column of a row is only in the windows that cover it: the
    lanes whose shifted load wraps onto it (the next or previous row's far side) read a masked zero,
    not ``inf * 0`` (NaN)."""
    cfg = _config(1, 3, 7, 3)
    x = np.random.default_rng(1).standard_normal((1, 3, 7, 7)).astype(np.float32)
    x[0, 0, 2, 6] = np.inf
    x[0, 1, 4, 0] = -np.inf
    x[0, 2, 0, 6] = np.inf
    y, ref = _run(cfg, x=x)
    assert np.isinf(ref).sum() >= 12 and not np.isnan(ref).any()
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


def test_fits_the_registers_and_same_size_windows():
    assert fits(_config(1, 1152, 7, 5)) and fits(_config(1, 8, 9, 3, lanes=8))    # 11 vectors of 8
    assert not fits(_config(1, 8, 9, 3, lanes=8, registers=12))       # ... but not in 12 registers
    assert not fits(_config(1, 672, 14, 5)) and not fits(_config(1, 32, 28, 3))   # 13, 49 vectors
    assert not fits(dataclasses.replace(_config(1, 8, 7, 3), pw=0))   # a narrower output
    assert not fits(_config(1, 8, 3, 7))                              # padding past the image


def _problem(c, hw, k=3, s=1, n=1, mult=1, op="conv", dtype="float32"):
    p = k // 2
    o = (hw + 2 * p - k) // s + 1
    return WindowProblem(op, n, c, hw, hw, o, o, k, k, s, s, p, p, 1, 1, mult=mult, dtype=dtype, bias=op == "conv")


def _best(problem, target=CPU):
    return min(WINDOW.space(problem, target), key=lambda sc: WINDOW.cost(problem, target, sc))


@pytest.mark.skipif(CPU.vector_bytes < 64, reason="the space's 512-bit rates: AVX-512 hosts")
def test_offered_at_stride_one_and_taken_for_small_planes():
    """Offered for f32 depthwise convolutions at stride 1 keeping the image's size on planes of at
    most 12 vectors; ranked first for MobileNetV2's 7x7 layers on every 512-bit rate — measured on
    Zen 4 (two cores, isolated, side by side): 960 channels 3x3 at 7x7 11.0-11.2 us against the
    channel kernel's 13.6-13.8 and the row kernel's 26.  (5x5 windows there go to the channel
    kernel: test_window_chan.py.)"""
    for rate in (1.0, 1.75, 2.0):
        target = dataclasses.replace(CPU, fma512_per_cycle=rate)
        for problem in (_problem(960, 7), _problem(960, 7, n=8)):
            assert _best(problem, target).get("plane"), (rate, problem)
    plane = lambda problem: any(sc.get("plane") for sc in WINDOW.space(problem, CPU))
    assert plane(_problem(64, 10)) and plane(_problem(672, 7, 5))
    assert not plane(_problem(576, 14)) and not plane(_problem(576, 14, s=2)) and not plane(_problem(32, 112))
    assert not plane(_problem(64, 7, op="max")) and not plane(_problem(32, 7, mult=2))
    assert not plane(_problem(64, 7, dtype="float16"))


def _kernel_of(problem):
    return WINDOW.instantiate(problem, CPU, _best(problem)).module.entry_function.name


@pytest.mark.skipif(CPU.vector_bytes < 64, reason="the space's 512-bit rates: AVX-512 hosts")
def test_ops_depthwise_runs_it():
    """``taskmap.ops.depthwise_conv2d`` on a 7x7 image of many channels takes the plane kernel and
    matches torch, with and without a bias."""
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.standard_normal((1, 960, 7, 7)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((960, 1, 3, 3)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(960).astype(np.float32))
    assert "plane" in _kernel_of(_problem(960, 7))
    for bias in (b, None):
        ref = F.conv2d(x.double(), w.double(), None if bias is None else bias.double(), 1, 1, 1, 960).float()
        assert_close(ops.depthwise_conv2d(x, w, bias, 1, 1), ref, rtol=1e-5, atol=1e-4)


class _Block(nn.Module):
    def __init__(self, c=960):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = nn.ReLU6()

    def forward(self, x):
        return self.act(self.bn(self.dw(x))) + x


@pytest.mark.skipif(CPU.vector_bytes < 64, reason="the space's 512-bit rates: AVX-512 hosts")
def test_compiled_block_fuses_bn_relu6_and_residual_into_its_stores():
    torch.manual_seed(1)
    out, ref, kernels = compile_block(_Block(), torch.randn(1, 960, 7, 7))
    assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert kernels == [["depthwise_conv2d_cpu_plane"]]
