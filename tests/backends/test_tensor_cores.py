"""Tensor cores: ``mma_sync_m16n8k16`` (f16 and bf16 in, f32 accumulate), ``mma_sync_m16n8k8_tf32``
(f32 rounded to tf32) and ``ldmatrix``, with
fragments moved by the task-mapping layouts of ``taskmap.lang.mma``; and the tensor-core matmul
example (cp.async pipeline, ldmatrix, mma, predicated edges) on sizes that are not multiples of
its tiles — on the CPU emulation against numpy, built for sm_80 / sm_90, refused for HIP, and
launched on an NVIDIA GPU under the ``cuda`` marker."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prim_checks import DEVICES, built_for_cuda, run_on

import taskmap
from taskmap.errors import TaskmapError, UnsupportedError
from taskmap.templates.matmul_tc import B_NK_ROWS_B32
from taskmap.testing import round_tf32 as tf32_reference
from taskmap.lang import (attrs, bf16, f16, f32, lane_id, ldmatrix_x1, ldmatrix_x1_rows, ldmatrix_x2,
                          ldmatrix_x2_rows, ldmatrix_x4, ldmatrix_x4_rows, ldmatrix_x4_rows_b32, mma_a_layout, mma_b_layout, mma_c_layout,
                          mma_sync_m16n8k8_tf32, mma_sync_m16n8k16, mma_tf32_a_layout, mma_tf32_b_layout,
                          register_tensor, round_tf32, shared_tensor, syncthreads, tf32_operand, threadIdx)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FEW = settings(max_examples=8, deadline=None)
RNG = np.random.default_rng(17)
F16_TOL = dict(rtol=1e-3, atol=1e-3)  # f16 inputs, exact products, f32 sums: only summation order differs


def _example(name):
    spec = importlib.util.spec_from_file_location(f"taskmap_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TC = _example("matmul_tensorcore")
WG = _example("matmul_wgmma")


# ----------------------------------------------------------------------------- one mma, fragments by mapping


def mma_kernel(dtype):
    @taskmap.kernel
    def mma_tile(a: dtype[16, 16], b: dtype[16, 8], c: f32[16, 8]):
        attrs.block_dim = 32
        ra = register_tensor(dtype, [8])
        rb = register_tensor(dtype, [4])
        rc = register_tensor(f32, [4])
        for q, (i, k) in enumerate(mma_a_layout.on(lane_id())):
            ra[q] = a[i, k]
        for q, (k, j) in enumerate(mma_b_layout.on(lane_id())):
            rb[q] = b[k, j]
        for q, (i, j) in enumerate(mma_c_layout.on(lane_id())):
            rc[q] = c[i, j]
        mma_sync_m16n8k16(rc, ra, rb)
        for q, (i, j) in enumerate(mma_c_layout.on(lane_id())):
            c[i, j] = rc[q]
    return mma_tile


MMA_F16, MMA_BF16 = mma_kernel(f16), mma_kernel(bf16)


@pytest.mark.parametrize("device", DEVICES)
def test_one_mma_f16(device):
    a = RNG.uniform(-1, 1, (16, 16)).astype(np.float16)
    b = RNG.uniform(-1, 1, (16, 8)).astype(np.float16)
    c = RNG.uniform(-1, 1, (16, 8)).astype(np.float32)
    out = run_on(device, MMA_F16, a, b, c)[2]
    np.testing.assert_allclose(out, c + a.astype(np.float32) @ b.astype(np.float32), **F16_TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_one_mma_bf16(device):
    torch = pytest.importorskip("torch")
    a = torch.empty(16, 16).uniform_(-1, 1).to(torch.bfloat16)
    b = torch.empty(16, 8).uniform_(-1, 1).to(torch.bfloat16)
    c = torch.empty(16, 8).uniform_(-1, 1)
    want = c + a.float() @ b.float()
    if device == "cuda":
        a, b, c = a.cuda(), b.cuda(), c.cuda()
    MMA_BF16(a, b, c)
    np.testing.assert_allclose(c.cpu().numpy(), want.numpy(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_mma_builds_for_sm_80_and_sm_90(arch):
    built_for_cuda(MMA_F16, arch, ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"])
    built_for_cuda(MMA_BF16, arch, ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"])


def test_mma_is_refused_before_sm_80_and_on_hip():
    with pytest.raises(UnsupportedError, match=r"mma_sync_m16n8k16\(\) needs sm_80 or newer, not cuda:sm_75"):
        MMA_F16.build("cuda", arch="sm_75")
    with pytest.raises(UnsupportedError, match=r"NVIDIA tensor-core instruction with no HIP equivalent"):
        MMA_F16.build("hip", arch="gfx90a")


# ----------------------------------------------------------------------------- tf32: mma.m16n8k8 on f32 operands


@taskmap.kernel
def mma_tf32_tile(a: f32[16, 8], b: f32[8, 8], c: f32[16, 8]):
    attrs.block_dim = 32
    ra = register_tensor(f32, [4])
    rb = register_tensor(f32, [2])
    rc = register_tensor(f32, [4])
    for q, (i, k) in enumerate(mma_tf32_a_layout.on(lane_id())):
        ra[q] = a[i, k]
    for q, (k, j) in enumerate(mma_tf32_b_layout.on(lane_id())):
        rb[q] = b[k, j]
    for q, (i, j) in enumerate(mma_c_layout.on(lane_id())):
        rc[q] = c[i, j]
    mma_sync_m16n8k8_tf32(rc, ra, rb)
    for q, (i, j) in enumerate(mma_c_layout.on(lane_id())):
        c[i, j] = rc[q]


@pytest.mark.parametrize("device", DEVICES)
def test_one_mma_tf32(device):
    a = RNG.uniform(-1, 1, (16, 8)).astype(np.float32)
    b = RNG.uniform(-1, 1, (8, 8)).astype(np.float32)
    a[0, :] = 1 + 2.0 ** -12       # rounds to 1 in tf32: a full-f32 product would differ by 2^-12 per term
    b[:, 0] = 1.0
    c = RNG.uniform(-1, 1, (16, 8)).astype(np.float32)
    out = run_on(device, mma_tf32_tile, a, b, c)[2]
    want = c + tf32_reference(a).astype(np.float64) @ tf32_reference(b).astype(np.float64)   # exact in f32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert abs(out[0, 0] - (c[0, 0] + 8.0)) < 1e-5 and abs(c[0, 0] + 8 * (1 + 2.0 ** -12) - out[0, 0]) > 1e-3


def rounded_tiles(rounding):
    @taskmap.kernel
    def mma_tf32_rounded_tiles(a: f32[16, 8], b: f32[8, 16], c: f32[16, 16]):
        """Two mma calls sharing one A fragment, rounded once as it is loaded (``rounded=True``)."""
        attrs.block_dim = 32
        ra = register_tensor(f32, [4])
        rb = register_tensor(f32, [2, 2])
        rc = register_tensor(f32, [2, 4])
        for q, (i, k) in enumerate(mma_tf32_a_layout.on(lane_id())):
            ra[q] = rounding(a[i, k])
        for t in range(2):
            for q, (k, j) in enumerate(mma_tf32_b_layout.on(lane_id())):
                rb[t, q] = rounding(b[k, t * 8 + j])
            for q in range(4):
                rc[t, q] = 0.0
            mma_sync_m16n8k8_tf32(rc[t, 0], ra, rb[t, 0], rounded=True)
            for q, (i, j) in enumerate(mma_c_layout.on(lane_id())):
                c[i, t * 8 + j] = rc[t, q]
    return mma_tf32_rounded_tiles


#: rounded once by round_tf32 (tf32 values as f32), or by tf32_operand (half an ulp added: the
#: tensor cores drop the low bits)
ROUNDED_TILES = {"round_tf32": rounded_tiles(round_tf32), "tf32_operand": rounded_tiles(tf32_operand)}
mma_tf32_rounded_tiles = ROUNDED_TILES["round_tf32"]


@taskmap.kernel
def round_tf32_each(x: f32[64], y: f32[64]):
    attrs.block_dim = 64
    y[threadIdx.x] = round_tf32(x[threadIdx.x])


@taskmap.kernel
def tf32_operand_each(x: f32[64], y: f32[64]):
    attrs.block_dim = 64
    y[threadIdx.x] = tf32_operand(x[threadIdx.x])


@pytest.mark.parametrize("device", DEVICES)
def test_tf32_operand_is_cvt_rna_in_the_bits_the_tensor_cores_read(device):
    x = RNG.uniform(-4, 4, 64).astype(np.float32)
    u = x.view(np.uint32)
    u[:8] = (u[:8] & np.uint32(0xFFFFE000)) | np.uint32(0x1000)        # exact ties: away from zero
    x[8:13] = [np.inf, -np.inf, np.nan, 0.0, np.finfo(np.float32).max]
    y = run_on(device, tf32_operand_each, x, np.zeros(64, np.float32))[1]
    top = y.view(np.uint32) & np.uint32(0xFFFFE000)
    np.testing.assert_array_equal(top, tf32_reference(x).view(np.uint32) & np.uint32(0xFFFFE000))


@pytest.mark.parametrize("device", DEVICES)
def test_round_tf32_is_cvt_rna(device):
    """``round_tf32``: to nearest on 10 mantissa bits, ties away from zero; inf and NaN stay."""
    x = RNG.uniform(-4, 4, 64).astype(np.float32)
    u = x.view(np.uint32)
    u[:8] = (u[:8] & np.uint32(0xFFFFE000)) | np.uint32(0x1000)        # exact ties: away from zero
    x[8:12] = [np.inf, -np.inf, np.nan, 0.0]
    x[12] = np.finfo(np.float32).max                                     # rounds up to inf, as cvt.rna
    y = run_on(device, round_tf32_each, x, np.zeros(64, np.float32))[1]
    np.testing.assert_array_equal(y, tf32_reference(x))
    assert np.all(np.abs(y[:8]) > np.abs(x[:8])) and np.isinf(y[12])


@pytest.mark.parametrize("rounding", sorted(ROUNDED_TILES))
@pytest.mark.parametrize("device", DEVICES)
def test_mma_tf32_with_operands_rounded_once(device, rounding):
    a = RNG.uniform(-1, 1, (16, 8)).astype(np.float32)
    b = RNG.uniform(-1, 1, (8, 16)).astype(np.float32)
    u = a.view(np.uint32)
    u[:2] = (u[:2] & np.uint32(0xFFFFE000)) | np.uint32(0x1000)        # exact ties: away from zero
    out = run_on(device, ROUNDED_TILES[rounding], a, b, np.zeros((16, 16), np.float32))[2]
    want = tf32_reference(a).astype(np.float64) @ tf32_reference(b).astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert np.abs(out - a.astype(np.float64) @ b.astype(np.float64)).max() > 1e-5      # not the f32 products


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_mma_tf32_builds(arch):
    built_for_cuda(mma_tf32_tile, arch, ["mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "cvt.rna.tf32.f32"])
    ptx = built_for_cuda(mma_tf32_rounded_tiles, arch, ["mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"])
    assert "cvt.rna" not in ptx.artifact.extra.ptx           # rounded in integer arithmetic, once per element


def test_mma_tf32_is_refused_before_sm_80_on_hip_and_on_half_operands():
    with pytest.raises(UnsupportedError, match=r"mma_sync_m16n8k8_tf32\(\) needs sm_80 or newer, not cuda:sm_75"):
        mma_tf32_tile.build("cuda", arch="sm_75")
    with pytest.raises(UnsupportedError, match=r"NVIDIA tensor-core instruction with no HIP equivalent"):
        mma_tf32_tile.build("hip", arch="gfx90a")
    with pytest.raises(TaskmapError, match=r"the A operand of mma_sync_m16n8k8_tf32\(\) must be f32"):
        _mma_tf32_call(f16, runtime_flag=False)
    with pytest.raises(TaskmapError, match=r"rounded of mma_sync_m16n8k8_tf32\(\) must be a compile-time bool"):
        _mma_tf32_call(f32, runtime_flag=True)


def _mma_tf32_call(a_type, runtime_flag):
    @taskmap.kernel
    def one_call(c: f32[16, 8]):
        attrs.block_dim = 32
        ra = register_tensor(a_type, [4])
        rb = register_tensor(f32, [2])
        rc = register_tensor(f32, [4])
        if runtime_flag:
            mma_sync_m16n8k8_tf32(rc, ra, rb, rounded=threadIdx.x > 0)
        else:
            mma_sync_m16n8k8_tf32(rc, ra, rb)
    return one_call


@taskmap.kernel
def half_warp_mma(c: f32[16, 8]):
    attrs.block_dim = 16                  # a warp of 16 lanes cannot execute mma.sync
    ra = register_tensor(f16, [8])
    rb = register_tensor(f16, [4])
    rc = register_tensor(f32, [4])
    mma_sync_m16n8k16(rc, ra, rb)


def test_mma_by_part_of_a_warp_is_reported():
    with pytest.raises(TaskmapError, match="executed by only some lanes of a warp"):
        half_warp_mma(np.zeros((16, 8), np.float32))


# ----------------------------------------------------------------------------- ldmatrix


@taskmap.kernel
def ldmatrix_all(tile: f16[16, 16], out: f16[6, 32, 8]):
    """Every ldmatrix form on one 16x16 tile in shared memory; lane l's registers go to out[form, l]."""
    attrs.block_dim = 32
    s = shared_tensor(f16, [16, 16])
    regs = register_tensor(f16, [8])
    for e in range(8):
        s[threadIdx.x // 2, threadIdx.x % 2 * 8 + e] = tile[threadIdx.x // 2, threadIdx.x % 2 * 8 + e]
    syncthreads()
    for i, k in ldmatrix_x4_rows.on(lane_id()):
        ldmatrix_x4(regs, s[i, k])
    for q in range(8):
        out[0, threadIdx.x, q] = regs[q]
    for i, k in ldmatrix_x4_rows.on(lane_id()):
        ldmatrix_x4(regs, s[i, k], trans=True)
    for q in range(8):
        out[1, threadIdx.x, q] = regs[q]
    for i, k in ldmatrix_x2_rows.on(lane_id()):
        ldmatrix_x2(regs, s[i, k])
        ldmatrix_x2(regs[4], s[i, k + 8], True)
    for q in range(8):
        out[2 + q // 4, threadIdx.x, q % 4] = regs[q]
    for i, k in ldmatrix_x1_rows.on(lane_id()):
        ldmatrix_x1(regs, s[i, k])
        ldmatrix_x1(regs[2], s[i, k], trans=True)
    for q in range(4):
        out[4 + q // 2, threadIdx.x, q % 2] = regs[q]


def ldmatrix_model(tile):
    """What each lane should hold, from the mma fragment layouts (PTX's tables)."""
    want = np.zeros((6, 32, 8), np.float16)
    for lane in range(32):
        want[0, lane] = [tile[i, k] for i, k in mma_a_layout.worker2task(lane)]        # A fragment
        b = mma_b_layout.worker2task(lane)
        want[1, lane] = [tile[k, j] for k, j in b] + [tile[k, j + 8] for k, j in b]   # 2 B fragments
        want[2, lane, :4] = [tile[i, j] for i, j in mma_c_layout.worker2task(lane)]    # 16x8, C-like
        want[3, lane, :4] = [tile[k, j + 8] for k, j in b]                            # B fragment
        g, t = lane // 4, lane % 4
        want[4, lane, :2] = tile[g, 2 * t:2 * t + 2]
        want[5, lane, :2] = tile[2 * t:2 * t + 2, g]
    return want


@pytest.mark.parametrize("device", DEVICES)
def test_ldmatrix_forms_match_the_fragment_layouts(device):
    tile = RNG.standard_normal((16, 16)).astype(np.float16)
    out = run_on(device, ldmatrix_all, tile, np.zeros((6, 32, 8), np.float16))[1]
    want = ldmatrix_model(tile)
    for form in range(6):
        width = 8 if form < 2 else 4 if form < 4 else 2
        assert np.array_equal(out[form, :, :width], want[form, :, :width]), form


@taskmap.kernel
def ldmatrix_b32(tile: f32[16, 8], out: f32[2, 32, 4]):
    """ldmatrix_x4 on 32-bit elements: a 16x8 f32 tile read as the tf32 A fragment, and as the
    tf32 B fragments of two 8-column tiles of a B stored N x K (rows n, columns k)."""
    attrs.block_dim = 32
    s = shared_tensor(f32, [16, 8])
    regs = register_tensor(f32, [4])
    for e in range(4):
        s[threadIdx.x // 2, threadIdx.x % 2 * 4 + e] = tile[threadIdx.x // 2, threadIdx.x % 2 * 4 + e]
    syncthreads()
    for i, k in ldmatrix_x4_rows_b32.on(lane_id()):
        ldmatrix_x4(regs, s[i, k])
    for q in range(4):
        out[0, threadIdx.x, q] = regs[q]
    for n, k in B_NK_ROWS_B32.on(lane_id()):
        ldmatrix_x4(regs, s[n, k])
    for q in range(4):
        out[1, threadIdx.x, q] = regs[q]


@pytest.mark.parametrize("device", DEVICES)
def test_ldmatrix_of_32_bit_elements_gives_the_tf32_fragments(device):
    tile = RNG.standard_normal((16, 8)).astype(np.float32)
    out = run_on(device, ldmatrix_b32, tile, np.zeros((2, 32, 4), np.float32))[1]
    for lane in range(32):
        assert list(out[0, lane]) == [tile[i, k] for i, k in mma_tf32_a_layout.worker2task(lane)], lane
        b = mma_tf32_b_layout.worker2task(lane)        # (k, n) of each register
        assert list(out[1, lane]) == [tile[n, k] for k, n in b] + [tile[n + 8, k] for k, n in b], lane
    ptx = built_for_cuda(ldmatrix_b32, "sm_80").artifact.extra.ptx
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == 2


def test_ldmatrix_refuses_to_transpose_32_bit_elements():
    with pytest.raises(TaskmapError, match=r"ldmatrix\(trans=True\) transposes 16-bit elements"):
        @taskmap.kernel
        def bad(out: f32[32, 4]):
            attrs.block_dim = 32
            s = shared_tensor(f32, [16, 8])
            regs = register_tensor(f32, [4])
            for i, k in ldmatrix_x4_rows_b32.on(lane_id()):
                ldmatrix_x4(regs, s[i, k], trans=True)
            for q in range(4):
                out[threadIdx.x, q] = regs[q]


def test_ldmatrix_builds():
    ptx = built_for_cuda(ldmatrix_all, "sm_80").artifact.extra.ptx
    for form in ("x4.shared.b16", "x4.trans.shared.b16", "x2.shared.b16", "x2.trans.shared.b16",
                 "x1.shared.b16", "x1.trans.shared.b16"):
        assert f"ldmatrix.sync.aligned.m8n8.{form}" in ptx, form
    with pytest.raises(UnsupportedError, match="ldmatrix"):
        ldmatrix_all.build("hip", arch="gfx90a")


# ----------------------------------------------------------------------------- the matmul example


def check_matmul(device, m, n, k):
    a = RNG.uniform(-1, 1, (m, k)).astype(np.float16)
    b = RNG.uniform(-1, 1, (k, n)).astype(np.float16)
    c = run_on(device, TC.matmul_tc, a, b, np.full((m, n), np.nan, np.float32))[2]
    np.testing.assert_allclose(c, TC.reference(a, b), **F16_TOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (17, 33, 40), (100, 72, 130), (64, 64, 64), (100, 72, 136),
                                     (65, 136, 96)])
def test_tensor_core_matmul(device, m, n, k):
    check_matmul(device, m, n, k)


@given(m=st.integers(1, 80), n=st.integers(1, 80), k=st.integers(1, 80), aligned=st.booleans())
@FEW
def test_tensor_core_matmul_random_shapes(m, n, k, aligned):
    if aligned:                       # the cp.async path needs rows of A and B 16-byte aligned
        n, k = -(-n // 8) * 8, -(-k // 8) * 8
    check_matmul("cpu", m, n, k)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tensor_core_matmul_builds(arch):
    built_for_cuda(TC.matmul_tc, arch, ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                                        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                                        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                                        "cp.async.cg.shared.global", "cp.async.wait_group 1"])


def test_ldmatrix_is_refused_before_sm_75():
    with pytest.raises(UnsupportedError, match=r"ldmatrix\(\) needs sm_75 or newer, not cuda:sm_70"):
        ldmatrix_all.build("cuda", arch="sm_70")


# ----------------------------------------------------------------------------- wgmma (sm_90a): one warpgroup


def wgmma_kernel(n: int, k: int, wait_first: bool = True, dtype=f32):
    """C[64, n] = A[64, k] @ B[n, k]^T (f32 sums) by one warpgroup: the operands (f32, f16 or bf16)
    stored into 128-byte swizzled K-major tiles (``wgmma_sw128`` / ``wgmma_sw128_b16``), one
    ``wgmma_tf32`` / ``wgmma_f16`` per 8 / 16 of k (the first without C), then the accumulators out
    through ``wgmma_c_layout``."""
    from taskmap.lang import (fence_proxy_async, wgmma_c_layout, wgmma_commit, wgmma_f16, wgmma_fence, wgmma_sw128,
                              wgmma_sw128_b16, wgmma_tf32, wgmma_wait)
    layout = wgmma_c_layout(n)
    row = 128 // dtype.nbytes                   # elements of one swizzled 128-byte row
    step = row // 4                             # k of one wgmma
    sw, product = (wgmma_sw128, wgmma_tf32) if dtype is f32 else (wgmma_sw128_b16, wgmma_f16)
    tiles = k // row

    @taskmap.kernel
    def wgmma_tile(a: dtype[64, k], b: dtype[n, k], c: f32[64, n]):
        attrs.block_dim = 128
        sa = shared_tensor(dtype, [tiles, 64, row])
        sb = shared_tensor(dtype, [tiles, n, row])
        acc = register_tensor(f32, [n // 2])
        for t in range(tiles):
            for r in range(threadIdx.x // row, 64, 128 // row):
                sa[t, r, sw(r, threadIdx.x % row)] = a[r, t * row + threadIdx.x % row]
            for r in range(threadIdx.x // row, n, 128 // row):
                sb[t, r, sw(r, threadIdx.x % row)] = b[r, t * row + threadIdx.x % row]
        fence_proxy_async()
        syncthreads()
        wgmma_fence()
        for t in range(tiles):
            for kk in range(4):
                if t == 0 and kk == 0:
                    product(acc, sa[t, 0, 0], sb[t, 0, 0], n, accumulate=False)
                else:
                    product(acc, sa[t, 0, kk * step], sb[t, 0, kk * step], n)
        wgmma_commit()
        if wait_first:
            wgmma_wait(0, acc, n // 2)
        for q, (i, j) in enumerate(layout.on(threadIdx.x)):
            c[i, j] = acc[q]
        if not wait_first:                  # wrong: the accumulators were read before the wait
            wgmma_wait(0, acc, n // 2)
    return wgmma_tile


def _tf32_truncated(x):
    """What the tensor cores read of an f32 operand they take as it is: its top 19 bits."""
    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k", [(8, 32), (64, 64), (136, 32)])
def test_wgmma_tf32_one_warpgroup(device, n, k):
    a = RNG.standard_normal((64, k)).astype(np.float32)
    b = RNG.standard_normal((n, k)).astype(np.float32)
    c = np.full((64, n), np.nan, np.float32)       # every element written
    out = run_on(device, wgmma_kernel(n, k), a, b, c)[2]
    want = _tf32_truncated(a).astype(np.float64) @ _tf32_truncated(b).astype(np.float64).T
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    # a swizzle or layout mistake moves whole products: far beyond the tolerance
    assert np.abs(out - a.astype(np.float64) @ b.astype(np.float64).T).max() > 1e-4


def test_wgmma_is_asynchronous_in_emulation():
    """The emulation runs a thread's wgmma when a wgmma_wait retires their group: accumulators read
    before the wait hold what they held before (garbage here), as they might on a GPU."""
    a = RNG.standard_normal((64, 32)).astype(np.float32)
    b = RNG.standard_normal((16, 32)).astype(np.float32)
    c = np.full((64, 16), np.nan, np.float32)
    early = run_on("cpu", wgmma_kernel(16, 32, wait_first=False), a, b, c)[2]
    want = _tf32_truncated(a).astype(np.float64) @ _tf32_truncated(b).astype(np.float64).T
    assert not np.allclose(early, want, rtol=1e-3, atol=1e-3)


def test_wgmma_builds_for_sm_90a_only():
    kernel = wgmma_kernel(64, 32)
    built = built_for_cuda(kernel, "sm_90a", ["wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32",
                                              "wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                                              "wgmma.wait_group.sync.aligned 0", "fence.proxy.async.shared::cta"])
    assert "__align__(1024) unsigned char tm_smem[]" in built.source
    with pytest.raises(UnsupportedError, match=r"wgmma_\w+\(\) needs the arch-specific sm_90a \(wgmma\), "
                                                r"not cuda:sm_90$"):
        kernel.build("cuda", arch="sm_90")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,n,k", [(100, 72, 130), (130, 136, 96), (7, 200, 36)],
                         ids=["unaligned-k", "two-blocks", "thin"])
def test_wgmma_example(device, m, n, k):
    """The wgmma example (two warpgroups, 4-stage cp.async ring into swizzled tiles): every element
    written, against the f64 product of the tf32-truncated operands."""
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((n, k)).astype(np.float32)
    c = run_on(device, WG.matmul_wgmma, a, b, np.full((m, n), np.nan, np.float32))[2]
    np.testing.assert_allclose(c, WG.reference(a, b), rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_wgmma_example_builds():
    built_for_cuda(WG.matmul_wgmma, "sm_90a", ["wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32", "cp.async",
                                               "fence.proxy.async.shared::cta"])


def test_wgmma_misuse_is_a_clear_error():
    from taskmap.errors import DSLError
    from taskmap.lang import wgmma_tf32

    def build(n, where="shared"):
        @taskmap.kernel
        def bad(c: f32[64, 64]):
            attrs.block_dim = 128
            sa = shared_tensor(f32, [64, 32])
            sb = shared_tensor(f32, [64, 32]) if where == "shared" else register_tensor(f32, [64, 32])
            acc = register_tensor(f32, [32])
            wgmma_tf32(acc, sa[0, 0], sb[0, 0], n)
            c[0, 0] = acc[0]
        return bad

    with pytest.raises(DSLError, match=r"test_tensor_cores.py:\d+:\d+: .*wgmma_tf32\(\) computes 64 x n tiles with n "
                                       r"a multiple of 8 up to 256, got 12"):
        build(12)
    with pytest.raises(DSLError, match=r"the B operand of wgmma_tf32\(\) is an f32 shared tensor element"):
        build(64, "register")


def test_refilling_a_tile_a_pending_wgmma_reads_is_caught():
    """A cp_async into a tile before the wgmma reading it has been waited for faults in emulation
    (on a GPU the copy may land first)."""
    from taskmap.lang import cp_async, cp_async_commit, cp_async_wait, wgmma_commit, wgmma_fence, wgmma_tf32, wgmma_wait

    @taskmap.kernel
    def refill_early(a: f32[64, 32], b: f32[8, 32], c: f32[64, 8]):
        attrs.block_dim = 128
        sa = shared_tensor(f32, [64, 32])
        sb = shared_tensor(f32, [8, 32])
        acc = register_tensor(f32, [4])
        for r in range(threadIdx.x // 32, 64, 4):
            sa[r, threadIdx.x % 32] = a[r, threadIdx.x % 32]
        if threadIdx.x < 8:
            for e in range(32):
                sb[threadIdx.x, e] = b[threadIdx.x, e]
        syncthreads()
        wgmma_fence()
        wgmma_tf32(acc, sa[0, 0], sb[0, 0], 8, accumulate=False)
        wgmma_commit()
        cp_async(sa[threadIdx.x // 2, threadIdx.x % 2 * 16], a[0, 0], 16)    # wrong: before the wait
        cp_async_commit()
        wgmma_wait(0, acc, 4)
        cp_async_wait(0)
        c[threadIdx.x // 2, 0] = acc[0]

    args = (RNG.standard_normal((64, 32)).astype(np.float32), RNG.standard_normal((8, 32)).astype(np.float32),
            np.zeros((64, 8), np.float32))
    with pytest.raises(TaskmapError, match=r"cp_async\(\) into a shared tile that a pending wgmma_tf32\(\) still reads"):
        refill_early(*args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kk", [0, 3])
def test_wgmma_reads_the_swizzled_tiles_as_laid_out(device, kk):
    """One wgmma (k-step ``kk`` of a 32-wide tile) on coded operands: A[r, k] = 8 r + k % 8 (exact in
    tf32) and B[j, k] = 1 where k % 8 = j % 8, so C[r, j] names the A element it read.  On a
    mismatch the message decodes what the tensor cores read — the descriptor, the swizzle or the
    accumulator layout, whichever is off."""
    from taskmap.lang import (fence_proxy_async, wgmma_c_layout, wgmma_commit, wgmma_fence, wgmma_sw128, wgmma_tf32,
                              wgmma_wait)
    n = 16
    layout = wgmma_c_layout(n)

    @taskmap.kernel
    def one_step(a: f32[64, 32], b: f32[n, 32], c: f32[64, n]):
        attrs.block_dim = 128
        sa = shared_tensor(f32, [64, 32])
        sb = shared_tensor(f32, [n, 32])
        acc = register_tensor(f32, [n // 2])
        for r in range(threadIdx.x // 32, 64, 4):
            sa[r, wgmma_sw128(r, threadIdx.x % 32)] = a[r, threadIdx.x % 32]
        for r in range(threadIdx.x // 32, n, 4):
            sb[r, wgmma_sw128(r, threadIdx.x % 32)] = b[r, threadIdx.x % 32]
        fence_proxy_async()
        syncthreads()
        wgmma_fence()
        wgmma_tf32(acc, sa[0, kk * 8], sb[0, kk * 8], n, accumulate=False)
        wgmma_commit()
        wgmma_wait(0, acc, n // 2)
        for q, (i, j) in enumerate(layout.on(threadIdx.x)):
            c[i, j] = acc[q]

    rows, ks = np.meshgrid(np.arange(64), np.arange(32), indexing="ij")
    a = (8 * rows + ks % 8 + 1000 * (ks // 8 != kk)).astype(np.float32)     # other k-steps: far off
    b = (np.arange(32)[None, :] % 8 == np.arange(n)[:, None] % 8).astype(np.float32)
    b[:, [k for k in range(32) if k // 8 != kk]] = 0.0
    got = run_on(device, one_step, a, b, np.full((64, n), np.nan, np.float32))[2]
    want = 8 * np.arange(64)[:, None] + np.arange(n)[None, :] % 8
    bad = np.argwhere(got != want)
    detail = [f"C[{r}, {j}] = {got[r, j]:g} (A[{int(got[r, j]) // 8}, {int(got[r, j]) % 8}] read), want "
              f"A[{r}, {j % 8}]" for r, j in bad[:6]]
    assert not len(bad), f"{len(bad)} of {got.size} wrong: " + "; ".join(detail)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_f16_and_bf16_one_warpgroup(device, dtype):
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    n, k = 24, 128
    a = torch.randn(64, k).to(tdt)
    b = torch.randn(n, k).to(tdt)
    c = torch.full((64, n), float("nan"))
    kernel = wgmma_kernel(n, k, dtype={"float16": f16, "bfloat16": bf16}[dtype])
    if device == "cuda":
        a, b, c = a.cuda(), b.cuda(), c.cuda()
    kernel(a, b, c)
    want = a.double().cpu() @ b.double().cpu().T          # exact products, f32 sums
    np.testing.assert_allclose(c.cpu().numpy(), want.numpy(), rtol=1e-5, atol=1e-4)


def test_wgmma_f16_builds_for_sm_90a():
    built_for_cuda(wgmma_kernel(64, 64, dtype=f16), "sm_90a", ["wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"])
    built_for_cuda(wgmma_kernel(64, 64, dtype=bf16), "sm_90a",
                   ["wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"])
