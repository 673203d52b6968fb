"""``ops.cumsum`` / ``cumprod`` / ``logcumsumexp`` / ``cummax`` / ``cummin`` / ``topk`` / ``sort``: against torch on
hypothesis-drawn shapes, axes and dtypes (torch's result types: int64 for integers and bools,
16-bit floats accumulated in float32; the running extremum's index the latest of ties, NaN taking
over; NaN first in a top-k), the graph ops behind them in compiled models, and clear errors."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap import ops
from taskmap.errors import OpError, UnsupportedError
from taskmap.testing import shapes

RNG = np.random.default_rng(23)


@given(shape=shapes(min_dims=1, max_dims=4, max_side=40, max_elements=1 << 12), data=st.data(),
       dtype=st.sampled_from(["float32", "float64", "int32", "int64", "bool"]),
       op=st.sampled_from(["cumsum", "cumprod"]))
@settings(max_examples=30, deadline=None)
def test_scans_match_torch(shape, data, dtype, op):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    if dtype == "bool":
        x = RNG.random(shape) < 0.5
    elif dtype.startswith("int"):
        x = RNG.integers(-3, 4, shape).astype(dtype)
    else:   # products of values near 1 stay finite over 40 steps
        x = (RNG.uniform(0.8, 1.25, shape) * RNG.choice([-1, 1], shape) if op == "cumprod"
             else RNG.standard_normal(shape)).astype(dtype)
    want = getattr(torch, op)(torch.from_numpy(np.asarray(x)), dim).numpy()
    got = getattr(ops, op)(np.asarray(x), dim)
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype.startswith("float"):
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)


@given(shape=shapes(min_dims=1, max_dims=4, max_side=40, max_elements=1 << 12), data=st.data(),
       dtype=st.sampled_from(["float32", "float64", "int32", "int64"]), op=st.sampled_from(["cummax", "cummin"]))
@settings(max_examples=30, deadline=None)
def test_running_extrema_match_torch(shape, data, dtype, op):
    """Values and indices exactly as torch's, with many ties (small integers, rounded floats) and,
    for floats, a few NaNs."""
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    if dtype.startswith("int"):
        x = RNG.integers(-3, 4, shape).astype(dtype)
    else:
        x = np.round(RNG.standard_normal(shape) * 2).astype(dtype)
        x[RNG.random(shape) < 0.05] = np.nan
    want_v, want_i = getattr(torch, op)(torch.from_numpy(x), dim)
    got_v, got_i = getattr(ops, op)(x, dim)
    assert got_v.dtype == x.dtype and got_i.dtype == np.int64 and got_v.shape == x.shape
    np.testing.assert_array_equal(got_v, want_v.numpy())
    np.testing.assert_array_equal(got_i, want_i.numpy())


def test_logcumsumexp_matches_torch_with_infinities_and_nan():
    x = np.random.default_rng(3).standard_normal((3, 60, 5)).astype(np.float32) * 20
    x[0, :4, 0] = -np.inf                      # a leading run of -inf stays -inf
    x[1, 7, 1], x[1, 9, 1] = np.inf, np.inf    # inf, then inf again: inf, not NaN
    x[2, 11, 2] = np.nan
    for dim in (0, 1, -1):
        want = torch.logcumsumexp(torch.from_numpy(x), dim).numpy()
        np.testing.assert_allclose(ops.logcumsumexp(x, dim), want, rtol=2e-6, atol=1e-5)
    h = torch.randn(4, 300).half()
    torch.testing.assert_close(ops.logcumsumexp(h, 1), torch.logcumsumexp(h.float(), 1).half(), rtol=1e-3, atol=1e-3)
    with pytest.raises(OpError, match="logcumsumexp.*int64"):
        ops.logcumsumexp(np.ones(3, np.int64), 0)


def test_running_extrema_errors():
    with pytest.raises(OpError, match=r"cummax\(\): axis 2 is out of range"):
        ops.cummax(np.ones((2, 3), np.float32), 2)
    with pytest.raises(OpError, match="cummin"):
        ops.cummin(np.ones((2, 3), bool), 0)
    with ops.emulate_gpu("sm_90"), pytest.raises(UnsupportedError, match="runs on the CPU only"):
        ops.cummax(np.ones((2, 3), np.float32), 1)


class RunningPeaks(torch.nn.Module):
    """Drawdown-style features: the running peak, its position, and the running trough."""

    def forward(self, x):
        peak, where = torch.cummax(x, dim=1)
        trough = x.cummin(-1)
        return (x - peak) / (1 + where), trough.values * 2 + trough.indices


def test_compiled_models_take_running_extrema():
    x = torch.randn(2, 9, 6)
    x[1, 4, 2] = float("nan")
    fast = taskmap.compile(RunningPeaks(), progress=False)
    for got, want in zip(fast(x), RunningPeaks()(x)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert "run by PyTorch" not in fast.summary()
    dyn = torch.compile(RunningPeaks(), backend="taskmap")
    for got, want in zip(dyn(x), RunningPeaks()(x)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_half_precision_accumulates_in_float32_and_dtype_converts_first():
    h = torch.randn(3, 500).half()
    torch.testing.assert_close(ops.cumsum(h, 1), torch.cumsum(h, 1), rtol=1e-3, atol=1e-2)
    assert ops.cumsum(h, 1).dtype == torch.float16
    x = torch.randn(4, 6)
    got = ops.cumsum(x, 0, dtype=torch.float64)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.cumsum(x, 0, dtype=torch.float64))


def test_scan_errors():
    with pytest.raises(OpError, match=r"cumsum\(\): axis 2 is out of range for a 2-d array"):
        ops.cumsum(np.ones((2, 3), np.float32), 2)
    with pytest.raises(OpError, match="dim must be an int"):
        ops.cumsum(np.ones((2, 3), np.float32), 0.5)
    with ops.emulate_gpu("sm_90"), pytest.raises(UnsupportedError, match="runs on the CPU only"):
        ops.cumsum(np.ones((2, 3), np.float32), 1)


class PositionIds(torch.nn.Module):
    """RoBERTa's position ids: running count of non-padding tokens, padding at 1."""

    def forward(self, ids, x):
        mask = ids.ne(1).int()
        pos = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask + 1
        return pos, torch.cumprod(x, -1) + x.cumsum(0) + torch.logcumsumexp(x * 3, 1)


def test_compiled_models_scan():
    ids = torch.randint(0, 5, (3, 11))
    x = torch.rand(3, 11) + 0.5
    fast = taskmap.compile(PositionIds(), progress=False)
    got, want = fast(ids, x), PositionIds()(ids, x)
    assert torch.equal(got[0], want[0]) and got[0].dtype == want[0].dtype
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert "run by PyTorch" not in fast.summary()      # taskmap ran the scans (fallback is off anyway)


def _distinct(shape, dtype):
    """Values without ties (torch orders equal values its own way)."""
    n = int(np.prod(shape))
    x = RNG.permutation(n).reshape(shape).astype(dtype)
    return x / 7 - n / 14 if dtype.startswith("float") else x - n // 2


@given(shape=shapes(min_dims=1, max_dims=3, max_side=30, max_elements=1 << 11), data=st.data(),
       dtype=st.sampled_from(["float32", "float64", "int32", "int64"]), largest=st.booleans())
@settings(max_examples=30, deadline=None)
def test_topk_and_sort_match_torch(shape, data, dtype, largest):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(0, shape[dim]))
    x = _distinct(shape, dtype)
    tv, ti = torch.topk(torch.from_numpy(x), k, dim, largest=largest)
    v, i = ops.topk(x, k, dim, largest=largest)
    assert v.dtype == x.dtype and i.dtype == np.int64
    np.testing.assert_array_equal(v, tv.numpy())
    np.testing.assert_array_equal(i, ti.numpy())
    sv, si = torch.sort(torch.from_numpy(x), dim, descending=largest)
    v, i = ops.sort(x, dim, descending=largest)
    np.testing.assert_array_equal(v, sv.numpy())
    np.testing.assert_array_equal(i, si.numpy())


def test_topk_nan_ranks_first_and_ties_keep_their_order():
    x = torch.tensor([[1.0, float("nan"), 3.0, -2.0, float("nan"), 0.5]])
    for largest in (True, False):
        v, i = ops.topk(x, 4, largest=largest)
        tv, ti = torch.topk(x, 4, largest=largest)
        torch.testing.assert_close(v, tv, equal_nan=True)
        assert torch.equal(i, ti)
    v, i = ops.sort(torch.tensor([2.0, 1.0, 2.0, 1.0]))
    assert v.tolist() == [1.0, 1.0, 2.0, 2.0] and i.tolist() == [1, 3, 0, 2]      # stable


def test_topk_and_sort_errors():
    x = np.ones((2, 5), np.float32)
    with pytest.raises(OpError, match=r"topk\(\): k must be an int in 0..5"):
        ops.topk(x, 6)
    with pytest.raises(UnsupportedError, match="at most 4096"):
        ops.sort(np.ones((1, 5000), np.float32))


class Router(torch.nn.Module):
    """A mixture-of-experts router: the top-2 experts of each token, their weights renormalised."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(16, 8)

    def forward(self, h):
        w, experts = torch.topk(self.gate(h).softmax(-1), 2, dim=-1)
        return w / w.sum(-1, keepdim=True), experts, h.argsort(-1, descending=True)[:, :3]


def test_compiled_router_selects_like_torch():
    h = torch.randn(5, 16)
    m = Router().eval()
    got, want = taskmap.compile(m, progress=False)(h), m(h)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
