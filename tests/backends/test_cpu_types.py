"""Scalar types through the CPU backend: math builtins, casts, Python-semantics // and %, integer
widths i8..u64, f16 on numpy float16 and bf16 on torch bfloat16, compared with numpy or torch."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap.lang import (bf16, bool_, ceil, cos, erf, exp, f16, f32, f64, floor, fma, i8, i16, i32, i64, log, pow,
                          rsqrt, sin, sqrt, tanh, u8, u16, u32, u64)
from taskmap.testing import arrays, assert_close, shapes

FEW = settings(max_examples=12, deadline=None)
RNG = np.random.default_rng(4321)


def rand(*shape, dtype=np.float32, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


MATH = ["exp", "log", "sqrt", "rsqrt", "tanh", "erf", "abs", "min", "max", "pow", "sin", "cos", "floor", "ceil",
        "fma", "math.exp", "abs_int"]


def make_math(dt):
    # `dt` is used in the body too: the front end evaluates annotations from the closure only
    # (an enclosing local named only in annotations is not found; reported to the front end).
    @taskmap.kernel
    def math_fns(a: dt["n"], b: dt["n"], k: i32["n"], out: dt[17, "n"]):
        for i in range(a.shape[0]):
            x, y = a[i], b[i]
            out[0, i] = dt(exp(x))
            out[1, i] = log(y)
            out[2, i] = sqrt(y)
            out[3, i] = rsqrt(y)
            out[4, i] = tanh(x)
            out[5, i] = erf(x)
            out[6, i] = abs(x)
            out[7, i] = min(x, y)
            out[8, i] = max(x, y)
            out[9, i] = pow(y, x)
            out[10, i] = sin(x)
            out[11, i] = cos(x)
            out[12, i] = floor(x * 3.0)
            out[13, i] = ceil(x * 3.0)
            out[14, i] = fma(x, y, 0.5)
            out[15, i] = math.exp(x) - math.sqrt(y)
            out[16, i] = abs(k[i])
    return math_fns


MATH_KERNELS = {np.float32: make_math(f32), np.float64: make_math(f64)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
@FEW
def test_math_builtins(dtype, n, seed):
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(-3, 3, n).astype(dtype), rng.uniform(0.05, 4, n).astype(dtype)
    k = rng.integers(-1000, 1000, n).astype(np.int32)
    out = np.empty((17, n), dtype)
    MATH_KERNELS[dtype](x, y, k, out)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    want = [np.exp(xd), np.log(yd), np.sqrt(yd), 1 / np.sqrt(yd), np.tanh(xd), np.vectorize(math.erf)(xd),
            np.abs(xd), np.minimum(xd, yd), np.maximum(xd, yd), yd ** xd, np.sin(xd), np.cos(xd),
            np.floor(x * dtype(3)), np.ceil(x * dtype(3)), xd * yd + 0.5, np.exp(xd) - np.sqrt(yd), np.abs(k)]
    for row, (name, w) in enumerate(zip(MATH, want)):
        rtol, atol = (1e-5, 1e-5) if dtype == np.float32 else (1e-12, 1e-12)
        assert_close(out[row], np.asarray(w, dtype), rtol=rtol, atol=atol, err_msg=name)


@taskmap.kernel
def casts(x: f32["n"], d: f64["n"], k: i64["n"], out32: f32[4, "n"], outi: i32[3, "n"], out64: i64[2, "n"],
          outh: f16[2, "n"], outb: bool_[3, "n"], outd: f64[2, "n"]):
    for i in range(x.shape[0]):
        out32[0, i] = f32(d[i])
        out32[1, i] = f32(k[i])
        out32[2, i] = f32(f16(x[i]))
        out32[3, i] = f32(x[i] > 0.0) + f32(i32(x[i]))
        outi[0, i] = i32(x[i])
        outi[1, i] = i32(k[i])
        outi[2, i] = i32(bool_(k[i]))
        out64[0, i] = i64(d[i] * 1000.0)
        out64[1, i] = i64(i32(k[i])) * 3
        outh[0, i] = f16(x[i])
        outh[1, i] = f16(d[i]) * f16(2.0)
        outb[0, i] = bool_(x[i])
        outb[1, i] = bool_(k[i] % 3)
        outb[2, i] = x[i] > f32(d[i])
        outd[0, i] = f64(x[i])
        outd[1, i] = f64(i64(d[i] * 7.0))


@given(n=st.integers(1, 200), seed=st.integers(0, 2**32 - 1))
@FEW
def test_casts_between_types(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-50, 50, n).astype(np.float32)
    x[rng.random(n) < 0.2] = 0.0
    d = rng.uniform(-1e3, 1e3, n)
    k = rng.integers(-(2**40), 2**40, n)
    k[rng.random(n) < 0.2] = 0
    out32, outi = np.empty((4, n), np.float32), np.empty((3, n), np.int32)
    out64, outh = np.empty((2, n), np.int64), np.empty((2, n), np.float16)
    outb, outd = np.empty((3, n), np.bool_), np.empty((2, n), np.float64)
    casts(x, d, k, out32, outi, out64, outh, outb, outd)
    assert_close(out32[0], d.astype(np.float32))
    assert_close(out32[1], k.astype(np.float32))
    assert_close(out32[2], x.astype(np.float16).astype(np.float32), rtol=0, atol=0)
    assert_close(out32[3], (x > 0).astype(np.float32) + np.trunc(x))
    assert (outi[0] == x.astype(np.int32)).all()
    assert (outi[1] == k.astype(np.int32)).all()  # wraps modulo 2**32, as in C and numpy
    assert (outi[2] == (k != 0)).all()
    assert (out64[0] == (d * 1000.0).astype(np.int64)).all()
    assert (out64[1] == k.astype(np.int32).astype(np.int64) * 3).all()
    assert (outh[0] == x.astype(np.float16)).all()
    assert_close(outh[1], d.astype(np.float16) * np.float16(2))
    assert (outb[0] == (x != 0)).all() and (outb[1] == (k % 3 != 0)).all()
    assert (outb[2] == (x > d.astype(np.float32))).all()
    assert (outd[0] == x.astype(np.float64)).all()
    assert (outd[1] == np.trunc(d * 7.0)).all()


def make_divmod(dt):
    @taskmap.kernel
    def py_divmod(a: dt["n"], b: dt["n"], q: dt["n"], r: dt["n"], c: i32, qc: i32["m"], rc: i32["m"]):
        for i in range(a.shape[0]):
            q[i] = dt(a[i] // b[i])  # `dt` named in the body: see make_math
            r[i] = a[i] % b[i]
        for i in range(-a.shape[0], a.shape[0]):  # a loop variable that goes negative
            qc[i + a.shape[0]] = i // c
            rc[i + a.shape[0]] = i % c
    return py_divmod


DIVMOD = {dt: make_divmod(t) for dt, t in ((np.int32, i32), (np.int64, i64), (np.float32, f32), (np.float64, f64))}


@pytest.mark.parametrize("dtype", list(DIVMOD))
@given(n=st.integers(1, 100), c=st.integers(-7, 7).filter(bool), seed=st.integers(0, 2**32 - 1))
@FEW
def test_floor_division_and_modulo_match_python(dtype, n, c, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        a = rng.integers(-1000, 1000, n).astype(dtype)
        b = rng.integers(-12, 12, n).astype(dtype)
    else:  # quarters: floor(a / b) is exact, so numpy's // (which avoids a / b) agrees
        a = (rng.integers(-400, 400, n) / 4).astype(dtype)
        b = (rng.integers(-24, 24, n) / 4).astype(dtype)
    b[b == 0] = -3
    q, r = np.empty_like(a), np.empty_like(a)
    qc, rc = np.empty(2 * n, np.int32), np.empty(2 * n, np.int32)
    DIVMOD[dtype](a, b, q, r, c, qc, rc)
    assert q.tolist() == [x // y for x, y in zip(a.tolist(), b.tolist())]
    assert r.tolist() == [x % y for x, y in zip(a.tolist(), b.tolist())]
    assert qc.tolist() == [i // c for i in range(-n, n)]
    assert rc.tolist() == [i % c for i in range(-n, n)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_modulo_random_values(dtype):
    a, b = rand(500, dtype=dtype, lo=-100, hi=100), rand(500, dtype=dtype, lo=-5, hi=5)
    q, r = np.empty_like(a), np.empty_like(a)
    DIVMOD[dtype](a, b, q, r, 1, np.empty(1000, np.int32), np.empty(1000, np.int32))
    assert_close(r, np.mod(a, b))  # fmod adjusted to the divisor's sign, as Python and numpy do
    assert np.all(np.sign(r[r != 0]) == np.sign(b[r != 0]))


INT_TYPES = {np.int8: i8, np.int16: i16, np.int32: i32, np.int64: i64,
             np.uint8: u8, np.uint16: u16, np.uint32: u32, np.uint64: u64}


def make_int_arith(dt):
    @taskmap.kernel
    def int_arith(a: dt["n"], b: dt["n"], out: dt[8, "n"]):
        for i in range(a.shape[0]):
            x, y = a[i], b[i]
            out[0, i] = dt(x + y)
            out[1, i] = x - y
            out[2, i] = x * y
            out[3, i] = (x * y + x) // y
            out[4, i] = (x - y) % y
            out[5, i] = (x & y) | (x ^ 5)
            out[6, i] = (x >> 1) + (y << 1)
            out[7, i] = max(x, y) - min(x, y) + (1 if x < y else 0)
    return int_arith


INT_ARITH = {dt: make_int_arith(t) for dt, t in INT_TYPES.items()}


@pytest.mark.parametrize("dtype", list(INT_TYPES), ids=lambda d: np.dtype(d).name)
@given(n=st.integers(1, 100), seed=st.integers(0, 2**32 - 1))
@FEW
def test_integer_dtypes_arithmetic(dtype, n, seed):
    """Results wrap to the type after every operation (numpy's semantics); no signed 32/64-bit overflow."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -3000), min(info.max, 3000)
    a, b = rng.integers(lo, hi, n, endpoint=True).astype(dtype), rng.integers(1, min(hi, 100), n).astype(dtype)
    out = np.empty((8, n), dtype)
    INT_ARITH[dtype](a, b, out)
    with np.errstate(over="ignore"):
        five, one, zero = dtype(5), dtype(1), dtype(0)
        want = [a + b, a - b, a * b, (a * b + a) // b, (a - b) % b, (a & b) | (a ^ five),
                (a >> one) + (b << one), np.maximum(a, b) - np.minimum(a, b) + np.where(a < b, one, zero)]
    for row, w in enumerate(want):
        assert out[row].tolist() == np.asarray(w, dtype).tolist(), row


@taskmap.kernel
def half_kernel(a: f16["n"], b: f16["n"], out: f16["n"]):
    for i in range(a.shape[0]):
        out[i] = a[i] * b[i] + f16(0.5) - tanh(a[i])


@given(arrays(np.float16, shapes(1, 1, max_side=600)), st.integers(0, 2**32 - 1))
@FEW
def test_f16_kernel_on_numpy_float16(a, seed):
    b = np.random.default_rng(seed).uniform(-2, 2, a.shape).astype(np.float16)
    out = np.empty_like(a)
    half_kernel(a, b, out)
    assert out.dtype == np.float16
    want = a.astype(np.float32) * b.astype(np.float32) + 0.5 - np.tanh(a.astype(np.float32))
    assert_close(out, want.astype(np.float16), rtol=1e-2, atol=4e-3)


@taskmap.kernel
def bf16_kernel(a: bf16["n"], b: bf16["n"], out: bf16["n"], out32: f32["n"]):
    for i in range(a.shape[0]):
        out[i] = a[i] * b[i] + 1.0
        out32[i] = f32(a[i]) - f32(b[i])


@given(shapes(1, 1, max_side=600), st.integers(0, 2**32 - 1))
@FEW
def test_bf16_kernel_on_torch_bfloat16(shape, seed):
    torch = pytest.importorskip("torch", reason="bf16 tensors come from torch (numpy has no bfloat16)")
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(shape, generator=g) * 4 - 2).to(torch.bfloat16)
    b = (torch.rand(shape, generator=g) * 4 - 2).to(torch.bfloat16)
    out, out32 = torch.empty_like(a), torch.empty(shape, dtype=torch.float32)
    bf16_kernel(a, b, out, out32)
    assert out.dtype == torch.bfloat16
    assert_close(out, (a.float() * b.float() + 1).to(torch.bfloat16))
    assert_close(out32, a.float() - b.float())




@taskmap.kernel
def half_scalars(out: f32[2], h: f16, b: bf16):
    out[0] = f32(h)
    out[1] = f32(b)


@given(st.floats(-1e4, 1e4, allow_nan=False, width=32))
@FEW
def test_f16_and_bf16_scalar_parameters_are_rounded_to_their_type(x):
    torch = pytest.importorskip("torch", reason="the bfloat16 reference comes from torch")
    out = np.empty(2, np.float32)
    half_scalars(out, x, x)
    assert out[0] == np.float32(np.float16(x))
    assert out[1] == torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float().item()
