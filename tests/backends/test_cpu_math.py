"""The C backend's f32 erf and tanh: inline rational approximations (no libm call, so gcc
vectorizes loops of them), checked against the double-precision functions on a dense grid and
at the special values."""
import math

import numpy as np

from taskmap import ops
from taskmap.backends.cpu.runtime_c import RUNTIME_C


def grid():
    x = np.concatenate([np.linspace(-10, 10, 400_001), np.geomspace(1e-30, 1e-2, 2000),
                        -np.geomspace(1e-30, 1e-2, 2000), [0.0, -0.0, 3.999, 4.0, 4.001, 7.9, 8.0]])
    return x.astype(np.float32)


def check(fn, ref, x):
    got = np.asarray(fn(x), np.float64)
    want = np.array([ref(float(v)) for v in x])
    err = np.abs(got - want)
    assert err.max() <= 5e-7, x[err.argmax()]
    tiny = np.abs(want) < 1e-3           # near zero: relative accuracy (no absolute floor hides it)
    assert (err[tiny] / np.abs(want[tiny]).clip(1e-38)).max() <= 1e-6
    assert np.array_equal(np.signbit(got[x == 0]), np.signbit(x[x == 0]))


def test_erf_tanh_accuracy_and_special_values():
    x = grid()
    check(ops.erf, math.erf, x)
    check(ops.tanh, math.tanh, x)
    special = np.array([np.nan, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(ops.erf(special), [np.nan, 1.0, -1.0])
    np.testing.assert_array_equal(ops.tanh(special), [np.nan, 1.0, -1.0])


def test_no_libm_call_for_f32():
    assert "static inline float tm_erff(float x)" in RUNTIME_C and "static inline float tm_tanhf(float x)" in RUNTIME_C
    from taskmap.backends.cpu.codegen import CpuFuncGen
    from taskmap.ir import expr as E

    assert CpuFuncGen.MATH[E.Intrinsic.ERF][0] == "tm_erff" and CpuFuncGen.MATH[E.Intrinsic.TANH][0] == "tm_tanhf"


def test_trunc_and_fmod_in_kernels_match_c_semantics():
    """``math.trunc`` / ``trunc`` and ``math.fmod`` / ``fmod`` on IR values: rounding toward zero
    and the remainder with the dividend's sign, in f32 and f64 (vectorized loops included)."""
    import taskmap
    from taskmap import spatial
    from taskmap.lang import f32, f64, fmod, trunc

    @taskmap.kernel
    def k32(x: f32[257], d: f32[257], y: f32[2, 257]):
        for i in spatial(257).vectorize():
            y[0, i] = math.trunc(x[i]) + trunc(-x[i])
            y[1, i] = math.fmod(x[i], d[i]) + fmod(x[i], 1.5)

    @taskmap.kernel
    def k64(x: f64[257], d: f64[257], y: f64[2, 257]):
        for i in spatial(257):
            y[0, i] = trunc(x[i])
            y[1, i] = fmod(x[i], d[i])

    rng = np.random.default_rng(5)
    x = rng.standard_normal(257) * 20
    x[:4] = [-0.0, 2.5, -2.5, np.inf]
    d = rng.standard_normal(257) * 4
    d[3] = 2.0
    for kernel, t in ((k32, np.float32), (k64, np.float64)):
        xs, ds = x.astype(t), d.astype(t)
        y = np.zeros((2, 257), t)
        kernel(xs, ds, y)
        with np.errstate(invalid="ignore"):          # inf: trunc(inf) + trunc(-inf), fmod(inf, d) are NaN
            want = [np.trunc(xs), np.fmod(xs, ds)] if t is np.float64 else \
                [np.trunc(xs) + np.trunc(-xs), np.fmod(xs, ds) + np.fmod(xs, t(1.5))]
        np.testing.assert_array_equal(y, np.stack(want))
