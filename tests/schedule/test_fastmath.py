"""exp of non-positive values in plain IR arithmetic (vectorizable on the CPU): accuracy, limits."""
import numpy as np

from taskmap.compute import compute, tensor_input
from taskmap.ir import f32, f64
from taskmap.ir import expr as E
from taskmap.schedule.fastmath import EXP_NONPOSITIVE, exp_nonpositive, helpers_for
from taskmap.schedule.rule_based import build_module, schedule
from taskmap.testing import assert_close


def test_exp_nonpositive_is_accurate_to_a_few_ulp():
    n = 1 << 16
    x = tensor_input("x", f32, [n])
    y = compute("y", [n], lambda i: exp_nonpositive(x[i]))
    rng = np.random.default_rng(1)
    xs = np.concatenate([-rng.exponential(8.0, n - 8).astype(np.float32),
                         np.array([0.0, -0.0, -1e-30, -87.2, -87.4, -1000.0, -np.inf, np.nan], np.float32)])
    out = np.empty(n, np.float32)
    schedule(y, "cpu")(xs, out)
    ref = np.exp(xs.astype(np.float64))
    normal = ref > 1.2e-38
    rel = np.abs(out[normal] - ref[normal]) / ref[normal]
    assert rel.max() < 3e-7
    assert list(out[-8:-5]) == [1.0, 1.0, 1.0]
    assert abs(out[-5] / np.exp(np.float64(np.float32(-87.2))) - 1) < 1e-6
    assert list(out[-4:-1]) == [0.0, 0.0, 0.0]  # below -87.3 (subnormal results): 0
    assert np.isnan(out[-1])


def test_exp_nonpositive_is_a_helper_in_the_module_and_vectorizes():
    x = tensor_input("x", f32, [4096])
    y = compute("y", [4096], lambda i: exp_nonpositive(x[i] - 1.0))
    module = build_module(y, "cpu")
    assert [f.name for f in module.functions] == ["y_cpu", EXP_NONPOSITIVE]
    assert helpers_for(module.entry_function.body)
    src = schedule(y, "cpu").build("cpu").source
    assert "#pragma omp simd" in src and "expf" not in src.split("tm_entry")[1]


def test_other_dtypes_use_the_intrinsic():
    v = E.var("v", f64)
    assert isinstance(exp_nonpositive(v), E.Call)
    x = tensor_input("x", f64, [10])
    y = compute("y", [10], lambda i: exp_nonpositive(x[i]))
    xs = -np.linspace(0, 50, 10)
    out = np.empty(10)
    schedule(y, "cpu")(xs, out)
    assert_close(out, np.exp(xs))
