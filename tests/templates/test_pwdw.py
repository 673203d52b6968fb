"""The fused pointwise + depthwise convolution template (``pwdw_cpu``): every point of its space
against PyTorch in float64 on drawn shapes, windows, strides, paddings and activations; the
bands (a core's scratch in half its L2, units for every core); arguments viewed, not copied."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from taskmap.backends.base import host_cpu_target
from taskmap.schedule.worker import build_candidate
from taskmap.templates.attention_cpu import l2_per_core
from taskmap.templates.pwdw_cpu import PWDW_CPU, PwDwProblem, band_rows
from taskmap.testing import assert_close

RNG = np.random.default_rng(7)
ACTS = {"none": lambda t: t, "relu": torch.relu, "relu6": F.relu6, "hardswish": F.hardswish, "silu": F.silu}


def reference(p, x, w1, b1, wd, bd):
    d = [torch.from_numpy(a).double() for a in (x, w1, b1, wd, bd)]
    e = ACTS[p.act](F.conv2d(d[0], d[1].reshape(p.cexp, p.cin, 1, 1), d[2]))
    e = F.pad(e, (p.pl, p.pr, p.pt, p.pb))
    return F.conv2d(e, d[3].reshape(p.cexp, 1, p.kh, p.kw), d[4], (p.sh, p.sw), groups=p.cexp).float().numpy()


def run(p, schedule):
    x, w1, b1, wd, bd = (RNG.standard_normal(s).astype(np.float32) for s, _ in p.input_specs())
    y = np.full((p.n, p.cexp, p.oh, p.ow), np.nan, np.float32)
    target = host_cpu_target()
    kernel = build_candidate(PWDW_CPU, p, target, schedule)
    kernel(*PWDW_CPU.arguments(p, [x, w1, b1, wd, bd], [y], schedule=schedule, target=target))
    return y, reference(p, x, w1, b1, wd, bd)


@st.composite
def problems(draw):
    n, cin, cexp = draw(st.sampled_from([1, 2])), draw(st.integers(1, 24)), draw(st.integers(1, 40))
    h, w = draw(st.integers(2, 40)), draw(st.integers(4, 40))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pt, pb, pl, pr = (draw(st.integers(0, 2)) for _ in range(4))
    p = PwDwProblem(n, cin, h, w, cexp, kh, kw, sh, sw, pt, pb, pl, pr, draw(st.sampled_from(sorted(ACTS))))
    return p


@given(p=problems())
@settings(max_examples=25, deadline=None, derandomize=True)
def test_every_schedule_matches_torch(p):
    target = host_cpu_target()
    assume(p.oh >= 1 and p.ow >= 1)
    assert PWDW_CPU.applies(p, target) == (p.h * p.w >= 16)
    assume(p.h * p.w >= 16)
    for schedule in PWDW_CPU.space(p, target):
        got, want = run(p, schedule)
        assert_close(got, want, rtol=1e-4, atol=1e-4 * (p.cin + p.kh * p.kw))


@pytest.mark.parametrize("p", [
    PwDwProblem(1, 16, 112, 112, 96, 3, 3, 2, 2, 1, 1, 1, 1, "relu6"),     # MobileNetV2's block 2
    PwDwProblem(1, 24, 56, 56, 144, 3, 3, 1, 1, 1, 1, 1, 1, "relu6"),
    PwDwProblem(1, 40, 28, 28, 240, 5, 5, 2, 2, 2, 2, 2, 2, "hardswish"),  # MobileNetV3 / EfficientNet
])
def test_model_blocks(p):
    schedule = min(PWDW_CPU.space(p, host_cpu_target()), key=lambda s: PWDW_CPU.cost(p, host_cpu_target(), s))
    got, want = run(p, schedule)
    assert_close(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("p", [
    PwDwProblem(1, 16, 112, 112, 96, 3, 3, 2, 2, 1, 1, 1, 1, "relu6"),
    PwDwProblem(1, 160, 7, 7, 960, 3, 3, 1, 1, 1, 1, 1, 1, "relu6"),
    PwDwProblem(4, 8, 9, 9, 24, 3, 3, 1, 1, 1, 1, 1, 1, "relu"),
])
def test_bands_fit_l2_and_feed_every_core(p):
    target = host_cpu_target()
    for s in PWDW_CPU.space(p, target):
        cfg = PWDW_CPU.config(p, target, s)
        assert cfg.rows == band_rows(p, s["mr"], s["nr"], cfg.lanes, s["cores"], l2_per_core(target))
        units = p.n * cfg.bands * -(-p.cexp // s["mr"])
        fits = cfg.per_core * 4 <= l2_per_core(target) // 2 and units >= 2 * s["cores"]
        halved = PWDW_CPU.config(p, target, s).__class__(**{**cfg.__dict__, "rows": -(-cfg.rows // 2)})
        assert fits or cfg.rows == 1 or halved.min_band_pixels < s["nr"]     # halving stops there
        assert s["nr"] <= cfg.min_band_pixels        # whole pixel tiles in every band
        assert cfg.workspace == s["cores"] * cfg.per_core


def test_arguments_are_views():
    p = PwDwProblem(1, 4, 8, 8, 12, 3, 3, 1, 1, 1, 1, 1, 1, "relu")
    x, w1, b1, wd, bd = (np.zeros(s, np.float32) for s, _ in p.input_specs())
    y = np.zeros((1, 12, 8, 8), np.float32)
    args = PWDW_CPU.arguments(p, [x, w1.reshape(12, 4, 1, 1), b1, wd.reshape(12, 1, 3, 3), bd], [y])
    assert args[0].shape == (1, 4, 64) and np.shares_memory(args[0], x)
    assert args[1].shape == (12, 4) and args[3].shape == (12, 9) and args[5] is y


@pytest.mark.parametrize("p", [
    PwDwProblem(1, 3, 2, 8, 5, 1, 1, 2, 1, 0, 0, 0, 0, "relu"),      # one row read: 8 pixels, a 16-pixel tile
    PwDwProblem(2, 3, 4, 5, 13, 3, 3, 1, 1, 1, 1, 1, 1, "relu6"),
])
def test_bands_shorter_than_a_tile_are_masked(p):
    for schedule in PWDW_CPU.space(p, host_cpu_target()):
        got, want = run(p, schedule)
        assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_images_under_a_vector_are_not_taken():
    target = host_cpu_target()
    p = PwDwProblem(1, 4, 2, 3, 8, 3, 3, 1, 1, 1, 1, 1, 1, "relu")
    assert not PWDW_CPU.applies(p, target) and PWDW_CPU.space(p, target) == []


def test_windows_of_more_taps_than_are_unrolled_are_not_taken():
    """The depthwise taps are unrolled: a 1 x 65 window is left to the two kernels."""
    target = host_cpu_target()
    assert PWDW_CPU.applies(PwDwProblem(1, 4, 4, 80, 8, 1, 64, 1, 1, 0, 0, 32, 31, "relu"), target)
    assert not PWDW_CPU.applies(PwDwProblem(1, 4, 4, 80, 8, 1, 65, 1, 1, 0, 0, 32, 32, "relu"), target)


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("p", [
    PwDwProblem(1, 5, 9, 12, 20, 3, 3, 1, 2, 1, 1, 1, 1, "none"),
    PwDwProblem(2, 3, 4, 5, 13, 3, 3, 1, 1, 1, 1, 1, 1, "none"),        # masked tiles (bands under a tile)
])
def test_every_activation_at_the_stores(p, act):
    """The activation is applied as the expansion's tile is stored, whole tiles and masked ones."""
    p = PwDwProblem(**{**p.__dict__, "act": act})
    for schedule in PWDW_CPU.space(p, host_cpu_target()):
        got, want = run(p, schedule)
        assert_close(got, want, rtol=1e-4, atol=1e-4 * (p.cin + p.kh * p.kw))
