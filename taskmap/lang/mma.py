"""Operand layouts of the tensor-core primitives, as task mappings over the 32 lanes of a warp.

``mma_sync_m16n8k16(c, a, b)`` computes ``C[16, 8] += A[16, 16] @ B[16, 8]`` with one warp; each
lane holds a *fragment* of every operand: 8 elements of A, 4 of B, 4 of C (PTX ISA, "Matrix
fragments for mma.m16n8k16").  With ``groupID = lane >> 2`` and ``threadID_in_group = lane % 4``,
register ``i`` of a lane holds

* A: row ``groupID + 8 * (i // 2 % 2)``, column ``2 * threadID_in_group + i % 2 + 8 * (i // 4)``;
* B (K x N): row ``2 * threadID_in_group + i % 2 + 8 * (i // 2)``, column ``groupID``;
* C (and D): row ``groupID + 8 * (i // 2)``, column ``2 * threadID_in_group + i % 2``.

``mma_sync_m16n8k8_tf32(c, a, b)`` computes ``C[16, 8] += A[16, 8] @ B[8, 8]`` on f32 operands
rounded to tf32: 4 elements of A per lane — row ``groupID + 8 * (i % 2)``, column
``threadID_in_group + 4 * (i // 2)`` — 2 of B — row ``threadID_in_group + 4 * i``, column
``groupID`` — and C as above (``mma_tf32_a_layout``, ``mma_tf32_b_layout``, ``mma_c_layout``).
Each call rounds its operands; a kernel whose fragments feed several calls rounds them once, as
it loads them, with :func:`round_tf32` (or the cheaper :func:`tf32_operand`), and passes
``rounded=True``.

Each layout below is that table written as a task mapping whose workers are lanes and whose
tasks, in order, are the fragment's elements: ``mma_a_layout.worker2task(lane)[i]`` is the
``(row, col)`` of register ``i``.  So a kernel fills and drains fragments with mapping loops::

    for q, (i, k) in enumerate(mma_a_layout.on(lane_id())):
        a_regs[q] = smem_a[i, k]
    ...
    for q, (i, j) in enumerate(mma_c_layout.on(lane_id())):
        c[row0 + i, col0 + j] = acc[q]

The ``ldmatrix_*_rows`` mappings give, for each lane, the first element of the 8-element shared
memory row whose address it passes to ``ldmatrix_x4/x2/x1``: one task per lane, so
``for i, k in ldmatrix_x4_rows.on(lane_id()): ldmatrix_x4(a_regs, smem_a[i, k])`` loads the
A fragment of a 16x16 tile (row-major in shared memory).  With ``trans=True`` the same rows of a
16x16 (K x N) tile of B stored row-major give the B fragments of two adjacent 8-column tiles
(the 8 registers: 4 for columns 0-7, then 4 for columns 8-15).  On 32-bit elements an 8x8 b16
matrix is 8 rows of 4 floats and lane ``l`` receives row ``l // 4``, column ``l % 4`` — the
tf32 fragments' ``(groupID, threadID_in_group)``: ``ldmatrix_x4_rows_b32`` loads the tf32 A
fragment of a 16x8 tile of f32 (row-major).
"""
from __future__ import annotations

from ..ir.dtypes import f32, i32, u32
from ..ir.mapping import TaskMapping, custom_mapping, repeat, spatial
from .builtins import bitcast, func, select

#: Shape of one ``mma_sync_m16n8k16``.
MMA_M, MMA_N, MMA_K = 16, 8, 16
WARP_LANES = 32

#: A[16, 16] fragments: register pairs along k, then the row half (+8), then the column half (+8).
mma_a_layout: TaskMapping = repeat(2, 2, ranks=[1, 0]) * spatial(8, 4) * repeat(1, 2)
#: B[16, 8] (K x N) fragments: register pairs along k, then the k half (+8); lanes are column-major.
mma_b_layout: TaskMapping = repeat(2, 1) * spatial(4, 8, ranks=[1, 0]) * repeat(2, 1)
#: C[16, 8] (and D) fragments: register pairs along n, then the row half (+8).
mma_c_layout: TaskMapping = repeat(2, 1) * spatial(8, 4) * repeat(1, 2)

#: K of one ``mma_sync_m16n8k8_tf32`` (M and N as above; C's fragments are ``mma_c_layout``'s).
MMA_TF32_K = 8
#: tf32 A[16, 8] fragments: the row half (+8), then the column half (+4).
mma_tf32_a_layout: TaskMapping = repeat(2, 2, ranks=[1, 0]) * spatial(8, 4)
#: tf32 B[8, 8] (K x N) fragments: the k half (+4); lanes are column-major.
mma_tf32_b_layout: TaskMapping = repeat(2, 1) * spatial(4, 8, ranks=[1, 0])


@func
def round_tf32(x: f32) -> f32:
    """``x`` rounded to tf32 as ``cvt.rna.tf32.f32`` does (10 mantissa bits, to nearest, ties away
    from zero; inf and NaN unchanged), in integer arithmetic that the compiler can share: the
    operands of ``mma_sync_m16n8k8_tf32(..., rounded=True)``."""
    u = bitcast(x, u32)
    return bitcast(select((u & 0x7F800000) != 0x7F800000, (u + 0x1000) & 0xFFFFE000, u), f32)


@func
def tf32_operand(x: f32) -> f32:
    """``x`` as an operand of ``mma_sync_m16n8k8_tf32(..., rounded=True)``: half a tf32 ulp added to
    its magnitude when it is finite, so that the tensor cores, which read the top 19 bits, take
    ``x`` rounded as ``cvt.rna.tf32.f32`` rounds it (ties away from zero; inf and NaN as they
    are).  Two instructions where the rounding alone takes three; the 13 low bits are left as
    they fall, so the result is not ``x`` in tf32 as an f32 value (that is :func:`round_tf32`)."""
    u = bitcast(x, u32)
    return bitcast(select(abs(x) <= 3.4028234663852886e38, u + 0x1000, u), f32)


def _x4_row(lane, k, half=8):  # lanes 0-15 address rows 0-15 at column 0, lanes 16-31 at column half
    return lane % 16, lane // 16 * half


def _x2_row(lane, k):  # lanes 0-15 address the rows; lanes 16-31 repeat them (their addresses are unused)
    return lane % 16, 0


def _x1_row(lane, k):  # lanes 0-7 address the rows; the others repeat them (unused)
    return lane % 8, 0


#: ``ldmatrix_x4``: a 16x16 tile as four 8x8 matrices (rows 0-7/8-15 x columns 0-7/8-15).
ldmatrix_x4_rows: TaskMapping = custom_mapping((16, 16), WARP_LANES, 1, _x4_row)
#: ``ldmatrix_x4`` of 32-bit elements: a 16x8 tile (f32, row-major) as four 8x4 matrices (rows
#: 0-7/8-15 x columns 0-3/4-7), in the order of the tf32 A fragment's registers.
ldmatrix_x4_rows_b32: TaskMapping = custom_mapping((16, 8), WARP_LANES, 1, lambda lane, k: _x4_row(lane, k, 4))
#: ``ldmatrix_x2``: a 16x8 tile as two 8x8 matrices (rows 0-7, 8-15).
ldmatrix_x2_rows: TaskMapping = custom_mapping((16, 8), WARP_LANES, 1, _x2_row)
#: ``ldmatrix_x1``: one 8x8 matrix.
ldmatrix_x1_rows: TaskMapping = custom_mapping((8, 8), WARP_LANES, 1, _x1_row)


def wgmma_c_layout(n: int) -> TaskMapping:
    """The accumulators of ``wgmma_tf32(c, a, b, n)`` over a 64 x n tile and the warpgroup's 128
    threads: warp ``w`` holds rows ``16w .. 16w + 15`` as ``mma_c_layout`` does, for each 8-column
    tile in turn (register ``4j + i`` in tile j)."""
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma tiles are 64 x n with n a multiple of 8 up to 256, got n = {n}")
    return repeat(1, n // 8) * spatial(4, 1) * mma_c_layout


@func
def wgmma_sw128(row: i32, k: i32) -> i32:
    """Where element ``(row, k)`` of a wgmma operand tile (K-major f32 rows of 32, 128-byte
    swizzle) lies in a ``[rows, 32]`` shared tensor: 16-byte chunk ``k // 4`` of a row is stored as
    chunk ``k // 4 ^ row % 8`` (the row's column index there; write ``tile[row, wgmma_sw128(row, k)]``).
    ``k`` a multiple of 4 moves whole 16-byte chunks (cp_async's)."""
    return (k // 4 ^ row % 8) * 4 + k % 4


@func
def wgmma_sw128_b16(row: i32, k: i32) -> i32:
    """``wgmma_sw128`` for 16-bit elements (f16, bf16): rows of 64, 16-byte chunks of 8 — element
    ``(row, k)`` of a ``[rows, 64]`` tile is stored at column ``(k // 8 ^ row % 8) * 8 + k % 8``."""
    return (k // 8 ^ row % 8) * 8 + k % 8


def ptx_fragment(operand: str, lane: int) -> list[tuple[int, int]]:
    """The ``(row, col)`` of each register of ``operand`` ("a", "b" or "c") held by ``lane``,
    straight from the PTX ISA's formulas (the reference the mappings are tested against)."""
    group, tig = lane >> 2, lane % 4
    if operand == "a":
        return [(group + (0 if i < 2 or 4 <= i < 6 else 8), tig * 2 + (i & 1) + (0 if i < 4 else 8))
                for i in range(8)]
    if operand == "b":
        return [(tig * 2 + (i & 1) + (0 if i < 2 else 8), group) for i in range(4)]
    if operand == "c":
        return [(group + (0 if i < 2 else 8), tig * 2 + (i & 1)) for i in range(4)]
    if operand == "a_tf32":      # "Matrix fragments for mma.m16n8k8" with .tf32: a0..a3
        return [(group + 8 * (i % 2), tig + 4 * (i // 2)) for i in range(4)]
    if operand == "b_tf32":      # b0, b1
        return [(tig + 4 * i, group) for i in range(2)]
    raise ValueError(f"operand must be 'a', 'b', 'c', 'a_tf32' or 'b_tf32', got {operand!r}")


__all__ = ["MMA_K", "MMA_M", "MMA_N", "MMA_TF32_K", "ldmatrix_x1_rows", "ldmatrix_x2_rows", "ldmatrix_x4_rows",
           "ldmatrix_x4_rows_b32",
           "mma_a_layout", "mma_b_layout", "mma_c_layout", "mma_tf32_a_layout", "mma_tf32_b_layout", "ptx_fragment",
           "round_tf32", "tf32_operand", "wgmma_c_layout", "wgmma_sw128", "wgmma_sw128_b16"]
