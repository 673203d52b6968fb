"""Lowering fusion groups to ONE kernel each (taskmap.graph.lower) and running them in a
CompiledGraph: numerics against PyTorch, kernel counts, and the fallback to separate kernels."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskmap
from taskmap.backends.base import host_cpu_target
from taskmap.errors import FusionError
from taskmap.graph import (
    BinaryAttrs,
    BinaryFn,
    Conv2dAttrs,
    GraphBuilder,
    NormAttrs,
    OpKind,
    PermuteAttrs,
    ShapeAttrs,
    UnaryAttrs,
    UnaryFn,
)
from taskmap.graph import lower as lower_mod
from taskmap.graph.lower import lower_graph, summary
from taskmap.graph.passes import optimize
from taskmap.ir.dtypes import f32
from taskmap.runtime.graph import CompiledGraph

RNG = np.random.default_rng(2)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def t(a):
    return torch.from_numpy(np.array(a))


def compiled(graph):
    return CompiledGraph(graph, "cpu", "numpy")


@pytest.mark.parametrize("shape,groups,stride", [((2, 4, 9, 9), 1, 1), ((2, 4, 8, 8), 2, 2)])
def test_conv_bn_relu_is_one_kernel(shape, groups, stride):
    cin = shape[1]
    b = GraphBuilder()
    x = b.input(shape, f32)
    wt = b.constant(rand(8, cin // groups, 3, 3))
    y = b.op(OpKind.CONV2D, [x, wt], Conv2dAttrs((stride, stride), (1, 1), (1, 1), groups))
    mean, var = b.constant(rand(8) * 0.1), b.constant(RNG.random(8).astype(np.float32) + 0.5)
    gamma, beta = b.constant(RNG.random(8).astype(np.float32) + 0.5), b.constant(rand(8))
    y = b.op(OpKind.BATCH_NORM, [y, mean, var, gamma, beta], NormAttrs(1e-5))
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    cg = compiled(b.build([y]))
    assert len(cg.steps) == 1 and cg.steps[0].kernel is not None
    xa = rand(*shape)
    ref = F.relu(F.batch_norm(F.conv2d(t(xa), t(wt.data), stride=stride, padding=1, groups=groups),
                              t(mean.data), t(var.data), t(gamma.data), t(beta.data), eps=1e-5))
    np.testing.assert_allclose(cg(xa)[0], ref.numpy(), rtol=1e-4, atol=1e-4)


def test_pointwise_conv_bias_residual_relu_is_one_kernel():
    b = GraphBuilder()
    x = b.input((1, 8, 5, 5), f32)
    r = b.input((1, 6, 5, 5), f32)
    wt, bias = b.constant(rand(6, 8, 1, 1)), b.constant(rand(6))
    y = b.op(OpKind.CONV2D, [x, wt, bias], Conv2dAttrs())
    y = b.op(OpKind.BINARY, [y, r], BinaryAttrs(BinaryFn.ADD))
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    cg = compiled(b.build([y]))
    assert len(cg.steps) == 1
    xa, ra = rand(1, 8, 5, 5), rand(1, 6, 5, 5)
    ref = F.relu(F.conv2d(t(xa), t(wt.data), t(bias.data)) + t(ra))
    np.testing.assert_allclose(cg(xa, ra)[0], ref.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [3, 40])       # 3 < n: the swapped (c^T = w x^T) problem
def test_linear_bias_gelu_is_one_kernel(m):
    b = GraphBuilder()
    x = b.input((2, m, 16), f32)
    w, bias = b.constant(rand(24, 16)), b.constant(rand(24))
    y = b.op(OpKind.LINEAR, [x, w, bias])
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.GELU))
    cg = compiled(b.build([y]))
    assert len(cg.steps) == 1
    xa = rand(2, m, 16)
    ref = F.gelu(F.linear(t(xa), t(w.data), t(bias.data)))
    np.testing.assert_allclose(cg(xa)[0], ref.numpy(), rtol=1e-4, atol=1e-4)


def test_gelu_tanh_diamond_is_an_epilogue_of_its_matmul():
    """GPT-2's MLP: matmul + bias, then ``0.5 x (1 + tanh(c (x + 0.044715 x^3)))`` — x read by
    three ops (a diamond, not a chain) — in one kernel; ``x^3`` as products (no ``powf`` call,
    which kept the epilogue from vectorizing)."""
    b = GraphBuilder()
    x = b.input((5, 16), f32)
    w, bias = b.constant(rand(16, 24)), b.constant(rand(24))

    def binary(fn, u, v):
        if isinstance(v, float):        # a Python scalar, as the PyTorch frontend passes it
            return b.op(OpKind.BINARY, [u], BinaryAttrs(fn, scalar=v))
        return b.op(OpKind.BINARY, [u, v], BinaryAttrs(fn))
    y = binary(BinaryFn.ADD, b.op(OpKind.MATMUL, [x, w]), bias)
    inner = binary(BinaryFn.ADD, y, binary(BinaryFn.MUL, binary(BinaryFn.POW, y, 3.0), 0.044715))
    th = b.op(OpKind.UNARY, [binary(BinaryFn.MUL, inner, 0.7978845608)], UnaryAttrs(UnaryFn.TANH))
    out = binary(BinaryFn.MUL, binary(BinaryFn.MUL, y, 0.5), binary(BinaryFn.ADD, th, 1.0))
    cg = compiled(b.build([out]))
    assert len(cg.steps) == 1
    assert "powf" not in cg.steps[0].kernel.render(cg.target)
    xa = rand(5, 16)
    ref = F.gelu(t(xa) @ t(w.data) + t(bias.data), approximate="tanh")
    np.testing.assert_allclose(cg(xa)[0], ref.numpy(), rtol=1e-4, atol=1e-5)


def test_linear_heads_split_epilogue_reshape_permute():
    """BERT's q/k/v projections: linear -> view(b, s, h, d) -> permute(0, 2, 1, 3) in one kernel."""
    b = GraphBuilder()
    x = b.input((2, 6, 16), f32)
    w, bias = b.constant(rand(16, 16)), b.constant(rand(16))
    y = b.op(OpKind.LINEAR, [x, w, bias])
    y = b.op(OpKind.RESHAPE, [y], ShapeAttrs((2, 6, 4, 4)))
    y = b.op(OpKind.PERMUTE, [y], PermuteAttrs((0, 2, 1, 3)))
    cg = compiled(b.build([y]))
    assert len(cg.steps) == 1
    xa = rand(2, 6, 16)
    ref = F.linear(t(xa), t(w.data), t(bias.data)).view(2, 6, 4, 4).permute(0, 2, 1, 3)
    np.testing.assert_allclose(cg(xa)[0], ref.numpy(), rtol=1e-4, atol=1e-4)


def test_transpose_prologue_into_matmul_and_residual_epilogue():
    """Attention's output: permute + reshape folded into the projection's loads."""
    b = GraphBuilder()
    x = b.input((2, 4, 6, 8), f32)        # (batch, heads, seq, dim)
    res = b.input((2, 6, 32), f32)
    w = b.constant(rand(32, 32))
    y = b.op(OpKind.PERMUTE, [x], PermuteAttrs((0, 2, 1, 3)))
    y = b.op(OpKind.RESHAPE, [y], ShapeAttrs((2, 6, 32)))
    y = b.op(OpKind.LINEAR, [y, w])
    y = b.op(OpKind.BINARY, [y, res], BinaryAttrs(BinaryFn.ADD))
    cg = compiled(b.build([y]))
    assert len(cg.steps) == 1
    xa, ra = rand(2, 4, 6, 8), rand(2, 6, 32)
    ref = F.linear(t(xa).permute(0, 2, 1, 3).reshape(2, 6, 32), t(w.data)) + t(ra)
    np.testing.assert_allclose(cg(xa, ra)[0], ref.numpy(), rtol=1e-4, atol=1e-4)


def test_batched_matmul_with_transposed_operand_prologue():
    b = GraphBuilder()
    q = b.input((3, 5, 8), f32)
    k = b.input((3, 7, 8), f32)
    kt = b.op(OpKind.PERMUTE, [k], PermuteAttrs((0, 2, 1)))
    s = b.op(OpKind.MATMUL, [q, kt])
    s = b.op(OpKind.BINARY, [s], BinaryAttrs(BinaryFn.MUL, 0.25))
    cg = compiled(b.build([s]))
    assert len(cg.steps) == 1
    qa, ka = rand(3, 5, 8), rand(3, 7, 8)
    np.testing.assert_allclose(cg(qa, ka)[0], qa @ ka.transpose(0, 2, 1) * 0.25, rtol=1e-4, atol=1e-4)


def test_refused_fusion_falls_back_to_separate_kernels(monkeypatch):
    real = lower_mod.plan_anchor

    def refuse(anchor, prologues, epilogue, target):
        if prologues or epilogue:
            raise FusionError("refused for the test")
        return real(anchor, prologues, epilogue, target)
    monkeypatch.setattr(lower_mod, "plan_anchor", refuse)
    b = GraphBuilder()
    x = b.input((8, 4), f32)
    xt = b.op(OpKind.PERMUTE, [x], PermuteAttrs((1, 0)))
    y = b.op(OpKind.MATMUL, [xt, b.constant(rand(8, 5))])
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.TANH))
    g = b.build([y])
    groups = lower_graph(optimize(g), host_cpu_target())
    assert len(groups) == 3 and all(kg.kernel is not None for kg in groups)
    assert summary(groups)["fallbacks"] and all(kg.fallback == "refused for the test" for kg in groups)
    cg = compiled(g)
    assert len(cg.steps) == 3
    xa = rand(8, 4)
    w = g.ops[1].inputs[1].data
    np.testing.assert_allclose(cg(xa)[0], np.tanh(xa.T @ w), rtol=1e-4, atol=1e-4)


def test_unsupported_anchor_shape_runs_its_operator():
    b = GraphBuilder()
    x = b.input((2, 1, 4, 8), f32)
    y = b.op(OpKind.MATMUL, [x, b.input((3, 8, 5), f32)])      # broadcast batch: taskmap.ops.matmul
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    cg = compiled(b.build([y]))
    assert len(cg.steps) == 2 and cg.steps[0].kernel is None
    xa, wa = rand(2, 1, 4, 8), rand(3, 8, 5)
    np.testing.assert_allclose(cg(xa, wa)[0], np.maximum(xa @ wa, 0), rtol=1e-4, atol=1e-4)


def test_repeated_calls_reuse_prepared_launches_and_fresh_outputs():
    b = GraphBuilder()
    x = b.input((4, 8), f32)
    y = b.op(OpKind.LINEAR, [x, b.constant(rand(8, 8))])
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    z = b.op(OpKind.LINEAR, [y, b.constant(rand(8, 8))])
    cg = compiled(b.build([z]))
    outs = [cg(a)[0] for a in (rand(4, 8), rand(4, 8))]
    a = rand(4, 8)
    first, second = cg(a)[0], cg(a)[0]
    assert first is not second and not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, second)
    assert not np.allclose(outs[0], outs[1])


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + y)
        return F.gelu(self.fc(y.mean((2, 3))))


def test_compiled_torch_model_runs_fused_kernels():
    torch.manual_seed(0)
    model = ConvBlock().eval()
    for bn in (model.bn1, model.bn2):
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 8, 8)
    fast = taskmap.compile(model)
    out = fast(x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    (entry,) = fast.entries.values() if isinstance(fast.entries, dict) else fast.entries
    steps = entry.compiled.steps
    # conv-bn-relu, conv-bn-add-relu, mean (rule-based), linear-bias-gelu
    assert len(steps) == 4 and all(s.kernel is not None for s in steps)


def test_fusion_can_be_turned_off():
    b = GraphBuilder()
    x = b.input((4, 8), f32)
    w = b.constant(rand(6, 8))
    y = b.op(OpKind.LINEAR, [x, w])
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    g = b.build([y])
    cg = CompiledGraph(g, "cpu", "numpy", fuse=False)
    assert len(cg.steps) == 2 and cg.graph is g
    xa = rand(4, 8)
    np.testing.assert_allclose(cg(xa)[0], np.maximum(xa @ w.data.T, 0), rtol=1e-5, atol=1e-6)


def test_groups_debug_dump(monkeypatch, capsys):
    monkeypatch.setenv("TASKMAP_DEBUG", "groups")
    b = GraphBuilder()
    x = b.input((4, 8), f32)
    y = b.op(OpKind.MATMUL, [x, b.constant(rand(8, 8))], name="mm")
    b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU), name="act")
    lower_graph(b.build([b._ops[-1].output]), host_cpu_target())
    assert "anchored  [mm] act" in capsys.readouterr().err


def test_source_debug_dump_names_each_kernels_source(monkeypatch, capsys):
    monkeypatch.setenv("TASKMAP_DEBUG", "source")
    b = GraphBuilder()
    x = b.input((4, 8), f32)
    y = b.op(OpKind.MATMUL, [x, b.constant(rand(8, 8))], name="mm")
    z = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU), name="act")
    cg = CompiledGraph(b.build([z]), "cpu", "numpy")
    err = capsys.readouterr().err
    path = cg.steps[0].kernel.build("cpu").source_path
    assert f"// mm+act: {path}" in err and "#include" in open(path).read()


def test_reduction_anchor_with_prologue_and_epilogue_is_one_rule_based_kernel():
    from taskmap.graph import AdaptivePoolAttrs, ReduceAttrs, ReduceFn
    b = GraphBuilder()
    x = b.input((2, 8, 5, 5), f32)
    e = b.op(OpKind.UNARY, [x], UnaryAttrs(UnaryFn.EXP))
    m = b.op(OpKind.ADAPTIVE_AVG_POOL2D, [e], AdaptivePoolAttrs((1, 1)))     # keepdim: (2, 8, 1, 1)
    m = b.op(OpKind.BINARY, [m], BinaryAttrs(BinaryFn.MUL, 2.0))
    s = b.op(OpKind.REDUCE, [x], ReduceAttrs(ReduceFn.MAX, (1, 3)))
    s = b.op(OpKind.UNARY, [s], UnaryAttrs(UnaryFn.TANH))
    t = b.op(OpKind.REDUCE, [x], ReduceAttrs(ReduceFn.MEAN, (0, 1, 2, 3)))   # to a 0-d tensor
    cg = compiled(b.build([m, s, t]))
    assert [len(st.name.split("+")) for st in cg.steps] == [3, 2, 1]
    assert all(st.kernel is not None for st in cg.steps)
    xa = rand(2, 8, 5, 5)
    om, os_, ot = cg(xa)
    np.testing.assert_allclose(om, np.exp(xa).mean((2, 3), keepdims=True) * 2, rtol=1e-5)
    np.testing.assert_allclose(os_, np.tanh(xa.max((1, 3))), rtol=1e-5)
    np.testing.assert_allclose(ot, xa.mean(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 3])
def test_row_statistics_of_a_single_row_are_one_kernel(rows):
    """RMSNorm's statistics at a decode step (one token: the output all ones but the reduced
    axis): ``rsqrt(mean(x * x) + eps)`` is one kernel, as for several rows.  Before, the epilogue's
    read of the reduction at index 0 (the axis of extent 1 folded to a constant) was refused and
    the group split into three launches, the reduction run by its ``taskmap.ops`` runner."""
    from taskmap.graph import ReduceAttrs, ReduceFn
    b = GraphBuilder()
    x = b.input((1, rows, 64), f32)
    sq = b.op(OpKind.BINARY, [x, x], BinaryAttrs(BinaryFn.MUL))
    v = b.op(OpKind.REDUCE, [sq], ReduceAttrs(ReduceFn.MEAN, (2,), keepdim=True))
    r = b.op(OpKind.UNARY, [b.op(OpKind.BINARY, [v], BinaryAttrs(BinaryFn.ADD, 1e-6))], UnaryAttrs(UnaryFn.RSQRT))
    cg = compiled(b.build([r]))
    assert len(cg.steps) == 1 and cg.steps[0].kernel is not None, [st.name for st in cg.steps]
    xa = rand(1, rows, 64)
    np.testing.assert_allclose(cg(xa)[0], 1 / np.sqrt((xa * xa).mean(2, keepdims=True) + 1e-6), rtol=1e-5)


@pytest.mark.parametrize("m", [1, 5])
def test_reshape_only_prologue_reads_its_source(m):
    """A prologue of reshapes (flatten before a classifier) is no computation: the kernel reads
    the reshape's input as its operand (so the schedule is free to read it in place: the small-M
    kernels), and the group still computes flatten + linear + bias."""
    b = GraphBuilder()
    x = b.input((m, 48, 1, 1), f32)
    flat = b.op(OpKind.RESHAPE, [x], ShapeAttrs((m, 48)))
    w, bias = rand(40, 48), rand(40)
    y = b.op(OpKind.LINEAR, [flat, b.constant(w), b.constant(bias)])
    graph = b.build([y])
    (kg,) = lower_graph(optimize(graph), host_cpu_target())
    assert [op.kind for op in kg.ops] == [OpKind.RESHAPE, OpKind.LINEAR]
    assert graph.inputs[0] in kg.args                 # the 4-D input itself, viewed as (m, 48)
    assert not any(p.name.startswith("p") for p in kg.kernel.func.params)   # no prologue parameters
    xv = rand(m, 48, 1, 1)
    (out,) = compiled(graph)(xv)
    np.testing.assert_allclose(out, xv.reshape(m, 48).astype(np.float64) @ w.T + bias, rtol=1e-5, atol=1e-5)


class SqueezeExcite(nn.Module):
    """EfficientNet's squeeze-and-excitation and projection: ``proj(x * s)``, ``s`` per channel."""

    def __init__(self, c=144, r=6, co=24):
        super().__init__()
        self.reduce, self.expand, self.proj = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1), nn.Conv2d(c, co, 1)

    def forward(self, x):
        x = F.silu(x)
        s = torch.sigmoid(self.expand(F.silu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))
        return self.proj(x * s)


@pytest.mark.parametrize("n", [1, 3])
def test_pointwise_conv_takes_a_prologue_in_its_packing(n):
    """A 1x1 convolution on the implicit GEMM reads its input through B's packing: the channel
    scaling before it (x * s) is spliced there instead of running as a kernel of its own."""
    model = SqueezeExcite().eval()
    x = torch.randn(n, 144, 32, 32)
    fast = taskmap.compile(model, progress=False)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(fast(x), want, rtol=1e-4, atol=1e-5)
    steps = fast._entry(fast._bind((x,), {})).ready(False).steps
    proj = [s for s in steps if "binary" in s.name and "conv2d" in s.name]
    assert len(proj) == 1 and proj[0].kernels[0].__name__ == "matmul_cpu", [s.name for s in steps]


def test_squeeze_excitation_moves_a_projection_onto_the_gemm(monkeypatch):
    """EfficientNet's 672 -> 112 projection at 14x14: routed alone to the direct template, which
    takes no prologue (the ``x * s`` before it would be a kernel of its own); the cost model
    prices the implicit GEMM with ``x * s`` in its packing below the two, so the projection is
    re-anchored there: one kernel, matching eager."""
    torch.manual_seed(0)
    model = SqueezeExcite(672, 28, 112).eval()
    x = torch.randn(1, 672, 14, 14)
    with torch.no_grad():
        want = model(x)

    def steps():
        fast = taskmap.compile(model, progress=False)
        torch.testing.assert_close(fast(x), want, rtol=1e-4, atol=1e-5)
        return fast._entry(fast._bind((x,), {})).ready(False).steps

    proj = [s for s in steps() if s.name.startswith("binary") and "conv2d" in s.name]
    assert len(proj) == 1 and proj[0].kernels[0].__name__ == "matmul_cpu"
    from taskmap.ops.conv_route import route
    from taskmap.templates.conv_problem import ConvProblem

    p = ConvProblem(1, 672, 14, 14, 112, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
    if route(p, host_cpu_target())[0] is None:      # a host whose route is the GEMM anyway
        return
    # routed alone to the direct template: without the re-anchoring the multiply is its own kernel
    monkeypatch.setattr(lower_mod, "gemm_takes_prologue", lambda *a: False)
    plain = steps()
    assert any(s.name.startswith("binary") and "conv2d" not in s.name for s in plain), [s.name for s in plain]
    assert [s for s in plain if s.name.startswith("conv2d")][-1].kernels[0].__name__ == "conv_cpu_cvec"


def _se_graph(scale_shape=(1, 48, 1, 1), constant=False, reused=False, kernel=1):
    """``conv(x * s)``: ``s`` per channel (computed, or a constant), the product read once (or
    returned too)."""
    b = GraphBuilder()
    x = b.input((1, 48, 14, 14), f32)
    s = b.constant(rand(*scale_shape)) if constant else b.input(scale_shape, f32)
    y = b.op(OpKind.BINARY, [x, s], BinaryAttrs(BinaryFn.MUL))
    out = b.op(OpKind.CONV2D, [y, b.constant(rand(16, 48, kernel, kernel))], Conv2dAttrs((1, 1), (kernel // 2,) * 2))
    graph = b.build([out, y] if reused else [out])
    return graph, graph.producer(out)


@pytest.mark.parametrize("case", ["se", "constant", "reused", "full", "3x3"])
def test_channel_scales_before_a_conv(case):
    """What counts as squeeze-and-excitation's scaling for the re-anchoring: a computed per-channel
    scale read by the convolution alone, a 1x1 one for the GEMM's packing to take."""
    from taskmap.graph.lower_anchor import gemm_takes_prologue

    graph, conv = _se_graph(constant=case == "constant", reused=case == "reused",
                            scale_shape=(1, 48, 14, 14) if case == "full" else (1, 48, 1, 1),
                            kernel=3 if case == "3x3" else 1)
    found = lower_mod._channel_scale(graph, conv)
    assert (found is not None) == (case in ("se", "3x3"))
    if case == "3x3":                  # no B packing to take it
        assert not gemm_takes_prologue(conv, found.output.numel, host_cpu_target())


class _PatchStem(nn.Module):
    """A patch-embedding stem: a k x k stride-k conv, then channels last (ConvNeXt's permute, or
    Swin's flatten and transpose) and a LayerNorm."""

    def __init__(self, cout, k, swin):
        super().__init__()
        self.conv, self.norm, self.swin = nn.Conv2d(3, cout, k, k), nn.LayerNorm(cout), swin

    def forward(self, x):
        y = self.conv(x)
        return self.norm(y.flatten(2).transpose(1, 2) if self.swin else y.permute(0, 2, 3, 1))


@pytest.mark.parametrize("swin", [False, True], ids=["permute", "flatten-transpose"])
@pytest.mark.parametrize("n,cout,hw", [(1, 96, 64), (2, 40, 60)])
def test_patch_stems_store_channels_last(monkeypatch, swin, n, cout, hw):
    """The channel kernel under a permute to NHWC (or Swin's equivalent) stores each pixel's
    channels together, a tile's panels in turn: matches eager, last panels and row tiles partial
    (40 channels, 15 pixels a row), a batch of two."""
    from taskmap.templates import conv_cpu

    configs = []
    config = conv_cpu.ConvCpuTemplate.config

    def recording(self, p, t, s):
        cfg = config(self, p, t, s)
        configs.append(cfg)
        return cfg
    monkeypatch.setattr(conv_cpu.ConvCpuTemplate, "config", recording)
    monkeypatch.setenv("TASKMAP_GRAPH_CACHE", "0")
    torch.manual_seed(3)
    model = _PatchStem(cout, 4, swin).eval()
    x = torch.randn(n, 3, hw, hw)
    with torch.no_grad():
        want = model(x)
    fast = taskmap.compile(model, progress=False)
    torch.testing.assert_close(fast(x), want, rtol=1e-4, atol=1e-4)
    chans = [c for c in configs if type(c).__name__ == "CvecConfig"]
    if not chans:
        pytest.skip("the cost model routed this stem to another kernel on this host")
    assert any(c.channels_last and c.by_image and not c.planes for c in chans), chans


def test_the_reanchoring_prices_a_gemm_that_packs_b():
    """``x * s`` runs in the GEMM's packing of B: the re-anchoring weighs the GEMM's schedules that
    pack B, not one that reads it in place, which the prologue would turn into a packing one
    (on a host where B in place costs nothing, one of EfficientNet-B0's 7x7 projections was
    re-anchored so, and took 0.17 ms in the flow against 0.12 for the two kernels)."""
    import dataclasses

    from taskmap.templates.conv_cpu import best_gemm
    from taskmap.templates.conv_problem import ConvProblem

    free = dataclasses.replace(host_cpu_target(), b_in_place_step=1.0, b_off_line_step=1.0)
    p = ConvProblem(1, 1152, 7, 7, 192, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
    assert not best_gemm(p, free)["pack_b"]
    assert best_gemm(p, free, packs_b=True)["pack_b"]


@pytest.mark.parametrize("relu", [False, True])
def test_reshapes_ending_an_epilogue_are_views_of_what_the_kernel_writes(relu):
    """Group norm's ``(N, C, H, W) -> (N, G, -1)`` after a convolution: the conv's kernel (with its
    element-wise epilogue, if any) writes the reshaped tensor seen in the conv's own shape — the
    same kernel as without the reshape, no index arithmetic in its stores."""
    w = rand(32, 3, 3, 3)

    def build(reshape):
        b = GraphBuilder()
        x = b.input((1, 3, 40, 40), f32)
        wt = b.constant(w)
        y = b.op(OpKind.CONV2D, [x, wt], Conv2dAttrs((1, 1), (1, 1)))
        if relu:
            y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
        if reshape:
            y = b.op(OpKind.RESHAPE, [y], ShapeAttrs((1, 8, 4 * 40 * 40)))
            y = b.op(OpKind.RESHAPE, [y], ShapeAttrs((8, 6400)))
        return compiled(b.build([y]))
    cg, plain = build(True), build(False)
    assert len(cg.steps) == 1 and cg.steps[0].kernels[0].build("cpu").source == \
        plain.steps[0].kernels[0].build("cpu").source
    xa = rand(1, 3, 40, 40)
    np.testing.assert_array_equal(cg(xa)[0], plain(xa)[0].reshape(8, 6400))
