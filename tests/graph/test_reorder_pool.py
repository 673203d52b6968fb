"""The reorder_pool graph pass: an average pool and a 1x1 conv trade places where that is less
work (Inception's pool -> conv to fewer channels, DenseNet's conv -> strided pool) — which pairs
move, which stay, and the numerics of both orders against PyTorch."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import taskmap
from taskmap.graph import BinaryFn, Conv2dAttrs, GraphBuilder, OpKind, Pool2dAttrs, UnaryAttrs, UnaryFn
from taskmap.graph.passes import PASSES, optimize, reorder_pool
from taskmap.ir.dtypes import f16, f32
from taskmap.runtime.graph import CompiledGraph

RNG = np.random.default_rng(3)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def t(a):
    return torch.from_numpy(np.array(a))


def kinds(graph):
    return [op.kind for op in graph.ops]


def _pool_then_conv(shape, cout, pool, bias=True, dtype=f32):
    """avg_pool(x) -> 1x1 conv (-> relu); returns the builder's graph and its constants."""
    b = GraphBuilder()
    x = b.input(shape, dtype)
    p = b.op(OpKind.AVG_POOL2D, [x], pool)
    w = b.constant(rand(cout, shape[1], 1, 1).astype(dtype.numpy_dtype))
    ins = [p, w] + ([b.constant(rand(cout).astype(dtype.numpy_dtype))] if bias else [])
    y = b.op(OpKind.CONV2D, ins, Conv2dAttrs())
    return b.build([b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))]), ins[1:]


def _conv_then_pool(shape, cout, pool, bias=False, conv=Conv2dAttrs(), k=1):
    b = GraphBuilder()
    x = b.input(shape, f32)
    ins = [x, b.constant(rand(cout, shape[1], k, k))] + ([b.constant(rand(cout))] if bias else [])
    y = b.op(OpKind.CONV2D, ins, conv)
    return b.build([b.op(OpKind.AVG_POOL2D, [y], pool)]), ins[1:]


def _torch_pool(x, a):
    return F.avg_pool2d(x, a.kernel, a.stride, a.padding, a.ceil_mode, a.count_include_pad, a.divisor_override)


def test_the_pass_runs_after_batch_norm_folding():
    names = [n for n, _ in PASSES]
    assert names.index("fold_batch_norm") < names.index("reorder_pool") < names.index("cse")


@pytest.mark.parametrize("pool", [
    Pool2dAttrs((3, 3), (1, 1), (1, 1)),                                   # Inception's branch_pool
    Pool2dAttrs((3, 3), (1, 1), (1, 1), count_include_pad=False),
    Pool2dAttrs((3, 3), (1, 1), (0, 1), ceil_mode=True),
    Pool2dAttrs((2, 3), (1, 1), (1, 1), divisor_override=5),
])
@pytest.mark.parametrize("bias", [True, False])
def test_a_pool_before_a_conv_to_fewer_channels_runs_on_the_conv_channels(pool, bias):
    g, consts = _pool_then_conv((2, 24, 7, 9), 8, pool, bias)
    new = reorder_pool(g)
    conv, pooled = new.ops[0], new.ops[1]
    assert conv.kind is OpKind.CONV2D and conv.inputs[0] is g.inputs[0] and len(conv.inputs) == 2
    assert pooled.kind is OpKind.AVG_POOL2D and pooled.inputs[0] is conv.output and pooled.output.shape[1] == 8
    assert [op.attrs.fn for op in new.ops if op.kind is OpKind.BINARY] == ([BinaryFn.ADD] if bias else [])
    assert new.outputs[0] is g.outputs[0]
    x = rand(2, 24, 7, 9)
    ref = F.relu(F.conv2d(_torch_pool(t(x), pool), t(consts[0].data), t(consts[1].data) if bias else None))
    for graph in (g, new):
        np.testing.assert_allclose(CompiledGraph(graph, "cpu", "numpy")(x)[0], ref.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool,bias", [
    (Pool2dAttrs((2, 2), (2, 2)), False),                                  # DenseNet's transition
    (Pool2dAttrs((2, 2), (2, 2)), True),
    (Pool2dAttrs((3, 3), (2, 2), (1, 1), ceil_mode=True, count_include_pad=False), True),
    (Pool2dAttrs((3, 3), (2, 2), (1, 1)), False),
])
def test_a_strided_pool_after_a_conv_goes_first(pool, bias):
    g, consts = _conv_then_pool((2, 12, 8, 10), 6, pool, bias)
    new = reorder_pool(g)
    assert kinds(new) == [OpKind.AVG_POOL2D, OpKind.CONV2D]
    assert new.ops[0].inputs[0] is g.inputs[0] and new.ops[0].output.shape[1] == 12
    assert new.ops[1].output is g.outputs[0] and len(new.ops[1].inputs) == len(g.ops[0].inputs)
    x = rand(2, 12, 8, 10)
    ref = _torch_pool(F.conv2d(t(x), t(consts[0].data), t(consts[1].data) if bias else None), pool)
    for graph in (g, new):
        np.testing.assert_allclose(CompiledGraph(graph, "cpu", "numpy")(x)[0], ref.numpy(), rtol=1e-5, atol=1e-5)


def test_pairs_that_would_not_gain_or_not_be_exact_stay():
    stay = [
        # a conv to as many channels: the pool costs the same either way
        _pool_then_conv((1, 8, 6, 6), 8, Pool2dAttrs((3, 3), (1, 1), (1, 1)))[0],
        # a strided pool before the conv: the conv already runs on the pooled pixels
        _pool_then_conv((1, 16, 6, 6), 4, Pool2dAttrs((2, 2), (2, 2)))[0],
        # half precision rounds at other points
        _pool_then_conv((1, 16, 6, 6), 4, Pool2dAttrs((3, 3), (1, 1), (1, 1)), dtype=f16)[0],
        # a bias through a pool that averages in zero padding: not a constant at the borders
        _conv_then_pool((1, 8, 6, 6), 4, Pool2dAttrs((3, 3), (2, 2), (1, 1)), bias=True)[0],
        # a stride-1 pool after the conv: no fewer pixels
        _conv_then_pool((1, 8, 6, 6), 4, Pool2dAttrs((3, 3), (1, 1), (1, 1)))[0],
        # not a pointwise conv
        _conv_then_pool((1, 8, 6, 6), 4, Pool2dAttrs((2, 2), (2, 2)), conv=Conv2dAttrs(padding=(1, 1)), k=3)[0],
        _conv_then_pool((1, 8, 6, 6), 4, Pool2dAttrs((2, 2), (2, 2)), conv=Conv2dAttrs(stride=(2, 2)))[0],
    ]
    for g in stay:
        assert reorder_pool(g) is g


def test_an_intermediate_with_another_reader_stays():
    b = GraphBuilder()
    x = b.input((1, 16, 6, 6), f32)
    p = b.op(OpKind.AVG_POOL2D, [x], Pool2dAttrs((3, 3), (1, 1), (1, 1)))
    y = b.op(OpKind.CONV2D, [p, b.constant(rand(4, 16, 1, 1))], Conv2dAttrs())
    g = b.build([y, p])
    assert reorder_pool(g) is g


def test_a_pool_conv_pool_chain_moves_once():
    b = GraphBuilder()
    x = b.input((1, 16, 8, 8), f32)
    p = b.op(OpKind.AVG_POOL2D, [x], Pool2dAttrs((3, 3), (1, 1), (1, 1)))
    w = b.constant(rand(4, 16, 1, 1))
    y = b.op(OpKind.CONV2D, [p, w], Conv2dAttrs())
    z = b.op(OpKind.AVG_POOL2D, [y], Pool2dAttrs((2, 2), (2, 2)))
    g = b.build([z])
    new = optimize(g)
    xa = rand(1, 16, 8, 8)
    ref = F.avg_pool2d(F.conv2d(F.avg_pool2d(t(xa), 3, 1, 1), t(w.data)), 2, 2)
    np.testing.assert_allclose(CompiledGraph(new, "cpu", "numpy")(xa)[0], ref.numpy(), rtol=1e-5, atol=1e-5)


class _InceptionPoolBranch(torch.nn.Module):
    """Inception's pool branch (avg pool 3x3 / 1, 1x1 conv, BN, ReLU) beside a 1x1 branch, then
    a DenseNet transition (BN, ReLU, 1x1 conv, 2x2 / 2 avg pool)."""

    def __init__(self, cin=48, c_pool=16, c_out=24):
        super().__init__()
        self.branch1 = torch.nn.Conv2d(cin, c_out, 1)
        self.pool_conv = torch.nn.Conv2d(cin, c_pool, 1, bias=False)
        self.pool_bn = torch.nn.BatchNorm2d(c_pool)
        self.bn = torch.nn.BatchNorm2d(c_out + c_pool)
        self.trans = torch.nn.Conv2d(c_out + c_pool, 20, 1, bias=False)

    def forward(self, x):
        pooled = F.avg_pool2d(x, 3, 1, 1)
        y = torch.cat([self.branch1(x), F.relu(self.pool_bn(self.pool_conv(pooled)))], 1)
        return F.avg_pool2d(self.trans(F.relu(self.bn(y))), 2, 2)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_model_with_both_patterns_matches_eager(batch):
    torch.manual_seed(0)
    model = _InceptionPoolBranch().eval()
    for bn in (model.pool_bn, model.bn):
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(batch, 48, 14, 14)
    fast = taskmap.compile(model, (x,), progress=False)
    graph = next(iter(fast.entries.values())).compiled.graph
    convs = [op for op in graph.ops if op.kind is OpKind.CONV2D]
    pools = [op for op in graph.ops if op.kind is OpKind.AVG_POOL2D]
    assert {p.output.shape[1] for p in pools} == {16, 40}       # pooled: the conv's 16 channels, the 40 before it
    assert sorted(c.inputs[0].shape[2] for c in convs)[0] == 7    # the transition's conv on the pooled pixels
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
