"""A 1x1 convolution feeding a depthwise one, lowered to ONE kernel (taskmap.graph.lower_pwdw):
MobileNet-style blocks compiled from PyTorch against eager, the launches counted; the pair is
kept as two kernels where it does not qualify (the expanded tensor read twice or returned, an
activation the kernel lacks (GELU), an image's expanded tensor too small, ``TASKMAP_FUSE_PWDW=0``).
Whether an image's expanded tensor is big enough depends on the machine's L2
(:func:`taskmap.templates.pwdw_cpu.worth_fusing`): the images here are sized from it."""
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import taskmap
from taskmap.backends.base import host_cpu_target
from taskmap.templates.pwdw_cpu import MAX_FUSED_CIN, worth_fusing
from taskmap.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.models.cnn_defs import mobilenet_v2, randomize_bn


class Block(nn.Module):
    """Expansion (1x1 conv, BN, activation), depthwise conv (BN, ReLU6), projection."""

    def __init__(self, cin=8, cexp=192, k=3, stride=1, act=nn.ReLU6, bn=True, extra=None):
        super().__init__()
        norm = nn.BatchNorm2d if bn else (lambda c: nn.Identity())
        self.expand = nn.Sequential(nn.Conv2d(cin, cexp, 1, bias=not bn), norm(cexp), act())
        self.dw = nn.Sequential(nn.Conv2d(cexp, cexp, k, stride, k // 2, groups=cexp, bias=not bn), norm(cexp),
                                nn.ReLU6())
        self.project = nn.Conv2d(cexp, cin, 1)
        self.extra = extra

    def forward(self, x):
        e = self.expand(x)
        y = self.project(self.dw(e))
        if self.extra == "reuse":          # the expanded tensor read twice
            return y, e.mean()
        return y


def compiled_steps(model, x):
    fast = taskmap.compile(model, (x,))
    with torch.no_grad():
        want = model(x)
    got = fast(x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert_close(g, w, rtol=1e-4, atol=1e-4)
    return [s.name for e in fast.entries.values() for s in e.compiled.steps]


def fused(names):
    return [n for n in names if n.count("conv2d") == 2]


def fusing_side(cexp, least=28):
    """The smallest image side (a multiple of 4, at least ``least``) whose expanded tensor of
    ``cexp`` channels this machine fuses."""
    side = least
    while not worth_fusing(cexp * side * side * 4, 8, host_cpu_target()):
        side = max(side + 4, 4 * math.ceil(side * 1.2 / 4))
    return side


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("act", [nn.ReLU6, nn.ReLU, nn.Hardswish, nn.SiLU])
def test_block_is_one_kernel_less(stride, act):
    torch.manual_seed(0)
    model = randomize_bn(Block(stride=stride, act=act)).eval()
    side = fusing_side(192)
    names = compiled_steps(model, torch.randn(1, 8, side, side))
    assert len(names) == 2 and len(fused(names)) == 1          # (expand + depthwise), projection
    assert names[0].count("unary") == 2                       # both activations inside


def test_five_by_five_without_batch_norm():
    torch.manual_seed(0)
    model = Block(cin=6, cexp=160, k=5, stride=2, bn=False).eval()       # the convs' own biases
    side = fusing_side(160, 32)
    names = compiled_steps(model, torch.randn(2, 6, side, side))
    assert len(fused(names)) == 1


def test_no_bias_at_all():
    torch.manual_seed(0)
    model = Block(cin=6, cexp=160, k=3, bn=False).eval()
    for conv in (model.expand[0], model.dw[0]):
        conv.bias = None
    side = fusing_side(160, 32)
    assert len(fused(compiled_steps(model, torch.randn(1, 6, side, side)))) == 1


@pytest.mark.parametrize("why", ["reuse", "gelu", "small", "small-images", "env", "wide-input"])
def test_pairs_that_stay_two_kernels(why, monkeypatch):
    """Not fused: the expansion read elsewhere too, an activation the kernel lacks, images whose
    expanded tensor fits L2, the switch off, a pointwise of more than ``MAX_FUSED_CIN`` input
    channels (Xception's separable layers: a GEMM the matmul template runs faster)."""
    torch.manual_seed(0)
    if why == "env":
        monkeypatch.setenv("TASKMAP_FUSE_PWDW", "0")
    cin = MAX_FUSED_CIN + 16 if why == "wide-input" else 8
    model = Block(cin=cin, act=nn.GELU if why == "gelu" else nn.ReLU6, extra="reuse" if why == "reuse" else None)
    side = {"small": 8, "small-images": 14}.get(why, fusing_side(192))     # 8x8x192: 48 KB
    x = torch.randn(8 if why == "small-images" else 1, cin, side, side)    # 8 x 150 KB: small per image
    names = compiled_steps(randomize_bn(model).eval(), x)
    assert not fused(names)


def test_mobilenet_v2_launches():
    """The pairs whose expanded tensors this machine fuses are one kernel each: with 1 MB of L2 a
    core the six at 112x112 .. 28x28 (0.6-4.8 MB), with 2 MB the three at 112x112 and 56x56; the
    14x14 and 7x7 ones (0.19-0.45 MB) stay two kernels."""
    pairs = [(96, 112)] + [(144, 56)] * 2 + [(192, 28)] * 3 + [(384, 14)] * 4 + [(576, 14)] * 3 + [(960, 7)] * 3
    want = sum(worth_fusing(c * hw * hw * 4, c // 6, host_cpu_target()) for c, hw in pairs)
    assert want >= 1 and not worth_fusing(576 * 14 * 14 * 4, 96, host_cpu_target())
    torch.manual_seed(0)
    names = compiled_steps(mobilenet_v2().eval(), torch.randn(1, 3, 224, 224))
    assert len(fused(names)) == want and len(names) == 54 - want


def test_debug_output_names_the_pairs(monkeypatch, capsys):
    monkeypatch.setenv("TASKMAP_DEBUG", "groups")
    torch.manual_seed(0)
    side = fusing_side(192)
    compiled_steps(randomize_bn(Block()).eval(), torch.randn(1, 8, side, side))
    assert "fused 1x1 + depthwise pairs" in capsys.readouterr().err
