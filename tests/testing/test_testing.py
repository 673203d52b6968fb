"""taskmap.testing: tolerances, assert_close/is_close, and the hypothesis strategies."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.testing import (
    TOLERANCES,
    arrays,
    assert_close,
    dtype_name,
    dtypes,
    is_close,
    shapes,
    tolerance,
)

# -- tolerances -------------------------------------------------------------------------------


def test_tolerance_table():
    assert TOLERANCES["float32"] == (1e-5, 1e-5)
    assert TOLERANCES["float16"] == (1e-2, 1e-3)
    assert TOLERANCES["bfloat16"] == (2e-2, 1e-2)
    assert TOLERANCES["float64"] == (1e-12, 1e-12)
    assert TOLERANCES["int32"] == TOLERANCES["bool"] == (0.0, 0.0)
    assert tolerance(np.float16) == tolerance("f16") == tolerance("half") == TOLERANCES["float16"]


def test_dtype_names():
    assert dtype_name(np.float32) == dtype_name(np.dtype("float32")) == dtype_name("f32") == "float32"
    assert dtype_name("torch.bfloat16") == dtype_name("bf16") == "bfloat16"
    with pytest.raises(ValueError, match="no default tolerance for dtype 'float8'"):
        tolerance("float8")


# -- assert_close -----------------------------------------------------------------------------


def test_assert_close_passes_within_tolerance():
    expected = np.linspace(-2, 2, 101, dtype=np.float32)
    assert_close(expected * (1 + 5e-6), expected)
    assert_close(expected.astype(np.float16), expected)  # the looser (f16) tolerance applies
    assert_close(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    assert_close(np.array([np.inf]), np.array([np.inf]))
    assert_close(np.arange(5), [0, 1, 2, 3, 4])
    assert_close(np.zeros((0, 3)), np.zeros((0, 3)))
    assert_close(np.float32(1.0), 1.0)
    big = np.array([2**62 + 1], dtype=np.int64)
    assert not is_close(big, big - 1)  # exact integers, no float64 rounding


def test_assert_close_explicit_tolerances():
    a, b = np.array([1.0, 2.0]), np.array([1.0, 2.1])
    assert not is_close(a, b)
    assert_close(a, b, atol=0.2)
    assert_close(a, b, dtype="float16", rtol=0.1)
    with pytest.raises(AssertionError):
        assert_close(a, b, dtype="float16")


def test_assert_close_failure_message_is_informative():
    expected = np.zeros((4, 5), np.float32)
    actual = expected.copy()
    actual[2, 3] = 0.5
    actual[0, 1] = 1e-3
    with pytest.raises(AssertionError) as info:
        assert_close(actual, expected, err_msg="vec_add on cpu")
    msg = str(info.value)
    assert msg.startswith("vec_add on cpu\n")
    assert "dtype float32, rtol=1e-05, atol=1e-05" in msg
    assert "2 of 20 elements mismatch (10%)" in msg
    assert "worst at index (2, 3): actual 0.5, expected 0.0" in msg
    assert "max abs error 0.5 at index (2, 3)" in msg


def test_assert_close_shape_mismatch():
    with pytest.raises(AssertionError, match=r"shape mismatch: actual \(3,\) vs expected \(3, 1\)"):
        assert_close(np.zeros(3), np.zeros((3, 1)))
    assert not is_close(np.zeros(3), np.zeros((3, 1)))


def test_assert_close_nan_mismatch():
    with pytest.raises(AssertionError) as info:
        assert_close(np.array([1.0, np.nan, 3.0]), np.array([1.0, 2.0, 3.0]))
    msg = str(info.value)
    assert "worst at index (1,): actual nan, expected 2.0" in msg
    assert "NaN in only one of the arrays at 1 element(s)" in msg


def test_assert_close_integers_exact():
    with pytest.raises(AssertionError, match="dtype int32, rtol=0, atol=0"):
        assert_close(np.array([1, 2], np.int32), np.array([1, 3], np.int32))
    assert_close(np.array([True, False]), np.array([True, False]))


class FakeTensor:
    """Anything with .numpy() is accepted."""

    def __init__(self, data):
        self.data = data

    def numpy(self):
        return self.data


def test_objects_with_numpy_method():
    assert_close(FakeTensor(np.ones(3, np.float32)), np.ones(3, np.float32))


def test_torch_tensors():
    torch = pytest.importorskip("torch", reason="torch is an optional dependency")
    t = torch.linspace(-1, 1, 17)
    assert_close(t, t.numpy().copy())
    assert_close(t.to(torch.bfloat16), t)  # bf16 goes through .float()
    assert is_close(t.requires_grad_(), t.detach())
    with pytest.raises(AssertionError, match="dtype bfloat16, rtol=0.02, atol=0.01"):
        assert_close(t.to(torch.bfloat16) + 1, t.to(torch.bfloat16))


# -- strategies -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(shapes())
def test_shapes_defaults(shape):
    assert isinstance(shape, tuple) and 1 <= len(shape) <= 4
    assert all(isinstance(s, int) and 1 <= s <= 64 for s in shape)
    assert math.prod(shape) <= 1 << 18


@settings(max_examples=200, deadline=None)
@given(shapes(min_dims=2, max_dims=3, min_side=4, max_side=100, odd=True, max_elements=5000))
def test_shapes_options(shape):
    assert 2 <= len(shape) <= 3
    assert all(4 <= s <= 100 and s % 2 == 1 for s in shape)
    assert math.prod(shape) <= 5000


def test_shapes_are_biased_to_awkward_sides():
    seen = set()

    @settings(max_examples=300, deadline=None, database=None)
    @given(shapes(max_dims=1, max_side=1000))
    def collect(shape):
        seen.add(shape[0])

    collect()
    assert 1 in seen and {3, 5, 7, 13, 17, 31, 61, 127} & seen and {255, 257, 511, 513} & seen


def test_shapes_rejects_impossible_requests():
    with pytest.raises(ValueError, match="no odd side"):
        shapes(min_side=4, max_side=4, odd=True)
    with pytest.raises(ValueError, match="max_elements"):
        shapes(min_dims=3, min_side=100, max_side=200, max_elements=1000)
    with pytest.raises(ValueError, match="min_side"):
        shapes(min_side=0)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_arrays(data):
    dtype = data.draw(dtypes(("float", "int", "uint", "bool")))
    shape = data.draw(shapes(max_dims=3, max_side=17))
    arr = data.draw(arrays(dtype, shape))
    assert arr.dtype == np.dtype(dtype) and arr.shape == shape
    assert arr.flags.c_contiguous and arr.any()
    if arr.dtype.kind == "f":
        assert np.isfinite(arr).all() and np.abs(arr).max() <= 2
    elif arr.dtype.kind in "iu":
        assert arr.min() >= -100 and arr.max() <= 100


@settings(max_examples=50, deadline=None)
@given(arrays(dtypes(("float32",)), shapes(max_dims=2), low=0.5, high=1.0))
def test_arrays_strategy_arguments_and_range(arr):
    assert arr.dtype == np.float32 and arr.min() >= 0.5 and arr.max() <= 1.0


@settings(max_examples=30, deadline=None)
@given(arrays("int32", (1,)))
def test_arrays_single_element_never_zero(arr):
    assert arr[0] != 0


def test_dtypes_strategy():
    @settings(max_examples=100, deadline=None, database=None)
    @given(dtypes(("float", "int32", "f16")))
    def check(name):
        assert name in {"float16", "float32", "float64", "int32"}

    check()
    with pytest.raises(ValueError, match="unknown dtype"):
        dtypes(("float7",))


def test_arrays_rejects_unsupported_dtypes():
    with pytest.raises(ValueError, match="numpy has no bfloat16"):
        arrays("bfloat16", (4,))
    with pytest.raises(ValueError, match="unsupported dtype 'complex64'"):
        arrays("complex64", (4,))
