"""Bit-casts through the backends: bit-exact against numpy's ``view`` on the CPU (every same-size
pair, NaN payloads and infinities included), vectorized by gcc, and compiled by NVRTC and hipRTC."""
import shutil
import subprocess

import numpy as np
import pytest

import taskmap
from taskmap.backends.cpu.build import CFLAGS
from taskmap.backends.hip.hiprtc import hiprtc_available
from taskmap.lang import (
    attrs,
    bf16,
    bitcast,
    f16,
    f32,
    f64,
    i16,
    i32,
    i64,
    spatial,
    threadIdx,
    u16,
    u32,
    u64,
    vectorize,
)

N = 256
RNG = np.random.default_rng(7)


def bit_patterns(nbytes: int) -> np.ndarray:
    """Random bits plus the special float patterns (zeros, infinities, NaNs with payloads, subnormals)."""
    t = {2: np.uint16, 4: np.uint32, 8: np.uint64}[nbytes]
    bits = RNG.integers(0, np.iinfo(t).max, N, dtype=t, endpoint=True)
    specials = {2: [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0xFD55, 0x0001, 0x83FF, 0x3C00],
                4: [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFA5A5A5, 1, 0x807FFFFF, 0x3F800000],
                8: [0, 1 << 63, 0x7FF0 << 48, 0xFFF0 << 48, (0x7FF8 << 48) | 1, 1, 0x3FF << 52]}[nbytes]
    bits[:len(specials)] = specials
    return bits


def make_roundtrip(src, mid, dst):
    @taskmap.kernel
    def roundtrip(a: src[N], b: mid[N], c: dst[N]):
        for i in vectorize(N):
            b[i] = bitcast(a[i], mid)
            c[i] = bitcast(bitcast(a[i], mid), dst)
    return roundtrip


@pytest.mark.parametrize("src,mid,dst", [(f32, i32, u32), (u32, f32, i32), (i32, f32, f32), (f64, i64, u64),
                                         (u64, f64, i64), (f16, i16, u16), (u16, f16, i16), (i16, u16, f16)])
def test_cpu_bits_match_numpy_view(src, mid, dst):
    a = bit_patterns(src.nbytes).view(src.numpy_dtype)
    b = np.empty(N, mid.numpy_dtype)
    c = np.empty(N, dst.numpy_dtype)
    make_roundtrip(src, mid, dst)(a, b, c)
    assert (b.view(np.uint8) == a.view(np.uint8)).all()
    assert (c.view(np.uint8) == a.view(np.uint8)).all()


@taskmap.kernel
def bf16_bits(a: bf16[N], b: i16[N], c: bf16[N]):
    for i in range(N):
        b[i] = bitcast(a[i], i16)
        c[i] = bitcast(bitcast(a[i], u16) ^ 0x8000, bf16)


def test_cpu_bf16_bits_on_torch_bfloat16():
    torch = pytest.importorskip("torch", reason="bf16 tensors come from torch (numpy has no bfloat16)")
    bits = bit_patterns(2)
    bits = bits[(bits & 0x7F80 != 0x7F80)]  # no NaNs: bf16 values are computed in float (NaNs get quieted)
    a = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
    b = torch.empty(N, dtype=torch.int16)
    c = torch.empty(N, dtype=torch.bfloat16)
    n = len(bits)
    a = torch.cat([a, torch.zeros(N - n, dtype=torch.bfloat16)])
    bf16_bits(a, b, c)
    assert torch.equal(b, a.view(torch.int16))
    assert torch.equal(c.view(torch.int16), a.view(torch.int16) ^ torch.tensor(-0x8000, dtype=torch.int16))


@taskmap.kernel
def gpu_bits(a: f32[N], b: i32[N], d: f64[N], e: u64[N], h: f16[N], s: u16[N], bb: bf16[N], si: i16[N]):
    attrs.grid_dim = 1
    attrs.block_dim = N
    for i in spatial(N).on(threadIdx.x):
        b[i] = bitcast(a[i], i32) + 1
        a[i] = bitcast(b[i], f32)
        e[i] = bitcast(d[i], u64) ^ 1
        d[i] = bitcast(e[i], f64)
        s[i] = bitcast(h[i], u16) | 1
        h[i] = bitcast(s[i], f16)
        si[i] = bitcast(bb[i], i16)
        bb[i] = bitcast(si[i], bf16)


def test_gpu_style_kernel_runs_on_the_cpu():
    a = RNG.standard_normal(N).astype(np.float32)
    d = RNG.standard_normal(N)
    h = RNG.standard_normal(N).astype(np.float16)
    args = [a.copy(), np.empty(N, np.int32), d.copy(), np.empty(N, np.uint64), h.copy(), np.empty(N, np.uint16)]
    torch = pytest.importorskip("torch", reason="bf16 tensors come from torch")
    bb = torch.randn(N).bfloat16()
    si = torch.empty(N, dtype=torch.int16)
    gpu_bits(*args, bb.clone(), si)
    assert (args[1] == a.view(np.int32) + 1).all() and (args[0].view(np.int32) == args[1]).all()
    assert (args[3] == d.view(np.uint64) ^ np.uint64(1)).all() and (args[2].view(np.uint64) == args[3]).all()
    assert (args[5] == h.view(np.uint16) | np.uint16(1)).all() and (args[4].view(np.uint16) == args[5]).all()
    assert torch.equal(si, bb.view(torch.int16))


def test_cuda_source_uses_the_intrinsics_and_nvrtc_compiles_it():
    k = gpu_bits.build("cuda", arch="sm_90")
    for name in ("__float_as_uint", "__uint_as_float", "__double_as_longlong", "__longlong_as_double",
                 "__half_as_ushort", "__ushort_as_half", "tm_f32_to_bf16", "tm_bf16_to_f32"):
        assert name in k.source, name
    assert k.binary


@pytest.mark.skipif(not hiprtc_available(), reason="hipRTC (libamdhip64) not installed: "
                                                   "apt-get install -y libamdhip64-dev")
def test_hiprtc_compiles_it():
    k = gpu_bits.build("hip", arch="gfx90a")
    assert "__float_as_uint" in k.source and k.binary


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_gcc_vectorizes_a_loop_of_bitcasts(tmp_path):
    src = tmp_path / "k.c"
    src.write_text(make_roundtrip(f32, i32, f32).build("cpu").source)
    out = subprocess.run(["gcc", *CFLAGS, "-fopt-info-vec-optimized", str(src), "-o", str(tmp_path / "k.so")],
                         capture_output=True, text=True, check=True)
    assert "loop vectorized" in out.stderr, out.stderr
