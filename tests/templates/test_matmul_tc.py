"""The tensor-core matmul template (f16 / bf16, mma.sync + ldmatrix + cp.async; f32 on TF32 tensor
cores): numerics with GPU semantics on the CPU — aligned (cp.async) and unaligned (element-wise)
tiles, stored and transposed B, split-K, f16 and f32 outputs, TF32's rounding.  Spaces, builds
and GPU runs: test_matmul_simt.py."""
from dataclasses import replace

import numpy as np
import pytest

from taskmap.backends import cuda_target
from taskmap.templates.matmul_problem import MatmulProblem
from taskmap.templates.matmul_tc import MATMUL_TC
from taskmap.testing import assert_close, round_tf32
from taskmap.templates.matmul_simt import MATMUL_SIMT
from test_matmul_simt import SM80, operands, run, simt, tc


@pytest.mark.parametrize("schedule,shape", [
    (tc(), (37, 29, 45)),                                   # misaligned rows: element-wise copies
    (tc(bm=64, bn=32, bk=64, wm=2, wn=1, stages=4), (33, 40, 64)),   # aligned: cp.async
    (tc(wm=1, wn=2, stages=2, split=2), (19, 24, 208)),     # split-K
    (tc(bn=64, wm=1, wn=2, split=4), (21, 19, 200)),        # A aligned, a stored B's rows not
], ids=["unaligned", "aligned-4stage", "splitk2", "splitk4-mixed"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_tensor_cores_match_numpy(schedule, shape, trans_b):
    p = MatmulProblem(2, *shape, "float16", "float16", b_batched=False, trans_b=trans_b, bias=True)
    c, ref = run(MATMUL_TC, p, schedule, SM80, np.float16)
    assert_close(c, ref.astype(np.float16), rtol=2e-3, atol=2e-3 * np.sqrt(shape[2]))


def test_tensor_cores_f32_output():
    p = MatmulProblem(1, 20, 16, 48, "float16", "float32")
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-1, 1, p.a_shape).astype(np.float16), rng.uniform(-1, 1, p.b_shape).astype(np.float16)
    c = np.zeros(p.c_shape, np.float32)
    MATMUL_TC.instantiate(p, SM80, tc())(*MATMUL_TC.arguments(p, [a, b], [c], tc()))
    assert_close(c, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("schedule,shape", [
    (tc(bk=16), (37, 29, 45)),                              # misaligned rows: element-wise copies
    (tc(bm=64, bn=64, bk=32, wm=2, wn=2, stages=2), (33, 40, 64)),   # aligned: cp.async of 4 floats
    (tc(bk=16, wm=1, wn=2, stages=4, split=3), (19, 24, 200)),       # split-K
    (tc(bk=16, bn=64, wm=1, wn=2), (21, 49, 36)),           # A aligned, a stored B's rows (49) not
], ids=["unaligned", "aligned", "splitk3", "mixed"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_tf32_tensor_cores_round_the_operands(schedule, shape, trans_b):
    """f32 in and out on TF32 tensor cores: the result is the f64 product of the operands rounded
    to TF32 (up to f32 summation), and measurably not the f32 product of the operands."""
    p = MatmulProblem(2, *shape, "float32", "float32", b_batched=False, trans_b=trans_b, bias=True, tf32=True)
    c, full = run(MATMUL_TC, p, schedule, SM80)          # full: the f64 product of the f32 operands
    a, b, bias = operands(p, np.float32)                   # the operands run() used
    bm = np.swapaxes(b, 1, 2) if trans_b else b
    want = round_tf32(a).astype(np.float64) @ round_tf32(bm).astype(np.float64) + bias
    assert_close(c, want, rtol=1e-5, atol=1e-6 * np.sqrt(shape[2]))
    assert np.abs(c - full).max() > 20 * np.abs(c - want).max()      # TF32 products, not f32 ones


@pytest.mark.parametrize("schedule,shape", [
    (tc(bk=16), (37, 29, 45)),                              # misaligned rows: element-wise copies
    (tc(bm=64, bn=64, bk=32, wm=2, wn=2, stages=2), (33, 40, 96)),   # aligned: cp.async of 4 floats
    (tc(bk=16, wm=1, wn=2, stages=4, split=3), (19, 24, 200)),       # split-K
    (tc(bm=32, bn=32, bk=32, wm=1, wn=2, stages=2), (32, 32, 1536)),  # long K: truncated sums drift
], ids=["unaligned", "aligned", "splitk3", "long-k"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_3xtf32_is_as_accurate_as_f32(schedule, shape, trans_b):
    """3xTF32: each f32 operand split into a tf32 high part and a tf32 low part (the rest), the
    products hi*hi + hi*lo + lo*hi on TF32 tensor cores.  Against the f64 product of the f32
    operands its error is within 3x that of the SIMT template's f32 FMAs (lo*lo, ~2^-22 of a
    product, is dropped), and hundreds of times below TF32's.  The emulated mma truncates its sums
    as the tensor cores do: with the accumulators as the mma's C, the aligned and long-K cases
    fail (as 1024x768x3072 did on an H200: 14x the f32 error)."""
    kw = dict(b_batched=False, trans_b=trans_b, bias=True)
    p = MatmulProblem(2, *shape, "float32", "float32", tf32x3=True, **kw)
    c, full = run(MATMUL_TC, p, schedule, SM80)          # full: the f64 product of the f32 operands
    assert_close(c, full, rtol=1e-5, atol=1e-6 * np.sqrt(shape[2]))
    c_f32, _ = run(MATMUL_SIMT, replace(p, tf32x3=False), simt(), SM80)
    c_tf32, _ = run(MATMUL_TC, replace(p, tf32x3=False, tf32=True), schedule, SM80)
    err = {name: np.abs(x - full).max() for name, x in (("x3", c), ("f32", c_f32), ("tf32", c_tf32))}
    assert err["x3"] <= 3 * err["f32"], err
    assert err["tf32"] > 100 * err["x3"], err


def test_3xtf32_config_and_precedence():
    """A problem that allows TF32 runs TF32 (one mma); 3xTF32 only where it does not; both keep
    the template to f32 on sm_80+."""
    x3 = MatmulProblem(1, 64, 64, 64, tf32x3=True)
    assert MATMUL_TC.applies(x3, SM80) and not MATMUL_TC.applies(x3, cuda_target("sm_75"))
    s = MATMUL_TC.space(x3, SM80)[0]
    assert MATMUL_TC.config(x3, SM80, s).x3
    assert not MATMUL_TC.config(replace(x3, tf32=True), SM80, s).x3
    big = replace(x3, m=4096, n=4096, k=4096)          # three times the tensor-core work: dearer at best
    best = [min(MATMUL_TC.cost(q, SM80, t) for t in MATMUL_TC.space(q, SM80))
            for q in (big, replace(big, tf32x3=False, tf32=True))]
    assert best[0] > 1.2 * best[1]


def test_tf32_only_when_the_problem_allows_it():
    allowed = MatmulProblem(1, 64, 64, 64, tf32=True)
    assert MATMUL_TC.applies(allowed, SM80) and MATMUL_TC.space(allowed, SM80)
    assert not MATMUL_TC.applies(MatmulProblem(1, 64, 64, 64), SM80)          # f32 stays f32 by default
    assert not MATMUL_TC.applies(allowed, cuda_target("sm_75"))               # no TF32 before Ampere
    assert {s["bk"] for s in MATMUL_TC.space(allowed, SM80)} == {16, 32}
def test_bf16_transposed_weight():
    torch = pytest.importorskip("torch")
    p = MatmulProblem(1, 18, 24, 40, "bfloat16", "bfloat16", trans_b=True, bias=True)
    g = torch.Generator().manual_seed(0)
    a, w = torch.rand(1, 18, 40, generator=g) - 0.5, torch.rand(1, 24, 40, generator=g) - 0.5
    bias = torch.rand(24, generator=g) - 0.5
    a, w, bias = a.bfloat16(), w.bfloat16(), bias.bfloat16()
    c = torch.zeros(1, 18, 24, dtype=torch.bfloat16)
    s = tc(bn=32, wm=1, wn=2)
    MATMUL_TC.instantiate(p, cuda_target("sm_90"), s)(*MATMUL_TC.arguments(p, [a, w, bias], [c], s))
    ref = a.double() @ w.double().transpose(1, 2) + bias.double()
    assert_close(c.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.cuda
def test_3xtf32_on_the_gpu():
    """On the GPU: the 3xTF32 kernels (stored and transposed B, bias, split-K) against the f64
    product, within 3x the error of the SIMT template's f32 FMAs, and far below TF32's."""
    torch = pytest.importorskip("torch")
    from taskmap.backends.cuda.target import current_cuda_target
    from taskmap.schedule.tune import choose

    target = current_cuda_target(0)
    for (m, n, k), trans_b in [((37, 29, 45), False), ((1024, 768, 3072), True), ((64, 1000, 2048), True)]:
        base = MatmulProblem(1, m, n, k, trans_b=trans_b, bias=True)
        a = torch.randn(1, m, k, device="cuda")
        b = torch.randn(1, *base.b_shape[1:], device="cuda")
        bias = torch.randn(n, device="cuda")
        exact = (a.double() @ (b.double().transpose(1, 2) if trans_b else b.double())) + bias.double()
        err = {}
        for name, template, p in (("x3", MATMUL_TC, replace(base, tf32x3=True)), ("f32", MATMUL_SIMT, base),
                                  ("tf32", MATMUL_TC, replace(base, tf32=True))):
            s = choose(template, p, target, mode="model")
            c = torch.empty(1, m, n, device="cuda")
            template.instantiate(p, target, s)(*template.arguments(p, [a, b, bias], [c], s))
            torch.cuda.synchronize()
            err[name] = float((c.double() - exact).abs().max())
        assert err["x3"] <= 3 * err["f32"] and err["tf32"] > 30 * err["x3"], ((m, n, k), err)
