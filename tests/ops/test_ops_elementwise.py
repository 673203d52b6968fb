"""Element-wise operators against numpy / torch on drawn shapes, broadcasting pairs and dtypes."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap import ops
from taskmap.compute import dag_str, tensor_input
from taskmap.errors import OpError
from taskmap.ir import f32
from taskmap.ops.elementwise import binary_compute
from taskmap.testing import assert_close, shapes

FEW = settings(max_examples=12, deadline=None)
RNG = np.random.default_rng(11)

UNARY_REF = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh,
    "erf": lambda x: torch.erf(torch.from_numpy(x)).numpy(), "abs": np.abs, "neg": np.negative,
    "relu": lambda x: np.maximum(x, 0), "relu6": lambda x: np.clip(x, 0, 6), "sin": np.sin, "cos": np.cos,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu": lambda x: F.gelu(torch.from_numpy(x)).numpy(),
    "hardswish": lambda x: F.hardswish(torch.from_numpy(x)).numpy(),
}
_T = lambda fn: lambda x: fn(torch.from_numpy(x)).numpy()  # noqa: E731
UNARY_REF.update({
    "floor": np.floor, "ceil": np.ceil, "round": np.round, "trunc": np.trunc, "sign": np.sign,
    "reciprocal": lambda x: 1 / x, "square": np.square, "expm1": np.expm1, "log1p": np.log1p,
    "softplus": _T(F.softplus), "mish": _T(F.mish), "hardsigmoid": _T(F.hardsigmoid), "logsigmoid": _T(F.logsigmoid),
    "selu": _T(F.selu),
})
POSITIVE = {"log", "sqrt", "rsqrt"}


def _data(shape, dtype, positive=False):
    x = RNG.uniform(0.1, 3, shape) if positive else RNG.uniform(-4, 4, shape)
    return np.asarray(x).astype(dtype)


@given(name=st.sampled_from(sorted(UNARY_REF)), shape=shapes(min_dims=0, max_dims=4, max_side=33, max_elements=4096),
       dtype=st.sampled_from(["float32", "float64", "float16"]))
@FEW
def test_unary(name, shape, dtype):
    x = _data(shape, dtype, name in POSITIVE)
    y = getattr(ops, name)(x)
    assert isinstance(y, np.ndarray) and y.shape == x.shape and y.dtype == x.dtype
    assert_close(y, UNARY_REF[name](x.astype(np.float64)).astype(dtype))


def test_new_unary_special_values_and_integers_like_torch():
    # half-way rounding to even, large / tiny arguments (softplus's threshold, expm1 / log1p near 0), NaN
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 30.0, -30.0, 1e-7, -1e-7, 100.0, -100.0, np.nan], np.float32)
    t = torch.from_numpy(x)
    for name, ref in (("round", torch.round), ("floor", torch.floor), ("trunc", torch.trunc), ("sign", torch.sign),
                      ("softplus", F.softplus), ("logsigmoid", F.logsigmoid), ("mish", F.mish), ("selu", F.selu),
                      ("expm1", torch.expm1), ("log1p", lambda v: torch.log1p(v.abs()))):
        arg = np.abs(x) if name == "log1p" else x
        np.testing.assert_allclose(getattr(ops, name)(arg), ref(t).numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
    i = np.array([-3, 0, 4], np.int64)
    for name in ("floor", "round", "sign", "square"):
        y = getattr(ops, name)(i)
        assert y.dtype == np.int64 and np.array_equal(y, getattr(torch, name)(torch.from_numpy(i)).numpy())
    assert_close(ops.softplus(x[:11], beta=2.0, threshold=5.0), F.softplus(t[:11], 2.0, 5.0).numpy())


@pytest.mark.parametrize("name, lo, hi", [("tan", -1.4, 1.4), ("asin", -1, 1), ("acos", -1, 1), ("atan", -20, 20),
                                          ("sinh", -8, 8), ("cosh", -8, 8), ("asinh", -50, 50), ("acosh", 1, 50),
                                          ("atanh", -0.99, 0.99)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_trigonometric_and_hyperbolic(name, lo, hi, dtype):
    x = RNG.uniform(lo, hi, (7, 33)).astype(dtype)
    want = getattr(torch, name)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(getattr(ops, name)(x), want, rtol=2e-6 if dtype == "float32" else 1e-13, atol=1e-7)
    assert getattr(ops, name)(np.arange(3, dtype=np.int32) * 0 + (1 if name == "acosh" else 0)).dtype == np.float32


def test_atan2_and_lgamma_like_torch():
    y, x = RNG.standard_normal((2, 9, 13)).astype(np.float32)
    x[0, :3] = 0.0
    np.testing.assert_allclose(ops.atan2(y, x), torch.atan2(torch.from_numpy(y), torch.from_numpy(x)).numpy(),
                               rtol=2e-6, atol=1e-7)
    assert ops.atan2(np.arange(3, dtype=np.int32), 2).dtype == np.float32
    v = RNG.uniform(-4.5, 30, (9, 13)).astype(np.float32)
    np.testing.assert_allclose(ops.lgamma(v), torch.lgamma(torch.from_numpy(v)).numpy(), rtol=1e-5, atol=1e-5)


def test_gelu_tanh_and_bad_approximate():
    x = _data((7, 9), np.float32)
    assert_close(ops.gelu(x, approximate="tanh"), F.gelu(torch.from_numpy(x), approximate="tanh"))
    with pytest.raises(taskmap.errors.OpError, match="approximate"):
        ops.gelu(x, approximate="fast")


def test_integer_inputs():
    x = RNG.integers(-50, 50, (5, 6)).astype(np.int32)
    assert ops.exp(x).dtype == np.float32  # float math on ints gives float32, as in torch
    assert_close(ops.exp(x), np.exp(x.astype(np.float32)))
    for name in ("abs", "neg", "relu", "relu6"):
        y = getattr(ops, name)(x)
        assert y.dtype == np.int32
        assert_close(y, UNARY_REF[name](x))


@st.composite
def broadcast_pairs(draw):
    """Two shapes that broadcast: the result shape, then each operand drops or squeezes dims."""
    out = draw(shapes(min_dims=1, max_dims=4, max_side=17, max_elements=4096))

    def operand():
        keep = draw(st.integers(0, len(out)))
        return tuple(1 if draw(st.booleans()) else s for s in out[len(out) - keep:])
    return operand(), operand()


BINARY_REF = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
              "minimum": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
              "gt": np.greater, "ge": np.greater_equal}


@given(pair=broadcast_pairs(), name=st.sampled_from(sorted(BINARY_REF)))
@FEW
def test_binary_broadcasting(pair, name):
    a, b = _data(pair[0], np.float32), _data(pair[1], np.float32)
    if name in ("eq", "ne"):
        b = np.where(RNG.random(b.shape) < 0.5, b, 1.0).astype(np.float32)
        a = np.where(RNG.random(a.shape) < 0.5, a, 1.0).astype(np.float32)
    y = getattr(ops, name)(a, b)
    ref = BINARY_REF[name](a, b)
    assert y.shape == ref.shape and y.dtype == ref.dtype
    assert_close(y, ref)


def test_pow_and_scalars():
    a = _data((4, 5), np.float32, positive=True)
    assert_close(ops.pow(a, 2.5), a ** np.float32(2.5))
    assert_close(ops.pow(2.0, a), np.float32(2.0) ** a)
    assert_close(ops.sub(1, a), 1 - a)
    assert ops.add(a.astype(np.float16), 2.0).dtype == np.float16  # a scalar does not widen
    assert ops.add(np.arange(4, dtype=np.int32), 2).dtype == np.int32
    assert ops.mul(np.arange(4, dtype=np.int32), 0.5).dtype == np.float32
    assert ops.div(np.arange(6, dtype=np.int64), 4).dtype == np.float32
    i = np.array([2, 3, -4], np.int32)
    assert np.array_equal(ops.pow(i, 3), i ** 3)
    assert np.array_equal(ops.add(np.array([True, False]), np.array([True, True])), [True, True])
    assert_close(ops.maximum(a, np.float32(1.5)), np.maximum(a, 1.5))


@pytest.mark.parametrize("exponent", [1.0, 2.0, 3.0, 4.0, 0.5, -1.0])
def test_pow_by_small_constants_is_products_like_torch(exponent):
    """``x ** 2 / 3 / 4`` as products, ``x ** 0.5`` a square root, ``x ** -1`` a reciprocal (as
    PyTorch computes them, and vectorizable where ``powf`` calls are not): the same values as
    torch.pow (negative bases included where defined), and no ``pow`` call in the definition."""
    a = _data((7, 9), np.float32, positive=exponent == 0.5)
    want = torch.pow(torch.from_numpy(a), exponent).numpy()
    assert_close(ops.pow(a, exponent), want)
    node = binary_compute("pow", tensor_input("x", f32, [3]), exponent, (3,))
    assert "pow(" not in dag_str(node)


ROUNDED = {"floor_divide": torch.floor_divide, "remainder": torch.remainder, "fmod": torch.fmod,
           "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
           "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc")}


def _rounded(name, a, b):
    if name.startswith("div_"):
        return ops.div(a, b, rounding_mode=name[4:])
    return getattr(ops, name)(a, b)


@given(pair=broadcast_pairs(), name=st.sampled_from(sorted(ROUNDED)),
       dtype=st.sampled_from(["float32", "float64", "int32", "int64"]))
@FEW
def test_rounded_division_and_remainders_match_torch_exactly(pair, name, dtype):
    """``//``, ``%``, fmod and div's rounding modes: bit for bit torch's values, signs of zero
    included, on both signs of dividend and divisor (no zero divisor here: integers trap in torch)."""
    if dtype.startswith("int"):
        a = np.asarray(RNG.integers(-60, 60, pair[0]), dtype)
        b = np.asarray(RNG.integers(1, 9, pair[1]) * RNG.choice([-1, 1], pair[1]), dtype)
    else:
        a = np.asarray(RNG.standard_normal(pair[0]) * 10, dtype)
        b = np.asarray(RNG.standard_normal(pair[1]) * 3, dtype)
    want = ROUNDED[name](torch.from_numpy(a), torch.from_numpy(b)).numpy()
    got = _rounded(name, a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("name", sorted(ROUNDED))
def test_rounded_division_special_values_like_torch(name):
    # 1.0 // 0.1 is 9 (floor(1.0 / 0.1) would be 10); zero divisors, infinities, NaN, -0.0
    a = np.array([1.0, -1.0, 7.5, -7.5, 0.0, -0.0, np.inf, -np.inf, 3.0, np.nan, 5.0, -5.0, 1e30], np.float32)
    b = np.array([0.1, 0.1, -2.0, 2.0, 3.0, 3.0, 2.0, 2.0, np.inf, 1.0, 0.0, 0.0, 1e-30], np.float32)
    want = ROUNDED[name](torch.from_numpy(a), torch.from_numpy(b)).numpy()
    got = _rounded(name, a, b)
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want))
    assert_close(_rounded(name, a[:4], 2.5), ROUNDED[name](torch.from_numpy(a[:4]), 2.5).numpy())


def test_rounded_division_errors_and_integer_zero_divisors():
    with pytest.raises(OpError, match=r"div\(\): rounding_mode must be None, 'floor' or 'trunc', got 'round'"):
        ops.div(np.ones(3, np.float32), 2.0, rounding_mode="round")
    # torch raises on an integer division by zero; a kernel cannot, and must not trap: -1 / the dividend
    i = np.array([7, -7, 0], np.int32)
    assert np.array_equal(ops.floor_divide(i, np.zeros(3, np.int32)), [-1, -1, -1])
    assert np.array_equal(ops.remainder(i, np.zeros(3, np.int32)), i)


def test_nan_propagates_through_maximum_and_relu():
    a = np.array([np.nan, 1.0, -1.0], np.float32)
    assert np.isnan(ops.maximum(a, 0.0)[0]) and np.isnan(ops.minimum(0.0, a)[0])
    assert np.isnan(ops.relu(a)[0]) and np.isnan(ops.relu6(a)[0])


def test_mixed_dtype_promotion():
    a = _data((3, 4), np.float16)
    b = _data((4,), np.float32)
    y = ops.add(a, b)
    assert y.dtype == np.float32
    assert_close(y, a.astype(np.float32) + b)
    assert ops.add(np.arange(3, dtype=np.int8), np.arange(3, dtype=np.int64)).dtype == np.int64


@given(pair=broadcast_pairs())
@FEW
def test_where(pair):
    c = np.asarray(RNG.random(pair[0]) < 0.5)
    a, b = _data(pair[1], np.float32), _data(pair[0][-1:], np.float64)
    y = ops.where(c, a, b)
    ref = np.where(c, a, b)
    assert y.dtype == ref.dtype and y.shape == ref.shape
    assert_close(y, ref)
    assert_close(ops.where(c, a, 0.0), np.where(c, a, np.float32(0)))
    assert_close(ops.where(c.astype(np.int32), 1.0, a), np.where(c, np.float32(1), a))


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("float32", "float16"), ("float64", "float32"),
                                     ("int64", "float64"), ("float32", "bool"), ("bool", "float32"),
                                     ("int32", "int8"), ("float16", "float64")])
def test_cast(src, dst):
    x = (RNG.uniform(-100, 100, (6, 7))).astype(src)
    assert_close(ops.cast(x, dst), x.astype(dst))
    assert ops.cast(x, np.dtype(dst)).dtype == np.dtype(dst)


def test_torch_in_torch_out_with_bf16():
    t = torch.randn(5, 33, dtype=torch.bfloat16)
    u = torch.randn(33, dtype=torch.bfloat16)
    y = ops.mul(ops.silu(t), u)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    assert_close(y, F.silu(t) * u)
    assert ops.cast(t, torch.float32).dtype == torch.float32
    assert_close(ops.gt(t, 0.0), t > 0)


def test_taskmap_tensor_in_tensor_out_and_strided_inputs():
    x = _data((4, 6), np.float32)
    tt = taskmap.tensor(x, device="cpu")
    y = ops.exp(tt)
    assert isinstance(y, taskmap.Tensor)
    assert_close(y.numpy(), np.exp(x))
    strided = _data((6, 8), np.float32)[:, ::2]
    assert_close(ops.neg(strided), -strided)
    assert_close(ops.add(torch.from_numpy(x).t(), 1.0), torch.from_numpy(x).t() + 1)


def test_zero_size_and_zero_d():
    assert ops.exp(np.zeros((3, 0), np.float32)).shape == (3, 0)
    assert ops.add(np.zeros((0, 4), np.float32), np.ones(4, np.float32)).shape == (0, 4)
    z = ops.mul(np.array(3.0, np.float32), np.array(2.0, np.float32))
    assert z.shape == () and float(z) == 6.0
    assert math.isclose(float(ops.exp(np.array(1.0))), math.e)


BITWISE = {"bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
           "bitwise_left_shift": torch.bitwise_left_shift, "bitwise_right_shift": torch.bitwise_right_shift}


@given(pair=broadcast_pairs(), name=st.sampled_from(sorted(BITWISE)),
       dtype=st.sampled_from(["int8", "uint8", "int32", "int64"]), scalar=st.booleans())
@FEW
def test_bitwise_integer_ops_match_torch_exactly(pair, name, dtype, scalar):
    """Bitwise and / or / xor and shifts of integers (negative ones included: right shifts are
    arithmetic), against an array or a Python int, bit for bit torch's (wrapping in the type)."""
    lo = 0 if dtype == "uint8" else -100
    a = np.asarray(RNG.integers(lo, 100, pair[0]), dtype)
    b = 3 if scalar else np.asarray(RNG.integers(0, 7, pair[1]), dtype)
    want = BITWISE[name](torch.from_numpy(a), b if scalar else torch.from_numpy(b)).numpy()
    got = np.asarray(getattr(ops, name)(a, b))
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def test_bitwise_ops_refuse_floats():
    with pytest.raises(OpError, match=r"bitwise_and\(\): integer \(or bool\) operands only, got float32"):
        ops.bitwise_and(np.ones(3, np.float32), 1)
