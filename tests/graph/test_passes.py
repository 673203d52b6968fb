"""Graph passes (taskmap.graph.passes): constant folding, batch-norm folding, simplification,
CSE and DCE — structure and numerics against numpy / PyTorch."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import taskmap

from taskmap.graph import (
    BinaryAttrs,
    BinaryFn,
    Conv2dAttrs,
    GraphBuilder,
    MatmulAttrs,
    NormAttrs,
    OpKind,
    PermuteAttrs,
    ShapeAttrs,
    UnaryAttrs,
    UnaryFn,
)
from taskmap.graph.passes import (
    PASSES,
    combine_linears,
    cse,
    dce,
    fold_batch_norm,
    fold_constants,
    optimize,
    simplify,
    widen_half,
)
from taskmap.ir.dtypes import f16, f32
from taskmap.ops import emulate_gpu
from taskmap.runtime.graph import CompiledGraph

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def run(graph, *inputs, fuse=True):
    return CompiledGraph(graph, "cpu", "numpy", fuse=fuse)(*inputs)


def kinds(graph):
    return [op.kind for op in graph.ops]


def test_pass_list_is_ordered_and_named():
    names = [n for n, _ in PASSES]
    assert names.index("fold_constants") < names.index("fold_batch_norm") < names.index("dce")
    assert names.index("widen_half") < names.index("fold_constants")
    assert len(set(names)) == len(names)


def test_constant_subgraph_is_folded_with_numpy():
    b = GraphBuilder()
    x = b.input((3, 4), f32)
    c = b.constant(rand(4, 3))
    t = b.op(OpKind.PERMUTE, [c], PermuteAttrs((1, 0)))
    t = b.op(OpKind.BINARY, [t], BinaryAttrs(BinaryFn.MUL, 2.0))
    t = b.op(OpKind.UNARY, [t], UnaryAttrs(UnaryFn.EXP))
    y = b.op(OpKind.BINARY, [x, t], BinaryAttrs(BinaryFn.ADD))
    g = fold_constants(b.build([y]))
    assert kinds(g) == [OpKind.BINARY]
    folded = g.ops[0].inputs[1]
    assert folded.is_constant
    np.testing.assert_allclose(folded.data, np.exp(c.data.T * 2.0), rtol=1e-6)


def test_constant_folding_falls_back_to_the_compute_definition():
    b = GraphBuilder()
    x = b.input((5,), f32)
    c = b.constant(rand(5))
    t = b.op(OpKind.UNARY, [c], UnaryAttrs(UnaryFn.GELU))     # no numpy form: a rule-based kernel
    y = b.op(OpKind.BINARY, [x, t], BinaryAttrs(BinaryFn.SUB))
    g = fold_constants(b.build([y]))
    assert kinds(g) == [OpKind.BINARY]
    ref = F.gelu(torch.from_numpy(c.data.copy())).numpy()
    np.testing.assert_allclose(g.ops[0].inputs[1].data, ref, rtol=1e-5, atol=1e-6)


def test_folded_graph_output_becomes_a_constant():
    b = GraphBuilder()
    b.input((2,), f32)
    c = b.constant(rand(2, 3))
    y = b.op(OpKind.RESHAPE, [c], ShapeAttrs((3, 2)))
    g = optimize(b.build([y]))
    assert not g.ops and g.outputs[0].is_constant
    np.testing.assert_array_equal(g.outputs[0].data, c.data.reshape(3, 2))


def _conv_bn(b, x, cout, bias=False):
    cin = x.shape[1]
    w = b.constant(rand(cout, cin, 3, 3))
    ins = [x, w] + ([b.constant(rand(cout))] if bias else [])
    y = b.op(OpKind.CONV2D, ins, Conv2dAttrs((1, 1), (1, 1)))
    stats = [b.constant(rand(cout) * 0.1), b.constant(RNG.random(cout).astype(np.float32) + 0.5),
             b.constant(RNG.random(cout).astype(np.float32) + 0.5), b.constant(rand(cout))]
    return ins, stats, b.op(OpKind.BATCH_NORM, [y, *stats], NormAttrs(1e-5))


@pytest.mark.parametrize("bias", [False, True])
def test_batch_norm_folds_into_conv_weights(bias):
    b = GraphBuilder()
    x = b.input((2, 4, 6, 6), f32)
    ins, (mean, var, gamma, beta), y = _conv_bn(b, x, 8, bias)
    g = optimize(b.build([y]))
    assert kinds(g) == [OpKind.CONV2D] and len(g.ops[0].inputs) == 3 and g.ops[0].output is y
    xa = rand(2, 4, 6, 6)
    t = lambda a: torch.from_numpy(np.array(a))
    ref = F.batch_norm(F.conv2d(t(xa), t(ins[1].data), t(ins[2].data) if bias else None, padding=1),
                       t(mean.data), t(var.data), t(gamma.data), t(beta.data), eps=1e-5)
    np.testing.assert_allclose(run(g, xa, fuse=False)[0], ref.numpy(), rtol=1e-4, atol=1e-4)


def test_batch_norm_folds_into_a_2d_linear():
    b = GraphBuilder()
    x = b.input((3, 5), f32)
    w = b.constant(rand(4, 5))
    y = b.op(OpKind.LINEAR, [x, w])
    stats = [b.constant(rand(4)), b.constant(RNG.random(4).astype(np.float32) + 0.5)]
    z = b.op(OpKind.BATCH_NORM, [y, *stats], NormAttrs(1e-3, (), False, False))
    g = fold_batch_norm(b.build([z]))
    assert kinds(g) == [OpKind.LINEAR]
    xa = rand(3, 5)
    ref = (xa @ w.data.T - stats[0].data) / np.sqrt(stats[1].data + 1e-3)
    np.testing.assert_allclose(run(g, xa)[0], ref, rtol=1e-4, atol=1e-4)


def test_parallel_linears_become_one_linear_and_slices():
    """q / k / v projections of one input: one linear of the stacked weights, a slice per result
    (the results keep their identity, one of them a graph output); a linear of another input,
    without a bias, with other attributes or a non-constant weight stays as it is.  GPU graphs
    only (run here in GPU emulation)."""
    b = GraphBuilder(device="cuda:0")
    x, other, wv = b.input((2, 7, 16), f32), b.input((2, 7, 16), f32), b.input((6, 16), f32)
    ws = [b.constant(rand(n, 16)) for n in (8, 8, 4)]
    bs = [b.constant(rand(n)) for n in (8, 8, 4)]
    q, k, v = (b.op(OpKind.LINEAR, [x, w, bias]) for w, bias in zip(ws, bs))
    s = b.op(OpKind.BINARY, [q, k], BinaryAttrs(BinaryFn.MUL))
    lone = [b.op(OpKind.LINEAR, [other, ws[0], bs[0]]), b.op(OpKind.LINEAR, [x, ws[1]]),
            b.op(OpKind.LINEAR, [x, ws[2], bs[2]], MatmulAttrs(tf32=True)), b.op(OpKind.LINEAR, [x, wv])]
    g = b.build([s, v, *lone])
    c = combine_linears(g)
    linears = [op for op in c.ops if op.kind is OpKind.LINEAR]
    assert len(linears) == 5 and linears[0].output.shape == (2, 7, 20)
    assert [op.kind for op in c.ops[:4]] == [OpKind.LINEAR] + [OpKind.SLICE] * 3
    assert [op.output for op in c.ops[1:4]] == [q, k, v] and c.outputs[1] is v
    xa, oa, wva = rand(2, 7, 16), rand(2, 7, 16), rand(6, 16)
    with emulate_gpu("sm_90"):
        got, want = run(c, xa, oa, wva), run(g, xa, oa, wva)
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)
    assert combine_linears(c) is c                                   # nothing left to combine
    cpu = GraphBuilder(device="cpu")
    xc = cpu.input((3, 16), f32)
    g = cpu.build([cpu.op(OpKind.LINEAR, [xc, cpu.constant(w.data)]) for w in ws])
    assert combine_linears(g) is g                                   # CPU graphs: as they are


def test_batch_norm_is_not_folded_when_the_conv_has_another_reader():
    b = GraphBuilder()
    x = b.input((1, 2, 5, 5), f32)
    _, _, y = _conv_bn(b, x, 3)
    conv_out = y  # the batch norm's output
    bn = b._ops[-1]
    extra = b.op(OpKind.UNARY, [bn.inputs[0]], UnaryAttrs(UnaryFn.RELU))
    g = fold_batch_norm(b.build([conv_out, extra]))
    assert OpKind.BATCH_NORM in kinds(g)


def test_dce_drops_unused_ops_and_keeps_inputs():
    b = GraphBuilder()
    x = b.input((4,), f32)
    unused = b.input((4,), f32)
    b.op(OpKind.UNARY, [x], UnaryAttrs(UnaryFn.EXP))
    y = b.op(OpKind.UNARY, [x], UnaryAttrs(UnaryFn.TANH))
    g = dce(b.build([y]))
    assert kinds(g) == [OpKind.UNARY] and g.ops[0].attrs.fn is UnaryFn.TANH
    assert g.inputs == (x, unused)


def test_cse_merges_equal_ops_and_small_equal_constants():
    b = GraphBuilder()
    x = b.input((4,), f32)
    c1, c2 = b.constant(np.ones(4, np.float32)), b.constant(np.ones(4, np.float32))
    a1 = b.op(OpKind.BINARY, [x, c1], BinaryAttrs(BinaryFn.ADD))
    a2 = b.op(OpKind.BINARY, [x, c2], BinaryAttrs(BinaryFn.ADD))
    e1 = b.op(OpKind.UNARY, [a1], UnaryAttrs(UnaryFn.EXP))
    e2 = b.op(OpKind.UNARY, [a2], UnaryAttrs(UnaryFn.EXP))
    y = b.op(OpKind.BINARY, [e1, e2], BinaryAttrs(BinaryFn.MUL))
    g = cse(b.build([y]))
    assert kinds(g) == [OpKind.BINARY, OpKind.UNARY, OpKind.BINARY]
    assert g.ops[-1].inputs[0] is g.ops[-1].inputs[1]
    xa = rand(4)
    np.testing.assert_allclose(run(g, xa)[0], np.exp(xa + 1) ** 2, rtol=1e-5)


def test_cse_keeps_ops_that_are_graph_outputs_distinct():
    b = GraphBuilder()
    x = b.input((4,), f32)
    y1 = b.op(OpKind.UNARY, [x], UnaryAttrs(UnaryFn.EXP))
    y2 = b.op(OpKind.UNARY, [x], UnaryAttrs(UnaryFn.EXP))
    g = cse(b.build([y1, y2]))
    assert len(g.ops) == 2


def test_simplify_drops_identities_and_merges_reshapes():
    b = GraphBuilder()
    x = b.input((2, 3, 4), f32)
    t = b.op(OpKind.RESHAPE, [x], ShapeAttrs((2, 3, 4)))
    t = b.op(OpKind.PERMUTE, [t], PermuteAttrs((0, 1, 2)))
    t = b.op(OpKind.BINARY, [t], BinaryAttrs(BinaryFn.MUL, 1.0))
    t = b.op(OpKind.RESHAPE, [t], ShapeAttrs((6, 4)))
    t = b.op(OpKind.RESHAPE, [t], ShapeAttrs((24,)))
    y = b.op(OpKind.UNARY, [t], UnaryAttrs(UnaryFn.NEG))
    g = optimize(b.build([y]))
    assert kinds(g) == [OpKind.RESHAPE, OpKind.UNARY] and g.ops[0].inputs[0] is x
    xa = rand(2, 3, 4)
    np.testing.assert_allclose(run(g, xa)[0], -xa.reshape(24))


def test_identity_graph_output_is_kept():
    b = GraphBuilder()
    x = b.input((3,), f32)
    y = b.op(OpKind.RESHAPE, [x], ShapeAttrs((3,)))
    g = simplify(b.build([y]))
    assert len(g.ops) == 1


def test_debug_dump_after_each_changing_pass(monkeypatch, capsys):
    monkeypatch.setenv("TASKMAP_DEBUG", "passes")
    b = GraphBuilder()
    x = b.input((3,), f32)
    c = b.constant(rand(3))
    t = b.op(OpKind.UNARY, [c], UnaryAttrs(UnaryFn.ABS))
    y = b.op(OpKind.BINARY, [x, t], BinaryAttrs(BinaryFn.ADD))
    optimize(b.build([y]))
    err = capsys.readouterr().err
    assert "after graph pass fold_constants" in err and "after graph pass cse" not in err


def test_folding_keeps_zero_dim_constants_zero_dim():
    b = GraphBuilder()
    x = b.input((3,), f32)
    e = b.op(OpKind.UNARY, [b.constant(np.array(0.5, np.float32), name="c")], UnaryAttrs(UnaryFn.EXP))
    y = b.op(OpKind.BINARY, [x, e], BinaryAttrs(BinaryFn.MUL))
    g = fold_constants(b.build([y]))
    folded = [t for t in g.constants()]
    assert [t.shape for t in folded] == [()] and folded[0].data.shape == ()
    xs = rand(3)
    np.testing.assert_allclose(run(g, xs)[0], xs * np.exp(np.float32(0.5)), rtol=1e-6)


def test_half_products_on_the_cpu_compute_in_float32():
    """An f16 linear on the CPU: its inputs cast to f32 (the constant weight folds to an f32
    constant), the linear in f32, the result cast back; on a GPU the graph is left alone."""
    for device in ("cpu", "cuda:0"):
        b = GraphBuilder(device)
        x = b.input((3, 16), f16, "x")
        w = b.constant(rand(8, 16).astype(np.float16), "w")
        b_ = b.op(OpKind.LINEAR, [x, w])
        g = b.build([b.op(OpKind.UNARY, [b_], UnaryAttrs(UnaryFn.RELU))])
        widened = widen_half(g)
        if device != "cpu":
            assert widened is g
            continue
        (lin,) = [op for op in widened.ops if op.kind is OpKind.LINEAR]
        assert all(t.dtype is f32 for t in (*lin.inputs, lin.output))
        assert kinds(widened).count(OpKind.CAST) == 3 and widened.outputs[0].dtype is f16
        folded = optimize(g)
        (lin,) = [op for op in folded.ops if op.kind is OpKind.LINEAR]
        assert lin.inputs[1].is_constant and lin.inputs[1].dtype is f32


def test_half_precision_model_on_the_cpu_matches_torch():
    """Conv / linear / attention in float16 on the CPU (computed in float32, as PyTorch's CPU
    kernels accumulate), against eager float16 within its precision."""
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.lin = torch.nn.Linear(8 * 6 * 6, 16)

        def forward(self, x):
            y = F.relu(self.conv(x)).flatten(1)
            q = self.lin(y).reshape(2, 2, 2, 4)
            return F.scaled_dot_product_attention(q, q, q) @ torch.ones(4, 3, dtype=x.dtype)

    model = Net().half().eval()
    x = torch.randn(2, 3, 6, 6).half()
    got = taskmap.compile(model, progress=False)(x)
    with torch.no_grad():
        want = model(x)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
