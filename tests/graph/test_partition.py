"""Partition into fusion groups (taskmap.graph.partition): anchors with injective prologues and
bijective epilogue chains, merged injective groups, single ops, topological order."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.graph import (
    AxisAttrs,
    BinaryAttrs,
    BinaryFn,
    Conv2dAttrs,
    GraphBuilder,
    NormAttrs,
    OpKind,
    PermuteAttrs,
    ReduceAttrs,
    ReduceFn,
    ShapeAttrs,
    SliceAttrs,
    UnaryAttrs,
    UnaryFn,
)
from taskmap.graph.partition import GroupKind, groups_str, partition
from taskmap.graph.passes import optimize
from taskmap.ir.dtypes import f32

RNG = np.random.default_rng(1)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def check_cover(graph, groups):
    """Every op in exactly one group; groups in an order that respects data dependences."""
    seen = [op for g in groups for op in g.ops]
    assert sorted(map(id, seen)) == sorted(map(id, graph.ops))
    ready = set(graph.inputs) | set(graph.constants())
    for g in groups:
        assert all(t in ready for t in g.inputs), groups_str(groups)
        ready.update(g.outputs)
        made = {t for op in g.ops for t in op.outputs}
        for op in g.ops[:-1]:   # intermediates are read only inside the group
            for t in op.outputs:
                assert t not in graph.outputs
                assert all(c in g.ops for c in graph.consumers(t))
        assert made


def conv_bn_relu(b, x, cout):
    w = b.constant(rand(cout, x.shape[1], 3, 3))
    y = b.op(OpKind.CONV2D, [x, w], Conv2dAttrs((1, 1), (1, 1)))
    stats = [b.constant(rand(cout)), b.constant(RNG.random(cout).astype(np.float32) + 0.5)]
    y = b.op(OpKind.BATCH_NORM, [y, *stats], NormAttrs(1e-5, (), False, False))
    return b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))


def test_conv_bn_relu_is_one_group():
    b = GraphBuilder()
    x = b.input((1, 3, 8, 8), f32)
    g = optimize(b.build([conv_bn_relu(b, x, 4)]))
    groups = partition(g)
    assert len(groups) == 1 and groups[0].kind is GroupKind.ANCHORED
    assert groups[0].anchor.kind is OpKind.CONV2D and [op.kind for op in groups[0].epilogue] == [OpKind.UNARY]


def test_residual_add_is_an_epilogue_reading_another_tensor():
    b = GraphBuilder()
    x = b.input((1, 4, 6, 6), f32)
    y = conv_bn_relu(b, x, 4)
    w = b.constant(rand(4, 4, 3, 3))
    z = b.op(OpKind.CONV2D, [y, w], Conv2dAttrs((1, 1), (1, 1)))
    z = b.op(OpKind.BINARY, [z, x], BinaryAttrs(BinaryFn.ADD))
    z = b.op(OpKind.UNARY, [z], UnaryAttrs(UnaryFn.RELU))
    g = optimize(b.build([z]))
    groups = partition(g)
    check_cover(g, groups)
    assert len(groups) == 2
    assert [op.kind for op in groups[1].epilogue] == [OpKind.BINARY, OpKind.UNARY]
    assert x in groups[1].inputs


def test_epilogue_stops_at_a_tensor_with_two_readers():
    b = GraphBuilder()
    x = b.input((4, 8), f32)
    w = b.constant(rand(8, 8))
    y = b.op(OpKind.MATMUL, [x, w])
    r = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    s = b.op(OpKind.UNARY, [r], UnaryAttrs(UnaryFn.EXP))
    t = b.op(OpKind.UNARY, [r], UnaryAttrs(UnaryFn.TANH))
    g = b.build([s, t])
    groups = partition(g)
    check_cover(g, groups)
    assert [len(grp.ops) for grp in groups] == [2, 1, 1]
    assert groups[0].kind is GroupKind.ANCHORED and groups[0].outputs == (r,)


def test_epilogue_takes_a_diamond_that_joins_again():
    """``y * sigmoid(y)`` reads y twice: the ops up to the tensor both paths flow into join the
    epilogue, and the chain goes on after it; not when a path escapes (a graph output, or a
    reader of another kind) before the join."""
    b = GraphBuilder()
    x = b.input((4, 8), f32)
    y = b.op(OpKind.MATMUL, [x, b.constant(rand(8, 8))])
    s = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.SIGMOID))
    z = b.op(OpKind.BINARY, [y, s], BinaryAttrs(BinaryFn.MUL))
    r = b.op(OpKind.UNARY, [z], UnaryAttrs(UnaryFn.RELU))
    g = b.build([r])
    groups = partition(g)
    check_cover(g, groups)
    assert len(groups) == 1 and [op.kind for op in groups[0].epilogue] == [OpKind.UNARY, OpKind.BINARY, OpKind.UNARY]
    # sigmoid's result is also a graph output: the diamond does not close inside the group
    g = b.build([r, s])
    groups = partition(g)
    check_cover(g, groups)
    assert groups[0].kind is GroupKind.ANCHORED and not groups[0].epilogue
    # a path through a reduction
    b = GraphBuilder()
    x = b.input((4, 8), f32)
    y = b.op(OpKind.MATMUL, [x, b.constant(rand(8, 8))])
    m = b.op(OpKind.REDUCE, [y], ReduceAttrs(ReduceFn.MAX, (1,), True))
    z = b.op(OpKind.BINARY, [y, m], BinaryAttrs(BinaryFn.SUB))
    g = b.build([z])
    groups = partition(g)
    check_cover(g, groups)
    assert groups[0].anchor.kind is OpKind.MATMUL and not groups[0].epilogue


def test_broadcast_of_the_chain_value_is_not_an_epilogue():
    b = GraphBuilder()
    x = b.input((4, 8), f32)
    w = b.constant(rand(8, 1))
    y = b.op(OpKind.MATMUL, [x, w])                                 # (4, 1)
    z = b.op(OpKind.BINARY, [y, b.input((4, 5), f32)], BinaryAttrs(BinaryFn.ADD))   # (4, 5): y broadcast
    groups = partition(b.build([z]))
    assert [grp.kind for grp in groups] == [GroupKind.ANCHORED, GroupKind.INJECTIVE]
    assert not groups[0].epilogue


def test_transpose_prologue_is_absorbed_into_matmul():
    b = GraphBuilder()
    x = b.input((8, 4), f32)
    w = b.constant(rand(8, 6))
    xt = b.op(OpKind.PERMUTE, [x], PermuteAttrs((1, 0)))
    xs = b.op(OpKind.BINARY, [xt], BinaryAttrs(BinaryFn.MUL, 0.5))
    y = b.op(OpKind.MATMUL, [xs, w])
    groups = partition(b.build([y]))
    assert len(groups) == 1
    (k, ops), = groups[0].prologues
    assert k == 0 and [op.kind for op in ops] == [OpKind.PERMUTE, OpKind.BINARY]


def test_only_narrow_concats_join_a_prologue():
    """A concat of two inputs is read through the matmul's prologue; one of five (wider than
    MAX_PROLOGUE_CONCAT: a chain of selects per element read) is its own group."""
    from taskmap.graph.partition import MAX_PROLOGUE_CONCAT

    for n in (2, MAX_PROLOGUE_CONCAT + 1):
        b = GraphBuilder()
        xs = [b.op(OpKind.UNARY, [b.input((1, 8), f32)], UnaryAttrs(UnaryFn.EXP)) for _ in range(n)]
        y = b.op(OpKind.MATMUL, [b.op(OpKind.CONCAT, xs, AxisAttrs(0)), b.constant(rand(8, 3))])
        g = b.build([y])
        groups = partition(g)
        check_cover(g, groups)
        anchored = [grp for grp in groups if grp.kind is GroupKind.ANCHORED]
        assert len(anchored) == 1
        kinds = [op.kind for _, ops in anchored[0].prologues for op in ops]
        assert (OpKind.CONCAT in kinds) == (n <= MAX_PROLOGUE_CONCAT), (n, groups_str(groups))


def test_wide_concats_inside_a_concat_are_groups_of_their_own():
    """A stack of chunks: the chunks of five inputs are groups of their own (the copy kernel of
    the outer concat takes the chunks, not every part); chunks of two join the outer group."""
    from taskmap.graph.partition import MAX_PROLOGUE_CONCAT

    for n in (2, MAX_PROLOGUE_CONCAT + 1):
        b = GraphBuilder()
        chunks = [b.op(OpKind.CONCAT, [b.op(OpKind.UNARY, [b.input((1, 8), f32)], UnaryAttrs(UnaryFn.EXP))
                                       for _ in range(n)], AxisAttrs(0)) for _ in range(3)]
        g = b.build([b.op(OpKind.CONCAT, chunks, AxisAttrs(0))])
        groups = partition(g)
        check_cover(g, groups)
        sizes = sorted(sum(op.kind is OpKind.CONCAT for op in grp.ops) for grp in groups
                       if any(op.kind is OpKind.CONCAT for op in grp.ops))
        assert sizes == ([4] if n == 2 else [1, 1, 1, 1]), (n, groups_str(groups))


def test_views_read_only_by_one_injective_group_join_it():
    """Swin's patch merging: two strided row slices, each read by two of the four column slices
    a concatenation joins.  The row slices join the concatenation's group (recomputed for each
    reader) — unless something outside the group reads one too."""
    for also_outside in (False, True):
        b = GraphBuilder()
        x = b.input((1, 8, 8, 16), f32)
        rows = [b.op(OpKind.SLICE, [x], SliceAttrs(1, i, 2, 4)) for i in (0, 1)]
        parts = [b.op(OpKind.SLICE, [rows[i]], SliceAttrs(2, j, 2, 4)) for j in (0, 1) for i in (0, 1)]
        y = b.op(OpKind.CONCAT, parts, AxisAttrs(3))
        outs = [y, b.op(OpKind.UNARY, [rows[0]], UnaryAttrs(UnaryFn.EXP))] if also_outside else [y]
        g = b.build(outs)
        groups = partition(g)
        check_cover(g, groups)
        (cat,) = [grp for grp in groups if any(op.kind is OpKind.CONCAT for op in grp.ops)]
        inside = [op for op in cat.ops if op.output in (rows[0], rows[1])]
        assert [op.output for op in inside] == ([rows[1]] if also_outside else rows), groups_str(groups)


def test_shared_prologue_is_not_absorbed():
    b = GraphBuilder()
    x = b.input((8, 4), f32)
    xt = b.op(OpKind.PERMUTE, [x], PermuteAttrs((1, 0)))
    y = b.op(OpKind.MATMUL, [xt, b.constant(rand(8, 3))])
    z = b.op(OpKind.UNARY, [xt], UnaryAttrs(UnaryFn.EXP))
    g = b.build([y, z])
    groups = partition(g)
    check_cover(g, groups)
    assert not any(grp.prologues for grp in groups)


def test_injective_chains_merge_and_reductions_stand_alone():
    b = GraphBuilder()
    x = b.input((2, 3, 4), f32)
    t = b.op(OpKind.UNARY, [x], UnaryAttrs(UnaryFn.EXP))
    t = b.op(OpKind.PERMUTE, [t], PermuteAttrs((0, 2, 1)))
    t = b.op(OpKind.RESHAPE, [t], ShapeAttrs((8, 3)))
    s = b.op(OpKind.SOFTMAX, [t], AxisAttrs(1))
    u = b.op(OpKind.BINARY, [s], BinaryAttrs(BinaryFn.MUL, 3.0))
    g = b.build([u])
    groups = partition(g)
    check_cover(g, groups)
    assert [(grp.kind, len(grp.ops)) for grp in groups] == [(GroupKind.INJECTIVE, 3), (GroupKind.SINGLE, 1),
                                                            (GroupKind.INJECTIVE, 1)]


def test_unfusable_anchor_runs_alone():
    b = GraphBuilder()
    x = b.input((4, 8), f32)
    y = b.op(OpKind.MATMUL, [x, b.constant(rand(8, 8))])
    z = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    groups = partition(b.build([z]), fusable=lambda op: False)
    assert [grp.kind for grp in groups] == [GroupKind.SINGLE, GroupKind.INJECTIVE]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["relu", "exp", "add", "mm", "perm"]), st.integers(0, 10)),
                min_size=1, max_size=12))
def test_random_graphs_are_covered_in_dependency_order(program):
    b = GraphBuilder()
    vals = [b.input((4, 4), f32), b.input((4, 4), f32)]
    for op, pick in program:
        a = vals[pick % len(vals)]
        if op == "relu":
            vals.append(b.op(OpKind.UNARY, [a], UnaryAttrs(UnaryFn.RELU)))
        elif op == "exp":
            vals.append(b.op(OpKind.UNARY, [a], UnaryAttrs(UnaryFn.EXP)))
        elif op == "add":
            vals.append(b.op(OpKind.BINARY, [a, vals[(pick + 1) % len(vals)]], BinaryAttrs(BinaryFn.ADD)))
        elif op == "mm":
            vals.append(b.op(OpKind.MATMUL, [a, vals[(pick * 7) % len(vals)]]))
        else:
            vals.append(b.op(OpKind.PERMUTE, [a], PermuteAttrs((1, 0))))
    outs = list(dict.fromkeys(vals[2:][-2:])) or [vals[0]]
    g = b.build(outs)
    groups = partition(g)
    check_cover(g, groups)


def test_reduction_epilogue_stops_at_a_reshape():
    from taskmap.graph import ReduceAttrs, ReduceFn
    b = GraphBuilder()
    x = b.input((2, 6, 4), f32)
    s = b.op(OpKind.REDUCE, [x], ReduceAttrs(ReduceFn.SUM, (2,)))
    s = b.op(OpKind.UNARY, [s], UnaryAttrs(UnaryFn.SQRT))
    y = b.op(OpKind.RESHAPE, [s], ShapeAttrs((12,)))
    groups = partition(b.build([y]), fusable=lambda op: op.kind is OpKind.REDUCE,
                       prologue_inputs=lambda op: (0,))
    assert [(grp.kind, len(grp.ops)) for grp in groups] == [(GroupKind.ANCHORED, 2), (GroupKind.INJECTIVE, 1)]
