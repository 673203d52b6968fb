"""The f32 exp in plain IR arithmetic and bit-casts (vectorizable on the CPU): accuracy over a
dense sweep, its limits (flush to 0 below 2^-125.5, overflow to inf, -inf, +inf, NaN), and its
place in modules."""
import numpy as np
import pytest

from taskmap.compute import compute, tensor_input
from taskmap.ir import BitCast, collect, f32, f64
from taskmap.ir import expr as E
from taskmap.schedule.fastmath import (
    EXP_NONPOSITIVE,
    FAST_EXP,
    exp_nonpositive,
    fast_exp,
    fast_exp_function,
    helpers_for,
)
from taskmap.schedule.rule_based import build_module, schedule
from taskmap.testing import assert_close

N = 1 << 20
FLT_MAX = float(np.finfo(np.float32).max)
FLUSH = -125.5 * np.log(2.0)  # below: 0 (exp would be < 2^-125.5)
LAST = np.nextafter(np.float32(np.log(FLT_MAX)), np.float32(0))  # the largest x with a finite exp(x)
assert np.exp(np.float64(LAST)) <= FLT_MAX < np.exp(np.float64(np.nextafter(LAST, np.float32(100))))


@pytest.fixture(scope="module")
def run_exp():
    x = tensor_input("x", f32, [N])
    kernel = schedule(compute("y", [N], lambda i: fast_exp(x[i])), "cpu")

    def run(xs: np.ndarray) -> np.ndarray:
        a = np.zeros(N, np.float32)
        a[:len(xs)] = xs
        out = np.empty(N, np.float32)
        kernel(a, out)
        return out[:len(xs)]
    return run


def ulps(out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|out - ref| in units of the f32 spacing at the exact result."""
    return np.abs(out.astype(np.float64) - ref) / np.spacing(ref.astype(np.float32)).astype(np.float64)


def test_dense_sweep_is_within_about_one_ulp(run_exp):
    lo = np.nextafter(np.float32(FLUSH), np.float32(0))
    hi = LAST
    xs = np.linspace(lo, hi, N, dtype=np.float32)
    xs[:4096] = np.linspace(-1e-3, 1e-3, 4096, dtype=np.float32)  # around 0, densely
    out = run_exp(xs)
    ref = np.exp(xs.astype(np.float64))
    assert (ref <= FLT_MAX).all()
    u = ulps(out, ref)
    assert u.max() <= 1.5, (u.max(), xs[u.argmax()])
    assert np.abs(out / ref - 1).max() < 1.5e-7
    assert u.mean() < 0.4


def test_edges(run_exp):
    f = np.float32
    xs = np.array([0.0, -0.0, 1e-30, -1e-30, -np.inf, np.inf, np.nan, -np.nan, -1000.0, 1000.0,
                   LAST, 88.73, 89.0, FLUSH + 1e-4, FLUSH - 1e-4, -87.34, -103.0, -87.5, -88.0],
                  np.float32)
    out = run_exp(xs)
    assert list(out[:4]) == [1.0, 1.0, 1.0, 1.0]
    assert out[4] == 0.0 and out[5] == np.inf
    assert np.isnan(out[6]) and np.isnan(out[7])
    assert out[8] == 0.0 and out[9] == np.inf
    assert np.isfinite(out[10]) and ulps(out[10:11], np.exp(np.float64(xs[10])))[0] <= 1  # the largest finite
    assert out[11] == np.inf and out[12] == np.inf  # exp overflows f32 there
    assert abs(out[13] / np.exp(np.float64(xs[13])) - 1) < 2e-7  # just above the flush: normal, accurate
    # Below -125.5 ln2: 0 (what torch's vectorized exp_u20 does), although exp would still be a
    # normal f32 down to -87.34 and a subnormal down to -103.3.
    assert list(out[14:]) == [f(0)] * 5


def test_it_is_a_helper_in_the_module_and_vectorizes():
    x = tensor_input("x", f32, [4096])
    y = compute("y", [4096], lambda i: exp_nonpositive(x[i] - 1.0))  # the former name still works
    module = build_module(y, "cpu")
    assert FAST_EXP == EXP_NONPOSITIVE
    assert [f.name for f in module.functions] == ["y_cpu", FAST_EXP]
    assert helpers_for(module.entry_function.body)
    assert len(collect(fast_exp_function().body, BitCast)) == 2
    src = schedule(y, "cpu").build("cpu").source
    assert "#pragma omp simd" in src and "expf" not in src.split("tm_entry")[1]


def test_other_dtypes_use_the_intrinsic():
    v = E.var("v", f64)
    assert isinstance(fast_exp(v), E.Call)
    x = tensor_input("x", f64, [10])
    y = compute("y", [10], lambda i: fast_exp(x[i]))
    xs = np.linspace(-50, 50, 10)
    out = np.empty(10)
    schedule(y, "cpu")(xs, out)
    assert_close(out, np.exp(xs))
