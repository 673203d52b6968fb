"""The graph lowering for a GPU target, run in GPU emulation on the CPU (``emulate_gpu``): matmul,
linear and conv2d anchors become the GPU matmul template (SIMT for f32) with their prologues
(img2col, per-group weights) and epilogues (bias, folded BatchNorm, activations, residual adds)
spliced in — one kernel per fusion group, no operator runner — and the fused kernels build
with NVRTC for sm_90.  The real-GPU runs are in ``tests/models/test_gpu_models.py``."""
import numpy as np
import pytest
import torch

import taskmap
from taskmap.ops import emulate_gpu


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.c2, self.b2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=2, bias=False), torch.nn.BatchNorm2d(32)
        self.c3 = torch.nn.Conv2d(32, 32, 1)
        self.fc1, self.fc2 = torch.nn.Linear(32, 24), torch.nn.Linear(24, 7)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        y = y + self.c3(y)                        # 1x1 conv + residual add
        y = y.mean((2, 3))
        return self.fc2(torch.nn.functional.gelu(self.fc1(y)))


def _randomize_bn(model):
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)


def _emulated(model, *inputs):
    """``model`` compiled for sm_90 and run in GPU emulation, with eager's result."""
    with emulate_gpu("sm_90"):
        fast = taskmap.compile(model, inputs, progress=False)
        got = fast(*inputs)
    with torch.no_grad():
        want = model(*inputs)
    return fast, got, want


def _kernels(fast):
    (entry,) = fast.entries.values()
    return [(st.name, st.kernel) for st in entry.compiled.steps]


@pytest.mark.parametrize("batch", [1, 2])
def test_conv_net_fuses_into_gpu_matmul_kernels(batch):
    torch.manual_seed(batch)
    model = ConvNet().eval()
    _randomize_bn(model)
    fast, got, want = _emulated(model, torch.randn(batch, 3, 12, 10))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    steps = _kernels(fast)
    assert all(k is not None for _, k in steps), [n for n, k in steps if k is None]   # no runner
    names = [k.func.name for _, k in steps]
    # conv+BN+ReLU (x2), conv+add, mean, linear+GELU, linear: six launches, five matmul templates
    assert len(steps) == 6 and names.count("matmul_simt") == 5, list(zip([n for n, _ in steps], names))
    fused = dict(steps)
    conv_bn_relu = [n for n in fused if n.startswith("conv2d") and "unary" in n]
    assert len(conv_bn_relu) == 2
    assert any(n.startswith("linear") and "unary" in n for n in fused)       # linear + bias + GELU
    for _, k in steps:                     # what a real GPU would load: NVRTC builds every one
        assert k.build("cuda", arch="sm_90").binary


def test_batched_matmul_with_epilogue_on_gpu():
    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.tanh(a @ b.transpose(-1, -2) * 0.5)

    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 3, 17, 9, generator=g), torch.randn(2, 3, 13, 9, generator=g)
    with emulate_gpu("sm_90"):
        fast = taskmap.compile(M(), (a, b), progress=False)
        got = fast(a, b)
    want = torch.tanh(a @ b.transpose(-1, -2) * 0.5)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    # the transpose is a prologue (read in place), the scale and tanh an epilogue: one launch
    assert [k.func.name for _, k in _kernels(fast)] == ["matmul_simt"]


@pytest.mark.parametrize("wgmma", [False, "1", "tma"], ids=["mma.sync", "wgmma", "wgmma-tma"])
def test_half_anchors_are_fused_tensor_core_kernels(wgmma, monkeypatch):
    """f16 on a CUDA device (no widening to f32 there): linear + bias + GELU and conv + ReLU are ONE
    tensor-core matmul kernel each (the conv's img2col spliced into the template's tile loads, a
    one-element f16 zero bias for the conv), right in GPU emulation and built for sm_90.  On sm_90a
    with ``TASKMAP_WGMMA=1`` the linear runs the wgmma template (its N x K weight is K-major), with
    ``=tma`` its TMA form; the conv, whose B is K x N, stays on mma.sync."""
    import torch.nn.functional as F

    from taskmap.graph import Conv2dAttrs, GraphBuilder, OpKind, UnaryAttrs, UnaryFn
    from taskmap.ir.dtypes import f16
    from taskmap.runtime.graph import CompiledGraph

    rng = np.random.default_rng(0)
    h = lambda *shape: rng.standard_normal(shape).astype(np.float16)  # noqa: E731
    w, bias, cw = h(128, 96), h(128), h(16, 8, 3, 3)
    b = GraphBuilder(device="cuda:0")
    x, img = b.input((64, 96), f16), b.input((2, 8, 10, 10), f16)
    y = b.op(OpKind.UNARY, [b.op(OpKind.LINEAR, [x, b.constant(w), b.constant(bias)])], UnaryAttrs(UnaryFn.GELU))
    z = b.op(OpKind.UNARY, [b.op(OpKind.CONV2D, [img, b.constant(cw)], Conv2dAttrs((1, 1), (1, 1), (1, 1), 1))],
             UnaryAttrs(UnaryFn.RELU))
    xa, ia = h(64, 96), h(2, 8, 10, 10)
    arch = "sm_90a" if wgmma else "sm_90"
    if wgmma:
        monkeypatch.setenv("TASKMAP_WGMMA", wgmma)
    with emulate_gpu(arch):
        cg = CompiledGraph(b.build([y, z]), "cpu", "numpy")
        gy, gz = cg(xa, ia)
    linear = {False: "matmul_tc", "1": "matmul_wgmma", "tma": "matmul_wgmma_tma"}[wgmma]
    assert [st.kernel.func.name for st in cg.steps] == [linear, "matmul_tc"]
    f = lambda a: torch.from_numpy(a).float()  # noqa: E731
    for got, want in ((gy, F.gelu(F.linear(f(xa), f(w), f(bias)))), (gz, F.relu(F.conv2d(f(ia), f(cw), padding=1)))):
        assert got.dtype == np.float16
        err = np.abs(got.astype(np.float32) - want.numpy()).max() / np.abs(want.numpy()).max()
        assert err < 2e-3, err          # f16 output rounding (2^-11 relative) and f16 operands
    for st in cg.steps:
        assert st.kernel.build("cuda", arch=arch).binary


@pytest.mark.parametrize("math", ["tf32", "tf32x3"])
def test_f32_anchors_on_tensor_cores(math):
    """f32 linear / conv ops whose ``tf32`` attribute allows TF32 (PyTorch's setting at capture) are
    fused TF32 tensor-core kernels: their results are the products of the TF32-rounded operands
    (and measurably not the f32 products).  With ``tf32x3`` (``fp32_precision="3xtf32"``) they are
    3xTF32 tensor-core kernels that match the f64 products of the f32 operands as closely as f32
    arithmetic does.  The same linear without either stays SIMT."""
    import torch.nn.functional as F

    from taskmap.graph import Conv2dAttrs, GraphBuilder, MatmulAttrs, OpKind, UnaryAttrs, UnaryFn
    from taskmap.ir.dtypes import f32
    from taskmap.runtime.graph import CompiledGraph
    from taskmap.testing import round_tf32

    rng = np.random.default_rng(1)
    r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    w, bias, cw, cb = r(48, 96), r(48), r(16, 8, 3, 3), r(16)
    b = GraphBuilder(device="cuda:0")
    x, img = b.input((40, 96), f32), b.input((2, 8, 10, 10), f32)
    lin = lambda **kw: b.op(OpKind.LINEAR, [x, b.constant(w), b.constant(bias)], MatmulAttrs(**kw))  # noqa: E731
    y = b.op(OpKind.UNARY, [lin(**{math: True})], UnaryAttrs(UnaryFn.GELU))
    z = b.op(OpKind.UNARY, [b.op(OpKind.CONV2D, [img, b.constant(cw), b.constant(cb)],
                                 Conv2dAttrs((1, 1), (1, 1), (1, 1), 1, **{math: True}))], UnaryAttrs(UnaryFn.RELU))
    xa, ia = r(40, 96), r(2, 8, 10, 10)
    with emulate_gpu("sm_90"):
        cg = CompiledGraph(b.build([y, z, lin()]), "cpu", "numpy")
        gy, gz, gl = cg(xa, ia)
    assert [st.kernel.func.name for st in cg.steps] == ["matmul_tc", "matmul_tc", "matmul_simt"]
    d = lambda a: torch.from_numpy(np.asarray(a, np.float64))  # noqa: E731
    t = (lambda a: d(round_tf32(a))) if math == "tf32" else d
    cases = ((gy, F.gelu(F.linear(t(xa), t(w), d(bias))), F.gelu(F.linear(d(xa), d(w), d(bias)))),
             (gz, F.relu(F.conv2d(t(ia), t(cw), d(cb), padding=1)), F.relu(F.conv2d(d(ia), d(cw), d(cb), padding=1))))
    for got, want, f32_want in cases:
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=2e-5)
        if math == "tf32":
            assert np.abs(got - f32_want.numpy()).max() > 1e-3            # TF32 products, not f32 ones
    np.testing.assert_allclose(gl, F.linear(d(xa), d(w), d(bias)).numpy(), rtol=1e-5, atol=1e-5)
    for st in cg.steps:
        assert st.kernel.build("cuda", arch="sm_90").binary


def test_3xtf32_takes_the_faster_of_tensor_cores_and_simt():
    """3xTF32 and SIMT FMAs are both f32-accurate: a 3xTF32 problem runs on the template whose best
    schedule the cost model finds faster — BERT's batch-8 linear on tensor cores; the choice is
    never the dearer one.  A TF32 problem stays on tensor cores, a plain f32 one on SIMT."""
    from taskmap.backends import cuda_target
    from taskmap.graph.lower_anchor import gpu_template
    from taskmap.templates.matmul_problem import MatmulProblem
    from taskmap.templates.matmul_simt import MATMUL_SIMT
    from taskmap.templates.matmul_tc import MATMUL_TC

    sm90 = cuda_target("sm_90")
    best = lambda t, p: min(t.cost(p, sm90, s) for s in t.space(p, sm90))  # noqa: E731
    for m, n, k in [(1024, 3072, 768), (128, 768, 768), (1, 1000, 2048), (64, 1000, 2048)]:
        p = MatmulProblem(1, m, n, k, trans_b=True, bias=True, tf32x3=True)
        chosen = gpu_template(p, sm90)
        other = MATMUL_SIMT if chosen is MATMUL_TC else MATMUL_TC
        assert best(chosen, p) <= best(other, p)
    assert gpu_template(MatmulProblem(1, 1024, 3072, 768, trans_b=True, tf32x3=True), sm90) is MATMUL_TC
    assert gpu_template(MatmulProblem(1, 128, 768, 768, tf32=True), sm90) is MATMUL_TC
    assert gpu_template(MatmulProblem(1, 1024, 3072, 768), sm90) is MATMUL_SIMT


class ConvLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(2))


def test_fp32_precision_chooses_instead_of_pytorch(monkeypatch):
    """``taskmap.compile(..., fp32_precision=...)``: "3xtf32" turns the products PyTorch would run
    in IEEE f32 (its default: linears) into 3xTF32 and leaves TF32 where PyTorch allows it (its
    default: convolutions); "ieee" and "tf32" decide for both; the dynamo backend takes the same
    option; an unknown value is an error naming the known ones."""
    from taskmap.frontend.torch import precision
    from taskmap.frontend.torch.dynamo import taskmap_backend
    from taskmap.graph import OpKind

    real = precision.current
    monkeypatch.setattr(precision, "current", lambda dev: real("cuda:0"))     # as if captured on a GPU
    old = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = True
        want = {"3xtf32": {OpKind.CONV2D: (True, False), OpKind.LINEAR: (False, True)},
                "ieee": {OpKind.CONV2D: (False, False), OpKind.LINEAR: (False, False)},
                "tf32": {OpKind.CONV2D: (True, False), OpKind.LINEAR: (True, False)},
                None: {OpKind.CONV2D: (True, False), OpKind.LINEAR: (False, False)}}
        for choice, kinds in want.items():
            fast = taskmap.compile(ConvLinear().eval(), torch.randn(1, 3, 6, 6), progress=False, fp32_precision=choice)
            got = {op.kind: (op.attrs.tf32, op.attrs.tf32x3) for op in fast.graphs[0].ops
                   if op.kind in (OpKind.CONV2D, OpKind.LINEAR)}
            assert got == kinds, choice
        summary = taskmap.compile(ConvLinear().eval(), torch.randn(1, 3, 6, 6), progress=False,
                                  fp32_precision="3xtf32").summary()
        assert "3xTF32 (fp32_precision='3xtf32') for: linear" in summary
        assert "TF32 allowed (PyTorch's settings at compile time) for: conv2d" in summary
        assert precision.current("cuda:0") == precision.Tf32(conv=True)       # the choice does not outlive its compile
    finally:
        torch.set_float32_matmul_precision(old[0])
        torch.backends.cudnn.allow_tf32 = old[1]
    with pytest.raises(ValueError, match="fp32_precision='fast'; expected one of None, 'ieee', 'tf32', '3xtf32'"):
        taskmap.compile(ConvLinear().eval(), fp32_precision="fast")
    gm = torch.fx.symbolic_trace(ConvLinear().eval())
    with pytest.raises(ValueError, match="fp32_precision='fast'"):
        taskmap_backend(gm, [torch.randn(1, 3, 6, 6)], options={"fp32_precision": "fast"})


def test_tf32_settings_come_from_pytorch_at_capture(monkeypatch):
    """The frontend records PyTorch's TF32 settings (cuDNN convolutions: on by default; matmuls:
    off, on under ``set_float32_matmul_precision("high")``) as the ops' ``tf32`` attribute of CUDA
    graphs; CPU graphs never take TF32."""
    from taskmap.frontend.torch import precision
    from taskmap.graph import OpKind

    old = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("highest")
        assert precision.current("cuda:0") == precision.Tf32(matmul=False, conv=True)
        assert precision.current("cpu") == precision.Tf32()
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = False
        assert precision.current("cuda:0") == precision.Tf32(matmul=True, conv=False)
        torch.backends.cudnn.allow_tf32 = True
        seen = {}
        real = precision.current
        monkeypatch.setattr(precision, "current", lambda dev: seen.setdefault(dev, real("cuda:0")))
        fast = taskmap.compile(ConvLinear().eval(), torch.randn(1, 3, 6, 6), progress=False)
        assert seen == {"cpu": precision.Tf32(matmul=True, conv=True)}
        ops = {op.kind: op.attrs.tf32 for op in fast.graphs[0].ops if op.kind in (OpKind.CONV2D, OpKind.LINEAR)}
        assert ops == {OpKind.CONV2D: True, OpKind.LINEAR: True}
        assert "TF32 allowed (PyTorch's settings at compile time) for: conv2d, linear" in fast.summary()
    finally:
        torch.set_float32_matmul_precision(old[0])
        torch.backends.cudnn.allow_tf32 = old[1]


def test_split_k_takes_the_epilogue_in_its_reduction():
    """Few output tiles over a long K (a batch-1 classifier, a deep 3x3 conv at 5x5): the GPU
    template splits K, the prologues stay in the main kernel's loads and the epilogue (bias,
    GELU, scale; ReLU, add) moves into the split-K reduction's stores — two launches in one
    step, the partial sums in a workspace."""
    from taskmap.backends import cuda_target
    from taskmap.graph.lower import lower_graph
    from taskmap.graph.passes import optimize

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.conv = torch.nn.Linear(2048, 40), torch.nn.Conv2d(64, 24, 3, padding=1)

        def forward(self, x, img):
            return torch.nn.functional.gelu(self.fc(x)) * 2.0, torch.relu(self.conv(img)) + 1.0

    torch.manual_seed(0)
    model = M().eval()
    fast, got, want = _emulated(model, torch.randn(3, 2048), torch.randn(1, 64, 5, 5))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    (entry,) = fast.entries.values()
    groups = lower_graph(optimize(entry.imported.graph), cuda_target("sm_90"))
    assert len(groups) == 2
    for kg in groups:
        assert [k.func.name for k, _, _ in kg.launches] == ["matmul_simt", "splitk_reduce"], kg
        assert "unary" in kg.name and "binary" in kg.name          # the whole epilogue in this step
        for k, _, _ in kg.launches:
            assert k.build("cuda", arch="sm_90").binary


def _all_launches_build(fast):
    (entry,) = fast.entries.values()
    for st in entry.compiled.steps:
        assert st.kernel is not None, f"{st.name} runs through its runner"
        assert st.kernel.build("cuda", arch="sm_90").binary


def test_transformer_on_gpu_runs_template_anchors_only():
    """A small BERT: the attention, layer norm and embedding templates are anchors on a GPU too
    — the heads' reshapes / permutes fold into the q / k / v linears' stores and the attention's,
    the embedding sums into the first layer norm — and nothing runs through a runner."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100, attn_implementation="sdpa")
    model = transformers.BertModel(config).eval()
    fast, got, want = _emulated(model, torch.randint(0, 100, (2, 16)))
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-5)
    names = [k.func.name for _, k in _kernels(fast)]
    assert names.count("attention_gpu") == 2 and names.count("layer_norm_gpu") == 5
    assert len(names) == 20, names        # 9 launches per layer, the embeddings' and the pooler's
    assert any("attention" in n and "permute" in n for n, _ in _kernels(fast))
    _all_launches_build(fast)


def test_mobile_block_on_gpu_runs_template_anchors_only():
    """Max pooling, a depthwise convolution with BN + ReLU6, a 1x1 convolution and global average
    pooling: window templates and the GPU matmul, no runner."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.pool = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.MaxPool2d(3, 2, 1)
            self.dw, self.bn = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), torch.nn.BatchNorm2d(8)
            self.pw = torch.nn.Conv2d(8, 16, 1)

        def forward(self, x):
            y = self.pool(torch.relu(self.stem(x)))
            y = self.pw(torch.nn.functional.relu6(self.bn(self.dw(y))))
            return torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)

    torch.manual_seed(1)
    model = Block().eval()
    _randomize_bn(model)
    fast, got, want = _emulated(model, torch.randn(2, 3, 14, 14))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    _all_launches_build(fast)


def test_half_attention_takes_the_heads_permutes_as_prologues():
    """f16 causal attention on a CUDA device: the tensor-core attention template reads q / k / v
    through the (batch, seq, heads, dim) -> (batch, heads, seq, dim) permutes — one kernel."""
    import torch.nn.functional as F

    from taskmap.graph import GraphBuilder, OpKind, PermuteAttrs
    from taskmap.graph.attrs import AttentionAttrs
    from taskmap.ir.dtypes import f16
    from taskmap.runtime.graph import CompiledGraph

    rng = np.random.default_rng(5)
    b = GraphBuilder(device="cuda:0")
    heads = [b.op(OpKind.PERMUTE, [b.input((2, 16, 4, 32), f16)], PermuteAttrs((0, 2, 1, 3))) for _ in range(3)]
    graph = b.build([b.op(OpKind.ATTENTION, heads, AttentionAttrs(is_causal=True))])
    arrays = [rng.standard_normal((2, 16, 4, 32)).astype(np.float16) for _ in range(3)]
    with emulate_gpu("sm_90"):
        cg = CompiledGraph(graph, "cpu", "numpy")
        (got,) = cg(*arrays)
    assert [st.kernel.func.name for st in cg.steps] == ["attention_tc"]
    q, k, v = (torch.from_numpy(a).float().permute(0, 2, 1, 3) for a in arrays)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    assert got.dtype == np.float16
    assert np.abs(got.astype(np.float32) - want).max() / np.abs(want).max() < 2e-3
    assert cg.steps[0].kernel.build("cuda", arch="sm_90").binary


def test_a_misaligned_input_view_is_copied_before_gpu_kernels_read_it():
    """A contiguous input view 2 bytes off a 16-byte boundary, read by the tensor-core template's
    ``cp_async`` (which faults on a GPU and in emulation): the compiled graph copies it first."""
    from taskmap.graph import GraphBuilder, OpKind
    from taskmap.ir.dtypes import f16
    from taskmap.runtime.graph import CompiledGraph

    rng = np.random.default_rng(7)
    w = rng.standard_normal((128, 96)).astype(np.float16)
    b = GraphBuilder(device="cuda:0")
    graph = b.build([b.op(OpKind.LINEAR, [b.input((64, 96), f16), b.constant(w)])])
    x = rng.standard_normal(64 * 96 + 1).astype(np.float16)[1:].reshape(64, 96)
    assert x.flags.c_contiguous and x.ctypes.data % 16
    with emulate_gpu("sm_90"):
        cg = CompiledGraph(graph, "cpu", "numpy")
        (got,) = cg(x)
    assert [st.kernel.func.name for st in cg.steps] == ["matmul_tc"]
    want = x.astype(np.float32) @ w.astype(np.float32).T
    assert np.abs(got.astype(np.float32) - want).max() / np.abs(want).max() < 2e-3


def test_tf32_anchors_on_wgmma_by_default(monkeypatch):
    """On sm_90a, TF32 linear and conv anchors run the wgmma template — the linear's bias + GELU
    and the conv's img2col (a K x N B, transposed into K-major tiles) and bias + ReLU fused in —
    and match the products of the operands' top 19 bits; with ``TASKMAP_WGMMA=0`` they stay on the
    mma.sync template."""
    import torch.nn.functional as F

    from taskmap.backends import cuda_target
    from taskmap.graph import Conv2dAttrs, GraphBuilder, MatmulAttrs, OpKind, UnaryAttrs, UnaryFn
    from taskmap.graph.lower_anchor import gpu_template
    from taskmap.ir.dtypes import f32
    from taskmap.runtime.graph import CompiledGraph
    from taskmap.templates.matmul_problem import MatmulProblem
    from taskmap.templates.matmul_tc import MATMUL_TC
    from taskmap.templates.matmul_wgmma import MATMUL_WGMMA

    p = MatmulProblem(1, 1024, 3072, 768, trans_b=True, tf32=True)
    monkeypatch.setenv("TASKMAP_WGMMA", "0")
    assert gpu_template(p, cuda_target("sm_90a")) is MATMUL_TC
    monkeypatch.delenv("TASKMAP_WGMMA")
    assert gpu_template(p, cuda_target("sm_90a")) is MATMUL_WGMMA
    x3 = MatmulProblem(1, 1024, 3072, 768, trans_b=True, tf32x3=True)
    assert gpu_template(x3, cuda_target("sm_90a")) is MATMUL_WGMMA
    decode = MatmulProblem(1, 1, 3072, 768, trans_b=True, tf32=True)       # one row: a wgmma would be 1/64 work
    assert gpu_template(decode, cuda_target("sm_90a")) is MATMUL_TC
    assert gpu_template(p, cuda_target("sm_90")) is MATMUL_TC

    rng = np.random.default_rng(2)
    r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    w, bias, cw, cb = r(48, 96), r(48), r(64, 8, 3, 3), r(64)     # 72 rows, 64 channels: a warpgroup's 64
    b = GraphBuilder(device="cuda:0")
    x, img = b.input((72, 96), f32), b.input((2, 8, 10, 10), f32)
    y = b.op(OpKind.UNARY, [b.op(OpKind.LINEAR, [x, b.constant(w), b.constant(bias)], MatmulAttrs(tf32=True))],
             UnaryAttrs(UnaryFn.GELU))
    z = b.op(OpKind.UNARY, [b.op(OpKind.CONV2D, [img, b.constant(cw), b.constant(cb)],
                                 Conv2dAttrs((1, 1), (1, 1), (1, 1), 1, tf32=True))], UnaryAttrs(UnaryFn.RELU))
    xa, ia = r(72, 96), r(2, 8, 10, 10)
    with emulate_gpu("sm_90a"):
        cg = CompiledGraph(b.build([y, z]), "cpu", "numpy")
        gy, gz = cg(xa, ia)
    assert [st.kernel.func.name for st in cg.steps] == ["matmul_wgmma", "matmul_wgmma"]
    top = lambda a: torch.from_numpy((a.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64))  # noqa: E731
    d = lambda a: torch.from_numpy(np.asarray(a, np.float64))  # noqa: E731
    np.testing.assert_allclose(gy, F.gelu(F.linear(top(xa), top(w), d(bias))).numpy(), rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(gz, F.relu(F.conv2d(top(ia), top(cw), d(cb), padding=1)).numpy(), rtol=1e-5, atol=2e-5)
    for st in cg.steps:
        assert st.kernel.build("cuda", arch="sm_90a").binary


def test_tma_form_takes_linears_and_leaves_prologues_to_cp_async(monkeypatch):
    """``TASKMAP_WGMMA=tma``: a linear whose operands are tensors runs the TMA form (tiles by the copy
    engine) with its bias + GELU fused; a linear whose input a prologue computes (tanh) and a conv
    (img2col) keep the cp.async form, still one kernel each; all match the truncated products."""
    import torch.nn.functional as F

    from taskmap.graph import Conv2dAttrs, GraphBuilder, MatmulAttrs, OpKind, UnaryAttrs, UnaryFn
    from taskmap.ir.dtypes import f32
    from taskmap.runtime.graph import CompiledGraph

    monkeypatch.setenv("TASKMAP_WGMMA", "tma")
    rng = np.random.default_rng(3)
    r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    w, bias, w2, cw = r(48, 96), r(48), r(40, 96), r(64, 8, 3, 3)
    b = GraphBuilder(device="cuda:0")
    x, x2, img = b.input((72, 96), f32), b.input((72, 96), f32), b.input((2, 8, 10, 10), f32)
    y = b.op(OpKind.UNARY, [b.op(OpKind.LINEAR, [x, b.constant(w), b.constant(bias)], MatmulAttrs(tf32=True))],
             UnaryAttrs(UnaryFn.GELU))
    t = b.op(OpKind.LINEAR, [b.op(OpKind.UNARY, [x2], UnaryAttrs(UnaryFn.TANH)), b.constant(w2)], MatmulAttrs(tf32=True))
    z = b.op(OpKind.CONV2D, [img, b.constant(cw)], Conv2dAttrs((1, 1), (1, 1), (1, 1), 1, tf32=True))
    xa, xb, ia = r(72, 96), r(72, 96), r(2, 8, 10, 10)
    with emulate_gpu("sm_90a"):
        cg = CompiledGraph(b.build([y, t, z]), "cpu", "numpy")
        gy, gt, gz = cg(xa, xb, ia)
    assert [st.kernel.func.name for st in cg.steps] == ["matmul_wgmma_tma", "matmul_wgmma", "matmul_wgmma"]
    top = lambda a: torch.from_numpy((np.asarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFFE000))  # noqa: E731
                                     .view(np.float32).astype(np.float64))
    d = lambda a: torch.from_numpy(np.asarray(a, np.float64))  # noqa: E731
    np.testing.assert_allclose(gy, F.gelu(F.linear(top(xa), top(w), d(bias))).numpy(), rtol=1e-5, atol=2e-5)
    # the kernel's tanh may differ from numpy's in a last bit, which truncation to tf32 can keep
    np.testing.assert_allclose(gt, F.linear(top(np.tanh(xb)), top(w2)).numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(gz, F.conv2d(top(ia), top(cw), padding=1).numpy(), rtol=1e-5, atol=2e-5)
    assert "cp.async.bulk.tensor" in cg.steps[0].kernel.build("cuda", arch="sm_90a").artifact.extra.ptx


@pytest.mark.parametrize("mode", ["1", "tma"])
def test_wgmma_3xtf32_models_match_eager_as_f32_does(monkeypatch, mode):
    """End to end on sm_90a with ``TASKMAP_WGMMA=1`` (and ``=tma``: the linears on the TMA form) and
    ``fp32_precision="3xtf32"`` (cuDNN's TF32 off, so the convolutions take 3xTF32 too): a small BERT
    and a conv block run their linears and convolutions on the wgmma template — epilogues (bias,
    GELU, residual adds, BN, ReLU), split-K and img2col fused in — and match eager within f32's
    tolerances.  (Every product but BERT's pooler has at least a warpgroup's 64 rows: fewer go to
    the other templates.)"""
    transformers = pytest.importorskip("transformers")
    from taskmap.frontend.torch import precision

    real = precision.current
    monkeypatch.setattr(precision, "current", lambda dev: real("cuda:0"))     # as if captured on a GPU
    monkeypatch.setenv("TASKMAP_WGMMA", mode)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch.manual_seed(3)
    bert = transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256, vocab_size=100,
        attn_implementation="sdpa")).eval()
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.BatchNorm2d(64)
            self.c2, self.b2 = torch.nn.Conv2d(64, 128, 3, stride=2, padding=1), torch.nn.BatchNorm2d(128)
            self.c3 = torch.nn.Conv2d(128, 128, 1)

        def forward(self, x):
            y = torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))
            return y + self.c3(y)

    block = Block().eval()
    _randomize_bn(block)
    for model, x in ((bert, torch.randint(0, 100, (2, 40))), (block, torch.randn(2, 3, 12, 10))):
        with emulate_gpu("sm_90a"):
            fast = taskmap.compile(model, (x,), progress=False, fp32_precision="3xtf32")
            got = fast(x)
        with torch.no_grad():
            want = model(x)
        if model is bert:
            got, want = got.last_hidden_state, want.last_hidden_state
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        names = [k.func.name for _, k in _kernels(fast)]
        tma = names.count("matmul_wgmma_tma")
        assert names.count("matmul_wgmma") + tma == (12 if model is bert else 3), names     # 6 linears a layer
        assert tma == (0 if mode == "1" or model is block else 12), names


@pytest.mark.parametrize("dtype", ["tf32", "float16"])
def test_constant_k_by_n_weights_are_transposed_for_wgmma(monkeypatch, dtype):
    """GPT-2's Conv1D: a product with a constant K x N weight.  On sm_90a its weight is transposed
    once to N x K, so the wgmma template takes it with its K-major tiles (f16: instead of
    mma.sync; TF32: instead of copying B element by element), and the result matches; with
    ``TASKMAP_WGMMA=0`` or in IEEE f32 (SIMT) the weight stays as it is."""
    from taskmap.backends import cuda_target
    from taskmap.graph import GraphBuilder, MatmulAttrs, OpKind
    from taskmap.graph.lower_anchor import anchor_problem
    from taskmap.ir.dtypes import f16, f32
    from taskmap.runtime.graph import CompiledGraph

    rng = np.random.default_rng(7)
    npt = np.float16 if dtype == "float16" else np.float32
    w, xa = rng.standard_normal((96, 48)).astype(npt), rng.standard_normal((72, 96)).astype(npt)

    def build(tf32):
        b = GraphBuilder(device="cuda:0")
        x = b.input((72, 96), f16 if dtype == "float16" else f32)
        y = b.op(OpKind.MATMUL, [x, b.constant(w)], MatmulAttrs(tf32=tf32))
        return b.build([y])

    import taskmap.runtime.graph as rg

    made = []                           # the lowering's constants, as the runtime takes them on
    real = rg._lowering_constant       # the kind's device (a GPU's memory: uploaded once)
    monkeypatch.setattr(rg, "_lowering_constant", lambda data, kind: made.append(data) or real(data, kind))
    g = build(dtype == "tf32")
    with emulate_gpu("sm_90a"):
        cg = CompiledGraph(g, "cpu", "numpy")
        (got,) = cg(xa)
    (st,) = cg.steps
    assert st.kernel.func.name == "matmul_wgmma"         # f16: mma.sync before (wgmma reads K-major B only)
    assert len(made) == 1 and np.array_equal(made[0].reshape(48, 96), w.T)
    assert all(c.shape != w.shape for c in cg.constants.values())      # the K x N original: not kept
    on_device = real(made[0], rg.ArrayKind("torch", "meta"))
    assert isinstance(on_device, torch.Tensor) and on_device.device.type == "meta" and on_device.shape == made[0].shape
    if dtype == "tf32":
        top = lambda a: (a.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)  # noqa: E731
        np.testing.assert_allclose(got, top(xa) @ top(w), rtol=1e-5, atol=2e-5)
    else:
        want = xa.astype(np.float64) @ w.astype(np.float64)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    op = next(o for o in g.ops if o.kind is OpKind.MATMUL)
    assert anchor_problem(op, cuda_target("sm_90a")).problem.trans_b
    monkeypatch.setenv("TASKMAP_WGMMA", "0")
    fresh = next(o for o in build(dtype == "tf32").ops if o.kind is OpKind.MATMUL)     # anchors are made once per op
    assert not anchor_problem(fresh, cuda_target("sm_90a")).problem.trans_b
    monkeypatch.delenv("TASKMAP_WGMMA")
    if dtype == "tf32":
        ieee = next(o for o in build(False).ops if o.kind is OpKind.MATMUL)
        assert not anchor_problem(ieee, cuda_target("sm_90a")).problem.trans_b          # SIMT reads K x N


class _PatchMerge(torch.nn.Module):
    """Swin's patch merging: four strided parts (two row slices, each read by two of them)
    concatenated along the channels, a LayerNorm, a linear."""

    def __init__(self, c=8):
        super().__init__()
        self.norm, self.proj = torch.nn.LayerNorm(4 * c), torch.nn.Linear(4 * c, 2 * c)

    def forward(self, x):
        parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
        return self.proj(self.norm(torch.cat(parts, -1)))


def test_views_shared_inside_a_group_on_a_gpu():
    """The row slices two parts share are recomputed inside the group that reads them (no step
    of their own) in the GPU lowering too, and the result matches eager."""
    torch.manual_seed(4)
    fast, got, want = _emulated(_PatchMerge().eval(), torch.randn(2, 6, 6, 8))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    names = [name for name, _ in _kernels(fast)]
    assert not any(name.startswith("slice") and "concat" not in name for name in names), names
