"""Template anchors (taskmap.graph.lower_template): softmax, log_softmax, layer_norm, pooling,
depthwise conv2d and attention lowered to ONE kernel of their template with prologues and
epilogues spliced in; numerics against PyTorch, exact kernel counts, the fallback when fusion
is refused, and no ``taskmap.ops`` runner left for these kinds."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import taskmap
from taskmap.backends.base import host_cpu_target
from taskmap.errors import FusionError
from taskmap.graph import (
    AdaptivePoolAttrs,
    AttentionAttrs,
    AxisAttrs,
    BinaryAttrs,
    BinaryFn,
    Conv2dAttrs,
    GraphBuilder,
    NormAttrs,
    OpKind,
    PermuteAttrs,
    Pool2dAttrs,
    ShapeAttrs,
    SliceAttrs,
    UnaryAttrs,
    UnaryFn,
)
from taskmap.graph.lower import lower_graph, summary
from taskmap.graph.lower_template import (
    TEMPLATE_KINDS,
    Scalar,
    plan_template,
    template_fusable,
)
from taskmap.ir.dtypes import f32
from taskmap.runtime.graph import CompiledGraph

RNG = np.random.default_rng(5)
TOL = {"rtol": 1e-4, "atol": 1e-5}


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def t(a):
    return torch.from_numpy(np.array(a))


def run(graph, *inputs):
    """The compiled graph's result, its steps; every step a prepared kernel (no runner)."""
    cg = CompiledGraph(graph, "cpu", "numpy")
    assert all(s.kernel is not None and s.planned for s in cg.steps), [s.name for s in cg.steps]
    assert not [s for s in cg.steps if s.kind in TEMPLATE_KINDS and s.kernel is None]
    out = cg(*inputs)[0]
    again = cg(*inputs)[0]                     # prepared launches re-run on the same buffers
    np.testing.assert_array_equal(out, again)
    return out, cg.steps


def binary(b, fn, x, y=None, scalar=None):
    return b.op(OpKind.BINARY, [x] if y is None else [x, y], BinaryAttrs(fn, scalar))


# ----------------------------------------------------------------------------- row templates


@pytest.mark.parametrize("shape", [(4, 8, 32), (3, 50), (2, 3, 5, 17)])
def test_add_layer_norm_is_one_kernel(shape):
    n = shape[-1]
    b = GraphBuilder()
    x, r = b.input(shape, f32), b.input(shape, f32)
    w, bias = b.constant(rand(n)), b.constant(rand(n))
    y = b.op(OpKind.LAYER_NORM, [binary(b, BinaryFn.ADD, x, r), w, bias], NormAttrs(1e-5, (n,), True, True))
    xa, ra = rand(*shape), rand(*shape)
    out, steps = run(b.build([y]), xa, ra)
    assert len(steps) == 1
    ref = F.layer_norm(t(xa + ra), (n,), t(w.data), t(bias.data), 1e-5)
    np.testing.assert_allclose(out, ref.numpy(), **TOL)


def test_layer_norm_without_affine_and_with_epilogue():
    b = GraphBuilder()
    x = b.input((6, 40), f32)
    y = b.op(OpKind.LAYER_NORM, [x], NormAttrs(1e-6, (40,), False, False))
    y = binary(b, BinaryFn.MUL, y, scalar=3.0)
    xa = rand(6, 40)
    out, steps = run(b.build([y]), xa)
    assert len(steps) == 1                       # the layer norm writes its output once: the epilogue fuses
    np.testing.assert_allclose(out, 3 * F.layer_norm(t(xa), (40,), eps=1e-6).numpy(), **TOL)


def test_a_concatenation_before_a_layer_norm_is_written_apart():
    """Swin's patch merging: four strided slices of an image concatenated along the channels, then
    a LayerNorm over them.  On the CPU the concatenation is not the norm's prologue (its vector
    loop would select among the parts element by element): a kernel of its own writes it (the
    row slices two parts share recomputed inside it), and the norm reads it, matching torch."""
    b = GraphBuilder()
    x = b.input((1, 8, 8, 16), f32)
    parts = [b.op(OpKind.SLICE, [b.op(OpKind.SLICE, [x], SliceAttrs(1, i, 2, 4))], SliceAttrs(2, j, 2, 4))
             for j, i in ((0, 0), (0, 1), (1, 0), (1, 1))]
    merged = b.op(OpKind.CONCAT, parts, AxisAttrs(3))
    w, bias = b.constant(rand(64)), b.constant(rand(64))
    y = b.op(OpKind.LAYER_NORM, [merged, w, bias], NormAttrs(1e-5, (64,), True, True))
    xa = rand(1, 8, 8, 16)
    out, steps = run(b.build([y]), xa)
    names = [s.name for s in steps]
    assert len(steps) == 2 and "concat" in names[0] and names[1] == "layer_norm12", names
    xt = t(xa)
    ref = torch.cat([xt[:, 0::2, 0::2], xt[:, 1::2, 0::2], xt[:, 0::2, 1::2], xt[:, 1::2, 1::2]], -1)
    np.testing.assert_allclose(out, F.layer_norm(ref, (64,), t(w.data), t(bias.data), 1e-5).numpy(), **TOL)


@pytest.mark.parametrize("kind,axis", [(OpKind.SOFTMAX, -1), (OpKind.SOFTMAX, 1), (OpKind.LOG_SOFTMAX, -1)])
def test_scaled_softmax_is_one_kernel(kind, axis):
    b = GraphBuilder()
    x = b.input((3, 7, 20), f32)
    y = b.op(kind, [binary(b, BinaryFn.MUL, x, scalar=0.125)], AxisAttrs(axis))
    xa = rand(3, 7, 20)
    out, steps = run(b.build([y]), xa)
    assert len(steps) == 1
    fn = F.softmax if kind is OpKind.SOFTMAX else F.log_softmax
    np.testing.assert_allclose(out, fn(t(xa) * 0.125, axis).numpy(), **TOL)


def test_softmax_epilogue_falls_back_keeping_the_prologue():
    """The CPU softmax kernel stashes exp() in its output and reads it back: no epilogue."""
    b = GraphBuilder()
    x = b.input((4, 33), f32)
    y = b.op(OpKind.SOFTMAX, [binary(b, BinaryFn.MUL, x, scalar=2.0)], AxisAttrs(-1))
    z = binary(b, BinaryFn.MUL, y, scalar=10.0)
    g = b.build([z])
    groups = lower_graph(g, host_cpu_target())
    assert len(groups) == 2 and all(kg.kernel is not None for kg in groups)
    assert "reads its output" in groups[0].fallback and len(groups[0].ops) == 2
    with pytest.raises(FusionError, match="reads its output"):
        plan_template(groups[0].group.anchor, (), groups[1].ops, host_cpu_target())
    xa = rand(4, 33)
    out, steps = run(g, xa)
    assert len(steps) == 2
    np.testing.assert_allclose(out, 10 * F.softmax(t(xa) * 2, -1).numpy(), **TOL)


# ----------------------------------------------------------------------------- window templates


def test_depthwise_bn_relu6_is_one_kernel():
    b = GraphBuilder()
    x = b.input((2, 8, 11, 11), f32)
    wt = b.constant(rand(8, 1, 3, 3))
    y = b.op(OpKind.CONV2D, [x, wt], Conv2dAttrs((2, 2), (1, 1), (1, 1), 8))
    mean, var = b.constant(rand(8) * 0.1), b.constant(RNG.random(8).astype(np.float32) + 0.5)
    gamma, beta = b.constant(RNG.random(8).astype(np.float32) + 0.5), b.constant(rand(8))
    y = b.op(OpKind.BATCH_NORM, [y, mean, var, gamma, beta], NormAttrs(1e-5))
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU6))
    g = b.build([y])
    xa = rand(2, 8, 11, 11)
    out, steps = run(g, xa)
    assert len(steps) == 1
    ref = F.relu6(F.batch_norm(F.conv2d(t(xa), t(wt.data), stride=2, padding=1, groups=8), t(mean.data),
                               t(var.data), t(gamma.data), t(beta.data), eps=1e-5))
    np.testing.assert_allclose(out, ref.numpy(), **TOL)


def test_depthwise_with_bias_and_prologue():
    b = GraphBuilder()
    x = b.input((1, 6, 9, 9), f32)
    wt, bias = b.constant(rand(6, 1, 5, 5)), b.constant(rand(6))
    xr = b.op(OpKind.UNARY, [x], UnaryAttrs(UnaryFn.TANH))
    y = b.op(OpKind.CONV2D, [xr, wt, bias], Conv2dAttrs((1, 1), (2, 2), (1, 1), 6))
    xa = rand(1, 6, 9, 9)
    out, steps = run(b.build([y]), xa)
    assert len(steps) == 1
    ref = F.conv2d(torch.tanh(t(xa)), t(wt.data), t(bias.data), padding=2, groups=6)
    np.testing.assert_allclose(out, ref.numpy(), **TOL)


@pytest.mark.parametrize("kind,attrs,ref", [
    (OpKind.MAX_POOL2D, Pool2dAttrs((3, 3), (2, 2), (1, 1)), lambda x: F.max_pool2d(x, 3, 2, 1)),
    (OpKind.AVG_POOL2D, Pool2dAttrs((2, 2), (2, 2)), lambda x: F.avg_pool2d(x, 2, 2)),
    (OpKind.AVG_POOL2D, Pool2dAttrs((3, 3), (1, 1), (1, 1), count_include_pad=False),
     lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)),
    (OpKind.ADAPTIVE_MAX_POOL2D, AdaptivePoolAttrs((3, 3)), lambda x: F.adaptive_max_pool2d(x, 3)),
    (OpKind.ADAPTIVE_MAX_POOL2D, AdaptivePoolAttrs((1, 1)), lambda x: F.adaptive_max_pool2d(x, 1)),
    (OpKind.ADAPTIVE_AVG_POOL2D, AdaptivePoolAttrs((4, 3)), lambda x: F.adaptive_avg_pool2d(x, (4, 3))),
])
def test_pool_with_prologue_and_epilogue_is_one_kernel(kind, attrs, ref):
    b = GraphBuilder()
    x = b.input((2, 5, 10, 9), f32)
    y = b.op(kind, [binary(b, BinaryFn.ADD, x, scalar=1.0)], attrs)
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    xa = rand(2, 5, 10, 9)
    out, steps = run(b.build([y]), xa)
    assert len(steps) == 1
    np.testing.assert_allclose(out, F.relu(ref(t(xa) + 1)).numpy(), **TOL)


# ----------------------------------------------------------------------------- attention


def _heads(b, x, n, h, d):
    """(n, l, h*d) -> (n, h, l, d): a reshape and a permute."""
    y = b.op(OpKind.RESHAPE, [x], ShapeAttrs((n, x.shape[1], h, d)))
    return b.op(OpKind.PERMUTE, [y], PermuteAttrs((0, 2, 1, 3)))


def test_attention_with_permuted_operands_and_mask_arithmetic_is_one_kernel():
    n, L, h, d = 2, 9, 3, 8
    b = GraphBuilder()
    q, k, v = (b.input((n, L, h * d), f32) for _ in range(3))
    m = b.input((n, 1, 1, L), f32)
    mask = binary(b, BinaryFn.MUL, binary(b, BinaryFn.SUB, m, scalar=1.0), scalar=10000.0)
    y = b.op(OpKind.ATTENTION, [_heads(b, q, n, h, d), _heads(b, k, n, h, d), _heads(b, v, n, h, d), mask],
             AttentionAttrs(has_mask=True))
    y = b.op(OpKind.PERMUTE, [y], PermuteAttrs((0, 2, 1, 3)))
    g = b.build([y])
    groups = lower_graph(g, host_cpu_target())
    assert len(groups) == 1                      # head split / mask prologues, the head merge epilogue: 1 kernel
    assert len(groups[0].ops) == 10 and any(isinstance(a, Scalar) for a in groups[0].args)
    qa, ka, va = rand(n, L, h * d), rand(n, L, h * d), rand(n, L, h * d)
    ma = (RNG.random((n, 1, 1, L)) > 0.3).astype(np.float32)
    out, steps = run(g, qa, ka, va, ma)
    assert len(steps) == 1
    split = lambda a: t(a).reshape(n, L, h, d).permute(0, 2, 1, 3)
    ref = F.scaled_dot_product_attention(split(qa), split(ka), split(va), (t(ma) - 1) * 10000.0)
    np.testing.assert_allclose(out, ref.permute(0, 2, 1, 3).numpy(), rtol=1e-4, atol=1e-4)


def test_attention_reads_heads_sliced_from_a_fused_projection_as_strided_views():
    """GPT-2: q, k, v are slices of one (n, L, 3 h d) projection, each split into heads.  The
    composed prologue indices (slice, reshape, permute, the template's view) are simplified
    within the operands' ranges: one kernel whose inner functions compute no ``//`` or ``%`` per
    element (it ran 100x slower when they did)."""
    n, L, h, d = 1, 16, 4, 16
    b = GraphBuilder()
    qkv = b.input((n, L, 3 * h * d), f32)
    parts = [b.op(OpKind.SLICE, [qkv], SliceAttrs(2, j * h * d, 1, h * d)) for j in range(3)]
    y = b.op(OpKind.ATTENTION, [_heads(b, x, n, h, d) for x in parts], AttentionAttrs(is_causal=True))
    g = b.build([b.op(OpKind.PERMUTE, [y], PermuteAttrs((0, 2, 1, 3)))])
    cg = CompiledGraph(g, "cpu", "numpy")
    assert len(cg.steps) == 1
    src = cg.steps[0].kernel.render(cg.target)
    inner = src[src.index("static inline void tm_fn_"):src.index("int tm_entry_")]
    assert "tm_fdiv_i32" not in inner and "tm_fmod_i32" not in inner
    xa = rand(n, L, 3 * h * d)
    q, k, v = (t(xa)[..., j * h * d:(j + 1) * h * d].reshape(n, L, h, d).permute(0, 2, 1, 3) for j in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(0, 2, 1, 3)
    np.testing.assert_allclose(cg(xa)[0], ref.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal,scale", [(False, None), (True, 0.3)])
def test_attention_alone_is_a_prepared_kernel(causal, scale):
    b = GraphBuilder()
    q, k, v = b.input((2, 4, 7, 16), f32), b.input((2, 4, 11, 16), f32), b.input((2, 4, 11, 8), f32)
    y = b.op(OpKind.ATTENTION, [q, k, v], AttentionAttrs(is_causal=causal, scale=scale))
    qa, ka, va = rand(2, 4, 7, 16), rand(2, 4, 11, 16), rand(2, 4, 11, 8)
    out, steps = run(b.build([y]), qa, ka, va)
    assert len(steps) == 1
    ref = F.scaled_dot_product_attention(t(qa), t(ka), t(va), is_causal=causal, scale=scale)
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_attention_with_a_bool_mask_constant():
    b = GraphBuilder()
    q, k, v = (b.input((1, 2, 6, 8), f32) for _ in range(3))
    keep = np.tril(np.ones((6, 6), bool))[None, None] | (RNG.random((1, 1, 6, 6)) > 0.5)
    y = b.op(OpKind.ATTENTION, [q, k, v, b.constant(keep)], AttentionAttrs(has_mask=True))
    qa, ka, va = rand(1, 2, 6, 8), rand(1, 2, 6, 8), rand(1, 2, 6, 8)
    out, steps = run(b.build([y]), qa, ka, va)
    assert len(steps) == 1
    ref = F.scaled_dot_product_attention(t(qa), t(ka), t(va), t(keep))
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-4, atol=1e-4)


class _Rotary(torch.nn.Module):
    """Llama's rotary embedding (``x * cos + rotate_half(x) * sin``: two slices, a negation and a
    concatenation) on q and (``keys``) k, then causal attention."""

    def __init__(self, keys=True):
        super().__init__()
        self.keys = keys

    def forward(self, q, k, v, cos, sin):
        def rope(x):
            half = x.shape[-1] // 2
            return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
        return F.scaled_dot_product_attention(rope(q), rope(k) if self.keys else k, v, is_causal=True)


@pytest.mark.parametrize("L,d", [(37, 32), (8, 20)])
def test_rotary_embeddings_are_attentions_prologues(L, d):
    """One kernel.  Each row tile's q is staged once, its prologue with it (before, the rotary ran
    in the score micro-kernel for every key block: Llama's attention 4x slower), and the
    concatenation's loads are contiguous in the staging loop (no clamps, ``Simplifier.visit_Select``)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, L, d), torch.randn(2, 3, L, d), torch.randn(2, 3, L, d)
    cos, sin = torch.randn(1, 1, L, d), torch.randn(1, 1, L, d)
    fast = taskmap.compile(_Rotary(), (q, k, v, cos, sin), progress=False)
    cg = next(iter(fast.entries.values())).compiled
    assert len(cg.steps) == 1 and "attention" in cg.steps[0].name, [s.name for s in cg.steps]
    with torch.no_grad():
        torch.testing.assert_close(fast(q, k, v, cos, sin), _Rotary()(q, k, v, cos, sin), rtol=1e-4, atol=1e-5)


def test_prologues_sharing_inputs_fuse_when_one_view_is_memoised():
    """q's rotary prologue, memoised by its text when a first graph (q alone roped) was lowered,
    and k's, made fresh for the second graph, read the same cos / sin inputs as different node
    objects of the same names: one kernel still (before: 'two different definition nodes are
    named p1', and the group split — Falcon's layers in a process that had compiled others)."""
    q, k, v = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    cos, sin = torch.randn(1, 1, 9, 16), torch.randn(1, 1, 9, 16)
    args = (q, k, v, cos, sin)
    taskmap.compile(_Rotary(keys=False), args, progress=False)(*args)
    fast = taskmap.compile(_Rotary(), args, progress=False)
    cg = next(iter(fast.entries.values())).compiled
    assert len(cg.steps) == 1, [s.name for s in cg.steps]
    with torch.no_grad():
        torch.testing.assert_close(fast(*args), _Rotary()(*args), rtol=1e-4, atol=1e-5)


def test_attention_with_broadcast_key_keeps_its_runner():
    """Operands the kernel cannot read in place (a key broadcast against the value's batch) go
    through ``taskmap.ops`` (which expands them first)."""
    b = GraphBuilder()
    q, k, v = b.input((3, 5, 8), f32), b.input((1, 5, 8), f32), b.input((3, 5, 8), f32)
    y = b.op(OpKind.ATTENTION, [q, k, v], AttentionAttrs())
    g = b.build([y])
    assert not template_fusable(g.ops[0], host_cpu_target())
    assert summary(lower_graph(g, host_cpu_target()))["runners"] == 1
    qa, ka, va = rand(3, 5, 8), rand(1, 5, 8), rand(3, 5, 8)
    out = CompiledGraph(g, "cpu", "numpy")(qa, ka, va)[0]
    ref = F.scaled_dot_product_attention(t(qa), t(ka).expand(3, 5, 8), t(va))
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_non_float32_ops_keep_their_runners():
    b = GraphBuilder()
    x = b.input((4, 16), "float64")
    y = b.op(OpKind.SOFTMAX, [x], AxisAttrs(-1))
    g = b.build([y])
    assert summary(lower_graph(g, host_cpu_target()))["runners"] == 1
    xa = RNG.standard_normal((4, 16))
    out = CompiledGraph(g, "cpu", "numpy")(xa)[0]
    np.testing.assert_allclose(out, F.softmax(t(xa), -1).numpy(), rtol=1e-10)
    assert math.isclose(float(out.sum()), 4.0, rel_tol=1e-9)


class _Small(torch.nn.Module):
    """Depthwise conv + bn + relu6, max pool, layer norm, softmax and attention from PyTorch."""

    def __init__(self):
        super().__init__()
        self.dw = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x, r):
        y = F.relu6(self.bn(self.dw(x)))
        y = F.max_pool2d(y, 2).reshape(2, 4, 16)
        y = self.ln(y + r)
        a = F.scaled_dot_product_attention(y[:, None], y[:, None], y[:, None])[:, 0]
        return F.softmax(a * 0.5, dim=-1)


def test_compiled_module_runs_no_runner_for_template_kinds():
    torch.manual_seed(0)
    model = _Small().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.2, 0.2)
        model.bn.running_var.uniform_(0.5, 1.5)
    args = (torch.randn(2, 4, 8, 8), torch.randn(2, 4, 16))
    fast = taskmap.compile(model, args)
    with torch.no_grad():
        ref, out = model(*args), fast(*args)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)
    steps = [st for e in fast.entries.values() for st in e.compiled.steps]
    assert all(st.kernel is not None for st in steps), [st.name for st in steps if st.kernel is None]
    names = " ".join(st.name for st in steps)
    for kind in ("conv2d", "max_pool2d", "layer_norm", "attention", "softmax"):
        assert kind in names, names
    assert len(steps) <= 6, names
