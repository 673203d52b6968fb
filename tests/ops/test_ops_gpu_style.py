"""The operators' GPU schedules: inside ``ops.emulate_gpu(arch)`` host arrays run GPU-style
kernels (blocks, warps, shuffles, shared memory) on the CPU with GPU semantics; the same kernels
build for sm_90 (NVRTC) and gfx90a (hipRTC, 64-lane wavefronts); with a GPU, CUDA tensors run."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap import ops
from taskmap.ir.func import FuncKind
from taskmap.testing import assert_close, shapes

FEW = settings(max_examples=10, deadline=None)
RNG = np.random.default_rng(19)
ARCHS = ["sm_90", "gfx90a"]


def _data(shape, dtype=np.float32):
    return np.asarray(RNG.uniform(-2, 2, shape)).astype(dtype)


def _built(emu, arch):
    """Every kernel the block ran, built for ``arch``: GPU kernels with a binary."""
    assert emu.kernels and all(k.func.kind is FuncKind.GPU_KERNEL for k in emu.kernels)
    for k in emu.kernels:
        built = k.build("hip" if arch.startswith("gfx") else "cuda", arch=arch)
        assert built.binary[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", ARCHS)
@given(shape=shapes(min_dims=1, max_dims=3, max_side=300, max_elements=1 << 13), data=st.data())
@settings(max_examples=6, deadline=None)
def test_row_operators(arch, shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = _data(shape)
    t = torch.from_numpy(x)
    with ops.emulate_gpu(arch):
        assert_close(ops.softmax(x, axis), torch.softmax(t.double(), axis).float(), rtol=1e-5, atol=1e-6)
        assert_close(ops.sum(x, axis), x.astype(np.float64).sum(axis), rtol=1e-5, atol=1e-4)
        assert_close(ops.max(x, axis, keepdim=True), x.max(axis, keepdims=True))
        # atol: rows of nearly equal values divide f32 rounding of x - mean by sqrt(eps) = 0.003
        assert_close(ops.layer_norm(t, shape[-1:]), F.layer_norm(t.double(), shape[-1:]).float(), rtol=1e-4,
                     atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_operator_family_builds_for_the_gpu(arch):
    x = _data((6, 70))
    w = _data((70,))
    with ops.emulate_gpu(arch) as emu:
        assert_close(ops.gelu(x), F.gelu(torch.from_numpy(x)))
        assert_close(ops.add(x, w), x + w)
        assert_close(ops.where(x > 0, x, w), np.where(x > 0, x, w))
        tx, tw = torch.from_numpy(x * 7), torch.from_numpy(w)
        assert np.array_equal(ops.floor_divide(x * 7, w), torch.floor_divide(tx, tw).numpy())
        assert np.array_equal(ops.remainder(x * 7, w), torch.remainder(tx, tw).numpy())
        assert np.array_equal(ops.fmod(x * 7, w), torch.fmod(tx, tw).numpy())
        assert_close(ops.transpose(x, 0, 1), x.T)
        assert_close(ops.concat([x, x[:2]], 0), np.concatenate([x, x[:2]], 0))
        assert_close(ops.pad(x, (1, 2), mode="reflect"), np.pad(x, ((0, 0), (1, 2)), mode="reflect"))
        assert_close(ops.var(x, 0), x.astype(np.float64).var(0, ddof=1), rtol=1e-4, atol=1e-5)
        assert_close(ops.mean(x, (0, 1)), x.astype(np.float64).mean(), rtol=1e-5, atol=1e-6)
        assert_close(ops.log_softmax(x, 0), torch.log_softmax(torch.from_numpy(x), 0), rtol=1e-5, atol=1e-5)
        assert_close(ops.rms_norm(x, (70,), w, 1e-6), F.rms_norm(torch.from_numpy(x), (70,), torch.from_numpy(w), 1e-6),
                     rtol=1e-4, atol=1e-5)
    _built(emu, arch)


def test_long_rows_use_whole_blocks_and_short_rows_warps():
    with ops.emulate_gpu("sm_90") as emu:
        ops.softmax(_data((4, 6000)))
        ops.softmax(_data((512, 24)))
    long, short = (repr(k.module) for k in emu.kernels)
    assert "partials" in long and "syncthreads" in long
    assert "partials" not in short and "shfl_xor_sync" in short


def test_low_precision_on_gpu_schedules():
    t = torch.randn(5, 300, dtype=torch.bfloat16)
    h = _data((5, 300), np.float16)
    with ops.emulate_gpu("sm_90"):
        assert_close(ops.softmax(t), torch.softmax(t.float(), -1).to(torch.bfloat16))
        assert_close(ops.sum(h, 1), h.astype(np.float64).sum(1), atol=0.05)


@pytest.mark.cuda
def test_cuda_tensors_run_on_the_gpu():
    x = torch.randn(64, 1000, device="cuda")
    w = torch.randn(1000, device="cuda")
    y = ops.layer_norm(x, (1000,), w)
    assert y.is_cuda
    assert_close(y, F.layer_norm(x, (1000,), w), rtol=1e-4, atol=1e-5)
    assert_close(ops.softmax(x, 0), torch.softmax(x, 0), rtol=1e-5, atol=1e-6)
    assert_close(ops.add(x, w), x + w)
    assert_close(ops.permute(x, (1, 0)), x.t())
