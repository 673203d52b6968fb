"""Pooling (max, average, adaptive) against torch.nn.functional in float64, on drawn shapes and
windows; the GPU schedules run with GPU semantics on the CPU and build for sm_90 and gfx90a."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap import ops
from taskmap.backends.hip import hiprtc_available
from taskmap.errors import OpError
from taskmap.ir.func import FuncKind
from taskmap.testing import assert_close

FEW = settings(max_examples=6, deadline=None, derandomize=True)
RNG = np.random.default_rng(23)
SIDES = st.sampled_from([1, 2, 3, 5, 7, 8, 11, 13, 17, 20])


def _data(shape, dtype="float32"):
    t = torch.from_numpy(RNG.standard_normal(shape))
    return t.to(getattr(torch, dtype))


@st.composite
def windows(draw, dilation=True):
    """(input shape, kernel, stride, padding, dilation, ceil_mode) that torch accepts."""
    while True:
        batch = draw(st.sampled_from([(), (1,), (2,)]))
        shape = (*batch, draw(st.sampled_from([1, 3, 4])), draw(SIDES), draw(SIDES))
        k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
        s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
        d = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if dilation else (1, 1)
        ceil = draw(st.booleans())
        try:
            F.max_pool2d(torch.zeros(shape), k, s, p, d, ceil)
        except RuntimeError:
            continue
        return shape, k, s, p, d, ceil


@given(w=windows(), dtype=st.sampled_from(["float32", "float64", "float16"]))
@FEW
def test_max_pool2d(w, dtype):
    shape, k, s, p, d, ceil = w
    x = _data(shape, dtype)
    ref = F.max_pool2d(x.double(), k, s, p, d, ceil).to(x.dtype)
    assert_close(ops.max_pool2d(x, k, s, p, d, ceil), ref)
    if dtype == "float32":  # numpy in, numpy out
        assert_close(ops.max_pool2d(x.numpy(), k, s, p, d, ceil), ref.numpy())


@given(w=windows(dilation=False), include_pad=st.booleans(), divisor=st.sampled_from([None, None, 3]),
       dtype=st.sampled_from(["float32", "float64", "bfloat16"]))
@FEW
def test_avg_pool2d(w, include_pad, divisor, dtype):
    shape, k, s, p, _, ceil = w
    x = _data(shape, dtype)
    ref = F.avg_pool2d(x.double(), k, s, p, ceil, include_pad, divisor).to(x.dtype)
    assert_close(ops.avg_pool2d(x, k, s, p, ceil, include_pad, divisor), ref)


@given(shape=st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 3]), SIDES, SIDES),
       out=st.one_of(st.integers(1, 6), st.tuples(st.one_of(st.none(), st.integers(1, 6)), st.integers(1, 6))),
       dtype=st.sampled_from(["float32", "float64"]))
@FEW
def test_adaptive_pools(shape, out, dtype):
    x = _data(shape, dtype)
    assert_close(ops.adaptive_avg_pool2d(x, out), F.adaptive_avg_pool2d(x.double(), out).to(x.dtype))
    assert_close(ops.adaptive_max_pool2d(x, out), F.adaptive_max_pool2d(x.double(), out).to(x.dtype))


def test_global_average_pool_and_resnet_stem():
    x = _data((2, 40, 7, 7))  # 80 planes: 5 blocks of 16
    assert_close(ops.adaptive_avg_pool2d(x, 1), F.adaptive_avg_pool2d(x.double(), 1).float())
    assert_close(ops.avg_pool2d(x, 7), F.avg_pool2d(x.double(), 7).float())
    assert_close(ops.adaptive_max_pool2d(x, (1, 1)), F.adaptive_max_pool2d(x.double(), 1).float())
    x = _data((1, 8, 112, 112))
    assert_close(ops.max_pool2d(x, 3, 2, 1), F.max_pool2d(x.double(), 3, 2, 1).float())
    x = _data((1, 2, 64, 70))  # few planes: rows of each plane in chunks over the cores
    assert_close(ops.max_pool2d(x, 3, 1, 1), F.max_pool2d(x.double(), 3, 1, 1).float())
    assert_close(ops.avg_pool2d(x, 9, 3, 4), F.avg_pool2d(x.double(), 9, 3, 4).float())  # 81 taps: per output


def test_nan_wins_a_max_and_empty_batches():
    x = _data((1, 2, 9, 9))
    x[0, 1, 4, 4] = float("nan")
    y = ops.max_pool2d(x, 3, 2, 1)
    assert torch.equal(torch.isnan(y), torch.isnan(F.max_pool2d(x, 3, 2, 1)))
    assert torch.isnan(ops.adaptive_max_pool2d(x, 1)[0, 1]).all()
    assert ops.max_pool2d(torch.zeros(0, 3, 8, 8), 2).shape == (0, 3, 4, 4)
    assert ops.adaptive_avg_pool2d(torch.zeros(2, 3, 8, 8), (0, 4)).shape == (2, 3, 0, 4)


@pytest.mark.parametrize("stride, pad", [(1, 1), (2, 1), (2, 0), (3, 1)])
def test_max_pool_fast_and_nan_paths_agree_with_torch(stride, pad):
    # The kernel scans each chunk's staged input for NaN and takes plain vector maxima when there
    # is none: chunks with and without NaN (and with infinities) in one call, bit for bit torch's
    x = _data((2, 5, 40, 37))
    x[0, 1, 7, 3] = float("nan")
    x[1, 4, 39, 36] = float("nan")
    x[0, 2, 20, :] = float("inf")
    x[1, 0, :, 0] = float("-inf")
    want = F.max_pool2d(x, 3, stride, pad)
    got = ops.max_pool2d(x, 3, stride, pad)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got).any()
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    clean = torch.nan_to_num(x, nan=0.0)
    assert torch.equal(ops.max_pool2d(clean, 3, stride, pad), F.max_pool2d(clean, 3, stride, pad))


@pytest.mark.parametrize("arch", ["sm_90", "gfx90a"])  # emulated; built with NVRTC / hipRTC (no GPU needed)
def test_gpu_schedules(arch):
    x = _data((2, 3, 13, 17))
    xd = x.double()
    with ops.emulate_gpu(arch) as emu:
        assert_close(ops.max_pool2d(x, 3, 2, 1, 2, True), F.max_pool2d(xd, 3, 2, 1, 2, True).float())
        assert_close(ops.avg_pool2d(x, (3, 2), 2, 1, True, False), F.avg_pool2d(xd, (3, 2), 2, 1, True, False).float())
        assert_close(ops.adaptive_avg_pool2d(x, (5, 4)), F.adaptive_avg_pool2d(xd, (5, 4)).float())
        assert_close(ops.adaptive_max_pool2d(x, 3), F.adaptive_max_pool2d(xd, 3).float())
        assert_close(ops.adaptive_avg_pool2d(x, 1), F.adaptive_avg_pool2d(xd, 1).float())  # a warp per plane
    names = {k.func.name for k in emu.kernels}
    assert {"max_pool2d_gpu", "avg_pool2d_gpu", "adaptive_avg_pool2d_gpu", "mean_gpu"} <= names
    for k in emu.kernels:
        assert k.func.kind is FuncKind.GPU_KERNEL
        if arch.startswith("gfx") and not hiprtc_available():
            continue  # the emulation ran; hipRTC (libamdhip64) is not installed to build the code object
        assert k.build("hip" if arch.startswith("gfx") else "cuda", arch=arch).binary[:4] == b"\x7fELF"


@pytest.mark.parametrize("call, message", [
    (lambda x: ops.max_pool2d(x[0, 0], 2), "3-d \\(C, H, W\\) or 4-d"),
    (lambda x: ops.max_pool2d(x[None], 2), "3-d \\(C, H, W\\) or 4-d"),
    (lambda x: ops.max_pool2d(x, 9), "too small"),
    (lambda x: ops.max_pool2d(x, 3, padding=2), "at most half of the kernel"),
    (lambda x: ops.avg_pool2d(x, 2, padding=(0, 2)), "at most half of the kernel"),
    (lambda x: ops.max_pool2d(x, 2, stride=0), "stride must be positive"),
    (lambda x: ops.avg_pool2d(x, 2, stride=(1, -1)), "stride must be positive"),
    (lambda x: ops.max_pool2d(x, 0), "kernel_size must be positive"),
    (lambda x: ops.max_pool2d(x, (2, 2, 2)), "one or two ints"),
    (lambda x: ops.max_pool2d(x, 2, dilation=0), "dilation must be positive"),
    (lambda x: ops.max_pool2d(x, 2, padding=-1), "padding must be non-negative"),
    (lambda x: ops.avg_pool2d(x, 2, divisor_override=0), "divisor_override"),
    (lambda x: ops.max_pool2d(x, 2, return_indices=True), "return_indices"),
    (lambda x: ops.adaptive_avg_pool2d(x, -1), "non-negative"),
    (lambda x: ops.adaptive_avg_pool2d(x, (1, 2, 3)), "one or two ints"),
    (lambda x: ops.adaptive_max_pool2d(x, 1.5), "one or two ints"),
    (lambda x: ops.max_pool2d(x.to(torch.int32), 2), "does not support dtype int32"),
    (lambda x: ops.avg_pool2d(torch.zeros(1, 0, 4, 4), 2), "non-empty"),
])
def test_bad_input(call, message):
    with pytest.raises(OpError, match=message):
        call(torch.zeros(1, 2, 8, 8))


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_repeated_calls_run_their_host_plan(lib):
    conv = (lambda a: a.numpy()) if lib == "numpy" else (lambda a: a)
    calls = [(lambda x: ops.max_pool2d(x, 3, 2, 1), lambda x: F.max_pool2d(x, 3, 2, 1)),
             (lambda x: ops.avg_pool2d(x, 2, 2, 0, True, False), lambda x: F.avg_pool2d(x, 2, 2, 0, True, False)),
             (lambda x: ops.adaptive_avg_pool2d(x, 1), lambda x: F.adaptive_avg_pool2d(x, 1)),
             (lambda x: ops.adaptive_max_pool2d(x, (3, 2)), lambda x: F.adaptive_max_pool2d(x, (3, 2)))]
    for ours, theirs in calls:
        for _ in range(3):  # the first call plans, the others run the plan on new data
            x = _data((2, 20, 11, 9))
            y = ours(conv(x))
            assert type(y) is type(conv(x))
            assert_close(y, conv(theirs(x.double()).float()), rtol=1e-5, atol=1e-6)
    with pytest.raises(OpError):  # a bad call like a planned one still fails its checks
        ops.max_pool2d(conv(_data((2, 20, 11, 9))), 3, 2, 2)


def test_taskmap_tensors_in_taskmap_tensors_out():
    x = _data((1, 2, 9, 9)).numpy()
    t = taskmap.tensor(x, device="cpu")
    y = ops.max_pool2d(t, 3, 2, 1)
    assert isinstance(y, taskmap.Tensor)
    assert_close(y.numpy(), F.max_pool2d(torch.from_numpy(x), 3, 2, 1))


@given(w=windows(), op=st.sampled_from(["max", "avg"]))
@settings(max_examples=4, deadline=None, derandomize=True)
def test_gpu_schedules_on_drawn_windows(w, op):
    shape, k, s, p, d, ceil = w
    x = _data(shape)
    with ops.emulate_gpu("sm_90"):
        if op == "max":
            assert_close(ops.max_pool2d(x, k, s, p, d, ceil), F.max_pool2d(x.double(), k, s, p, d, ceil).float())
        else:
            assert_close(ops.avg_pool2d(x, k, s, p, ceil), F.avg_pool2d(x.double(), k, s, p, ceil).float())
