"""taskmap.fusion.hoist: dividing loop-invariant index arithmetic leaves vector loops (so gcc
makes vector loads of spliced reads), nothing else moves, and results do not change."""
import numpy as np

import taskmap
from taskmap.fusion.hoist import hoist_invariants
from taskmap.ir import expr as E
from taskmap.ir import stmt as S
from taskmap.ir.func import Module
from taskmap.ir.functor import collect
from taskmap.ir.mapping import MappingLoopKind, spatial
from taskmap.lang import f32
from taskmap.runtime.kernel import Kernel


@taskmap.kernel
def gather_rows(a: f32[64], o: f32[8, 16]):
    for r in range(8):
        for s in spatial(16).vectorize():
            o[r, s] = a[r // 3 * 16 + s] if (r + s) % 2 == 0 else a[r * 4 + s // 4]


def test_invariant_divisions_leave_the_vector_loop_and_results_match():
    f = gather_rows.func
    h = hoist_invariants(f)
    loops = [n for n in collect(h.body, S.MappingFor) if n.kind is MappingLoopKind.VECTORIZE]
    assert len(loops) == 1
    divs = [b for b in collect(loops[0].body, E.Binary) if b.op in (E.BinOp.FLOORDIV, E.BinOp.MOD)]
    # r // 3 moved out; (r + s) % 2 and s // 4 depend on the lane and stay
    assert all(any(v.name == "s" for v in collect(b, E.Var)) for b in divs) and divs
    assert len(collect(h.body, S.DeclScalar)) == 1
    a = np.arange(64, dtype=np.float32)
    o1, o2 = np.zeros((8, 16), np.float32), np.zeros((8, 16), np.float32)
    gather_rows(a, o1)
    Kernel(Module(tuple(h if g is f else g for g in gather_rows.module.functions), gather_rows.module.entry))(a, o2)
    np.testing.assert_array_equal(o1, o2)


def test_nothing_to_hoist_returns_the_same_function():
    @taskmap.kernel
    def plain(a: f32[16], o: f32[4, 16]):
        for r in range(4):
            for s in spatial(16).vectorize():
                o[r, s] = a[s] * r

    assert hoist_invariants(plain.func).body is plain.func.body
