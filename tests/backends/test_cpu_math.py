"""The C backend's f32 erf, tanh and exp: inline approximations (no libm call, so gcc
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


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in f32 units in the last place (both finite and of one sign, or equal)."""
    g, w = (np.asarray(a, np.float32).view(np.int32).astype(np.int64) for a in (got, want))
    return np.abs(g - w)


def test_exp_within_one_ulp_over_the_whole_range():
    """Subnormal results (down to -103.97) and the overflow to inf (from 88.73) included: the
    scale is applied as two powers of two, the last product rounds once."""
    rng = np.random.default_rng(11)
    x = np.concatenate([np.linspace(-110, 95, 1_000_001), rng.uniform(-105, 90, 200_000),
                        [0.0, -0.0, 88.72, 88.7228, 88.73, -87.33, -87.34, -103.9, -103.97, -103.98, 1e-30,
                         -1e-30]]).astype(np.float32)
    got = ops.exp(x)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    assert ulps(got, want).max() <= 1
    assert np.isinf(got[x > 88.73]).all() and (got[x < -104] == 0).all()
    special = np.array([np.nan, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(ops.exp(special), [np.nan, np.inf, 0.0])


def test_log_log1p_expm1_within_two_ulp():
    """log (subnormal inputs included) within 1 ulp, log1p and expm1 within 2, special values as C's."""
    rng = np.random.default_rng(12)
    pos = np.concatenate([np.geomspace(1e-45, 3.4e38, 400_000), rng.uniform(0, 10, 100_000),
                          np.linspace(0.5, 2.0, 100_001)]).astype(np.float32)
    assert ulps(ops.log(pos), np.log(pos.astype(np.float64)).astype(np.float32)).max() <= 1
    x = np.concatenate([np.linspace(-0.999999, 10, 400_001), -np.geomspace(1e-30, 0.999, 50_000),
                        np.geomspace(1e-30, 3e38, 50_000)]).astype(np.float32)
    assert ulps(ops.log1p(x), np.log1p(x.astype(np.float64)).astype(np.float32)).max() <= 2
    x = np.concatenate([np.linspace(-100, 88.7, 400_001), np.geomspace(1e-30, 1, 50_000),
                        -np.geomspace(1e-30, 1, 50_000)]).astype(np.float32)
    assert ulps(ops.expm1(x), np.expm1(x.astype(np.float64)).astype(np.float32)).max() <= 2
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, -2.0], np.float32)
    with np.errstate(all="ignore"):
        for fn, ref in ((ops.log, np.log), (ops.log1p, np.log1p), (ops.expm1, np.expm1)):
            got, want = np.asarray(fn(special)), ref(special)
            np.testing.assert_array_equal(got, want)
            assert np.array_equal(np.signbit(got[:2]), np.signbit(want[:2]))


def test_sigmoid_and_silu_match_torch():
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.random.default_rng(2).standard_normal(100_000) * 8,
                        [-100.0, -88.0, -20.0, 0.0, 20.0, 88.0, 100.0]]).astype(np.float32)
    t = torch.from_numpy(x).double()
    np.testing.assert_allclose(ops.sigmoid(x), torch.sigmoid(t).numpy(), rtol=2e-7, atol=1e-38)
    np.testing.assert_allclose(ops.silu(x), torch.nn.functional.silu(t).numpy(), rtol=3e-7, atol=1e-38)


def test_sigmoid_within_two_ulp_and_its_special_values():
    """``ops.sigmoid`` (``tm_sigmoidf``: exp(-x) with one power of two, the input clamped) within
    2 ulp of the correctly rounded sigmoid over the whole range — subnormal results included,
    where its absolute error stays below 1e-38 — 0 and 1 at the infinities, NaN kept; SiLU as
    ``x / (1 + exp(-x))`` (``tm_siluf``: one division) within 2 ulp of the correctly rounded SiLU
    down to -88.7, where exp(-x) overflows and it flushes to -0 (as ``x * sigmoid(x)`` did)."""
    rng = np.random.default_rng(13)
    x = np.concatenate([np.linspace(-110, 110, 1_000_001), rng.standard_normal(200_000) * 10,
                        [0.0, -0.0, 87.3, 87.5, 87.6, -87.3, -87.5, -88.7, -88.73, -88.8, -88.9, -103.9]])
    x = x.astype(np.float32)
    got = np.asarray(ops.sigmoid(x))
    want = (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)
    normal = want >= np.finfo(np.float32).tiny
    assert ulps(got[normal], want[normal]).max() <= 2
    assert np.abs(got[~normal].astype(np.float64) - want[~normal]).max() < 1e-38
    special = np.array([np.nan, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(ops.sigmoid(special), [np.nan, 1.0, 0.0])
    y = np.asarray(ops.silu(x))
    x64 = x.astype(np.float64)
    want = (x64 / (1.0 + np.exp(-x64))).astype(np.float32)
    ok = x > -88.7                       # below, exp(-x) overflows: SiLU flushes to -0 (|silu| < 1e-36)
    assert ulps(y[ok], want[ok]).max() <= 2
    assert np.abs(y[~ok].astype(np.float64) - want[~ok]).max() < 1e-36
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(ops.silu(special), [np.nan, np.inf, np.nan])    # -inf / inf


def test_no_libm_call_for_f32():
    names = ("tm_erff", "tm_tanhf", "tm_expf", "tm_logf", "tm_log1pf", "tm_expm1f", "tm_sigmoidf", "tm_siluf")
    for name in names:
        assert f"static inline float {name}(float x)" in RUNTIME_C
    from taskmap.backends.cpu.codegen import CpuFuncGen
    from taskmap.ir import expr as E

    fns = (E.Intrinsic.ERF, E.Intrinsic.TANH, E.Intrinsic.EXP, E.Intrinsic.LOG, E.Intrinsic.LOG1P, E.Intrinsic.EXPM1,
           E.Intrinsic.SIGMOID, E.Intrinsic.SILU)
    assert tuple(CpuFuncGen.MATH[i][0] for i in fns) == names


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


# ---------------------------------------------------------------- float min / max

import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import taskmap  # noqa: E402
from taskmap import repeat, spatial  # noqa: E402
from taskmap.backends.cpu.build import CFLAGS  # noqa: E402
from taskmap.backends.base import host_cpu_target  # noqa: E402
from taskmap.lang import exp, expm1, f32, f64, log1p, sqrt  # noqa: E402

lanes = repeat(4) * spatial(16)


@taskmap.kernel
def min_max(a: f32[64], b: f32[64], lo: f32[64], hi: f32[64]):
    for i in lanes.vectorize():
        lo[i] = min(a[i], b[i])
        hi[i] = max(a[i], b[i])


@taskmap.kernel
def min_max64(a: f64[64], b: f64[64], lo: f64[64], hi: f64[64]):
    for i in lanes.vectorize():
        lo[i] = min(a[i], b[i])
        hi[i] = max(a[i], b[i])


SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, 1.0, -1.0, 3.4e38, 1e-45]


@pytest.mark.parametrize("kernel, dtype", [(min_max, np.float32), (min_max64, np.float64)], ids=["f32", "f64"])
@given(a=st.lists(st.sampled_from(SPECIAL) | st.floats(-1e6, 1e6, width=32), min_size=64, max_size=64),
       b=st.lists(st.sampled_from(SPECIAL) | st.floats(-1e6, 1e6, width=32), min_size=64, max_size=64))
@settings(max_examples=25, deadline=None)
def test_float_min_max_are_c_fmin_fmax(kernel, dtype, a, b):
    """A NaN operand gives the other one (C's fmin / fmax, numpy's fmin / fmax), infinities order."""
    a, b = np.array(a, dtype), np.array(b, dtype)
    lo, hi = np.empty_like(a), np.empty_like(a)
    kernel(a, b, lo, hi)
    nonzero = (a != 0) | (b != 0)           # two zeros: either one (the sign is unspecified)
    np.testing.assert_array_equal(lo[nonzero], np.fmin(a, b)[nonzero])
    np.testing.assert_array_equal(hi[nonzero], np.fmax(a, b)[nonzero])
    assert (lo[~nonzero] == 0).all() and (hi[~nonzero] == 0).all()


def entry_assembly(kernel, name: str, tmp_path) -> str:
    """gcc's assembly (the backend's flags) of the kernel's entry function."""
    path = tmp_path / "k.c"
    path.write_text(kernel.build("cpu").source)
    asm = subprocess.run(["gcc", *(f for f in CFLAGS if f != "-shared"), "-S", "-o", "-", str(path)],
                         capture_output=True, text=True, check=True).stdout
    body = asm[asm.index(f"tm_entry_{name}:"):]
    return body[:body.index(".cfi_endproc")]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the assembly")
def test_float_min_max_loops_vectorize(tmp_path):
    """No libm call per lane: the loop compiles to vector compares and blends."""
    source = min_max.build("cpu").source
    assert "tm_fminf(" in source and "tm_fmaxf(" in source and " fmaxf(" not in source
    body = entry_assembly(min_max, "min_max", tmp_path)
    assert not re.search(r"call\s+f(max|min)f", body)
    assert re.search(r"v(cmp|max|min)ps\s", body)


@taskmap.kernel
def roots(a: f32[64], c: f32[64]):
    for i in lanes.vectorize():
        c[i] = sqrt(a[i])


def test_sqrt_keeps_ieee_results():
    """NaN for negative inputs, -0 for -0, inf for inf (``-fno-math-errno`` changes no result)."""
    a = np.random.default_rng(3).standard_normal(64).astype(np.float32) * 100
    a[:4] = [0.0, -0.0, np.inf, -1.0]
    c = np.empty_like(a)
    roots(a, c)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(c, np.sqrt(a))


@taskmap.kernel
def sigmoids(a: f32[64], c: f32[64]):
    for i in lanes.vectorize():
        c[i] = 1.0 / (1.0 + exp(-a[i]))


@taskmap.kernel
def softpluses(a: f32[64], c: f32[64]):
    for i in lanes.vectorize():
        c[i] = a[i] if a[i] > 20.0 else log1p(exp(a[i]))


@taskmap.kernel
def elus(a: f32[64], c: f32[64]):
    for i in lanes.vectorize():
        c[i] = a[i] if a[i] > 0.0 else expm1(a[i])


@pytest.mark.skipif(shutil.which("gcc") is None or "avx512f" not in host_cpu_target().features,
                    reason="needs gcc and AVX-512 for the assembly")
@pytest.mark.parametrize("kernel, name, ref", [
    (softpluses, "softpluses", lambda a: np.where(a > 20, a, np.log1p(np.exp(a)))),
    (elus, "elus", lambda a: np.where(a > 0, a, np.expm1(a)))], ids=["softplus", "elu"])
def test_selects_of_log1p_and_expm1_vectorize(tmp_path, kernel, name, ref):
    """A select with ``log1p`` / ``expm1`` (which divide) in a branch: with ``-fno-trapping-math``
    gcc if-converts it — no libm call, 512-bit arithmetic (scalar before: Mish, softplus and ELU
    epilogues 5-6x slower than SiLU's)."""
    body = entry_assembly(kernel, name, tmp_path)
    assert not re.search(r"call\s+(log1pf|expm1f|expf)", body)
    assert re.search(r"vdivps\s+%zmm", body)
    a = np.random.default_rng(6).standard_normal(64).astype(np.float32) * 8
    a[:3] = [25.0, -0.0, np.nan]
    c = np.empty_like(a)
    kernel(a, c)
    np.testing.assert_allclose(c, ref(a.astype(np.float64)), rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(shutil.which("gcc") is None or "avx512f" not in host_cpu_target().features,
                    reason="needs gcc and AVX-512 for the assembly")
def test_exp_loops_vectorize(tmp_path):
    """A sigmoid loop: no ``expf`` call per lane, 512-bit vector arithmetic."""
    assert "tm_expf(" in sigmoids.build("cpu").source
    body = entry_assembly(sigmoids, "sigmoids", tmp_path)
    assert not re.search(r"call\s+expf", body)
    assert re.search(r"vfmadd\w+ps\s+%zmm", body)
    a = np.random.default_rng(4).standard_normal(64).astype(np.float32) * 10
    c = np.empty_like(a)
    sigmoids(a, c)
    np.testing.assert_allclose(c, 1.0 / (1.0 + np.exp(-a.astype(np.float64))), rtol=3e-7)


@pytest.mark.skipif(shutil.which("gcc") is None or "avx512f" not in host_cpu_target().features,
                    reason="needs gcc and AVX-512 for the assembly")
def test_sqrt_loops_vectorize(tmp_path):
    """``-fno-math-errno``: a vector square root, not a libm call per lane."""
    body = entry_assembly(roots, "roots", tmp_path)
    assert "vsqrtps" in body and "call\tsqrtf" not in body
