"""taskmap.ops.matmul / bmm / linear: torch's semantics (vectors, broadcast batches, linear over
leading dimensions), numpy / torch / taskmap arrays in and the same kind out, against numpy in
float64 with a float32 tolerance scaled by K; the GPU templates through ``emulate_gpu``; errors."""
import numpy as np
import torch.nn.functional as F
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap import ops
from taskmap.errors import OpError
from taskmap.testing import assert_close

try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
FEW = settings(max_examples=15, deadline=None)


def f32(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def close(out, ref, k, dtype="float32"):
    tol = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    assert_close(out, ref, rtol=10 * tol, atol=tol * max(1.0, np.sqrt(k)) * 4 + tol)


def ref_matmul(a, b):
    return np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))


side = st.integers(1, 40) | st.sampled_from([1, 2, 3, 5, 31, 33, 64, 65])
batch = st.lists(st.integers(1, 3), min_size=0, max_size=2)


@given(m=side, n=side, k=side)
@FEW
def test_matmul_2d(m, n, k):
    a, b = f32((m, k), 1), f32((k, n), 2)
    out = ops.matmul(a, b)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (m, n)
    close(out, ref_matmul(a, b), k)


@given(ba=batch, bb=batch, m=st.integers(1, 9), n=st.integers(1, 9), k=st.integers(1, 20), data=st.data())
@FEW
def test_matmul_broadcasts_batches_like_torch(ba, bb, m, n, k, data):
    # make the batch shapes broadcastable: where both have a dim, one of them may be 1
    nd = max(len(ba), len(bb))
    full = data.draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    ba = [1 if x == 1 else f for x, f in zip(ba, full[nd - len(ba):])]
    bb = [1 if x == 1 else f for x, f in zip(bb, full[nd - len(bb):])]
    a, b = f32((*ba, m, k), 3), f32((*bb, k, n), 4)
    out = ops.matmul(a, b)
    expect = ref_matmul(a, b)                   # numpy's matmul broadcasts as torch's does
    assert out.shape == expect.shape
    close(out, expect, k)


@pytest.mark.parametrize("sa,sb", [((7,), (7,)), ((7,), (7, 3)), ((5, 7), (7,)), ((2, 5, 7), (7,)), ((7,), (2, 7, 3)),
                                   ((1, 1), (1, 1)), ((4, 1, 5, 7), (3, 7, 2))])
def test_matmul_vectors_and_ranks(sa, sb):
    a, b = f32(sa, 5), f32(sb, 6)
    out = ops.matmul(a, b)
    expect = ref_matmul(a, b)
    assert out.shape == expect.shape
    close(out, expect, sa[-1])


@pytest.mark.parametrize("shape", [(257, 129, 300), (128, 768, 3072), (97, 1, 200), (1, 513, 65)])
def test_matmul_fixed_shapes(shape):
    m, n, k = shape
    a, b = f32((m, k), 7), f32((k, n), 8)
    close(ops.matmul(a, b), ref_matmul(a, b), k)


def test_strided_and_transposed_inputs():
    a, b = f32((40, 30), 9), f32((50, 40), 10)
    close(ops.matmul(a.T, b.T), ref_matmul(a.T, b.T), 40)
    close(ops.matmul(a[::2], b[:30, ::3]), ref_matmul(a[::2], b[:30, ::3]), 30)


@given(B=st.integers(1, 4), m=side, n=side, k=side)
@FEW
def test_bmm(B, m, n, k):
    a, b = f32((B, m, k), 11), f32((B, k, n), 12)
    close(ops.bmm(a, b), ref_matmul(a, b), k)


@needs_torch
@given(lead=st.lists(st.integers(1, 4), min_size=0, max_size=2), n=side, k=side, bias=st.booleans())
@FEW
def test_linear_matches_torch(lead, n, k, bias):
    x, w = f32((*lead, k), 13), f32((n, k), 14)
    bv = f32((n,), 15) if bias else None
    out = ops.linear(x, w, bv)
    expect = torch.nn.functional.linear(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                        None if bv is None else torch.from_numpy(bv).double()).numpy()
    assert out.shape == expect.shape
    close(out, expect, k)


@pytest.mark.parametrize("shape", [(128, 768, 768), (128, 3072, 768), (128, 768, 3072), (300, 20, 50)])
def test_linear_transformer_shapes(shape):
    m, n, k = shape
    x, w, bv = f32((m, k), 16), f32((n, k), 17), f32((n,), 18)
    close(ops.linear(x, w, bv), ref_matmul(x, w.T) + bv, k)
    close(ops.linear(x, w), ref_matmul(x, w.T), k)


@needs_torch
def test_linear_with_a_vector_weight():
    x, w = f32((3, 4, 6), 19), f32((6,), 20)
    expect = torch.nn.functional.linear(torch.from_numpy(x).double(), torch.from_numpy(w).double()).numpy()
    close(ops.linear(x, w), expect, 6)


@needs_torch
def test_torch_and_taskmap_arrays_keep_their_kind():
    a, b = f32((9, 13), 21), f32((13, 5), 22)
    t = ops.matmul(torch.from_numpy(a), torch.from_numpy(b))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    close(t, ref_matmul(a, b), 13)
    lin = ops.linear(torch.from_numpy(a), torch.from_numpy(b.T.copy()), torch.ones(5))
    assert isinstance(lin, torch.Tensor)
    close(lin, ref_matmul(a, b) + 1, 13)
    tm = ops.matmul(taskmap.tensor(a, device="cpu"), taskmap.tensor(b, device="cpu"))
    assert isinstance(tm, taskmap.Tensor)
    close(tm.numpy(), ref_matmul(a, b), 13)


def test_empty_dimensions():
    assert ops.matmul(f32((0, 3)), f32((3, 4))).shape == (0, 4)
    z = ops.matmul(f32((2, 0)), f32((0, 4)))
    assert z.shape == (2, 4) and not z.any()
    lin = ops.linear(f32((2, 0)), f32((3, 0)), np.arange(3, dtype=np.float32))
    assert np.array_equal(lin, np.tile(np.arange(3, dtype=np.float32), (2, 1)))


def test_kernels_are_planned_once_per_problem():
    from taskmap.ops import linalg
    a, b = f32((21, 22), 23), f32((22, 23), 24)
    ops.matmul(a, b)
    before = len(linalg._PLANS)
    for seed in range(3):
        ops.matmul(f32((21, 22), seed), f32((22, 23), seed))
    assert len(linalg._PLANS) == before


# ----------------------------------------------------------------------------- GPU templates, emulated


def test_f32_runs_the_simt_template_on_gpus():
    a, b = f32((37, 45), 25), f32((45, 29), 26)
    with ops.emulate_gpu("sm_80") as emu:
        out = ops.matmul(a, b)
        lin = ops.linear(a, b.T.copy(), np.ones(29, np.float32))
    close(out, ref_matmul(a, b), 45)
    close(lin, ref_matmul(a, b) + 1, 45)
    assert {k.__name__ for k in emu.kernels} == {"matmul_simt"}


@needs_torch
def test_f16_and_bf16_run_the_tensor_core_template():
    a, b = f32((2, 19, 40), 27), f32((40, 24), 28)
    with ops.emulate_gpu("sm_90") as emu:
        out = ops.matmul(a.astype(np.float16), b.astype(np.float16))
        tb = ops.matmul(torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16())
    assert out.dtype == np.float16 and tb.dtype == torch.bfloat16
    close(out, ref_matmul(a.astype(np.float16), b.astype(np.float16)), 40, "float16")
    close(tb.float(), ref_matmul(torch.from_numpy(a).bfloat16().float(), torch.from_numpy(b).bfloat16().float()), 40,
          "bfloat16")
    assert {k.__name__ for k in emu.kernels} == {"matmul_tc"}


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("call,match", [
    (lambda: ops.matmul(f32((3, 4)), f32((5, 6))), r"inner dimensions differ: \(3, 4\) @ \(5, 6\)"),
    (lambda: ops.matmul(f32((2, 3, 4)), f32((3, 4, 5))), r"batch dimensions \(2,\) and \(3,\) do not broadcast"),
    (lambda: ops.matmul(np.array(2.0, np.float32), f32((3,))), "at least 1 dimension"),
    (lambda: ops.matmul(f32((3, 4)), f32((4, 5)).astype(np.float64)), "same dtype"),
    (lambda: ops.matmul(f32((3, 4)).astype(np.float64), f32((4, 5)).astype(np.float64)), "CPU supports float32 only"),
    (lambda: ops.matmul(np.ones((3, 4), np.int32), np.ones((4, 5), np.int32)), "floating-point"),
    (lambda: ops.bmm(f32((3, 4)), f32((4, 5))), "must be 3-D"),
    (lambda: ops.bmm(f32((2, 3, 4)), f32((3, 4, 5))), "batch sizes differ: 2 and 3"),
    (lambda: ops.bmm(f32((2, 3, 4)), f32((2, 5, 5))), "inner dimensions differ"),
    (lambda: ops.linear(f32((3, 4)), f32((5, 6))), "input features 4 do not match the weight's 6"),
    (lambda: ops.linear(f32((3, 4)), f32((5, 4)), f32((4,))), r"bias must have shape \(5,\)"),
    (lambda: ops.linear(f32((3, 4)), f32((2, 5, 4))), "weight 1 or 2"),
    (lambda: ops.matmul(f32((3, 4)), 2.0), "must be an array"),
])
def test_errors(call, match):
    with pytest.raises(OpError, match=match):
        call()


def test_half_precision_on_the_cpu_sums_in_float32():
    """float16 / bfloat16 products on the CPU: f32 sums, one rounding — PyTorch's CPU kernels
    give the same bits but for ties; bf16 ``linear`` and matrix products run on AVX-512 BF16's
    dot products where the CPU has them, the rest (stacks, float16) in float32."""
    import torch

    g = torch.Generator().manual_seed(0)
    for dt in (torch.bfloat16, torch.float16):
        x, w, b = (torch.randn(*s, generator=g).to(dt) for s in ((2, 9, 67), (33, 67), (33,)))
        s3 = torch.randn(3, 67, 5, generator=g).to(dt)
        for got, want in ((ops.linear(x, w, b), F.linear(x.float(), w.float(), b.float())),
                          (ops.linear(x, w), F.linear(x.float(), w.float())),
                          (ops.matmul(x[0], w.T.contiguous()), x[0].float() @ w.float().T),
                          (ops.matmul(x[:1].expand(3, 9, 67).contiguous(), s3), x[:1].float() @ s3.float())):
            assert got.dtype == dt and got.shape == want.shape
            ulp = 2 ** -8 if dt == torch.bfloat16 else 2 ** -11
            assert ((got.float() - want).abs() / want.abs().max()).max() <= ulp + 1e-6


def test_f16_on_amd_gpus_is_refused_with_a_hint():
    with ops.emulate_gpu("gfx90a"), pytest.raises(OpError, match="gfx90a supports float32, got float16"):
        ops.matmul(f32((3, 4)).astype(np.float16), f32((4, 5)).astype(np.float16))
