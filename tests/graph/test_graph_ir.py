"""Graph IR: construction, inference, printing, errors, analysis views, op definitions,
serialisation, and running a graph (kernels + memory plan) against numpy."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.compute.analysis import is_bijective
from taskmap.compute.nodes import tensor_input
from taskmap.errors import IRError, LaunchError, OpError
from taskmap.graph import (AxisAttrs, BinaryAttrs, BinaryFn, CastAttrs, Conv2dAttrs, Graph, GraphBuilder, Op,
                           OpCategory, OpKind, PermuteAttrs, Pool2dAttrs, ReduceAttrs, ReduceFn, ShapeAttrs,
                           SliceAttrs, Tensor, UnaryAttrs, UnaryFn, graph_str, infer, serialize)
from taskmap.ir.dtypes import bool_, f32, i64
from taskmap.runtime.graph import CompiledGraph


def small_graph():
    b = GraphBuilder(name="g")
    x = b.input((8, 64), f32, name="x")
    w = b.constant(np.ones((64, 32), np.float32), name="w")
    y = b.op(OpKind.MATMUL, [x, w])
    z = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    s = b.op(OpKind.BINARY, [z], BinaryAttrs(BinaryFn.MUL, 2.0))
    return b.build([s]), (x, w, y, z, s)


def test_build_infer_and_topology():
    g, (x, w, y, z, s) = small_graph()
    assert y.shape == (8, 32) and y.dtype is f32
    assert g.inputs == (x,) and g.outputs == (s,) and len(g.ops) == 3
    assert g.producer(y).kind is OpKind.MATMUL and g.producer(x) is None
    assert [op.kind for op in g.consumers(y)] == [OpKind.UNARY]
    assert g.constants() == [w] and w.is_constant and not w.data.flags.writeable
    nx = g.to_networkx()
    assert nx.number_of_nodes() == 5 and nx.number_of_edges() == 4


def test_printer():
    g, _ = small_graph()
    text = str(g)
    assert text.startswith("graph g(x: f32[8, 64]) {")
    assert "MATMUL(x, w:f32[64, 32])" in text and "UNARY(" in text and "fn=relu" in text
    assert "scalar=2.0" in text and "scalar_first" not in text and text.rstrip().endswith("}")   # defaults left out
    assert graph_str(g) == text


@pytest.mark.parametrize("kind, shapes, attrs, expected", [
    (OpKind.BINARY, [(4, 1, 3), (5, 1)], BinaryAttrs(BinaryFn.ADD), (4, 5, 3)),
    (OpKind.MATMUL, [(2, 1, 3, 4), (5, 4, 6)], None, (2, 5, 3, 6)),
    (OpKind.MATMUL, [(4,), (4, 6)], None, (6,)),
    (OpKind.CONV2D, [(1, 8, 32, 32), (16, 4, 3, 3)], Conv2dAttrs((2, 2), (1, 1), (1, 1), 2), (1, 16, 16, 16)),
    (OpKind.CONV2D, [(1, 8, 32, 32), (8, 8, 3, 3)], Conv2dAttrs((1, 1), (2, 2), (2, 2), 1), (1, 8, 32, 32)),
    (OpKind.MAX_POOL2D, [(1, 3, 112, 112)], Pool2dAttrs((3, 3), (2, 2), (1, 1)), (1, 3, 56, 56)),
    (OpKind.AVG_POOL2D, [(1, 3, 8, 8)], Pool2dAttrs((3, 3), (2, 2), (0, 0), ceil_mode=True), (1, 3, 4, 4)),
    (OpKind.REDUCE, [(2, 3, 4)], ReduceAttrs(ReduceFn.MEAN, (1,), True), (2, 1, 4)),
    (OpKind.PERMUTE, [(2, 3, 4)], PermuteAttrs((2, 0, 1)), (4, 2, 3)),
    (OpKind.SLICE, [(10, 3)], SliceAttrs(0, 1, 3, 3), (3, 3)),
    (OpKind.CONCAT, [(2, 3), (2, 5)], AxisAttrs(1), (2, 8)),
    (OpKind.EXPAND, [(3, 1)], ShapeAttrs((2, 3, 4)), (2, 3, 4)),
])
def test_shape_inference(kind, shapes, attrs, expected):
    xs = [Tensor(s, f32) for s in shapes]
    assert infer(kind, xs, attrs)[0][0] == expected


def test_dtype_inference():
    x, n = Tensor((3,), f32), Tensor((3,), i64)
    assert infer(OpKind.BINARY, [x, n], BinaryAttrs(BinaryFn.ADD))[0][1] is f32
    assert infer(OpKind.BINARY, [n], BinaryAttrs(BinaryFn.DIV, 2))[0][1] is f32
    assert infer(OpKind.BINARY, [x], BinaryAttrs(BinaryFn.LT, 0.0))[0][1] is bool_
    assert infer(OpKind.UNARY, [n], UnaryAttrs(UnaryFn.EXP))[0][1] is f32
    assert infer(OpKind.REDUCE, [n], ReduceAttrs(ReduceFn.SUM, (0,)))[0][1] is i64
    assert infer(OpKind.CAST, [x], CastAttrs(i64))[0][1] is i64


def test_errors():
    x = Tensor((3, 4), f32)
    with pytest.raises(OpError, match="do not broadcast"):
        infer(OpKind.BINARY, [x, Tensor((5,), f32)], BinaryAttrs(BinaryFn.ADD))
    with pytest.raises(OpError, match="inner dimensions"):
        infer(OpKind.MATMUL, [x, Tensor((3, 4), f32)])
    with pytest.raises(IRError, match="must be a UnaryAttrs"):
        infer(OpKind.UNARY, [x], BinaryAttrs(BinaryFn.ADD))
    with pytest.raises(OpError, match="cannot reshape"):
        infer(OpKind.RESHAPE, [x], ShapeAttrs((5,)))
    y = Tensor((3, 4), f32, name="y")
    op = Op(OpKind.UNARY, (y,), (Tensor((3, 4), f32),), UnaryAttrs(UnaryFn.RELU))
    with pytest.raises(IRError, match="topological order"):
        Graph([x], op.outputs, [op])
    with pytest.raises(IRError, match="not computed by the graph"):
        Graph([x], [y], [])
    with pytest.raises(IRError, match="data is"):
        Tensor((2,), f32, data=np.zeros(3, np.float32))


def test_every_kind_has_a_definition():
    for kind in OpKind:
        d = kind.definition
        assert d.kind is kind
        if d.category.is_injective:
            assert d.compute is not None
        else:
            assert d.run is not None and d.category.is_anchor
    assert OpKind.CONV2D.definition.category is OpCategory.OUT_FUSABLE
    assert OpKind.SOFTMAX.definition.category is OpCategory.REDUCTION
    assert OpKind.TORCH.definition.category is OpCategory.OPAQUE


def test_compute_definitions_for_fusion():
    """Injective kinds give compute definitions; transposes are bijective, broadcasts are not."""
    x = tensor_input("x", f32, (2, 3))
    perm = OpKind.PERMUTE.definition.compute([x], PermuteAttrs((1, 0)), (3, 2))
    assert perm.shape == (3, 2) and is_bijective(perm)
    exp = OpKind.EXPAND.definition.compute([x], ShapeAttrs((4, 2, 3)), (4, 2, 3))
    assert not is_bijective(exp)


def test_serialize_round_trip(tmp_path):
    g, _ = small_graph()
    serialize.save({"graph": g}, tmp_path / "g.taskmap")
    g2 = serialize.load(tmp_path / "g.taskmap")["graph"]
    assert str(g2) == str(g)
    assert g2.inputs[0].dtype is f32  # interned dtypes survive
    np.testing.assert_array_equal(g2.constants()[0].data, g.constants()[0].data)


@settings(max_examples=4, deadline=None)
@given(st.integers(1, 5), st.integers(1, 33))
def test_run_against_numpy(rows, cols):
    b = GraphBuilder()
    x = b.input((rows, cols), f32, name="x")
    c = b.constant(np.arange(cols, dtype=np.float32))
    t = x
    for fn in (BinaryFn.ADD, BinaryFn.MUL, BinaryFn.SUB):
        t = b.op(OpKind.BINARY, [t, c], BinaryAttrs(fn))
    r = b.op(OpKind.UNARY, [t], UnaryAttrs(UnaryFn.RELU))
    p = b.op(OpKind.PERMUTE, [r], PermuteAttrs((1, 0)))
    s = b.op(OpKind.REDUCE, [p], ReduceAttrs(ReduceFn.SUM, (1,)))
    cg = CompiledGraph(b.build([p, s]), "cpu", "numpy", progress=False)
    a = np.random.rand(rows, cols).astype(np.float32)
    cv = np.arange(cols, dtype=np.float32)
    want = np.maximum(((a + cv) * cv) - cv, 0).T
    for _ in range(2):  # the second run reuses the planned buffers
        got_p, got_s = cg(a)
        np.testing.assert_allclose(got_p, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_s, want.sum(1), rtol=1e-4, atol=1e-5)
    assert len(cg.buffer_sizes) <= 2  # four intermediates by lifetime in two buffers


def test_compiled_graph_checks_inputs():
    g, _ = small_graph()
    cg = CompiledGraph(g, "cpu", "numpy", progress=False)
    with pytest.raises(LaunchError, match=r"expected float32\[8, 64\]"):
        cg(np.zeros((8, 63), np.float32))
    with pytest.raises(LaunchError, match="takes 1 inputs"):
        cg()
