"""The depthwise kernel with the channels in the lanes (taskmap.templates.window_chan): numerics
against torch in float64 (whole and partial blocks of channels, strides, dilation, padding, with
and without a bias, 16 and 8 lanes, one and two cores, planes in bands of rows and rows in
segments), where the window template offers and takes it, and compiled blocks whose depthwise
conv + BatchNorm + SiLU, or ConvNeXt's 7x7 depthwise conv, runs on it."""
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
from taskmap.templates.window import WINDOW, WindowProblem, output_size
from taskmap.templates import window_chan
from taskmap.templates.window_chan import CHAN_STACK_BYTES, TILE_REGISTERS, ChanConfig, build_kernel, fits
from taskmap.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.models.cnn_defs import compile_block  # noqa: E402

CPU = host_cpu_target()


def _config(n, c, hw, k, s, p, d=1, bias=True, lanes=16, cores=CPU.num_cores, w=None):
    w = hw if w is None else w
    oh, ow = output_size(hw, k, s, p, p, d), output_size(w, k, s, p, p, d)
    return ChanConfig(n, c, hw, w, oh, ow, k, k, s, s, p, p, d, d, bias, lanes, cores)


def _run(cfg, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((cfg.n, cfg.c, cfg.h, cfg.w)).astype(np.float32)
    w = rng.standard_normal((cfg.c, cfg.kh * cfg.kw)).astype(np.float32)
    b = rng.standard_normal(cfg.c).astype(np.float32)
    y = np.full((cfg.n, cfg.c, cfg.oh, cfg.ow), np.nan, np.float32)
    build_kernel(cfg)(*([x, w, b, y] if cfg.bias else [x, w, y]))
    ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double().reshape(cfg.c, 1, cfg.kh, cfg.kw),
                   torch.from_numpy(b).double() if cfg.bias else None, (cfg.sh, cfg.sw), (cfg.ph, cfg.pw),
                   (cfg.dh, cfg.dw), cfg.c).numpy()
    assert_close(y, ref, rtol=1e-5, atol=1e-5 * cfg.kh * cfg.kw)


@pytest.mark.parametrize("n, c, hw, k, s, p, d", [
    (1, 1152, 7, 5, 1, 2, 1),        # EfficientNet-B0's 7x7 layers: whole blocks of 16 channels
    (1, 960, 7, 3, 1, 1, 1),         # MobileNetV2's (9 taps: short of a transposed block)
    (2, 672, 14, 5, 2, 2, 1),        # stride 2 to 7x7, two images
    (3, 20, 7, 3, 1, 1, 1),          # a partial block of channels (20 = 16 + 4), three images
    (1, 5, 9, 5, 2, 1, 2),           # fewer channels than lanes, dilation 2, less padding than the window
    (2, 40, 13, 3, 2, 0, 1),         # no padding: input rows and columns past the frame unused
    (1, 24, 4, 3, 1, 3, 1),          # padding wider than the image
])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch(n, c, hw, k, s, p, d, bias):
    _run(_config(n, c, hw, k, s, p, d, bias))


@pytest.mark.parametrize("n, c, hw, k, s, p, d", [
    (1, 96, 56, 7, 1, 3, 1),         # ConvNeXt-T's first stage: bands of 8 rows, rows in two segments of 28
    (2, 20, 40, 7, 1, 3, 1),         # bands, two images, a partial block of channels
    (1, 40, 40, 3, 2, 0, 1),         # a frame narrower than the image: staged through the pixel-major copy
    (1, 16, 35, 3, 1, 1, 1),         # rows of 35: two segments of 18, the last overlapping
    (1, 24, 112, 3, 1, 1, 1),        # MobileNetV2's first depthwise plane: bands of 5 rows
])
@pytest.mark.parametrize("channels_last", [False, True])
def test_bands_and_segments_match_torch(n, c, hw, k, s, p, d, channels_last):
    """... also with the stores pixel by pixel (``channels_last``: the same values, in another
    order)."""
    cfg = dataclasses.replace(_config(n, c, hw, k, s, p, d), channels_last=channels_last)
    assert cfg.bands > 1 or cfg.seg < cfg.ow
    _run(cfg)


@pytest.mark.parametrize("n, c, hw, k, s, p, lanes", [
    (1, 33, 23, 5, 2, 2, 16),        # stride 2: bands' frames overlap by three rows
    (2, 40, 40, 3, 2, 0, 16),        # the pixel-major copy in bands
    (1, 17, 30, 7, 1, 3, 8),         # 8 lanes: segments of at most 14 pixels
])
def test_small_budget_bands_match_torch(monkeypatch, n, c, hw, k, s, p, lanes):
    """A small stack budget: bands of a few rows (the first and last padded, the middle ones
    not), with and without a bias."""
    monkeypatch.setattr(window_chan, "CHAN_STACK_BYTES", 24 * 1024)
    for bias in (True, False):
        cfg = _config(n, c, hw, k, s, p, bias=bias, lanes=lanes)
        assert cfg.bands >= 3 and cfg.bands == -(-cfg.oh // cfg.band), cfg
        _run(cfg, seed=int(bias))


@pytest.mark.parametrize("lanes, cores", [(8, 1), (8, 2), (16, 1)])
def test_eight_lanes_and_one_core(lanes, cores):
    """AVX2's 8 lanes (4 x 4-pixel output rows) and a single core."""
    _run(_config(2, 27, 8, 3, 2, 1, lanes=lanes, cores=cores), seed=lanes + cores)
    _run(_config(1, 16, 5, 5, 1, 2, lanes=lanes, cores=cores, w=3), seed=cores)


def test_bands_and_segments_fit_the_budget_and_the_registers():
    """A plane runs in bands of rows when its staging exceeds the stack budget (bands evened
    out), and rows wider than the register tile in segments of at most its pixels."""
    whole = _config(1, 1152, 7, 5, 1, 2)
    assert whole.bands == 1 and whole.seg == 7 and whole.stack_bytes <= CHAN_STACK_BYTES
    for cfg in (_config(1, 96, 56, 7, 1, 3), _config(1, 32, 112, 3, 1, 1), _config(1, 16, 35, 3, 1, 1)):
        assert fits(cfg) and cfg.bands > 1 and cfg.stack_bytes <= CHAN_STACK_BYTES, cfg
        assert cfg.band * (cfg.bands - 1) < cfg.oh <= cfg.band * cfg.bands
        assert cfg.seg <= TILE_REGISTERS[16] and cfg.seg * -(-cfg.ow // cfg.seg) >= cfg.ow
    assert _config(1, 96, 56, 7, 1, 3).seg == 28 and _config(1, 16, 35, 3, 1, 1).seg == 18
    assert _config(1, 16, 31, 1, 1, 0, lanes=8).seg == 11                  # 31 pixels: three tiles of 8 lanes
    assert not fits(_config(1, 16, 3000, 7, 1, 3))                         # one row's frame is past the budget


def _problem(c, hw, k=3, s=1, n=1, mult=1, op="conv", dtype="float32"):
    p = k // 2
    o = output_size(hw, k, s, p, p, 1)
    return WindowProblem(op, n, c, hw, hw, o, o, k, k, s, s, p, p, 1, 1, mult=mult, dtype=dtype, bias=op == "conv")


def _best(problem, target=CPU):
    return min(WINDOW.space(problem, target), key=lambda sc: WINDOW.cost(problem, target, sc))


@pytest.mark.skipif(CPU.vector_bytes < 64, reason="the space's 512-bit rates: AVX-512 hosts")
def test_offered_for_f32_depthwise_and_taken_for_large_windows():
    """Offered for every f32 depthwise convolution; ranked first at stride 2 to 7x7 outputs on Zen
    4's, Zen 5's and the Xeon's 512-bit rates, and for 5x5 windows at 7x7 where 512-bit operations
    issue whole.  On Zen 4's rate (measured there, two cores, isolated, side by side with the
    others' best): for 7x7 windows from 56x56 down to 7x7 (ConvNeXt-T's: 96 channels at 56x56
    199 us against the row kernel's 338, 192 at 28x28 114 / 174, 384 at 14x14 53 / 96), for 5x5
    windows at stride 1 (EfficientNet-B0's 240 at 28x28 75 / 91, 672 at 14x14 57 / 64, 1152 at
    7x7 27.5-28 against the plane kernel's 29-30); not for 3x3 windows at stride 1 from 14x14 up
    (the row kernel: 144 at 56x56 75 against 109, 384 at 14x14 17 / 19).  Pooling, channel
    multipliers and half floats: not offered."""
    for rate in (1.0, 1.75, 2.0):
        target = dataclasses.replace(CPU, fma512_per_cycle=rate)
        problems = [_problem(672, 14, 5, 2), _problem(96, 14, 5, 2, n=2)]
        if rate >= 1.5:
            problems += [_problem(1152, 7, 5), _problem(1152, 7, 5, n=8)]
        for problem in problems:
            assert _best(problem, target).get("chan"), (rate, problem)
    zen4 = dataclasses.replace(CPU, fma512_per_cycle=1.0)
    for problem in (_problem(96, 56, 7), _problem(192, 28, 7), _problem(384, 14, 7), _problem(768, 7, 7),
                    _problem(240, 28, 5), _problem(672, 14, 5), _problem(1152, 7, 5)):
        assert _best(problem, zen4).get("chan"), problem
    for problem in (_problem(144, 56), _problem(192, 28), _problem(384, 14), _problem(32, 112)):
        best = _best(problem, zen4)
        assert not best.get("chan") and not best.get("plane"), problem
    chan = lambda problem: any(sc.get("chan") for sc in WINDOW.space(problem, CPU))
    assert chan(_problem(384, 14)) and chan(_problem(32, 112)) and chan(_problem(96, 56, 7))
    assert not chan(_problem(64, 7, op="max")) and not chan(_problem(32, 7, mult=2))
    assert not chan(_problem(64, 7, dtype="float16"))


def test_ops_depthwise_runs_it():
    """``taskmap.ops.depthwise_conv2d`` at stride 2 to a 7x7 image takes the channel kernel (AVX-512
    hosts) and matches torch, with and without a bias."""
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.standard_normal((2, 48, 14, 14)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((48, 1, 5, 5)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(48).astype(np.float32))
    for bias in (b, None):
        ref = F.conv2d(x.double(), w.double(), None if bias is None else bias.double(), 2, 2, 1, 48).float()
        assert_close(ops.depthwise_conv2d(x, w, bias, 2, 2), ref, rtol=1e-5, atol=3e-4)


class _Block(nn.Module):
    def __init__(self, c=96, k=5):
        super().__init__()
        self.dw = nn.Conv2d(c, c, k, 2, k // 2, groups=c, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.dw(x))) * 0.5


@pytest.mark.skipif(CPU.vector_bytes < 64, reason="the 7x7 rows fill half of 16 lanes: AVX-512 hosts")
def test_compiled_block_fuses_bn_silu_and_scale_into_its_stores():
    torch.manual_seed(1)
    out, ref, kernels = compile_block(_Block(), torch.randn(2, 96, 14, 14))
    assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert kernels == [["depthwise_conv2d_cpu_chan"]]


class _ConvNextBlock(nn.Module):
    """ConvNeXt's block: a 7x7 depthwise conv, channels last for a LayerNorm and the two linears,
    a layer scale, back to channels first and the residual."""

    def __init__(self, c=48):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.pw2(F.gelu(self.pw1(y))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


@pytest.mark.skipif(CPU.vector_bytes < 64, reason="the space's 512-bit rates: AVX-512 hosts")
def test_compiled_convnext_block_runs_its_depthwise_conv_in_bands():
    """A 40x40 plane of 48 channels (bands of rows, rows in two segments): the compiled block
    matches eager, and its depthwise conv is the channel kernel storing channels-last (the
    permute spliced into its stores), then the LayerNorm and the two linears (the second with
    the layer scale, the permute back and the residual)."""
    torch.manual_seed(2)
    out, ref, kernels = compile_block(_ConvNextBlock(), torch.randn(1, 48, 40, 40))
    assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert kernels == [["depthwise_conv2d_cpu_chan_nhwc"], ["layer_norm_cpu"], ["matmul_cpu"], ["matmul_cpu"]]


def test_channels_last_only_before_a_permute_to_nhwc():
    """The graph lowering plans a convolution ``channels_last`` when its epilogue's first op past
    the element-wise ones is a permute to NHWC, or a flattening of the image's rows followed by a
    transpose of the channels last (Swin's patch embedding), and only then."""
    from taskmap.graph.lower_anchor import reads_channels_last

    class _T:
        def __init__(self, shape):
            self.shape = shape

    class _Op:
        def __init__(self, kind, category, dims=None, shapes=((), ())):
            self.kind, self.definition, self.attrs = kind, type("D", (), {"category": category}), \
                type("A", (), {"dims": dims})
            self.inputs, self.output = [_T(shapes[0])], _T(shapes[1])

    from taskmap.graph.kinds import OpCategory, OpKind
    scale = _Op(OpKind.BINARY, OpCategory.BROADCAST)
    nhwc, nwhc = _Op(OpKind.PERMUTE, OpCategory.INJECTIVE, (0, 2, 3, 1)), _Op(OpKind.PERMUTE, OpCategory.INJECTIVE,
                                                                            (0, 3, 2, 1))
    assert reads_channels_last([nhwc]) and reads_channels_last([scale, nhwc])
    assert not reads_channels_last([]) and not reads_channels_last([scale]) and not reads_channels_last([nwhc])
    rows = _Op(OpKind.RESHAPE, OpCategory.INJECTIVE, shapes=((1, 96, 56, 56), (1, 96, 3136)))
    other = _Op(OpKind.RESHAPE, OpCategory.INJECTIVE, shapes=((1, 96, 56, 56), (1, 96 * 56, 56)))
    tokens, swap = _Op(OpKind.PERMUTE, OpCategory.INJECTIVE, (0, 2, 1)), _Op(OpKind.PERMUTE, OpCategory.INJECTIVE,
                                                                          (1, 0, 2))
    assert reads_channels_last([rows, tokens]) and reads_channels_last([scale, rows, tokens])
    assert not reads_channels_last([rows, nhwc]) and not reads_channels_last([other, tokens])
    assert not reads_channels_last([rows, swap]) and not reads_channels_last([rows])
