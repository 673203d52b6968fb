"""bfloat16 models: their constants (``ml_dtypes``' bfloat16 arrays over the weights' bits), the
graph passes on them (folding in float32 with one rounding, batch norms folded across the cast of
a widened product), the CPU's float32 products and reductions, and whole models against eager
bfloat16 — on the CPU, in GPU emulation, saved and loaded, and under ``torch.compile``."""
import copy
import importlib
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import taskmap
from taskmap.errors import UnsupportedError
from taskmap.frontend.torch.registry import to_numpy, to_torch
from taskmap.graph import CastAttrs, GraphBuilder, NormAttrs, OpKind, UnaryAttrs, UnaryFn
from taskmap.graph.passes import fold_constants, optimize, widen_half
from taskmap.ir.dtypes import bf16, f32
from taskmap.backends.base import host_cpu_target
from taskmap.ops import emulate_gpu
from taskmap.templates.matmul_cpu_bf16 import supported as bf16_dots

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.models.cnn_defs import randomize_bn  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 constants need the ml_dtypes package")
transformers = pytest.importorskip("transformers")

# bfloat16 against the float32 model: ||got - want|| / ||want||.  bf16 keeps 8 bits (2e-3 per
# rounding); a small model's accumulated roundings stay under 2e-2.
BF16_REL_L2 = 2e-2
widen_half_module = importlib.import_module("taskmap.graph.passes.widen_half")


def _rel_l2(got, want):
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


def _main(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out


def _steps(fast):
    (entry,) = fast.entries.values()
    return entry.compiled.steps


def _check_model(model, *inputs, device=None):
    """Compile ``model`` in bfloat16, run it, and hold its error against the float32 model to
    that of eager bfloat16 (with room) and :data:`BF16_REL_L2`; every step a compiled kernel."""
    half = copy.deepcopy(model).to(torch.bfloat16)
    hin = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if device:
            with emulate_gpu(device):
                fast = taskmap.compile(half, hin, progress=False)
                got = _main(fast(*hin))
        else:
            fast = taskmap.compile(half, hin, progress=False)
            got = _main(fast(*hin))
    with torch.no_grad():
        want = _main(model(*inputs))
        eager = _main(half(*hin))
    assert got.dtype == torch.bfloat16 and bool(torch.isfinite(got).all())
    assert _rel_l2(got, want) < max(BF16_REL_L2, 2 * _rel_l2(eager, want)), (_rel_l2(got, want), _rel_l2(eager, want))
    assert all(st.kernel is not None for st in _steps(fast)), [st.name for st in _steps(fast) if st.kernel is None]
    return fast, got


class ConvNet(torch.nn.Module):
    """Conv + BN + ReLU, a residual 1x1 block, max and average pooling, a classifier."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = torch.nn.BatchNorm2d(16)
        self.c2 = torch.nn.Conv2d(16, 16, 1)
        self.b2 = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        y = F.relu(y + self.b2(self.c2(y)))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1)).softmax(-1)


def _bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100, attn_implementation="sdpa")
    return transformers.BertModel(config).eval()


def test_bfloat16_constants_are_the_weights_bits():
    w = torch.randn(5, 7).to(torch.bfloat16)
    data = to_numpy(w)
    assert data.dtype.name == "bfloat16" and data.shape == (5, 7)
    np.testing.assert_array_equal(data.view(np.uint16), w.view(torch.int16).numpy().view(np.uint16))
    b = GraphBuilder("cpu")
    back = to_torch(b.constant(data, "w"))
    assert back.dtype == torch.bfloat16 and torch.equal(back, w)


def test_without_ml_dtypes_a_bfloat16_model_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)         # import ml_dtypes fails
    with pytest.raises(UnsupportedError, match=r"Linear: constant weight: .*bfloat16.*ml_dtypes"):
        taskmap.compile(torch.nn.Linear(4, 3).bfloat16().eval(), torch.randn(2, 4, dtype=torch.bfloat16),
                        progress=False)


def test_folding_computes_in_float32_and_rounds_each_result_as_pytorch_does():
    """``(w * 3 + 1).exp()`` of a bf16 constant, and an f32 constant cast to bf16: folded to the
    bits eager bfloat16 gives (each op computed in f32, its result rounded)."""
    rng = np.random.default_rng(0)
    w32 = rng.standard_normal((6, 5)).astype(np.float32)
    w = torch.from_numpy(w32).to(torch.bfloat16)
    b = GraphBuilder("cpu")
    x = b.input((6, 5), bf16, "x")
    c = b.constant(to_numpy(w), "w")
    y = b.op(OpKind.UNARY, [b.op(OpKind.BINARY, [b.op(OpKind.BINARY, [c], _scaled("mul", 3.0))], _scaled("add", 1.0))],
             UnaryAttrs(UnaryFn.EXP))
    z = b.op(OpKind.CAST, [b.constant(w32, "w32")], CastAttrs(bf16))
    g = fold_constants(b.build([b.op(OpKind.BINARY, [x, y], _scaled("add")),
                                b.op(OpKind.BINARY, [x, z], _scaled("add"))]))
    consts = [t for op in g.ops for t in op.inputs if t.is_constant]
    assert len(consts) == 2 and all(t.dtype is bf16 and t.data.dtype.name == "bfloat16" for t in consts)
    want_y, want_z = ((w * 3 + 1).exp(), torch.from_numpy(w32).to(torch.bfloat16))
    assert torch.equal(to_torch(consts[0]), want_y) and torch.equal(to_torch(consts[1]), want_z)


def _scaled(fn, scalar=None):
    from taskmap.graph import BinaryAttrs, BinaryFn
    return BinaryAttrs(BinaryFn[fn.upper()], scalar=scalar)


def test_widening_shares_one_cast_per_tensor_and_takes_the_reductions(monkeypatch):
    """On a CPU without AVX-512 BF16 a bf16 tensor read by two linears and a layer norm is widened
    once; the layer norm (a float32 template) is widened too; the weights fold to float32 — a
    large one too."""
    monkeypatch.setattr(widen_half_module, "bf16_dots", lambda target: False)
    b = GraphBuilder("cpu")
    x = b.input((4, 3072), bf16, "x")
    rng = np.random.default_rng(1)
    w1 = b.constant(rng.standard_normal((768, 3072)).astype(ml_dtypes.bfloat16), "w1")   # 4.5 MiB as bf16
    w2 = b.constant(rng.standard_normal((8, 3072)).astype(ml_dtypes.bfloat16), "w2")
    gamma = b.constant(np.ones(3072, ml_dtypes.bfloat16), "g")
    outs = [b.op(OpKind.LINEAR, [x, w1]), b.op(OpKind.LINEAR, [x, w2]),
            b.op(OpKind.LAYER_NORM, [x, gamma], NormAttrs(1e-5, (3072,), has_weight=True, has_bias=False))]
    g = b.build(outs)
    wide = widen_half(g)
    casts_of_x = [op for op in wide.ops if op.kind is OpKind.CAST and op.inputs[0] is x]
    assert len(casts_of_x) == 1
    for op in wide.ops:
        if op.kind is not OpKind.CAST:
            assert all(t.dtype is f32 for t in (*op.inputs, *op.outputs)), op
    opt = optimize(g)
    for op in opt.ops:
        if op.kind in (OpKind.LINEAR, OpKind.LAYER_NORM):
            assert all(t.dtype is f32 for t in op.inputs[1:]) and all(t.is_constant for t in op.inputs[1:])
    assert [t.dtype for t in opt.outputs] == [bf16] * 3


def _kernel_names(fast):
    return [st.kernel.func.name for st in _steps(fast)]


needs_bf16_dots = pytest.mark.skipif(not bf16_dots(host_cpu_target()),
                                     reason="this CPU has no AVX-512 BF16: bf16 products are widened to f32")


@needs_bf16_dots
def test_bf16_linears_run_on_the_cpus_dot_products():
    """Where the CPU has AVX-512 BF16, a bf16 BERT's linears stay bf16 and run matmul_cpu_bf16
    (their epilogues — bias, GELU, the residual adds — in its stores); the rest is widened."""
    fast, _ = _check_model(_bert(), torch.randint(0, 100, (2, 16)))
    names = _kernel_names(fast)
    assert names.count("matmul_cpu_bf16") == 13 and "matmul_cpu" not in names, names   # 6 a layer + the pooler
    g = next(iter(fast.entries.values())).compiled.graph
    assert all(t.dtype is bf16 for op in g.ops if op.kind is OpKind.LINEAR for t in op.inputs)


@needs_bf16_dots
def test_gpt2s_k_by_n_weights_and_a_prologue_on_the_dot_products():
    """GPT-2's Conv1D layers (a matmul by a constant K x N matrix: packed transposed), a linear
    whose input a prologue computes (a kernel before it: the template reads its input in place)
    and one without a bias."""
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=100,
                                                           n_positions=32, use_cache=False)).eval()
    fast, _ = _check_model(model, torch.randint(0, 100, (2, 16)))
    assert _kernel_names(fast).count("matmul_cpu_bf16") == 4

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(48, 40)
            self.head = torch.nn.Linear(40, 33, bias=False)

        def forward(self, x):
            return self.head(F.gelu(self.lin(torch.tanh(x) * 2.0)))

    fast, _ = _check_model(Scaled().eval(), torch.randn(5, 7, 48))
    names = _kernel_names(fast)
    assert names[1:] == ["matmul_cpu_bf16"] * 2 and len(names) == 3, names


def test_batch_norm_folds_into_a_widened_convolution(monkeypatch):
    """conv (bf16) -> BN -> ReLU on a CPU without AVX-512 BF16: the BN folds into the float32
    convolution across the cast back to bf16, and the convolution, the cast and the ReLU are one
    kernel (the input's cast, which the direct convolution cannot read through, is a kernel
    before it)."""
    monkeypatch.setattr(widen_half_module, "bf16_dots", lambda target: False)
    model = randomize_bn(torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                                            torch.nn.ReLU()))
    fast, _ = _check_model(model, torch.randn(2, 3, 12, 12))
    g = next(iter(fast.entries.values())).compiled.graph
    assert OpKind.BATCH_NORM not in [op.kind for op in g.ops]
    (conv,) = [op for op in g.ops if op.kind is OpKind.CONV2D]
    assert conv.output.dtype is f32 and all(t.dtype is f32 and t.is_constant for t in conv.inputs[1:])
    names = [st.name for st in _steps(fast)]
    assert len(names) == 2 and names[1].startswith("conv2d") and "narrow" in names[1] and "unary" in names[1], names


def test_the_cast_a_direct_convolution_reads_through_ends_the_kernel_before_it(monkeypatch):
    """conv -> BN -> ReLU -> conv -> BN -> ReLU in bf16 widened to float32 (no AVX-512 BF16): the
    second (direct) convolution reads its float32 input in place, so the cast widening it is the
    first convolution's last epilogue op: three kernels (the input's cast, then one per
    convolution), not four."""
    monkeypatch.setattr(widen_half_module, "bf16_dots", lambda target: False)
    model = randomize_bn(torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1, stride=2), torch.nn.BatchNorm2d(32), torch.nn.ReLU()))
    fast, _ = _check_model(model, torch.randn(2, 16, 20, 20))
    names = [st.name for st in _steps(fast)]
    assert len(names) == 3 and names[1].endswith("widen") and "conv2d" in names[1], names


@needs_bf16_dots
def test_bf16_pointwise_convolutions_run_on_the_dot_products():
    """Where the CPU has AVX-512 BF16, bf16 1x1 convolutions (any stride) are implicit GEMMs of
    matmul_cpu_bf16 — the BN folded into bf16 weights, the input's panels packed per call, bias +
    ReLU in the stores: one kernel each; larger windows stay float32 (Winograd's and the direct
    kernels were faster than the bf16 implicit GEMM with its img2col: ResNet-50 at batch 8 167 ->
    228 ms with them on it, 133 with only the 1x1 layers)."""
    model = randomize_bn(torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 24, 1, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(24, 8, 3, padding=1)))
    fast, _ = _check_model(model, torch.randn(2, 16, 13, 13))
    names = _kernel_names(fast)
    # the second's epilogue ends with the cast the widened 3x3 convolution reads
    assert names == ["matmul_cpu_bf16_gemm"] * 2 + ["conv_cpu"], names
    g = next(iter(fast.entries.values())).compiled.graph
    assert OpKind.BATCH_NORM not in [op.kind for op in g.ops]
    convs = [op for op in g.ops if op.kind is OpKind.CONV2D]
    assert [op.output.dtype for op in convs] == [bf16, bf16, f32]
    assert all(t.dtype is bf16 and t.is_constant for op in convs[:2] for t in op.inputs[1:])


@pytest.mark.parametrize("batch", [1, 3])
def test_conv_net_in_bfloat16_on_the_cpu(batch):
    torch.manual_seed(batch)
    _check_model(randomize_bn(ConvNet()), torch.randn(batch, 3, 16, 16))


def test_bert_in_bfloat16_on_the_cpu():
    _check_model(_bert(), torch.randint(0, 100, (2, 16)))


def test_gpt2_in_bfloat16_on_the_cpu():
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
                                                           n_positions=32, use_cache=False)).eval()
    _check_model(model, torch.randint(0, 100, (2, 16)))


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_bfloat16_anchors_on_a_gpu_take_their_constants_as_they_are(arch):
    """On a CUDA device (GPU emulation) bf16 anchors run the tensor-core templates on the bf16
    constants themselves — linear + bias + GELU and conv + BN + ReLU one kernel each, the BN folded
    into bf16 weights (computed in float64, rounded once); on sm_90a the linear on wgmma.  Each
    kernel builds for the GPU (NVRTC)."""
    from taskmap.graph import Conv2dAttrs
    from taskmap.runtime.graph import CompiledGraph

    rng = np.random.default_rng(0)
    h = lambda *shape: rng.standard_normal(shape).astype(ml_dtypes.bfloat16)  # noqa: E731
    w, bias, cw = h(128, 96), h(128), h(16, 8, 3, 3)
    mean, var = h(16), np.abs(h(16)) + ml_dtypes.bfloat16(0.5)
    b = GraphBuilder(device="cuda:0")
    x, img = b.input((64, 96), bf16), b.input((2, 8, 10, 10), bf16)
    y = b.op(OpKind.UNARY, [b.op(OpKind.LINEAR, [x, b.constant(w), b.constant(bias)])], UnaryAttrs(UnaryFn.GELU))
    conv = b.op(OpKind.CONV2D, [img, b.constant(cw)], Conv2dAttrs((1, 1), (1, 1), (1, 1), 1))
    bn = b.op(OpKind.BATCH_NORM, [conv, b.constant(mean), b.constant(var)], NormAttrs(1e-5, has_weight=False,
                                                                                        has_bias=False))
    z = b.op(OpKind.UNARY, [bn], UnaryAttrs(UnaryFn.RELU))
    xa, ia = torch.randn(64, 96).to(torch.bfloat16), torch.randn(2, 8, 10, 10).to(torch.bfloat16)
    with emulate_gpu(arch):
        cg = CompiledGraph(b.build([y, z]), "cpu", "torch")
        gy, gz = cg(xa, ia)
    linear = "matmul_wgmma" if arch == "sm_90a" else "matmul_tc"
    assert [st.kernel.func.name for st in cg.steps] == [linear, "matmul_tc"]
    for st in cg.steps:
        assert st.kernel.build("cuda", arch=arch).binary
    assert all(t.dtype is bf16 for op in cg.graph.ops for t in op.inputs if t.is_constant)
    f = lambda a: torch.from_numpy(np.asarray(a, np.float32))  # noqa: E731
    s = 1 / torch.sqrt(f(var) + 1e-5)
    want_z = F.relu((F.conv2d(ia.float(), f(cw), padding=1) - f(mean)[:, None, None])
                    * s[:, None, None])
    for got, want in ((gy, F.gelu(F.linear(xa.float(), f(w), f(bias)))), (gz, want_z)):
        assert got.dtype == torch.bfloat16
        err = (got.float() - want).abs().max() / want.abs().max()
        assert err < 8e-3, err     # outputs rounded to bf16 (2^-9 relative), the folded weights too (seen: 3-4e-3)


def test_a_bfloat16_model_saves_and_loads(tmp_path):
    model = randomize_bn(ConvNet()).to(torch.bfloat16)
    x = torch.randn(2, 3, 16, 16).to(torch.bfloat16)
    fast = taskmap.compile(model, progress=False)
    got = fast(x)
    fast.save(tmp_path / "net.taskmap")
    again = taskmap.load(tmp_path / "net.taskmap")
    assert torch.equal(again(x), got)


def test_a_bfloat16_model_under_torch_compile():
    torch._dynamo.reset()
    model = _bert().to(torch.bfloat16)
    ids = torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state
        got = torch.compile(model, backend="taskmap")(input_ids=ids).last_hidden_state
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)


# ----------------------------------------------------------------------------- torch.autocast


class _Mixed(torch.nn.Module):
    """A linear under autocast, then float32 work; a convolution; a matmul method."""

    def __init__(self, inner: bool):
        super().__init__()
        self.inner = inner
        self.lin = torch.nn.Linear(32, 48)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.w = torch.nn.Parameter(torch.randn(48, 16))

    def forward(self, x, img):
        if self.inner:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = F.gelu(self.lin(x))
            return h.float().softmax(-1).matmul(self.w), self.conv(img)
        return F.gelu(self.lin(x)).matmul(self.w), self.conv(img)


def _eager_and_compiled(model, compile_fn, *xs, outer: bool):
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if outer else torch.autocast("cpu", enabled=False)
    with torch.no_grad(), ctx, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = model(*xs)
        got = compile_fn(model)(*xs)
    return want, got


@pytest.mark.parametrize("how", ["taskmap.compile", "torch.compile"])
def test_autocast_around_the_call(how):
    """Called inside ``torch.autocast("cpu", bfloat16)``: the products run in bf16 as eager's
    dispatcher runs them (outputs bf16, the same values), the rest as it is; outside it, the
    same compiled model computes in float32 (graphs keyed by the autocast state)."""
    torch.manual_seed(0)
    model = _Mixed(inner=False).eval()
    xs = (torch.randn(4, 32), torch.randn(2, 3, 8, 8))
    torch._dynamo.reset()
    fast = taskmap.compile(model, progress=False) if how == "taskmap.compile" else \
        torch.compile(model, backend="taskmap")
    want, got = _eager_and_compiled(model, lambda m: fast, *xs, outer=True)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), w.float(), rtol=2 ** -7, atol=2 ** -7)
    with torch.no_grad():
        plain = fast(*xs)
        ref = model(*xs)
    for g, w in zip(plain, ref):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    if how == "taskmap.compile":
        assert len(fast.entries) == 2
        if bf16_dots(host_cpu_target()):        # the autocast graph's linear on the dot products
            names = [[st.kernel.func.name for st in e.compiled.steps if st.kernel] for e in fast.entries.values()]
            assert sorted("matmul_cpu_bf16" in n for n in names) == [False, True], names


def test_an_autocast_region_inside_the_forward():
    """``with torch.autocast(...)`` inside compiled code (dynamo's enter / exit calls): the linear
    inside runs in bf16, the float32 work after it in float32."""
    torch.manual_seed(0)
    model = _Mixed(inner=True).eval()
    xs = (torch.randn(4, 32), torch.randn(2, 3, 8, 8))
    torch._dynamo.reset()
    want, got = _eager_and_compiled(model, lambda m: torch.compile(m, backend="taskmap"), *xs, outer=False)
    assert [g.dtype for g in got] == [w.dtype for w in want] == [torch.float32, torch.float32]
    torch.testing.assert_close(got[0], want[0], rtol=2 ** -7, atol=1e-3)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)
