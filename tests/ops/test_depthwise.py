"""Depthwise convolution against torch.nn.functional.conv2d(groups=C) in float64, on drawn shapes,
windows, strides, paddings, dilations and channel multipliers; the GPU schedule runs with GPU
semantics on the CPU and builds for sm_90 and gfx90a."""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap import ops
from taskmap.ops import _dispatch
from taskmap.backends.hip import hiprtc_available
from taskmap.errors import OpError
from taskmap.ir.func import FuncKind
from taskmap.templates.window import WINDOW, WindowProblem, output_size
from taskmap.testing import assert_close

FEW = settings(max_examples=10, deadline=None, derandomize=True)
RNG = np.random.default_rng(29)


def _data(shape, dtype="float32"):
    return torch.from_numpy(RNG.standard_normal(shape)).to(getattr(torch, dtype))


@st.composite
def convs(draw):
    while True:
        batch = draw(st.sampled_from([(), (1,), (3,)]))
        c = draw(st.sampled_from([1, 2, 5]))
        shape = (*batch, c, draw(st.sampled_from([1, 3, 7, 8, 13, 16, 19, 33])), draw(st.sampled_from([1, 2, 5, 11, 16, 17, 40])))
        k = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
        s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        p = draw(st.one_of(st.tuples(st.integers(0, 3), st.integers(0, 3)), st.just("same"), st.just("valid")))
        d = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        if p == "same":
            s = (1, 1)
        mult = draw(st.sampled_from([1, 1, 2]))
        try:
            with warnings.catch_warnings():  # 'same' with an even kernel: torch warns of a padded copy
                warnings.simplefilter("ignore", UserWarning)
                F.conv2d(torch.zeros(shape), torch.zeros(c * mult, 1, *k), None, s, p, d, c)
        except RuntimeError:
            continue
        return shape, c * mult, k, s, p, d


@given(conv=convs(), bias=st.booleans(), dtype=st.sampled_from(["float32", "float32", "float64", "float16"]))
@FEW
def test_depthwise_conv2d(conv, bias, dtype):
    shape, c_out, k, s, p, d = conv
    x, w = _data(shape, dtype), _data((c_out, 1, *k), dtype)
    b = _data((c_out,), dtype) if bias else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ref = F.conv2d(x.double(), w.double(), None if b is None else b.double(), s, p, d, shape[-3]).to(x.dtype)
    taps = k[0] * k[1]
    rtol, atol = {"float32": (1e-5, 1e-5 * taps), "float64": (1e-12, 1e-12 * taps), "float16": (1e-2, 2e-3 * taps)}[dtype]
    y = ops.depthwise_conv2d(x, w, b, s, p, d)
    assert y.dtype == x.dtype
    assert_close(y, ref, rtol=rtol, atol=atol)


def test_mobilenet_layers_and_numpy():
    for c, size, stride in ((8, 112, 1), (8, 112, 2), (2, 64, 1), (24, 7, 1)):  # D1, D2, D9-like; row chunks
        x, w, b = _data((1, c, size, size)), _data((c, 1, 3, 3)), _data((c,))
        ref = F.conv2d(x.double(), w.double(), b.double(), stride, 1, 1, c).float()
        assert_close(ops.depthwise_conv2d(x, w, b, stride, 1), ref, atol=1e-4)
    x, w = _data((2, 3, 10, 9)).numpy(), _data((6, 1, 3, 3)).numpy()
    y = ops.depthwise_conv2d(x, w, None, 2, 1)
    assert isinstance(y, np.ndarray)
    assert_close(y, F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), None, 2, 1, 1, 3).numpy(),
                 atol=1e-5)


def test_bfloat16():
    x, w, b = _data((2, 4, 12, 9), "bfloat16"), _data((4, 1, 3, 3), "bfloat16"), _data((4,), "bfloat16")
    ref = F.conv2d(x.double(), w.double(), b.double(), 1, 1, 1, 4).to(torch.bfloat16)
    assert_close(ops.depthwise_conv2d(x, w, b, 1, 1), ref, atol=0.05)


def test_cpu_kernel_vectorizes_along_the_row():
    p = WindowProblem("conv", 1, 8, 20, 40, output_size(20, 3, 2, 1, 1, 1), output_size(40, 3, 2, 1, 1, 1),
                      3, 3, 2, 2, 1, 1)
    from taskmap.backends.base import host_cpu_target
    target = host_cpu_target()
    src = repr(WINDOW.instantiate(p, target, WINDOW.space(p, target)[0]).module)
    assert "vectorize" in src and "buf" in src  # staged rows, lanes along the output row


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_repeated_calls_run_their_host_plan(lib):
    conv = (lambda a: a.numpy()) if lib == "numpy" else (lambda a: a)
    for bias in (True, False):
        for _ in range(3):  # the first call plans, the others run the plan on new data
            x, w, b = _data((2, 24, 9, 9)), _data((48, 1, 3, 3)), _data((48,))
            y = ops.depthwise_conv2d(conv(x), conv(w), conv(b) if bias else None, 2, 1)
            assert type(y) is type(conv(x)) and tuple(y.shape) == (2, 48, 5, 5)
            ref = F.conv2d(x.double(), w.double(), b.double() if bias else None, 2, 1, 1, 24).float()
            assert_close(y, conv(ref), rtol=1e-5, atol=1e-5)
    x, w = _data((2, 24, 9, 9)), _data((48, 1, 3, 3))
    assert _dispatch.host_plan(("depthwise_conv2d", 2, 1, 1), conv(x), conv(w))[0] is not None
    with pytest.raises(OpError, match="weight must have shape"):  # checks still run on new shapes
        ops.depthwise_conv2d(conv(x), conv(w[:47]), None, 2, 1)


def test_conv2d_with_groups_equal_channels_plans_the_depthwise_route():
    """conv2d(groups=C) remembers a plan that goes straight to depthwise_conv2d's own."""
    for _ in range(3):
        x, w, b = _data((1, 16, 7, 7)), _data((16, 1, 3, 3)), _data((16,))
        y = ops.conv2d(x.numpy(), w.numpy(), b.numpy(), 1, 1, 1, 16)
        assert_close(y, F.conv2d(x.double(), w.double(), b.double(), 1, 1, 1, 16).float().numpy(), rtol=1e-5, atol=1e-5)
    assert _dispatch.host_plan(("conv2d", 1, 1, 1, 16), x.numpy(), w.numpy(), b.numpy())[0] is not None


@pytest.mark.parametrize("arch", ["sm_90", "gfx90a"])  # emulated; built with NVRTC / hipRTC (no GPU needed)
def test_gpu_schedule(arch):
    x, w, b = _data((2, 3, 11, 14)), _data((6, 1, 3, 2)), _data((6,))
    ref = F.conv2d(x.double(), w.double(), b.double(), (2, 1), (1, 0), (1, 2), 3).float()
    with ops.emulate_gpu(arch) as emu:
        assert_close(ops.depthwise_conv2d(x, w, b, (2, 1), (1, 0), (1, 2)), ref)
    (k,) = emu.kernels
    assert k.func.kind is FuncKind.GPU_KERNEL and "threadIdx" in repr(k.module)
    if not (arch.startswith("gfx") and not hiprtc_available()):  # hipRTC (libamdhip64) may be missing
        assert k.build("hip" if arch.startswith("gfx") else "cuda", arch=arch).binary[:4] == b"\x7fELF"


@pytest.mark.parametrize("call, message", [
    (lambda x, w: ops.depthwise_conv2d(x[0, 0], w), "3-d \\(C, H, W\\) or 4-d"),
    (lambda x, w: ops.depthwise_conv2d(x, w[:, :, 0]), "weight must have shape"),
    (lambda x, w: ops.depthwise_conv2d(x, torch.zeros(3, 1, 3, 3)), "weight must have shape"),
    (lambda x, w: ops.depthwise_conv2d(x, torch.zeros(2, 2, 3, 3)), "weight must have shape"),
    (lambda x, w: ops.depthwise_conv2d(x, w, torch.zeros(3)), "bias must have shape"),
    (lambda x, w: ops.depthwise_conv2d(x, w.double()), "one dtype"),
    (lambda x, w: ops.depthwise_conv2d(x, torch.zeros(2, 1, 9, 3)), "smaller than the dilated kernel"),
    (lambda x, w: ops.depthwise_conv2d(x, w, dilation=4), "smaller than the dilated kernel"),
    (lambda x, w: ops.depthwise_conv2d(x, w, stride=0), "stride must be positive"),
    (lambda x, w: ops.depthwise_conv2d(x, w, stride=(1, -2)), "stride must be positive"),
    (lambda x, w: ops.depthwise_conv2d(x, w, padding=-1), "padding must be non-negative"),
    (lambda x, w: ops.depthwise_conv2d(x, w, padding="full"), "'valid' or 'same'"),
    (lambda x, w: ops.depthwise_conv2d(x, w, stride=2, padding="same"), "strided"),
    (lambda x, w: ops.depthwise_conv2d(x.to(torch.int64), w.to(torch.int64)), "does not support dtype int64"),
    (lambda x, w: ops.depthwise_conv2d(x, 3), "must be an array"),
])
def test_bad_input(call, message):
    with pytest.raises(OpError, match=message):
        call(torch.zeros(1, 2, 8, 8), torch.zeros(2, 1, 3, 3))


@given(conv=convs())
@settings(max_examples=4, deadline=None, derandomize=True)
def test_gpu_schedule_on_drawn_convolutions(conv):
    shape, c_out, k, s, p, d = conv
    x, w, b = _data(shape), _data((c_out, 1, *k)), _data((c_out,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ref = F.conv2d(x.double(), w.double(), b.double(), s, p, d, shape[-3]).float()
    with ops.emulate_gpu("sm_90"):
        assert_close(ops.depthwise_conv2d(x, w, b, s, p, d), ref, atol=1e-5 * k[0] * k[1])
