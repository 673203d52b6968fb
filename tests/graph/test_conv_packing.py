"""Weight pre-packing at graph compile time: a conv with constant weights (BatchNorm folded in)
lowers to the channel-vectorized direct kernel, whose weight argument is a constant packed once
by the lowering (panels of NR output channels, channels innermost); the fused kernel matches
PyTorch, also when the weights are a graph input (packed by the kernel on every call)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from taskmap.backends.base import host_cpu_target
from taskmap.graph import Conv2dAttrs, GraphBuilder, NormAttrs, OpKind, UnaryAttrs, UnaryFn
from taskmap.graph.lower import lower_graph
from taskmap.graph.passes import optimize
from taskmap.ir.dtypes import f32
from taskmap.runtime.graph import CompiledGraph
from taskmap.templates.conv_cpu_cvec import pack_weights
from taskmap.templates.conv_cpu_wino import transform_weights
from taskmap.testing import assert_close

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def conv_bn_relu(const_weights: bool, shape=(1, 32, 14, 14), cout=48, stride=1):
    b = GraphBuilder()
    x = b.input(shape, f32)
    w = rand(cout, shape[1], 3, 3) / 10
    wt = b.constant(w) if const_weights else b.input(w.shape, f32)
    y = b.op(OpKind.CONV2D, [x, wt], Conv2dAttrs((stride, stride), (1, 1), (1, 1), 1))
    stats = [rand(cout) * 0.1, RNG.random(cout).astype(np.float32) + 0.5, RNG.random(cout).astype(np.float32) + 0.5,
             rand(cout)]
    y = b.op(OpKind.BATCH_NORM, [y, *(b.constant(s) for s in stats)], NormAttrs(1e-5))
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    return b.build([y]), w, stats


def reference(x, w, stats, stride):
    t = torch.from_numpy
    mean, var, gamma, beta = (t(s).double() for s in stats)
    y = F.conv2d(t(x).double(), t(w).double(), stride=stride, padding=1)
    return F.relu(F.batch_norm(y, mean, var, gamma, beta, eps=1e-5)).numpy()


@pytest.mark.parametrize("stride", [1, 2])
def test_constant_weights_are_packed_once_by_the_lowering(stride):
    # 28x28: stride 1 runs on Winograd whatever the host's FMA rate (at 14x14 the channel kernel
    # is as fast where 512-bit FMAs run at two a cycle)
    graph, w, stats = conv_bn_relu(True, shape=(1, 32, 28, 28), stride=stride)
    groups = lower_graph(optimize(graph), host_cpu_target())
    assert len(groups) == 1
    kg = groups[0]
    # stride 1: the Winograd kernel takes the weights transformed (U = G g G^T), else packed panels
    winograd = stride == 1
    assert kg.kernel.__name__.startswith("conv_cpu_wino" if winograd else "conv_cpu_cvec")
    params = [p.name for p in kg.kernel.func.params]
    packed = kg.args[params.index("wt")]
    assert packed.data is not None and packed.data.ndim == 1          # a constant made by the lowering
    # the packing of the BatchNorm-folded weights: check its layout
    folded = w * (stats[2] / np.sqrt(stats[1] + 1e-5))[:, None, None, None]
    layouts = [transform_weights(folded, m, mr) for m in (2, 4) for mr in (4, 6, 8, 12, 16, 24)] if winograd \
        else [pack_weights(folded, nr) for nr in (16, 32, 48, 64, 80, 96, 112, 128)]
    if not any(x.size == packed.data.size and np.allclose(x, packed.data, rtol=1e-5, atol=1e-5) for x in layouts):
        pytest.fail("the packed constant is not the folded weights in the kernel's layout")
    x = rand(1, 32, 28, 28)
    out = CompiledGraph(graph, "cpu", "numpy")(x)[0]
    assert_close(out, reference(x, w, stats, stride), rtol=1e-4, atol=1e-4)


def test_weights_given_as_an_input_run_unpacked():
    graph, w, stats = conv_bn_relu(False)
    x = rand(1, 32, 14, 14)
    out = CompiledGraph(graph, "cpu", "numpy")(x, w)[0]
    assert_close(out, reference(x, w, stats, 1), rtol=1e-4, atol=1e-4)


def test_partition_and_plan_pack_the_weights_once(monkeypatch):
    """The partition asks whether each conv fuses, then the plan lowers it: one anchor problem
    per op, so the conv's schedule is selected and its weights packed once."""
    from taskmap.templates.conv_cpu import CONV_CPU
    calls = []
    real = CONV_CPU.weights
    monkeypatch.setattr(CONV_CPU, "weights", lambda *a, **k: calls.append(1) or real(*a, **k))
    graph, _, _ = conv_bn_relu(True)
    (kg,) = lower_graph(optimize(graph), host_cpu_target())
    assert kg.kernel.__name__.startswith(("conv_cpu_cvec", "conv_cpu_wino")) and len(calls) == 1


@pytest.mark.parametrize("m, n, k", [(4, 40, 33), (128, 96, 200), (70, 20, 64), (48, 200, 96)])
def test_linear_constant_weights_are_packed_once(m, n, k):
    """A linear with constant weights: the matmul kernel takes the weights as ``wb`` panels
    packed by the lowering (also when m < n: never computed transposed), packs nothing of them
    per call, and matches PyTorch with the bias + GELU epilogue."""
    from taskmap.graph import UnaryAttrs as UA
    from taskmap.templates.matmul_cpu_kernel import pack_b_panels

    b = GraphBuilder()
    x = b.input((m, k), f32)
    w, bias = rand(n, k) / 8, rand(n)
    y = b.op(OpKind.LINEAR, [x, b.constant(w), b.constant(bias)])
    y = b.op(OpKind.UNARY, [y], UA(UnaryFn.GELU))
    graph = b.build([y])
    groups = lower_graph(optimize(graph), host_cpu_target())
    assert len(groups) == 1
    kg = groups[0]
    params = [p.name for p in kg.kernel.func.params]
    if kg.kernel.__name__.startswith("matmul_cpu") and m > 8 and n > 8:      # the blocked kernel
        # constant weights are never swapped to c^T = w x^T: packed once as b, c's rows stored whole
        assert "wa" not in params or getattr(kg.args[params.index("wa")], "data", None) is None
        packed = kg.args[params.index("wb")]
        assert packed.data is not None and packed.data.ndim == 1
        fits = [nr for nr in (16, 32, 48, 64) if pack_b_panels(w[None], nr, True).size == packed.data.size]
        assert any(np.array_equal(pack_b_panels(w[None], v, True), packed.data) for v in fits)
    cg = CompiledGraph(graph, "cpu", "numpy")
    xv = rand(m, k)
    for _ in range(2):
        (out,) = cg(xv)
        ref = F.gelu(torch.from_numpy(xv).double() @ torch.from_numpy(w).double().T + torch.from_numpy(bias).double())
        assert_close(out, ref.numpy(), rtol=1e-4, atol=1e-5)
