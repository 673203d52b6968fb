"""Misused GPU primitives are DSL errors at the user's file:line:col, with the line and a caret.

Kernels that must fail carry a marker comment ``# E:<tag>`` on the line the error points at.
"""
from __future__ import annotations

import os
import pathlib

import pytest

from taskmap.errors import DSLError
from taskmap.ir.func import FuncKind
from taskmap.lang import (FULL_MASK, atomic_add, attrs, ballot_sync, copy16, cp_async, cp_async_wait, f16, f32, func,
                          i32, lane_id, ldmatrix_x4, mma_sync_m16n8k16, register_tensor, shared_tensor, shfl_sync,
                          shfl_xor_sync, syncwarp, threadIdx, transpile)

THIS = pathlib.Path(__file__)
LINES = THIS.read_text(encoding="utf-8").splitlines()


def expect_error(fn, tag: str, at: str, message: str, kind: FuncKind | None = None) -> DSLError:
    hits = [n for n, line in enumerate(LINES, 1) if line.rstrip().endswith(f"# E:{tag}")]
    assert len(hits) == 1, f"marker E:{tag} found {len(hits)} times"
    lineno, line = hits[0], LINES[hits[0] - 1]
    with pytest.raises(DSLError) as info:
        transpile(fn, kind)
    err = info.value
    assert message in err.msg, err.msg
    col = line.index(at)
    assert os.path.samefile(err.filename, THIS) and err.lineno == lineno and err.col == col, \
        (err.lineno, err.col, lineno, col, str(err))
    text = str(err).splitlines()
    assert text[0].startswith(f"{err.filename}:{lineno}:{col + 1}: error: ")
    assert text[1] == "    " + line.strip()
    assert text[2] == "    " + " " * (col - (len(line) - len(line.lstrip()))) + "^"
    return err


# ----------------------------------------------------------------------------- GPU-only primitives


def warp_in_cpu_kernel(a: f32[32]):
    for i in range(32):
        a[i] = shfl_sync(FULL_MASK, a[i], 0)  # E:warp_cpu


def test_warp_primitive_in_a_cpu_kernel():
    expect_error(warp_in_cpu_kernel, "warp_cpu", "shfl_sync(",
                 "shfl_sync() can only be used in GPU kernels, but 'warp_in_cpu_kernel' is a CPU kernel",
                 FuncKind.CPU_KERNEL)


def lane_in_cpu_kernel(a: i32[32]):
    a[0] = lane_id()  # E:lane_cpu


def test_lane_id_in_a_cpu_kernel():
    expect_error(lane_in_cpu_kernel, "lane_cpu", "lane_id()", "lane_id() can only be used in GPU kernels",
                 FuncKind.CPU_KERNEL)


def warp_without_block_dim(a: f32[32]):  # E:no_block
    a[0] = shfl_xor_sync(FULL_MASK, a[0], 1)


def test_warp_primitive_makes_a_gpu_kernel_that_needs_a_block_size():
    expect_error(warp_without_block_dim, "no_block", "def", "GPU kernel 'warp_without_block_dim' must set "
                                                            "attrs.block_dim (it uses shfl_xor_sync())")


@func
def helper_with_shuffle(x: f32) -> f32:
    return shfl_xor_sync(FULL_MASK, x, 1)


def cpu_calls_warp_helper(a: f32[32]):
    for i in range(32):
        a[i] = helper_with_shuffle(a[i])  # E:helper_cpu


def test_device_function_with_warp_primitives_in_a_cpu_kernel():
    expect_error(cpu_calls_warp_helper, "helper_cpu", "helper_with_shuffle(",
                 "device function 'helper_with_shuffle' (it uses GPU features) can only be used in GPU kernels",
                 FuncKind.CPU_KERNEL)


# ----------------------------------------------------------------------------- atomics


def atomic_on_scalar(h: i32[16]):
    attrs.block_dim = 32
    x = h[threadIdx.x % 16]
    atomic_add(x, 1)  # E:atomic_scalar


def test_atomic_on_a_scalar_value():
    expect_error(atomic_on_scalar, "atomic_scalar", "x, 1",
                 "argument 1 of atomic_add() must be a tensor element such as t[i, j], got a run-time i32 value")


def atomic_on_tensor(h: i32[16]):
    attrs.block_dim = 32
    atomic_add(h, 1)  # E:atomic_tensor


def test_atomic_on_a_whole_tensor():
    expect_error(atomic_on_tensor, "atomic_tensor", "h, 1",
                 "argument 1 of atomic_add() must be a tensor element such as t[i, j], got tensor 'h'")


def atomic_on_register(h: f32[16]):
    attrs.block_dim = 32
    r = register_tensor(f32, [4])
    atomic_add(r[0], 1.0)  # E:atomic_reg


def test_atomic_on_a_register_tensor():
    expect_error(atomic_on_register, "atomic_reg", "r[0]",
                 "atomic_add() needs an element of a global or shared tensor; 'r' is a register tensor")


def atomic_on_half(h: f16[16]):
    attrs.block_dim = 32
    atomic_add(h[threadIdx.x % 16], 1.0)  # E:atomic_f16


def test_atomic_on_an_unsupported_type():
    expect_error(atomic_on_half, "atomic_f16", "h[",
                 "atomic_add() on f16 elements is not supported (supported: f32, f64, i32, u32, i64, u64)")


# ----------------------------------------------------------------------------- copies


def cp_async_bad_size(g: f32[64]):
    attrs.block_dim = 32
    s = shared_tensor(f32, [64])
    cp_async(s[threadIdx.x], g[threadIdx.x], 12)  # E:cp_size


def test_cp_async_with_a_bad_size():
    expect_error(cp_async_bad_size, "cp_size", "12)",
                 "the size of cp_async() in bytes must be a compile-time 4 or 8 or 16, got 12")


def cp_async_to_global(g: f32[64], out: f32[64]):
    attrs.block_dim = 16
    cp_async(out[threadIdx.x * 4], g[threadIdx.x * 4], 16)  # E:cp_dst


def test_cp_async_into_global_memory():
    expect_error(cp_async_to_global, "cp_dst", "out[",
                 "the destination of cp_async() must be a shared tensor element, 'out' is global")


def cp_async_wait_runtime(g: f32[64], n: i32):
    attrs.block_dim = 32
    cp_async_wait(n)  # E:cp_wait


def test_cp_async_wait_needs_a_constant():
    expect_error(cp_async_wait_runtime, "cp_wait", "n)",
                 "cp_async_wait() needs a compile-time number of groups >= 0, got a run-time i32 value")


def cp_async_bad_keyword(g: f32[64]):
    attrs.block_dim = 32
    s = shared_tensor(f32, [64])
    cp_async(s[threadIdx.x], g[threadIdx.x], 4, nbytes_in=3)  # E:cp_kw


def test_cp_async_with_an_unknown_keyword():
    expect_error(cp_async_bad_keyword, "cp_kw", "3)", "cp_async() got an unexpected keyword argument 'nbytes_in'")


def copy16_misaligned(g: f32[64]):
    attrs.block_dim = 32
    s = shared_tensor(f32, [64])
    copy16(s[2], g[0])  # E:copy_align


def test_copy16_at_a_misaligned_constant_offset():
    expect_error(copy16_misaligned, "copy_align", "s[2]",
                 "copy16() needs a 16-byte aligned address, but element 2 of 's' is at byte 8")


def copy16_too_small(g: f32[64]):
    attrs.block_dim = 32
    r = register_tensor(f32, [2])
    copy16(r, g[0])  # E:copy_small


def test_copy16_into_a_too_small_register_tensor():
    expect_error(copy16_too_small, "copy_small", "r, g",
                 "copy16() accesses 4 elements from element 0 of 'r', which has 2")


# ----------------------------------------------------------------------------- tensor cores and warps


def mma_with_f32_inputs(c: f32[16]):
    attrs.block_dim = 32
    rc = register_tensor(f32, [4])
    ra = register_tensor(f32, [8])
    rb = register_tensor(f32, [4])
    mma_sync_m16n8k16(rc, ra, rb)  # E:mma_type


def test_mma_with_f32_inputs():
    expect_error(mma_with_f32_inputs, "mma_type", "ra,",
                 "the A operand of mma_sync_m16n8k16() must be f16 or bf16, got f32")


def ldmatrix_runtime_trans(t: i32):
    attrs.block_dim = 32
    s = shared_tensor(f16, [16, 16])
    r = register_tensor(f16, [8])
    ldmatrix_x4(r, s[lane_id() % 16, 0], t != 0)  # E:ldm_trans


def test_ldmatrix_transpose_flag_must_be_constant():
    expect_error(ldmatrix_runtime_trans, "ldm_trans", "t != 0",
                 "trans of ldmatrix_x4() must be a compile-time bool, got a run-time bool value")


def ballot_bad_dtype(out: i32[32]):
    attrs.block_dim = 32
    out[threadIdx.x] = ballot_sync(FULL_MASK, threadIdx.x > 3, dtype=i32)  # E:ballot


def test_ballot_result_type():
    expect_error(ballot_bad_dtype, "ballot", "i32)", "ballot_sync() returns u32 or u64, got")


def shfl_float_lane(a: f32[32]):
    attrs.block_dim = 32
    a[threadIdx.x] = shfl_sync(FULL_MASK, a[threadIdx.x], 1.5)  # E:shfl_lane


def test_shuffle_lane_must_be_an_integer():
    expect_error(shfl_float_lane, "shfl_lane", "1.5", "the source lane of shfl_sync() must be an integer, got f32")


def syncwarp_as_value(a: f32[32]):
    attrs.block_dim = 32
    a[threadIdx.x] = syncwarp()  # E:syncwarp_value


def test_syncwarp_has_no_value():
    expect_error(syncwarp_as_value, "syncwarp_value", "syncwarp()", "this call is a statement and has no value")


# ----------------------------------------------------------------------------- more operand rules


def mask_too_wide(a: f32[32]):
    attrs.block_dim = 32
    a[threadIdx.x] = shfl_sync(1 << 70, a[threadIdx.x], 0)  # E:mask_wide


def mask_float(a: f32[32]):
    attrs.block_dim = 32
    a[threadIdx.x] = shfl_sync(a[0], a[threadIdx.x], 0)  # E:mask_float


def cp_async_missing(g: f32[64]):
    attrs.block_dim = 32
    s = shared_tensor(f32, [64])
    cp_async(s[threadIdx.x], g[threadIdx.x])  # E:cp_missing


def cp_async_from_shared(g: f32[64]):
    attrs.block_dim = 16
    s = shared_tensor(f32, [64])
    t = shared_tensor(f32, [64])
    cp_async(s[threadIdx.x * 4], t[threadIdx.x * 4], 16)  # E:cp_src


def mma_in_shared(c: f32[16]):
    attrs.block_dim = 32
    rc = shared_tensor(f32, [4])
    ra = register_tensor(f16, [8])
    rb = register_tensor(f16, [4])
    mma_sync_m16n8k16(rc, ra, rb)  # E:mma_shared


def ldmatrix_from_global(g: f16[16, 16]):
    attrs.block_dim = 32
    r = register_tensor(f16, [8])
    ldmatrix_x4(r, g[lane_id() % 16, 0])  # E:ldm_global


def syncwarp_two_args(a: f32[32]):
    attrs.block_dim = 32
    syncwarp(FULL_MASK, 1)  # E:syncwarp_args


@pytest.mark.parametrize("fn, tag, at, message", [
    (mask_too_wide, "mask_wide", "1 << 70", "the mask of shfl_sync() has more than 64 bits"),
    (mask_float, "mask_float", "a[0], a", "the mask of shfl_sync() must be an integer, got f32"),
    (cp_async_missing, "cp_missing", "cp_async(", "cp_async() missing argument 'nbytes'"),
    (cp_async_from_shared, "cp_src", "t[", "the source of cp_async() must be a global tensor element, 't' is shared"),
    (mma_in_shared, "mma_shared", "rc,", "the operands of mma_sync_m16n8k16() are register tensors; 'rc' is shared"),
    (ldmatrix_from_global, "ldm_global", "g[", "ldmatrix() reads a shared tensor; 'g' is global"),
    (syncwarp_two_args, "syncwarp_args", "syncwarp(", "syncwarp() takes at most 1 argument(s), got 2"),
])
def test_operand_rules(fn, tag, at, message):
    expect_error(fn, tag, at, message)
