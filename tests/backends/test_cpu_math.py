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
