"""Transform operators against numpy / torch on drawn shapes (odd, prime and size-1 dims)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap import ops
from taskmap.testing import assert_close, shapes

FEW = settings(max_examples=12, deadline=None)
RNG = np.random.default_rng(13)


def _data(shape, dtype=np.float32):
    return np.asarray(RNG.standard_normal(shape)).astype(dtype)


@given(shape=shapes(min_dims=1, max_dims=4, max_side=20, max_elements=4096), data=st.data())
@FEW
def test_reshape_and_flatten(shape, data):
    x = _data(shape)
    n = x.size
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    a = data.draw(st.sampled_from(divisors))
    assert_close(ops.reshape(x, (a, -1)), x.reshape(a, -1))
    assert_close(ops.reshape(x, n), x.reshape(n))
    start = data.draw(st.integers(0, len(shape) - 1))
    assert_close(ops.flatten(x, start), torch.flatten(torch.from_numpy(x), start))


@given(shape=shapes(min_dims=1, max_dims=4, max_side=20, max_elements=4096), data=st.data())
@FEW
def test_permute_and_transpose(shape, data):
    x = _data(shape)
    perm = data.draw(st.permutations(range(len(shape))))
    assert_close(ops.permute(x, perm), x.transpose(perm))
    d0, d1 = data.draw(st.integers(-len(shape), len(shape) - 1)), data.draw(st.integers(0, len(shape) - 1))
    assert_close(ops.transpose(x, d0, d1), np.swapaxes(x, d0, d1))


@given(shape=shapes(min_dims=1, max_dims=3, max_side=25, max_elements=4096), data=st.data())
@FEW
def test_slice_and_narrow(shape, data):
    x = _data(shape)
    ax = data.draw(st.integers(0, len(shape) - 1))
    n = shape[ax]
    start = data.draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
    stop = data.draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
    step = data.draw(st.integers(1, 4))
    idx = tuple(slice(start, stop, step) if d == ax else slice(None) for d in range(len(shape)))
    assert_close(ops.slice(x, ax, start, stop, step), x[idx])
    s = data.draw(st.integers(0, n - 1))
    length = data.draw(st.integers(0, n - s))
    assert_close(ops.narrow(x, ax, s, length), torch.narrow(torch.from_numpy(x), ax, s, length))


@given(shape=shapes(min_dims=1, max_dims=3, max_side=12, max_elements=2048), data=st.data())
@FEW
def test_concat(shape, data):
    ax = data.draw(st.integers(0, len(shape) - 1))
    parts = []
    for _ in range(data.draw(st.integers(1, 4))):
        s = list(shape)
        s[ax] = data.draw(st.integers(0, 5))
        parts.append(_data(tuple(s), data.draw(st.sampled_from([np.float32, np.float64]))))
    y = ops.concat(parts, ax)
    ref = np.concatenate(parts, ax)
    assert y.dtype == ref.dtype
    assert_close(y, ref)


@given(shape=shapes(min_dims=1, max_dims=3, min_side=3, max_side=12, max_elements=2048), data=st.data(),
       mode=st.sampled_from(["constant", "reflect", "replicate"]))
@FEW
def test_pad(shape, data, mode):
    x = torch.from_numpy(_data(shape))
    pads = []
    for d in range(data.draw(st.integers(1, len(shape)))):
        lo = 0 if mode != "constant" else -1
        hi = shape[len(shape) - 1 - d] - 1
        pads += [data.draw(st.integers(lo, hi)), data.draw(st.integers(lo, hi))]
    pads = tuple(pads)
    if mode == "constant":
        assert_close(ops.pad(x, pads, value=2.5), F.pad(x, pads, value=2.5))
        return
    widths = [(0, 0)] * len(shape)
    for k in range(len(pads) // 2):
        widths[len(shape) - 1 - k] = (pads[2 * k], pads[2 * k + 1])
    ref = np.pad(x.numpy(), widths, mode={"reflect": "reflect", "replicate": "edge"}[mode])
    assert_close(ops.pad(x, pads, mode=mode), ref)


@given(shape=shapes(min_dims=1, max_dims=3, max_side=15, max_elements=2048), data=st.data())
@FEW
def test_gather(shape, data):
    x = _data(shape)
    ax = data.draw(st.integers(0, len(shape) - 1))
    ishape = tuple(data.draw(st.integers(1, 7)) if d == ax else data.draw(st.integers(1, s))
                   for d, s in enumerate(shape))
    dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    idx = RNG.integers(0, shape[ax], ishape).astype(dtype)
    assert_close(ops.gather(x, ax, idx), torch.gather(torch.from_numpy(x), ax, torch.from_numpy(idx.astype(np.int64))))


@given(shape=shapes(min_dims=1, max_dims=3, max_side=9, max_elements=512), data=st.data())
@FEW
def test_expand_broadcast_squeeze_unsqueeze(shape, data):
    src = tuple(1 if data.draw(st.booleans()) else s for s in shape)
    x = _data(src)
    lead = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    assert_close(ops.broadcast_to(x, lead + shape), np.broadcast_to(x, lead + shape))
    sizes = lead + tuple(-1 if data.draw(st.booleans()) else s for s in shape)
    assert_close(ops.expand(torch.from_numpy(x), *sizes), torch.from_numpy(x).expand(*sizes))
    assert_close(ops.squeeze(x), np.squeeze(x))
    d = data.draw(st.integers(-len(src) - 1, len(src)))
    assert_close(ops.unsqueeze(x, d), np.expand_dims(x, d))


def test_squeeze_dims_and_dtypes():
    x = _data((1, 3, 1, 4))
    assert ops.squeeze(x, 0).shape == (3, 1, 4)
    assert ops.squeeze(x, (0, 2)).shape == (3, 4)
    assert ops.squeeze(x, 1).shape == (1, 3, 1, 4)  # not of size 1: kept, as in torch
    b = RNG.random((3, 4)) < 0.5
    assert np.array_equal(ops.transpose(b, 0, 1), b.T)
    i = RNG.integers(0, 9, (2, 3, 4)).astype(np.int64)
    assert np.array_equal(ops.permute(i, (2, 0, 1)), i.transpose(2, 0, 1))
    t = torch.randn(3, 5, dtype=torch.bfloat16)
    assert torch.equal(ops.transpose(t, 0, 1), t.t().contiguous())


def test_empty_and_zero_d():
    assert ops.reshape(np.zeros((0, 3), np.float32), (3, 0)).shape == (3, 0)
    assert ops.concat([np.zeros((0, 2)), np.zeros((0, 2))], 0).shape == (0, 2)
    assert ops.pad(np.zeros((0,), np.float32), (1, 2), value=7.0).tolist() == [7.0, 7.0, 7.0]
    z = np.array(5.0, np.float32)
    assert ops.reshape(z, (1, 1)).tolist() == [[5.0]]
    assert ops.unsqueeze(z, 0).tolist() == [5.0]
    assert ops.permute(z, ()).shape == ()


@pytest.mark.parametrize("dims", [(0, 1), (1, 0)])
def test_outputs_are_copies(dims):
    x = _data((3, 4))
    y = ops.permute(x, dims)
    y[...] = 0
    assert np.abs(x).sum() > 0
