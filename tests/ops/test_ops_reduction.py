"""Reductions, softmax and the norms against numpy / torch on drawn shapes and axes."""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap import ops
from taskmap.testing import assert_close, shapes

FEW = settings(max_examples=12, deadline=None)
RNG = np.random.default_rng(17)


def _data(shape, dtype=np.float32):
    return np.asarray(RNG.uniform(-2, 2, shape)).astype(dtype)


@st.composite
def shape_and_axes(draw, min_dims=1):
    shape = draw(shapes(min_dims=min_dims, max_dims=4, max_side=40, max_elements=1 << 13))
    kind = draw(st.sampled_from(["none", "one", "many"]))
    if kind == "none":
        return shape, None
    if kind == "one":
        return shape, draw(st.integers(-len(shape), len(shape) - 1))
    axes = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True))
    return shape, tuple(axes)


@given(sa=shape_and_axes(), op=st.sampled_from(["sum", "mean", "max", "min"]), keepdim=st.booleans(),
       dtype=st.sampled_from(["float32", "float64"]))
@FEW
def test_reductions(sa, op, keepdim, dtype):
    shape, axis = sa
    x = _data(shape, dtype)
    y = getattr(ops, op)(x, axis, keepdim=keepdim)
    ref = getattr(np, op)(x.astype(np.float64), axis=axis, keepdims=keepdim)
    assert y.shape == np.shape(ref) and y.dtype == x.dtype
    assert_close(y, ref.astype(dtype), rtol=1e-5, atol=1e-5 * np.sqrt(x.size))


@given(sa=shape_and_axes(), unbiased=st.booleans())
@FEW
def test_var(sa, unbiased):
    shape, axis = sa
    x = _data(shape)
    y = ops.var(x, axis, unbiased=unbiased)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = x.astype(np.float64).var(axis=axis, ddof=int(unbiased))
    assert_close(y, ref.astype(np.float32), rtol=1e-4, atol=1e-5)
    assert_close(ops.var(x, axis, correction=0), x.astype(np.float64).var(axis=axis), rtol=1e-4, atol=1e-5)


def test_dim_keyword_prod_and_integer_sums():
    x = _data((3, 4, 5))
    assert_close(ops.sum(x, dim=(0, 2)), x.sum((0, 2)), rtol=1e-5, atol=1e-5)
    assert_close(ops.amax(x, dim=1), x.max(1))
    assert_close(ops.prod(x, 2), x.prod(2), rtol=1e-5)
    i = RNG.integers(-2**30, 2**30, (6, 50)).astype(np.int32)
    s = ops.sum(i, 1)
    assert s.dtype == np.int64 and np.array_equal(s, i.astype(np.int64).sum(1))
    assert np.array_equal(ops.max(i, 0), i.max(0)) and ops.max(i).dtype == np.int32
    b = RNG.random((4, 9)) < 0.3
    assert np.array_equal(ops.sum(b, 1), b.sum(1)) and ops.sum(b).dtype == np.int64
    assert ops.max(b, 1).dtype == np.bool_ and np.array_equal(ops.max(b, 1), b.max(1))


def test_nan_and_empty_axes():
    x = _data((3, 8))
    x[1, 3] = np.nan
    assert np.isnan(ops.max(x, 1)[1]) and np.isnan(ops.min(x, 1)[1]) and not np.isnan(ops.max(x, 1)[0])
    e = np.zeros((3, 0), np.float32)
    assert ops.sum(e, 1).tolist() == [0, 0, 0] and ops.prod(e, 1).tolist() == [1, 1, 1]
    assert np.isnan(ops.mean(e, 1)).all() and ops.sum(e, 0).shape == (0,)
    with pytest.raises(taskmap.errors.OpError, match="empty"):
        ops.max(e, 1)


@given(shape=shapes(min_dims=1, max_dims=4, max_side=64, max_elements=1 << 13), data=st.data(),
       log=st.booleans())
@FEW
def test_softmax(shape, data, log):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = torch.from_numpy(_data(shape) * 4)
    y = (ops.log_softmax if log else ops.softmax)(x, axis)
    ref = (torch.log_softmax if log else torch.softmax)(x.double(), axis).float()
    assert isinstance(y, torch.Tensor) and y.shape == x.shape
    assert_close(y, ref, rtol=1e-5, atol=1e-6)


def test_softmax_is_stable_and_keeps_dtypes():
    x = np.array([[1000.0, 1001.0, 999.0], [-1e4, 0.0, -np.inf]], np.float32)
    assert_close(ops.softmax(x), torch.softmax(torch.from_numpy(x), -1))
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        t = torch.randn(7, 130, dtype=dt)
        y = ops.softmax(t, dim=-1)
        assert y.dtype == dt
        assert_close(y, torch.softmax(t.double(), -1).to(dt))
    assert float(ops.softmax(np.array(3.0, np.float32))) == 1.0


@given(shape=shapes(min_dims=1, max_dims=3, max_side=100, max_elements=1 << 13), data=st.data(),
       affine=st.booleans())
@FEW
def test_layer_norm(shape, data, affine):
    k = data.draw(st.integers(1, len(shape)))
    ns = shape[len(shape) - k:]
    x = torch.from_numpy(_data(shape))
    w = torch.randn(ns) if affine else None
    b = torch.randn(ns) if affine and data.draw(st.booleans()) else None
    y = ops.layer_norm(x, ns, w, b, eps=1e-5)
    # atol: rows of nearly equal values divide f32 rounding of x - mean by sqrt(eps) = 0.003
    assert_close(y, F.layer_norm(x.double(), ns, None if w is None else w.double(), None if b is None else b.double(),
                                 1e-5).float(), rtol=1e-4, atol=1e-4 * (1 if w is None else 4))


@given(shape=shapes(min_dims=1, max_dims=3, max_side=100, max_elements=1 << 13), affine=st.booleans())
@FEW
def test_rms_norm(shape, affine):
    x = torch.from_numpy(_data(shape))
    w = torch.randn(shape[-1:]) if affine else None
    y = ops.rms_norm(x, shape[-1:], w, eps=1e-6)
    assert_close(y, F.rms_norm(x.double(), shape[-1:], None if w is None else w.double(), 1e-6).float(),
                 rtol=1e-4, atol=1e-4)
    if affine:
        assert_close(ops.rms_norm(x, weight=w), F.rms_norm(x, shape[-1:], w), rtol=1e-4, atol=1e-5)


def test_norms_in_low_precision():
    for dt in (torch.float16, torch.bfloat16):
        x = torch.randn(9, 257, dtype=dt)
        w, b = torch.randn(257, dtype=dt), torch.randn(257, dtype=dt)
        assert_close(ops.layer_norm(x, (257,), w, b), F.layer_norm(x.float(), (257,), w.float(), b.float()).to(dt))
        assert_close(ops.rms_norm(x, (257,), w), F.rms_norm(x.float(), (257,), w.float()).to(dt))


def test_numpy_in_numpy_out_and_tensor_in_tensor_out():
    x = _data((5, 6))
    assert isinstance(ops.softmax(x), np.ndarray)
    t = taskmap.tensor(x, device="cpu")
    y = ops.layer_norm(t, (6,))
    assert isinstance(y, taskmap.Tensor)
    assert_close(y.numpy(), F.layer_norm(torch.from_numpy(x), (6,)), rtol=1e-4, atol=1e-5)


def test_few_long_rows_are_reduced_in_two_stages():
    x = _data((2, 1 << 16))
    with ops.emulate_gpu("sm_90") as emu:
        assert_close(ops.sum(x, 1), x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-3)
        assert_close(ops.mean(x), x.astype(np.float64).mean(), rtol=1e-5, atol=1e-6)
        assert_close(ops.max(x, 1), x.max(1))
    assert len(emu.kernels) == 6  # each: chunks of rows, then the partial results
    p = (1 + x[0] * 1e-5).astype(np.float32)
    assert_close(ops.prod(p), np.prod(p.astype(np.float64)), rtol=2e-3)  # 65536 roundings in f32
    h = _data((1 << 16,), np.float16)
    assert_close(ops.sum(h), h.astype(np.float64).sum(), rtol=1e-3, atol=1.0)  # partial sums kept in f32
    odd = _data((1, 65537))  # a prime length: one stage
    assert_close(ops.sum(odd), odd.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)
