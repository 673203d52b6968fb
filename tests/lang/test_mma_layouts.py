"""The tensor-core operand layouts are task mappings: their ``worker2task`` reproduces the PTX ISA's
fragment tables for ``mma.m16n8k16`` (f16/bf16 A and B, f32 C), and the ``ldmatrix`` row mappings
give each lane the row the instruction expects it to address."""
import pytest

from taskmap.ir import Var, i32
from taskmap.ir.mapping import ComposedMapping, CustomMapping, RepeatMapping, SpatialMapping
from taskmap.lang import (MMA_K, MMA_M, MMA_N, ldmatrix_x1_rows, ldmatrix_x2_rows, ldmatrix_x4_rows, mma_a_layout,
                          mma_b_layout, mma_c_layout)
from taskmap.lang.mma import ptx_fragment

# The PTX ISA's tables, written out for a few lanes (groupID = lane >> 2, threadID_in_group = lane % 4).
PTX_LANE_5 = {  # groupID 1, threadID_in_group 1
    "a": [(1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)],
    "b": [(2, 1), (3, 1), (10, 1), (11, 1)],
    "c": [(1, 2), (1, 3), (9, 2), (9, 3)],
}


@pytest.mark.parametrize("operand, mapping, shape, per_lane", [
    ("a", mma_a_layout, (MMA_M, MMA_K), 8),
    ("b", mma_b_layout, (MMA_K, MMA_N), 4),
    ("c", mma_c_layout, (MMA_M, MMA_N), 4),
])
def test_fragment_layouts_match_the_ptx_tables(operand, mapping, shape, per_lane):
    assert mapping.num_workers == 32 and mapping.task_shape == shape and mapping.tasks_per_worker == per_lane
    for lane in range(32):
        assert mapping.worker2task(lane) == ptx_fragment(operand, lane), lane
    assert mapping.worker2task(5) == PTX_LANE_5[operand]
    # Every element of the operand is held by exactly one lane.
    held = [t for lane in range(32) for t in mapping.worker2task(lane)]
    assert sorted(held) == [(i, j) for i in range(shape[0]) for j in range(shape[1])]


def test_fragment_layouts_are_built_from_spatial_and_repeat():
    for m in (mma_a_layout, mma_b_layout, mma_c_layout):
        assert isinstance(m, ComposedMapping)
        kinds = [type(f) for f in m.factors]
        assert kinds == [RepeatMapping, SpatialMapping, RepeatMapping]
    assert repr(mma_a_layout) == "repeat(2, 2, ranks=[1, 0])*spatial(8, 4)*repeat(1, 2)"
    assert repr(mma_b_layout) == "repeat(2, 1)*spatial(4, 8, ranks=[1, 0])*repeat(2, 1)"


def test_fragment_layouts_lower_symbolically():
    lane = Var("lane", i32)
    loops = [Var(f"k{i}", i32) for i in range(len(mma_a_layout.loop_extents()))]
    row, col = mma_a_layout.task_index(lane, loops)
    assert "lane // 4" in repr(row) and "lane % 4" in repr(col)


def test_ldmatrix_rows():
    assert all(isinstance(m, CustomMapping) for m in (ldmatrix_x1_rows, ldmatrix_x2_rows, ldmatrix_x4_rows))
    # x4: lanes 8j..8j+7 address the rows of matrix j: (rows 0-7 | 8-15) x (cols 0-7 | 8-15), j-major.
    assert [ldmatrix_x4_rows.worker2task(lane)[0] for lane in (0, 7, 8, 15, 16, 31)] == \
        [(0, 0), (7, 0), (8, 0), (15, 0), (0, 8), (15, 8)]
    assert [ldmatrix_x2_rows.worker2task(lane)[0] for lane in (0, 15, 16, 31)] == [(0, 0), (15, 0), (0, 0), (15, 0)]
    assert [ldmatrix_x1_rows.worker2task(lane)[0] for lane in (0, 7, 8, 31)] == [(0, 0), (7, 0), (0, 0), (7, 0)]
    # The matrices x4 reads, in register order, are the A fragment's quadrants: a0a1, a2a3, a4a5, a6a7.
    for lane in range(32):
        a = mma_a_layout.worker2task(lane)
        for j in range(4):
            row0, col0 = ldmatrix_x4_rows.worker2task(8 * j)[0]
            assert a[2 * j] == (row0 + lane // 4, col0 + 2 * (lane % 4))


def test_ptx_fragment_rejects_unknown_operands():
    with pytest.raises(ValueError, match="operand must be 'a', 'b', 'c', 'a_tf32' or 'b_tf32'"):
        ptx_fragment("d", 0)


def test_tf32_fragment_layouts_match_the_ptx_tables():
    """``mma.m16n8k8`` with .tf32: A[16, 8] 4 registers, B[8, 8] 2, C as for m16n8k16."""
    from taskmap.lang import MMA_TF32_K, mma_tf32_a_layout, mma_tf32_b_layout

    for operand, mapping, shape, per_lane in (("a_tf32", mma_tf32_a_layout, (MMA_M, MMA_TF32_K), 4),
                                              ("b_tf32", mma_tf32_b_layout, (MMA_TF32_K, MMA_N), 2)):
        assert mapping.num_workers == 32 and mapping.task_shape == shape and mapping.tasks_per_worker == per_lane
        for lane in range(32):
            assert mapping.worker2task(lane) == ptx_fragment(operand, lane), (operand, lane)
        held = [t for lane in range(32) for t in mapping.worker2task(lane)]
        assert sorted(held) == [(i, j) for i in range(shape[0]) for j in range(shape[1])]
    # lane 5 (groupID 1, threadID_in_group 1), as the PTX ISA's figures show it
    assert mma_tf32_a_layout.worker2task(5) == [(1, 1), (9, 1), (1, 5), (9, 5)]
    assert mma_tf32_b_layout.worker2task(5) == [(1, 1), (5, 1)]
