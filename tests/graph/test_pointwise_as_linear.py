"""The pointwise_as_linear graph pass: a 1x1 convolution of a 1x1 image (squeeze-and-excitation's
channel mixing) becomes a LINEAR between two reshapes — which convolutions move, which stay, the
kernels they compile to, and the numerics against PyTorch (f32, batch 1 and 3, with and without a
bias, a computed weight, strides)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import taskmap
from taskmap.graph import Conv2dAttrs, GraphBuilder, OpKind, UnaryAttrs, UnaryFn
from taskmap.graph.passes import PASSES, pointwise_as_linear
from taskmap.ir.dtypes import f32
from taskmap.runtime.graph import CompiledGraph

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _conv(shape, cout, k=1, bias=True, attrs=Conv2dAttrs(), computed_weight=False):
    """x -> conv (weight constant, or x-independent input 2 when ``computed_weight``) -> silu."""
    b = GraphBuilder()
    x = b.input(shape, f32)
    w = b.input((cout, shape[1], k, k), f32) if computed_weight else b.constant(rand(cout, shape[1], k, k))
    ins = [x, w] + ([b.constant(rand(cout))] if bias else [])
    y = b.op(OpKind.CONV2D, ins, attrs)
    return b.build([b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.SILU))]), ins


def test_the_pass_runs_after_batch_norm_folding_and_before_cse():
    names = [n for n, _ in PASSES]
    assert names.index("fold_batch_norm") < names.index("pointwise_as_linear") < names.index("cse")


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("stride", [1, 2])
def test_a_single_pixel_conv_becomes_a_linear(n, bias, stride):
    g, ins = _conv((n, 48, 1, 1), 20, bias=bias, attrs=Conv2dAttrs(stride=(stride, stride)))
    new = pointwise_as_linear(g)
    assert [op.kind for op in new.ops] == [OpKind.RESHAPE, OpKind.LINEAR, OpKind.RESHAPE, OpKind.UNARY]
    linear = new.ops[1]
    assert linear.inputs[0].shape == (n, 48) and linear.inputs[1].shape == (20, 48) and linear.inputs[1].is_constant
    assert len(linear.inputs) == (3 if bias else 2)
    assert new.ops[2].output is g.ops[0].output           # the conv's own output: its readers unchanged
    x = rand(n, 48, 1, 1)
    ref = F.silu(F.conv2d(torch.from_numpy(x), torch.from_numpy(np.array(ins[1].data)),
                          torch.from_numpy(np.array(ins[2].data)) if bias else None, stride=stride))
    for graph in (g, new):
        np.testing.assert_allclose(CompiledGraph(graph, "cpu", "numpy")(x)[0], ref.numpy(), rtol=1e-5, atol=1e-5)


def test_a_computed_weight_is_reshaped_by_an_op():
    g, _ = _conv((2, 16, 1, 1), 8, computed_weight=True)
    new = pointwise_as_linear(g)
    assert [op.kind for op in new.ops] == [OpKind.RESHAPE, OpKind.RESHAPE, OpKind.LINEAR, OpKind.RESHAPE,
                                           OpKind.UNARY]
    x, w = rand(2, 16, 1, 1), rand(8, 16, 1, 1)
    b = g.ops[0].inputs[2].data
    ref = F.silu(F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(np.array(b))))
    np.testing.assert_allclose(CompiledGraph(new, "cpu", "numpy")(x, w)[0], ref.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,k,attrs", [
    ((1, 16, 2, 2), 1, Conv2dAttrs()),                    # more than one pixel
    ((1, 16, 1, 1), 1, Conv2dAttrs(padding=(1, 1))),      # padded: a 3x3 output
    ((1, 16, 1, 1), 3, Conv2dAttrs(padding=(1, 1))),      # a 3x3 kernel
    ((1, 16, 1, 1), 1, Conv2dAttrs(groups=4)),            # grouped
])
def test_other_convolutions_stay(shape, k, attrs):
    b = GraphBuilder()
    x = b.input(shape, f32)
    w = b.constant(rand(8, shape[1] // attrs.groups, k, k))
    g = b.build([b.op(OpKind.CONV2D, [x, w], attrs)])
    assert pointwise_as_linear(g) is g


class SqueezeExcite(torch.nn.Module):
    def __init__(self, c, s):
        super().__init__()
        self.reduce, self.expand = torch.nn.Conv2d(c, s, 1), torch.nn.Conv2d(s, c, 1)

    def forward(self, x):
        scale = torch.sigmoid(self.expand(F.silu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))
        return x * scale


@pytest.mark.parametrize("batch", [1, 2])
def test_squeeze_and_excitation_compiles_its_convs_as_linears(batch):
    torch.manual_seed(0)
    model = SqueezeExcite(96, 8).eval()
    x = torch.randn(batch, 96, 7, 7)
    fast = taskmap.compile(model, [x])
    with torch.no_grad():
        np.testing.assert_allclose(fast(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    graph = next(iter(fast.entries.values())).compiled.graph
    kinds = [op.kind for op in graph.ops]
    assert OpKind.CONV2D not in kinds and kinds.count(OpKind.LINEAR) == 2
