"""The wgmma template's TMA form (``TASKMAP_WGMMA=tma``: tiles by the copy engine, a producer warp,
full / empty mbarriers): numerics with GPU semantics on the CPU emulation (edges zero-filled by the
copy engine, one and two consumer warpgroups, 256 columns, k-tiles of two swizzle columns,
split-K, batches, f16 / bf16), its space, shared memory and threads, ptxas's view of every
schedule (no serialized wgmma, no spills), and on an H100 / H200 under the ``cuda`` marker."""
import shutil
import subprocess

import numpy as np
import pytest

from taskmap.backends import cuda_target
from taskmap.schedule.tune import choose
from taskmap.templates.base import Schedule
from taskmap.templates.matmul_problem import MatmulProblem
from taskmap.templates.matmul_wgmma import MATMUL_WGMMA
from taskmap.testing import assert_close
from test_matmul_simt import operands, run
from test_matmul_wgmma import assert_as_accurate_as_f32, truncated

SM90A = cuda_target("sm_90a")


@pytest.fixture
def tma_mode(monkeypatch):
    monkeypatch.setenv("TASKMAP_WGMMA", "tma")


def tma(bm=64, bn=64, bk=32, stages=3, split=1):
    return Schedule.of(bm=bm, bn=bn, bk=bk, stages=stages, split=split, inflight=1, tma=1)


@pytest.mark.parametrize("schedule,shape,a_batched", [
    (tma(), (37, 29, 44), True),                            # edges in m, n and k: the copy engine's zeros
    (tma(bm=128, bn=128, stages=4), (130, 72, 200), True),  # two consumer warpgroups, a 4-stage ring
    (tma(bn=256, stages=2), (20, 260, 64), False),          # 256 columns, a 2-stage ring, one A, batched Bs
    (tma(bm=128, bn=256), (140, 300, 96), True),            # two warpgroups of 128 accumulators
    (tma(split=3), (19, 24, 200), True),                    # split-K: partial sums, then the reduction
    (tma(bm=128, bk=64, stages=4), (130, 72, 520), True),   # k-tiles of two swizzle columns, many rounds
], ids=["edges", "two-warpgroups", "n256", "n256-two-warpgroups", "splitk3", "bk64-rounds"])
def test_tma_form_matches_the_truncated_product(schedule, shape, a_batched):
    p = MatmulProblem(2, *shape, "float32", "float32", a_batched=a_batched, b_batched=not a_batched, trans_b=True,
                      bias=True, tf32=True)
    assert MATMUL_WGMMA.config(p, SM90A, schedule).tma
    c, full = run(MATMUL_WGMMA, p, schedule, SM90A)
    a, b, bias = operands(p, np.float32)
    want = truncated(a).astype(np.float64) @ np.swapaxes(truncated(b), 1, 2).astype(np.float64) + bias
    assert_close(c, want, rtol=1e-5, atol=1e-6 * np.sqrt(shape[2]))
    assert np.abs(c - full).max() > 20 * np.abs(c - want).max()      # tf32 products, not f32 ones


@pytest.mark.parametrize("schedule,shape", [
    (tma(), (37, 29, 44)),                                  # edges: zero-filled lows too
    (tma(bm=128, bn=128, stages=4), (130, 72, 1536)),       # two warpgroups split B together; long K
    (tma(bm=128, bk=64, stages=3, split=2), (70, 40, 1000)),   # two swizzle columns, split-K
], ids=["edges", "two-warpgroups-long-k", "bk64-splitk"])
def test_tma_form_3xtf32_is_as_accurate_as_f32(schedule, shape):
    """3xTF32 on the TMA form (the consumers split the tiles, a named barrier among them): within 3x
    the error of the SIMT template's f32 FMAs against the f64 product, far below TF32's."""
    p = MatmulProblem(2, *shape, "float32", "float32", b_batched=False, trans_b=True, bias=True, tf32x3=True)
    cfg = MATMUL_WGMMA.config(p, SM90A, schedule)
    assert cfg.x3 and cfg.tma
    assert_as_accurate_as_f32(p, schedule)


@pytest.mark.parametrize("dtype,out,schedule", [
    ("float16", "float16", tma(bk=64)),
    ("bfloat16", "float32", tma(bm=128, bn=128, bk=128, stages=4)),
], ids=["f16", "bf16-bk128"])
def test_tma_form_16_bit(dtype, out, schedule):
    torch = pytest.importorskip("torch")
    bias = out == dtype
    p = MatmulProblem(2, 70, 72, 200, dtype, out, b_batched=False, trans_b=True, bias=bias)
    g = torch.Generator().manual_seed(1)
    tdt = getattr(torch, dtype)
    a, w = (torch.rand(*s, generator=g) - 0.5 for s in (p.a_shape, p.b_shape))
    bv = torch.rand(p.n, generator=g) - 0.5
    a, w, bv = a.to(tdt), w.to(tdt), bv.to(getattr(torch, out))
    c = torch.zeros(p.c_shape, dtype=getattr(torch, out))
    MATMUL_WGMMA.instantiate(p, SM90A, schedule)(*MATMUL_WGMMA.arguments(p, [a, w] + [bv] * bias, [c], schedule))
    want = a.double() @ w.double().transpose(1, 2) + (bv.double() if bias else 0)
    tol = 2e-3 if dtype == "float16" else 2e-2
    assert_close(c.float(), want.float(), rtol=tol, atol=tol * np.sqrt(p.k))


def test_tma_space_is_opt_in_and_applies_to_aligned_linears(tma_mode, monkeypatch):
    linear = MatmulProblem(1, 1024, 768, 3072, trans_b=True, bias=True, tf32=True)
    space = MATMUL_WGMMA.space(linear, SM90A)
    assert space and all(s["tma"] == 1 and s["inflight"] == 1 for s in space)
    best = choose(MATMUL_WGMMA, linear, SM90A, mode="model")
    assert best["tma"] == 1
    x3 = MATMUL_WGMMA.space(MatmulProblem(1, 512, 512, 512, trans_b=True, tf32x3=True), SM90A)
    assert x3 and all(s["tma"] == 1 and s["bn"] <= 128 for s in x3)
    # not for a K x N B or rows off 16 bytes: those keep the cp.async form
    for p in (MatmulProblem(1, 512, 512, 512, tf32=True), MatmulProblem(1, 512, 512, 510, trans_b=True, tf32=True),
              MatmulProblem(1, 512, 512, 500, "float16", "float16", trans_b=True)):
        assert all("tma" not in s.as_dict() for s in MATMUL_WGMMA.space(p, SM90A)), p
    assert MATMUL_WGMMA.space(MatmulProblem(1, 512, 512, 504, "float16", "float16", trans_b=True), SM90A)[0]["tma"]
    monkeypatch.setenv("TASKMAP_WGMMA", "1")
    assert all("tma" not in s.as_dict() for s in MATMUL_WGMMA.space(linear, SM90A))


def test_tma_form_threads_and_shared_memory(tma_mode):
    from taskmap.backends.clike import smem_layout
    from taskmap.runtime.kernel import launch_dims

    p = MatmulProblem(1, 4096, 4096, 4096, "float16", "float16", trans_b=True)
    for s in MATMUL_WGMMA.space(p, SM90A):
        cfg = MATMUL_WGMMA.config(p, SM90A, s)
        kernel = MATMUL_WGMMA.instantiate(p, SM90A, s).kernels[0]
        taken = smem_layout(kernel.func)[1]
        assert cfg.smem_bytes() <= taken <= cfg.smem_bytes() + 2048 and taken <= SM90A.max_shared_memory_optin
        _, block = launch_dims(kernel.func, {"m": 1, "n": 1, "k": 1, "cz": 1, "batch": 1, "nbias": 1})
        assert block[0] == cfg.threads == 128 * s["bm"] // 64 + 32


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on the PATH")
@pytest.mark.parametrize("math", ["tf32", "tf32x3", "float16"])
def test_ptxas_keeps_the_tma_form_pipelined(tma_mode, math, tmp_path):
    """Every schedule: no serialized wgmma (ptxas's C7515), no spills, the copy engine's loads and the
    barriers' waits in the code, and at most the registers 128 C + 32 threads leave a thread."""
    kw = {math: True} if math.startswith("tf32") else {"dtype": math, "out_dtype": math}
    p = MatmulProblem(1, 4096, 4096, 4096, trans_b=True, bias=True, **kw)
    for s in MATMUL_WGMMA.space(p, SM90A):
        ptx = MATMUL_WGMMA.instantiate(p, SM90A, s).build("cuda", arch="sm_90a").compiled[0].artifact.extra.ptx
        assert "cp.async.bulk.tensor.3d" in ptx and "mbarrier.try_wait.parity" in ptx and "cp.async.ca" not in ptx
        assert ("bar.sync" in ptx.replace("bar.sync \t0", "")) == (math == "tf32x3")
        (tmp_path / "k.ptx").write_text(ptx)
        log = subprocess.run([shutil.which("ptxas"), "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o",
                              str(tmp_path / "k.cubin")], capture_output=True, text=True, check=True).stderr
        assert "serialized" not in log and " 0 bytes spill stores" in log, (s, log)


def _varied(space):
    """A few schedules of a space that between them take every tile shape, ring depth and split."""
    seen, out = set(), []
    for s in space:
        d = s.as_dict()
        for key in ((d["bm"], d["bn"], d["bk"]), ("stages", d["stages"]), ("split", d["split"] > 1)):
            if key not in seen:
                seen.add(key)
                out.append(s)
                break
    return out


@pytest.mark.cuda
@pytest.mark.parametrize("math", ["tf32", "tf32x3", "float16"])
def test_tma_form_on_the_gpu(math, tma_mode):
    """On an H100 / H200: BERT-sized linears and a ragged one (the copy engine's zero fill), the
    model's schedule and one of every tile shape, ring depth and split, against torch's f64
    product (TF32: ~1e-3; 3xTF32: about f32's accuracy; f16)."""
    torch = pytest.importorskip("torch")
    from taskmap.backends.cuda.target import current_cuda_target

    target = current_cuda_target(0)
    if "wgmma" not in target.features:
        pytest.skip(f"{target.name} has no wgmma (an sm_90a GPU runs this)")
    tdt = torch.float16 if math == "float16" else torch.float32
    kw = {math: True} if math.startswith("tf32") else {"dtype": math, "out_dtype": math}
    tol = {"tf32": 2e-3, "tf32x3": 2e-5, "float16": 4e-3}[math]
    for m, n, k in [(1024, 768, 3072), (1024, 3072, 768), (300, 200, 136)]:
        p = MatmulProblem(1, m, n, k, trans_b=True, bias=True, **kw)
        a, w = torch.randn(1, m, k, device="cuda").to(tdt), torch.randn(1, n, k, device="cuda").to(tdt)
        bias = torch.randn(n, device="cuda").to(tdt)
        exact = a.double() @ w.double().transpose(1, 2) + bias.double()
        space = MATMUL_WGMMA.space(p, target)
        assert space and all(s["tma"] for s in space)
        for s in {choose(MATMUL_WGMMA, p, target, mode="model"), *_varied(space)}:
            c = torch.full((1, m, n), float("nan"), device="cuda", dtype=tdt)
            MATMUL_WGMMA.instantiate(p, target, s)(*MATMUL_WGMMA.arguments(p, [a, w, bias], [c], s))
            torch.cuda.synchronize()
            err = float((c.double() - exact).abs().max() / exact.abs().max())
            assert err < tol, ((m, n, k), s, err)
