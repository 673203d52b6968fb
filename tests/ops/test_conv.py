"""taskmap.ops.conv2d (implicit GEMM: img2col prologue + matmul template + bias epilogue, fused)
against torch.nn.functional.conv2d in float64 on drawn shapes (odd, prime, 1x1, strides,
dilations, groups, paddings); the GPU templates through emulate_gpu; errors."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap import ops
from taskmap.backends.hip import hiprtc_available
from taskmap.errors import OpError
from taskmap.testing import assert_close

torch = pytest.importorskip("torch")
FEW = settings(max_examples=12, deadline=None)
F = torch.nn.functional


def f32(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def reference(x, w, b, **kw):
    t = lambda v: None if v is None else torch.from_numpy(np.asarray(v, np.float64))  # noqa: E731
    return F.conv2d(t(x), t(w), t(b), **kw).numpy()


def close(out, ref, k, tol=1e-6):
    assert out.shape == ref.shape
    assert_close(np.asarray(out, np.float64), ref, rtol=10 * tol, atol=4 * tol * max(1.0, math.sqrt(k)) + tol)


@st.composite
def convs(draw):
    groups = draw(st.sampled_from([1, 1, 2]))
    cin = groups * draw(st.integers(1, 4))
    cout = groups * draw(st.integers(1, 5))
    kh, kw = draw(st.sampled_from([1, 2, 3, 5])), draw(st.sampled_from([1, 3]))
    stride = draw(st.sampled_from([1, 2, (2, 1)]))
    dilation = draw(st.sampled_from([1, 2]))
    padding = draw(st.sampled_from([0, 1, 2, (1, 0), "valid", "same"]))
    if padding == "same":
        stride = 1
    h, w = draw(st.integers(1, 13)), draw(st.integers(1, 17))
    n = draw(st.integers(1, 2))
    return dict(n=n, cin=cin, cout=cout, h=h, w=w, kh=kh, kw=kw, stride=stride, padding=padding,
                dilation=dilation, groups=groups, bias=draw(st.booleans()))


def run_case(c, seed=0):
    x = f32((c["n"], c["cin"], c["h"], c["w"]), seed)
    w = f32((c["cout"], c["cin"] // c["groups"], c["kh"], c["kw"]), seed + 1)
    b = f32((c["cout"],), seed + 2) if c["bias"] else None
    kw = dict(stride=c["stride"], padding=c["padding"], dilation=c["dilation"], groups=c["groups"])
    try:
        ref = reference(x, w, b, **kw)
    except RuntimeError:          # torch refuses it (output smaller than the kernel): so must we
        with pytest.raises(OpError, match="smaller than the dilated kernel"):
            ops.conv2d(x, w, b, **kw)
        return
    out = ops.conv2d(x, w, b, **kw)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    close(out, ref, c["cin"] // c["groups"] * c["kh"] * c["kw"])


@given(c=convs())
@FEW
def test_conv2d_matches_torch(c):
    run_case(c)


@pytest.mark.parametrize("case", [
    dict(n=1, cin=3, cout=8, h=23, w=19, kh=7, kw=7, stride=2, padding=3, dilation=1, groups=1, bias=True),
    dict(n=2, cin=6, cout=4, h=11, w=13, kh=1, kw=1, stride=1, padding=0, dilation=1, groups=2, bias=False),
    dict(n=1, cin=5, cout=7, h=17, w=17, kh=1, kw=1, stride=2, padding=0, dilation=1, groups=1, bias=True),
    dict(n=3, cin=4, cout=6, h=9, w=10, kh=3, kw=3, stride=2, padding=2, dilation=2, groups=2, bias=True),
    dict(n=1, cin=2, cout=3, h=8, w=8, kh=4, kw=2, stride=1, padding="same", dilation=1, groups=1, bias=True),
    dict(n=1, cin=64, cout=32, h=14, w=14, kh=3, kw=3, stride=1, padding=1, dilation=1, groups=1, bias=True),
], ids=["7x7s2", "pointwise-groups", "1x1s2", "s2d2g2", "same-even", "k576"])
def test_conv2d_fixed_cases(case):
    run_case(case, seed=3)


def test_unbatched_input_torch_tensors_and_depthwise():
    x, w, b = f32((3, 9, 7), 1), f32((5, 3, 3, 3), 2), f32((5,), 3)
    out = ops.conv2d(x, w, b, padding=1)
    assert out.shape == (5, 9, 7)
    close(out, reference(x[None], w, b, padding=1)[0], 27)
    t = ops.conv2d(torch.from_numpy(x[None]), torch.from_numpy(w), torch.from_numpy(b), stride=2)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    close(t.numpy(), reference(x[None], w, b, stride=2), 27)
    dw = f32((6, 1, 3, 3), 4)
    x6 = f32((1, 6, 8, 8), 5)
    close(ops.conv2d(x6, dw, None, padding=1, groups=6), reference(x6, dw, None, padding=1, groups=6), 9)


# ----------------------------------------------------------------------------- GPU templates (emulated)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", [
    dict(n=2, cin=4, cout=6, h=9, w=7, kh=3, kw=2, stride=2, padding=(1, 2), dilation=2, groups=2, bias=True),
    dict(n=1, cin=16, cout=8, h=8, w=8, kh=3, kw=3, stride=1, padding=1, dilation=1, groups=1, bias=False),
    dict(n=1, cin=8, cout=8, h=4, w=6, kh=1, kw=1, stride=1, padding=0, dilation=1, groups=1, bias=True),
], ids=["s2d2g2", "k144-aligned", "pointwise"])
def test_gpu_templates_emulated(dtype, case):
    tdt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(case["n"], case["cin"], case["h"], case["w"], generator=g).to(tdt) - 0.5
    w = torch.rand(case["cout"], case["cin"] // case["groups"], case["kh"], case["kw"], generator=g).to(tdt) - 0.5
    b = torch.rand(case["cout"], generator=g).to(tdt) if case["bias"] else None
    kw = dict(stride=case["stride"], padding=case["padding"], dilation=case["dilation"], groups=case["groups"])
    with ops.emulate_gpu("sm_90") as emu:
        out = ops.conv2d(x, w, b, **kw)
    assert out.dtype == tdt
    expect = F.conv2d(x.double(), w.double(), None if b is None else b.double(), **kw)
    k = case["cin"] // case["groups"] * case["kh"] * case["kw"]
    tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    close(out.double().numpy(), expect.numpy(), k, tol)
    assert [kk.__name__ for kk in emu.kernels] == ["matmul_simt" if dtype == "float32" else "matmul_tc"]
    assert emu.kernels[0].build("cuda", arch="sm_90").binary


def test_hip_emulation_and_build():
    x, w, b = f32((1, 3, 11, 13), 1), f32((5, 3, 3, 3), 2), f32((5,), 3)
    with ops.emulate_gpu("gfx90a") as emu:
        out = ops.conv2d(x, w, b, padding=1)
    close(out, reference(x, w, b, padding=1), 27)
    if hiprtc_available():
        assert emu.kernels[0].build("hip", arch="gfx90a").binary


# ----------------------------------------------------------------------------- errors


X, W = f32((1, 4, 8, 8), 1), f32((6, 4, 3, 3), 2)


@pytest.mark.parametrize("call,match", [
    (lambda: ops.conv2d(f32((8, 8), 0), W), r"expected a 3-d \(C, H, W\) or 4-d"),
    (lambda: ops.conv2d(X, f32((6, 4, 3), 0)), r"weight must be 4-d"),
    (lambda: ops.conv2d(X, f32((6, 3, 3, 3), 0)), r"expects 3 input channels .* the input has 4"),
    (lambda: ops.conv2d(X, f32((6, 2, 3, 3), 0), groups=3), r"4 channels are not divisible by groups=3"),
    (lambda: ops.conv2d(X, f32((5, 2, 3, 3), 0), groups=2), r"5 output channels must be a positive multiple"),
    (lambda: ops.conv2d(X, W, groups=0), r"groups must be a positive int"),
    (lambda: ops.conv2d(X, W, f32((5,), 0)), r"bias must have shape \(6,\)"),
    (lambda: ops.conv2d(X, W, stride=0), r"stride must be positive"),
    (lambda: ops.conv2d(X, W, stride=(1, 2, 3)), r"stride must be an int or a tuple of one or two ints"),
    (lambda: ops.conv2d(X, W, dilation=-1), r"dilation must be positive"),
    (lambda: ops.conv2d(X, W, padding=-1), r"padding must be non-negative"),
    (lambda: ops.conv2d(X, W, padding="full"), r"padding must be an int, a pair of ints, 'valid' or 'same'"),
    (lambda: ops.conv2d(X, W, stride=2, padding="same"), r"padding='same' is not supported for strided"),
    (lambda: ops.conv2d(f32((1, 4, 2, 2), 0), W), r"smaller than the dilated kernel"),
    (lambda: ops.conv2d(X, W.astype(np.float64)), r"must have one dtype"),
    (lambda: ops.conv2d(X.astype(np.float16), W.astype(np.float16)), r"on the CPU supports float32 only"),
    (lambda: ops.conv2d(X.astype(np.int32), W), r"does not support dtype int32"),
    (lambda: ops.conv2d(X, f32((6, 4, 0, 3), 0)), r"the kernel must be non-empty"),
], ids=["rank", "weight-rank", "channels", "groups-cin", "groups-cout", "groups-zero", "bias", "stride",
        "stride-len", "dilation", "padding", "padding-str", "same-strided", "too-small", "mixed-dtypes", "f16-cpu",
        "int", "empty-kernel"])
def test_errors(call, match):
    with pytest.raises(OpError, match=match):
        call()
