"""The attention templates: spaces (hardware terms, pruned by checks), costs, the model's choice,
and every kernel against torch in float64 — the CPU kernel at several points of its space, the
GPU SIMT kernel run on the CPU with GPU semantics (32- and 64-lane warps) — and builds for
sm_80 / sm_90 (NVRTC) and gfx90a (hipRTC)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.backends import cuda_target, hip_target, host_cpu_target
from taskmap.backends.hip import hiprtc_available
from taskmap.schedule.tune import choose
from taskmap.templates.attention_cpu import ATTENTION_CPU
from taskmap.templates.attention_gpu import ATTENTION_GPU
from taskmap.templates.attention_kernels import MaskKind
from taskmap.templates.attention_problem import AttentionProblem
from taskmap.templates.attention_tc import ATTENTION_TC
from taskmap.templates.base import Schedule
from taskmap.testing import assert_close

FEW = settings(max_examples=6, deadline=None, derandomize=True)
CPU, SM90, GFX = host_cpu_target(), cuda_target("sm_90"), hip_target("gfx90a")
RNG = np.random.default_rng(5)


def reference(p: AttentionProblem, q, k, v, mask):
    """torch in float64, batch by batch through the problem's index maps."""
    out = []
    for b in range(p.bh):
        kb, mbi = b // p.kd % p.km, b // p.md % p.mm
        m = None
        if mask is not None:
            m = torch.from_numpy(mask[mbi]) if p.mask == MaskKind.BOOL else torch.from_numpy(mask[mbi]).double()
        if p.causal:
            m = torch.ones(p.L, p.S, dtype=torch.bool).tril()
        t = [torch.from_numpy(x).double() for x in (q[b], k[kb], v[kb])]
        out.append(F.scaled_dot_product_attention(*t, attn_mask=m, scale=p.scale).numpy())
    return np.stack(out)


def run(template, p: AttentionProblem, target, schedule=None):
    s = schedule or choose(template, p, target, mode="model")
    kernel = template.instantiate(p, target, s)
    dt = np.dtype(p.dtype)
    q = RNG.standard_normal((p.bh, p.L, p.e)).astype(dt)
    k = RNG.standard_normal((p.bk, p.S, p.e)).astype(dt)
    v = RNG.standard_normal((p.bk, p.S, p.ev)).astype(dt)
    mask = None
    if p.mask == MaskKind.BOOL:
        mask = RNG.random((p.mb, p.ml, p.S)) > 0.3
    elif p.mask == MaskKind.ADD:
        mask = RNG.standard_normal((p.mb, p.ml, p.S)).astype(dt)
    out = np.full((p.bh, p.L, p.ev), np.nan, dt)
    kernel(*template.arguments(p, [q, k, v] + ([mask] if mask is not None else []), [out]))
    return out, reference(p, q, k, v, mask), kernel


problems = st.builds(
    lambda bh, L, S, e, ev, mask, causal, rows: AttentionProblem(
        bh, bh if bh % 2 else bh // 2, L, S, e, ev, mask=MaskKind.NONE if causal else mask,
        mb=bh, mask_rows=rows, causal=causal, scale=0.7 / np.sqrt(e), kd=1 if bh % 2 else 2, km=bh, md=1, mm=bh),
    bh=st.integers(1, 3), L=st.sampled_from([1, 2, 7, 13, 31]), S=st.sampled_from([1, 3, 17, 37, 70]),
    e=st.sampled_from([1, 20]), ev=st.sampled_from([1, 33]),
    mask=st.sampled_from([MaskKind.NONE, MaskKind.BOOL, MaskKind.ADD]), causal=st.booleans(), rows=st.booleans())


def _fix(p: AttentionProblem) -> AttentionProblem:
    """kd / km consistent with bk (the strategy halves bk for even bh: grouped heads of 2)."""
    return AttentionProblem(p.bh, p.bk, p.L, p.S, p.e, p.ev, p.dtype, p.mask, p.mb, p.mask_rows, p.causal, p.scale,
                            p.kd, p.bk, p.md, p.mm)


@given(p=problems)
@FEW
def test_cpu_template_matches_torch(p):
    out, ref, _ = run(ATTENTION_CPU, _fix(p), CPU)
    assert_close(out, ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("bm,bn,qg", [(1, 32, 1), (4, 64, 4), (8, 32, 1), (2, 128, 8), (6, 64, 4)])
def test_cpu_points_of_the_space(bm, bn, qg):
    p = AttentionProblem(2, 1, 19, 150, 24, 40, mask=MaskKind.ADD, mb=1, mask_rows=True, scale=0.2, kd=2, km=1)
    s = Schedule.of(bm=bm, bn=bn, qg=qg, cores=CPU.num_cores)
    out, ref, _ = run(ATTENTION_CPU, p, CPU, s)
    assert_close(out, ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("target", [SM90, GFX], ids=["sm_90", "gfx90a"])
@given(p=problems)
@settings(max_examples=3, deadline=None, derandomize=True)
def test_gpu_template_matches_torch_with_gpu_semantics(target, p):
    out, ref, _ = run(ATTENTION_GPU, _fix(p), target)
    assert_close(out, ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("nw,rw,kpl", [(1, 1, 1), (2, 4, 2), (4, 2, 4)])
@pytest.mark.parametrize("e,ev,S", [(64, 64, 70), (32, 16, 100), (20, 33, 37), (3, 5, 9)])
def test_gpu_points_with_vector_and_scalar_shared_reads(nw, rw, kpl, e, ev, S):
    # Head sizes that are multiples of 4 read Q and K rows (and the probabilities: S in runs of
    # 4, then the tail) as 16-byte vectors; others element by element.  When both are, K and V
    # tiles come in 16-byte chunks, the next tile's while this one is multiplied (S = 100: up to
    # four tiles, the last one partial).
    p = AttentionProblem(3, 3, 21, S, e, ev, mask=MaskKind.BOOL, mb=3, mask_rows=True, scale=0.3, kd=1, km=3,
                         md=1, mm=3)
    out, ref, _ = run(ATTENTION_GPU, p, SM90, Schedule.of(nw=nw, rw=rw, kpl=kpl))
    assert_close(out, ref, rtol=1e-5, atol=2e-6)


@given(p=problems)
@settings(max_examples=3, deadline=None, derandomize=True)
def test_tensor_core_template_matches_torch_with_gpu_semantics(p):
    p = _fix(p)
    p = AttentionProblem(p.bh, p.bk, p.L, p.S, p.e, p.ev, "float16", p.mask, p.mb, p.mask_rows, p.causal, p.scale,
                         p.kd, p.km, p.md, p.mm)
    out, ref, _ = run(ATTENTION_TC, p, SM90)
    assert_close(out, ref, rtol=2e-2, atol=5e-3)


@pytest.mark.parametrize("nw,bn", [(1, 32), (2, 64)])
def test_tensor_core_points_with_gpu_semantics(nw, bn):
    p = AttentionProblem(2, 1, 37, 70, 24, 40, "float16", MaskKind.BOOL, mb=1, mask_rows=True, scale=0.2, kd=2, km=1)
    out, ref, _ = run(ATTENTION_TC, p, SM90, Schedule.of(nw=nw, bn=bn))
    assert_close(out, ref, rtol=2e-2, atol=5e-3)


def test_fully_masked_rows_give_zeros():
    p = AttentionProblem(1, 1, 4, 9, 8, 8, mask=MaskKind.ADD, mb=1, scale=0.3)
    for template, target in ((ATTENTION_CPU, CPU), (ATTENTION_GPU, SM90)):
        q, k, v = (RNG.standard_normal(s).astype(np.float32) for s in ((1, 4, 8), (1, 9, 8), (1, 9, 8)))
        mask = np.zeros((1, 4, 9), np.float32)
        mask[0, 2] = -np.inf
        out = np.full((1, 4, 8), np.nan, np.float32)
        kernel = template.instantiate(p, target, choose(template, p, target, mode="model"))
        kernel(*template.arguments(p, [q, k, v, mask], [out]))
        assert np.all(out[0, 2] == 0) and np.all(np.isfinite(out))
        assert_close(out, reference(p, q, k, v, mask), rtol=1e-5, atol=2e-6)


def test_spaces_are_in_hardware_terms_and_pruned():
    small = AttentionProblem(1, 1, 5, 7, 64, 64)
    big = AttentionProblem(12, 12, 1024, 1024, 64, 64, causal=True)
    for p in (small, big):
        space = ATTENTION_CPU.space(p, CPU)
        assert space and all(s["bn"] % 16 == 0 or CPU.vector_bytes < 64 for s in space)
        regs = 32 if CPU.vector_bytes >= 64 else 16
        lanes = max(4, CPU.vector_bytes // 4)
        assert all(s["bm"] * (s["bn"] // lanes) + s["bn"] // lanes + 1 <= regs for s in space)
    assert {s["bm"] for s in ATTENTION_CPU.space(small, CPU)} <= {1, 2, 4, 6, 8}
    assert max(s["bn"] for s in ATTENTION_CPU.space(big, CPU)) > max(s["bn"] for s in ATTENTION_CPU.space(small, CPU))
    for target in (SM90, GFX):
        space = ATTENTION_GPU.space(big, target)
        assert space
        for s in space:
            cfg = ATTENTION_GPU.config(big, target, s)
            assert cfg.shared_bytes() <= target.max_shared_memory
            assert cfg.nw * 32 <= target.max_threads_per_block and cfg.nw * 32 % target.warp_size == 0
    wide = AttentionProblem(1, 1, 64, 64, 512, 512)          # big heads: tiles pruned by shared memory
    assert len(ATTENTION_GPU.space(wide, SM90)) < len(ATTENTION_GPU.space(big, SM90))
    assert not ATTENTION_CPU.space(big, SM90) and not ATTENTION_GPU.space(big, CPU)
    half = AttentionProblem(1, 1, 4, 4, 8, 8, dtype="float16")
    assert not ATTENTION_CPU.space(half, CPU) and not ATTENTION_GPU.space(half, SM90)
    assert ATTENTION_TC.space(half, SM90) and not ATTENTION_TC.space(half, GFX)      # mma.sync: NVIDIA only
    for s in ATTENTION_TC.space(AttentionProblem(8, 8, 512, 512, 128, 128, "bfloat16"), SM90):
        cfg = ATTENTION_TC.config(big, SM90, s)
        assert cfg.fragment_registers() <= 128


def test_cost_model_prefers_register_blocking_and_skips_causal_blocks():
    p = AttentionProblem(12, 12, 128, 128, 64, 64)
    costs = {s: ATTENTION_CPU.cost(p, CPU, s) for s in ATTENTION_CPU.space(p, CPU)}
    best = min(costs, key=costs.get)
    assert best["bm"] > 1
    pc = AttentionProblem(12, 12, 1024, 1024, 64, 64, causal=True)
    pf = AttentionProblem(12, 12, 1024, 1024, 64, 64)
    s = choose(ATTENTION_CPU, pf, CPU, mode="model")
    assert ATTENTION_CPU.cost(pc, CPU, s) < 0.7 * ATTENTION_CPU.cost(pf, CPU, s)
    g = choose(ATTENTION_GPU, pf, SM90, mode="model")
    assert ATTENTION_GPU.cost(pc, SM90, g) < ATTENTION_GPU.cost(pf, SM90, g)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gpu_kernels_build_for_cuda(arch):
    for mask, causal in ((MaskKind.NONE, True), (MaskKind.BOOL, False), (MaskKind.ADD, False)):
        p = AttentionProblem(4, 2, 100, 100, 64, 64, mask=mask, causal=causal, kd=2, km=2)
        kernel = ATTENTION_GPU.instantiate(p, SM90, choose(ATTENTION_GPU, p, SM90, mode="model"))
        built = kernel.build("cuda", arch=arch)
        assert built.binary


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_kernels_build_for_cuda(arch, dtype):
    for mask, causal in ((MaskKind.NONE, True), (MaskKind.ADD, False)):
        p = AttentionProblem(4, 4, 100, 100, 64, 64, dtype, mask=mask, causal=causal)
        kernel = ATTENTION_TC.instantiate(p, SM90, choose(ATTENTION_TC, p, SM90, mode="model"))
        built = kernel.build("cuda", arch=arch)
        assert "mma.sync.aligned.m16n8k16" in built.artifact.extra.ptx


@pytest.mark.skipif(not hiprtc_available(), reason="hipRTC (libamdhip64) not installed")
def test_gpu_kernels_build_for_hip():
    p = AttentionProblem(4, 4, 100, 100, 64, 64, mask=MaskKind.BOOL)
    kernel = ATTENTION_GPU.instantiate(p, GFX, choose(ATTENTION_GPU, p, GFX, mode="model"))
    assert kernel.build("hip", arch="gfx90a").binary
