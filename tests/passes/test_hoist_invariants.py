"""The last lowering pass: invariant dividing index arithmetic leaves vector loops, so that gcc
vectorizes their loads and stores (a spliced permute epilogue's ``(j * 64 + lane) // 64 % 4``,
which the simplifier makes ``j % 4`` once it knows the lane's range)."""
import numpy as np

import taskmap
from taskmap.ir import stmt as S
from taskmap.ir.expr import BinOp, Binary
from taskmap.ir.functor import collect
from taskmap.ir.mapping import spatial
from taskmap.lang import f32
from taskmap.passes import PASSES, lower

LANES = spatial(64)


@taskmap.kernel
def heads(x: f32[6, 768], y: f32[4, 6, 3, 64]):
    """Row i's 12 pieces of 64 to y[piece % 4, i, piece // 4, :]."""
    for i in range(6):
        for j in range(12):
            for s in LANES.vectorize():
                y[(j * 64 + s) // 64 % 4, i, (j * 64 + s) // 64 // 4, (j * 64 + s) % 64] = x[i, j * 64 + s]


def _divisions(node):
    return [b for b in collect(node, Binary) if b.op in (BinOp.FLOORDIV, BinOp.MOD)]


def test_divisions_of_outer_indices_leave_the_vector_loop():
    assert [name for name, _ in PASSES][-1] == "hoist_invariants"
    module = lower(heads.module)
    (f,) = [f for f in module.functions if f.name == module.entry]
    loops = [s for s in collect(f.body, S.For) if s.kind is S.ForKind.VECTORIZE]
    assert loops and all(not _divisions(loop.body) for loop in loops)
    assert any(_divisions(d.init) for d in collect(f.body, S.DeclScalar))


def test_results_unchanged():
    x = np.random.default_rng(0).standard_normal((6, 768)).astype(np.float32)
    y = np.zeros((4, 6, 3, 64), np.float32)
    heads(x, y)
    np.testing.assert_array_equal(y, x.reshape(6, 3, 4, 64).transpose(2, 0, 1, 3))
