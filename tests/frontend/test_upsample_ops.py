"""Upsampling the frontend composes from taskmap ops (``ops_upsample.py``): ``interpolate`` /
``nn.Upsample`` to any size or scale in every mode it supports, and ``conv_transpose2d`` over
strides, paddings (cropping ones too), output paddings, groups and dilations — against eager
PyTorch on random inputs."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_composite_ops import Fn, check, x4

import taskmap
from taskmap.errors import UnsupportedOpsError


@given(h=st.integers(1, 13), w=st.integers(1, 13), oh=st.integers(1, 29), ow=st.integers(1, 29),
       mode=st.sampled_from(["nearest", "nearest-exact", "bilinear", "bilinear_ac", "bicubic", "bicubic_ac", "area"]))
@settings(max_examples=40, deadline=None)
def test_interpolate_to_any_size(h, w, oh, ow, mode):
    x = torch.randn(2, 3, h, w)
    kwargs = {"mode": mode[:-3], "align_corners": True} if mode.endswith("_ac") else {"mode": mode}
    check(Fn(lambda t: F.interpolate(t, size=(oh, ow), **kwargs)), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [2, 3, 0.5, 1.7, (2, 1.5)])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bicubic"])
def test_interpolate_by_scale_factor(scale, mode):
    check(Fn(lambda t: F.interpolate(t, scale_factor=scale, mode=mode)), x4, atol=1e-5)
    check(Fn(lambda t: F.interpolate(t, scale_factor=scale, mode=mode, recompute_scale_factor=True)), x4, atol=1e-5)


def test_upsample_modules_linear_and_trilinear():
    check(nn.Upsample(scale_factor=2), x4)
    check(nn.Upsample(size=(5, 20), mode="bilinear"), x4, atol=1e-5)
    check(nn.UpsamplingBilinear2d(scale_factor=2), x4, atol=1e-5)
    check(nn.UpsamplingNearest2d(size=7), x4)
    check(Fn(lambda t: F.interpolate(t, scale_factor=2.5, mode="linear")), torch.randn(2, 3, 7), atol=1e-5)
    check(Fn(lambda t: F.interpolate(t, size=4, mode="area")), torch.randn(2, 3, 11), atol=1e-6)
    check(Fn(lambda t: F.interpolate(t, scale_factor=2, mode="area")), torch.randn(2, 3, 5), atol=1e-6)
    check(Fn(lambda t: F.interpolate(t, size=(3, 4, 5), mode="trilinear")), torch.randn(1, 2, 4, 3, 6), atol=1e-5)


def test_nearest_upsampling_by_an_integer_factor_is_a_broadcast():
    # a 2x nearest upsample, then a 3x3 conv: the upsample is the conv's prologue, no gather
    m = nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(6, 4, 3, padding=1))
    fast = check(m, x4, rtol=1e-4, atol=1e-5)
    entry = fast._entry(fast._bind((x4,), {}))
    assert not any(op.kind.name == "GATHER" for op in entry.imported.graph.ops)


def test_unsupported_interpolation_is_named():
    with pytest.raises(UnsupportedOpsError) as e:
        taskmap.compile(Fn(lambda t: F.interpolate(t, scale_factor=2, mode="bicubic", antialias=True)), x4,
                        progress=False)
    assert "antialias" in str(e.value)
    with pytest.raises(UnsupportedOpsError) as e:
        taskmap.compile(Fn(lambda t: F.interpolate(t, scale_factor=2, mode="area")), torch.randn(1, 2, 3, 4, 5),
                        progress=False)
    assert "interpolate(mode='area') of a 5-d tensor" in str(e.value)


@pytest.mark.parametrize("cin, cout, k, s, p, op, g, d", [
    (4, 6, 3, 2, 1, 1, 1, 1), (4, 6, 4, 2, 1, 0, 2, 1), (3, 5, 3, 1, 0, 0, 1, 1), (4, 4, 3, 3, 2, 2, 4, 1),
    (2, 3, 5, 2, 4, 1, 1, 2), (6, 4, 2, 2, 0, 0, 2, 1), (3, 3, 1, 2, 0, 1, 1, 1), (3, 2, 3, 2, 3, 0, 1, 1),
    (4, 6, 2, 2, 0, 0, 1, 1), (3, 5, 3, 3, 0, 0, 1, 1), (5, 4, 1, 1, 0, 0, 1, 1),     # stride = kernel: 1x1 convs
])
def test_conv_transpose2d(cin, cout, k, s, p, op, g, d):
    m = nn.ConvTranspose2d(cin, cout, k, s, p, op, g, True, d)
    fast = check(m, torch.randn(2, cin, 7, 9), rtol=1e-4, atol=1e-5)
    w = torch.randn(cin, cout // g, k, k)
    check(Fn(lambda t: F.conv_transpose2d(t, w, None, s, p, op, g, d)), torch.randn(1, cin, 5, 6), rtol=1e-4, atol=1e-5)
    entry = fast._entry(fast._bind((torch.randn(2, cin, 7, 9),), {}))
    pads = [op_ for op_ in entry.imported.graph.ops if op_.kind.name == "PAD"]
    assert bool(pads) == bool(s != k or p or op or g > 1 or d > 1)     # no zeros inserted where windows do not overlap


def test_unet_style_decoder():
    dec = nn.Sequential(nn.ConvTranspose2d(8, 4, 2, 2), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Upsample(scale_factor=2, mode="bilinear"), nn.Conv2d(4, 3, 3, padding=1))
    with torch.no_grad():
        dec[1].running_mean.copy_(torch.randn(4))
        dec[1].running_var.copy_(torch.rand(4) + 0.5)
    check(dec, torch.randn(2, 8, 5, 6), rtol=1e-4, atol=1e-5)
