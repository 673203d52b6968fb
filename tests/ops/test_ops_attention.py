"""``taskmap.ops.scaled_dot_product_attention`` against ``torch.nn.functional`` in float64: drawn
shapes (odd, prime and 1 lengths, E != Ev, batch and heads, broadcast batches, grouped-query
heads), both kinds of masks, causal with L != S, fully masked rows, the GPU schedule with GPU
semantics, and every error a user can hit."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap.errors import OpError
from taskmap.ops import emulate_gpu
from taskmap.ops import scaled_dot_product_attention as sdpa
from taskmap.testing import assert_close

SIDES = st.sampled_from([1, 2, 3, 5, 7, 13, 17, 31, 64, 67])
HEADS = st.sampled_from([8, 20, 64])          # few head sizes: one kernel per (E, Ev, flags)


def _t(x):
    if x is None:
        return None
    t = torch.from_numpy(x)
    return t if t.dtype == torch.bool else t.double()


def reference(q, k, v, mask=None, causal=False, scale=None, gqa=False):
    return F.scaled_dot_product_attention(_t(q), _t(k), _t(v), attn_mask=_t(mask), is_causal=causal, scale=scale,
                                          enable_gqa=gqa).numpy()


def tol(S):
    return dict(rtol=1e-5, atol=2e-6 * max(1.0, math.sqrt(S)))


@st.composite
def cases(draw):
    """(q, k, v, mask, causal, scale, gqa) on a seeded RNG."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    L, S, E, Ev = draw(SIDES), draw(SIDES), draw(HEADS), draw(st.sampled_from([5, 16, 64]))
    batch = draw(st.sampled_from([(), (2,), (1, 3), (2, 3), (2, 4)]))
    gqa = len(batch) >= 1 and batch[-1] == 4 and draw(st.booleans())
    kv_batch = batch
    if gqa:
        kv_batch = batch[:-1] + (2,)       # two key / value heads for the four query heads
    elif batch and draw(st.booleans()):
        kv_batch = (1,) * len(batch)       # key / value broadcast over the batch
    q = rng.standard_normal(batch + (L, E)).astype(np.float32)
    k = rng.standard_normal(kv_batch + (S, E)).astype(np.float32)
    v = rng.standard_normal(kv_batch + (S, Ev)).astype(np.float32)
    kind = draw(st.sampled_from(["none", "bool", "float", "causal"]))
    mask, causal = None, kind == "causal"
    if kind in ("bool", "float"):
        mshape = draw(st.sampled_from([(L, S), (1, S), batch + (L, S), batch[:1] + (1,) * (len(batch) > 1) + (1, S)]))
        mask = rng.random(mshape) > 0.3 if kind == "bool" else rng.standard_normal(mshape).astype(np.float32)
    scale = draw(st.sampled_from([None, 0.05, 1.0]))
    return q, k, v, mask, causal, scale, gqa


@given(case=cases())
@settings(max_examples=12, deadline=None, derandomize=True)
def test_matches_torch_float64(case):
    q, k, v, mask, causal, scale, gqa = case
    out = sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    ref = reference(q, k, v, mask, causal, scale, gqa)
    assert out.shape == ref.shape and out.dtype == np.float32
    assert_close(out, ref, **tol(k.shape[-2]))


@given(case=cases())
@settings(max_examples=4, deadline=None, derandomize=True)
def test_gpu_schedule_with_gpu_semantics(case):
    q, k, v, mask, causal, scale, gqa = case
    with emulate_gpu("sm_90") as emu:
        out = sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    assert {k.__name__ for k in emu.kernels} >= {"attention_gpu"}
    assert_close(out, reference(q, k, v, mask, causal, scale, gqa), **tol(k.shape[-2]))


@pytest.mark.parametrize("L,S", [(5, 9), (9, 5), (1, 7), (7, 1), (64, 200)])
def test_causal_is_top_left_aligned(L, S):
    rng = np.random.default_rng(L * 100 + S)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, L, 16), (2, S, 16), (2, S, 24)))
    assert_close(sdpa(q, k, v, is_causal=True), reference(q, k, v, causal=True), **tol(S))


def test_torch_tensors_in_torch_tensors_out_and_fully_masked_rows():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 2, 6, 8, generator=g), torch.randn(1, 2, 10, 8, generator=g), torch.randn(1, 2, 10, 4,
                                                                                                        generator=g)
    bmask = torch.rand(6, 10, generator=g) > 0.5
    bmask[3] = False                                   # a row with no key: torch gives zeros
    fmask = torch.zeros(1, 2, 6, 10)
    fmask[0, 1, 2] = -math.inf
    for mask in (bmask, fmask):
        out = sdpa(q, k, v, attn_mask=mask)
        assert isinstance(out, torch.Tensor) and out.shape == (1, 2, 6, 4)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                             attn_mask=mask if mask.dtype == torch.bool else mask.double())
        assert_close(out, ref, rtol=1e-5, atol=2e-6)
    assert torch.all(sdpa(q, k, v, attn_mask=bmask)[:, :, 3] == 0)


def test_empty_shapes():
    q, k, v = np.ones((2, 0, 8), np.float32), np.ones((2, 5, 8), np.float32), np.ones((2, 5, 3), np.float32)
    assert sdpa(q, k, v).shape == (2, 0, 3)
    out = sdpa(np.ones((2, 4, 8), np.float32), np.ones((2, 0, 8), np.float32), np.ones((2, 0, 3), np.float32))
    assert out.shape == (2, 4, 3) and np.all(out == 0)     # as torch: no keys, zeros


def test_exported():
    assert taskmap.ops.scaled_dot_product_attention is sdpa


# ----------------------------------------------------------------------------- errors

Q, K, V = np.ones((2, 4, 8), np.float32), np.ones((2, 6, 8), np.float32), np.ones((2, 6, 5), np.float32)


@pytest.mark.parametrize("args,kwargs,match", [
    ((Q, np.ones((2, 6, 7), np.float32), V), {}, "same number of features"),
    ((Q, K, np.ones((2, 5, 5), np.float32)), {}, "same length"),
    ((Q, K, V), {"attn_mask": np.ones((3, 6), bool)}, "cannot be broadcast"),
    ((Q, K, V), {"attn_mask": np.ones((4, 6), np.int32)}, "must be bool or have the query's dtype"),
    ((Q, K, V), {"attn_mask": np.ones((4, 6), np.float64)}, "must be bool or have the query's dtype"),
    ((Q, K, V), {"dropout_p": 0.1}, "dropout_p must be 0"),
    ((Q, K, V), {"attn_mask": np.ones((4, 6), bool), "is_causal": True}, "cannot be combined with is_causal"),
    ((Q, K, V), {"scale": "big"}, "scale must be a number"),
    ((Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64)), {}, "supports float32"),
    ((Q, K.astype(np.float64), V), {}, "same dtype"),
    ((Q.astype(np.int32), K, V), {}, "floating point"),
    ((np.ones(8, np.float32), K, V), {}, "at least 2 dimensions"),
    ((np.ones((3, 4, 8), np.float32), K, V), {}, "do not broadcast"),
    ((np.ones((1, 4, 4, 8), np.float32), np.ones((1, 3, 6, 8), np.float32), np.ones((1, 3, 6, 5), np.float32)),
     {"enable_gqa": True}, "multiple of the key / value heads"),
    ((None, K, V), {}, "must be an array"),
    ((np.ones((2, 4, 0), np.float32), np.ones((2, 6, 0), np.float32), V), {}, "no features"),
])
def test_bad_input_raises_op_error(args, kwargs, match):
    with pytest.raises(OpError, match=match):
        sdpa(*args, **kwargs)


def test_gpu_schedules_refuse_other_dtypes():
    with emulate_gpu("sm_90"), pytest.raises(OpError, match="supports float32, float16, bfloat16; got float64"):
        sdpa(Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64))
    with emulate_gpu("gfx90a"), pytest.raises(OpError, match="supports float32; got float16"):
        sdpa(Q.astype(np.float16), K.astype(np.float16), V.astype(np.float16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tensor_cores_for_half_precision_with_gpu_semantics(dtype):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(s, generator=g).to(dtype) for s in ((2, 2, 19, 40), (2, 2, 37, 40), (2, 2, 37, 24)))
    mask = torch.randn(19, 37, generator=g).to(dtype)
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}, {"attn_mask": mask > 0}):
        with emulate_gpu("sm_90") as emu:
            out = sdpa(q, k, v, **kwargs)
        assert {kk.__name__ for kk in emu.kernels} == {"attention_tc"} and out.dtype == dtype
        m = kwargs.get("attn_mask")
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=kwargs.get("is_causal", False),
                                             attn_mask=m if m is None or m.dtype == torch.bool else m.double())
        assert_close(out, ref, rtol=2e-2, atol=1e-2 if dtype == torch.float16 else 3e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_on_the_gpu(dtype):
    if not torch.cuda.is_available():
        pytest.skip("torch was built without CUDA")
    g = torch.Generator(device="cuda").manual_seed(0)
    for (b, h, L, S, E, Ev), causal in (((2, 3, 37, 53, 40, 24), False), ((1, 12, 128, 128, 64, 64), True),
                                        ((1, 8, 1000, 1000, 64, 64), False)):
        q = torch.randn(b, h, L, E, device="cuda", generator=g).to(dtype)
        k = torch.randn(b, h, S, E, device="cuda", generator=g).to(dtype)
        v = torch.randn(b, h, S, Ev, device="cuda", generator=g).to(dtype)
        out = sdpa(q, k, v, is_causal=causal)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        assert out.device == q.device and out.dtype == dtype
        assert_close(out, ref, rtol=1e-4 if dtype == torch.float32 else 2e-2,
                     atol=1e-5 if dtype == torch.float32 else 3e-2)
