"""Scatter-style writes — ``ops.scatter`` / ``scatter_reduce`` / ``index_copy`` / ``index_add`` —
against torch on hypothesis-drawn shapes, axes, reductions and dtypes; the frontend's scatter,
``index_put`` and item assignment through index tensors and masks in compiled models (both entry
points); and clear errors (out-of-range indices are reported, never written)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap import ops
from taskmap.errors import OpError, UnsupportedError
from taskmap.testing import shapes

RNG = np.random.default_rng(29)
REDUCES = [None, "sum", "prod", "amax", "amin", "mean"]


def _values(shape, dtype, reduce):
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    if dtype.startswith("int"):
        return RNG.integers(-9, 10, shape).astype(dtype)
    if reduce == "prod":                          # products of a few values near 1 stay finite
        return (RNG.uniform(0.5, 1.5, shape) * RNG.choice([-1, 1], shape)).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def _index(xshape, ishape, dim, unique):
    """Indices into ``xshape[dim]`` of shape ``ishape``; ``unique``: no column repeats a position
    (plain scatter: which of two writes wins is torch's to choose)."""
    n = xshape[dim]
    if not unique:
        return RNG.integers(0, n, ishape)
    keys = RNG.random(ishape[:dim] + (n,) + ishape[dim + 1:]).argsort(axis=dim)
    return np.take(keys, np.arange(ishape[dim]), axis=dim)


@given(shape=shapes(min_dims=1, max_dims=4, max_side=12, max_elements=1 << 11), data=st.data(),
       dtype=st.sampled_from(["float32", "float64", "int32", "int64", "bool"]),
       reduce=st.sampled_from(REDUCES), include_self=st.booleans(), index_dtype=st.sampled_from(["int32", "int64"]))
@settings(max_examples=60, deadline=None)
def test_scatter_matches_torch(shape, data, dtype, reduce, include_self, index_dtype):
    if dtype == "bool" and reduce == "mean":
        reduce = "amax"
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = dim % len(shape)
    # index: at most x outside dim (any size along it; a plain scatter's positions distinct), src at least index
    ishape = tuple(data.draw(st.integers(1, n)) if k != d else
                   data.draw(st.integers(1, n if reduce is None else 2 * n)) for k, n in enumerate(shape))
    sshape = tuple(i + data.draw(st.integers(0, 2)) for i in ishape)
    x, src = _values(shape, dtype, reduce), _values(sshape, dtype, reduce)
    index = _index(shape, ishape, d, reduce is None).astype(index_dtype)
    tx, ti, ts = (torch.from_numpy(np.ascontiguousarray(a)) for a in (x, index, src))
    if reduce is None:
        want = tx.scatter(dim, ti.long(), ts)
        got = ops.scatter(x, dim, index, src)
    else:
        want = tx.scatter_reduce(dim, ti.long(), ts, reduce, include_self=include_self)
        got = ops.scatter_reduce(x, dim, index, src, reduce, include_self)
    assert got.dtype == x.dtype and got.shape == x.shape
    if dtype.startswith("float"):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want.numpy())


def test_repeated_positions_and_nan():
    """A position written twice keeps the last value (torch on the CPU); amax / amin keep a NaN;
    an integer mean rounds down (torch's floor division)."""
    x = torch.zeros(2, 3)
    index = torch.tensor([[0, 1, 1], [0, 0, 1], [0, 1, 1]])
    src = torch.arange(9.0).reshape(3, 3)
    torch.testing.assert_close(ops.scatter(x, 0, index, src), x.scatter(0, index, src))
    nan = torch.tensor([float("nan"), 1.0, 5.0])
    for r in ("amax", "amin"):
        got = ops.scatter_reduce(torch.zeros(2), 0, torch.tensor([0, 0, 1]), nan, r)
        torch.testing.assert_close(got, torch.zeros(2).scatter_reduce(0, torch.tensor([0, 0, 1]), nan, r),
                                   equal_nan=True)
    i = torch.tensor([0, 0, 1])
    v = torch.tensor([-3, -4, 7])
    assert ops.scatter_reduce(torch.zeros(2, dtype=torch.int64), 0, i, v, "mean", False).tolist() == [-4, 7]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32(dtype):
    """2048 + 1 + 1 in float16 is 2050 when summed in float32, 2048 when rounded at each step."""
    x = torch.zeros(2, dtype=dtype)
    src = torch.tensor([2048.0, 1.0, 1.0, 3.0], dtype=dtype)
    index = torch.tensor([0, 0, 0, 1])
    got = ops.scatter_add(x, 0, index, src)
    assert got.dtype == dtype
    torch.testing.assert_close(got, x.scatter_add(0, index, src), rtol=0, atol=0)
    h = torch.randn(6, 40).to(dtype)
    idx = torch.randint(0, 6, (9, 40))
    s = torch.randn(9, 40).to(dtype)
    torch.testing.assert_close(ops.scatter_reduce(h, 0, idx, s, "mean"), h.scatter_reduce(0, idx, s, "mean"))


@given(shape=shapes(min_dims=1, max_dims=3, max_side=10, max_elements=1 << 10), data=st.data(),
       alpha=st.sampled_from([1, 2.5]))
@settings(max_examples=30, deadline=None)
def test_index_copy_and_index_add_match_torch(shape, data, alpha):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    d = dim % len(shape)
    x = torch.from_numpy(RNG.standard_normal(shape).astype(np.float32))
    k = data.draw(st.integers(1, shape[d]))
    picked = torch.from_numpy(RNG.permutation(shape[d])[:k])
    source = torch.from_numpy(RNG.standard_normal(shape[:d] + (k,) + shape[d + 1:]).astype(np.float32))
    torch.testing.assert_close(ops.index_copy(x, dim, picked, source), x.index_copy(dim, picked, source))
    repeated = torch.from_numpy(RNG.integers(0, shape[d], k))
    torch.testing.assert_close(ops.index_add(x, dim, repeated, source, alpha),
                               x.index_add(dim, repeated, source, alpha=alpha), rtol=1e-5, atol=1e-5)


def test_scatter_errors():
    x = np.zeros((3, 4), np.float32)
    src = np.ones((2, 4), np.float32)
    for bad in (3, -1):
        index = np.array([[0, 1, bad, 2], [1, 1, 1, 1]])
        with pytest.raises(OpError, match=rf"scatter\(\): index {bad} is out of bounds for dimension 0 with size 3"):
            ops.scatter(x, 0, index, src)
    with pytest.raises(OpError, match="index must be int32 or int64, got float32"):
        ops.scatter(x, 0, src, src)
    with pytest.raises(OpError, match="src must have x's dtype float32, got int64"):
        ops.scatter(x, 0, np.zeros((2, 4), np.int64), np.zeros((2, 4), np.int64))
    with pytest.raises(OpError, match="same number of dimensions"):
        ops.scatter(x, 0, np.zeros(4, np.int64), src)
    with pytest.raises(OpError, match=r"index \(2, 5\) must be no larger than src \(2, 4\)"):
        ops.scatter(x, 0, np.zeros((2, 5), np.int64), src)
    with pytest.raises(OpError, match="reduce must be one of"):
        ops.scatter_reduce(x, 0, np.zeros((2, 4), np.int64), src, "median")
    with pytest.raises(OpError, match="one slice per entry"):
        ops.index_copy(x, 0, np.array([0, 1, 2]), src)
    with ops.emulate_gpu("sm_90"), pytest.raises(UnsupportedError, match="runs on the CPU only"):
        ops.scatter(x, 0, np.zeros((2, 4), np.int64), src)


class Writes(torch.nn.Module):
    """Scatter-style writes as models use them: one-hot labels, a segment sum and max, a KV cache
    updated in place at given positions, a masked fill through item assignment, rows set and
    accumulated through index tensors."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("cache", torch.zeros(2, 10, 8))

    def forward(self, x, labels, segments, pos):
        h = self.lin(x)                                                      # (2, 6, 8)
        onehot = torch.zeros(labels.shape[0], 5).scatter(1, labels[:, None], 1.0)
        seg_sum = torch.zeros(4, 8).index_add(0, segments, h[0])
        seg_max = torch.full((4, 8), -1e9).scatter_reduce(0, segments[:, None].expand(6, 8), h[1], "amax")
        cache = self.cache.clone()
        cache.index_copy_(1, pos, h)
        g = h.clone()
        g[g < 0] = 0.0
        g[:, segments[2:4]] = -h[:, :2]
        r = torch.zeros(6, 8)
        r.index_put_((segments,), h[0], accumulate=True)
        return onehot, seg_sum, seg_max, cache.sum(1), g, r


def _inputs():
    return (torch.randn(2, 6, 8), torch.randint(0, 5, (7,)), torch.tensor([0, 3, 3, 1, 0, 3]),
            torch.tensor([9, 2, 4, 0, 7, 5]))


@pytest.mark.parametrize("capture", ["auto", "dynamo"])
def test_compiled_models_scatter(capture):
    m = Writes().eval()
    args = _inputs()
    fast = taskmap.compile(m, progress=False, capture=capture)
    for got, want in zip(fast(*args), m(*args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "run by PyTorch" not in fast.summary()      # taskmap ran the writes (fallback is off anyway)


def test_scatter_under_torch_compile_and_bad_positions():
    m = Writes().eval()
    args = _inputs()
    with torch.no_grad():
        compiled = torch.compile(m, backend="taskmap")
        for got, want in zip(compiled(*args), m(*args)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        fast = taskmap.compile(m, progress=False)
        fast(*args)
        with pytest.raises(OpError, match="out of bounds for dimension 1 with size 10"):
            fast(*args[:3], torch.tensor([9, 2, 4, 0, 7, 10]))
