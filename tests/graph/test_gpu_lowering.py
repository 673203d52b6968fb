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


def _kernels(fast):
    (entry,) = fast.entries.values()
    return [(st.name, st.kernel) for st in entry.compiled.steps]


@pytest.mark.parametrize("batch", [1, 2])
def test_conv_net_fuses_into_gpu_matmul_kernels(batch):
    torch.manual_seed(batch)
    model = ConvNet().eval()
    _randomize_bn(model)
    x = torch.randn(batch, 3, 12, 10)
    with emulate_gpu("sm_90"):
        fast = taskmap.compile(model, x, progress=False)
        got = fast(x)
    with torch.no_grad():
        want = model(x)
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


def test_half_anchors_are_fused_tensor_core_kernels():
    """f16 on a CUDA device (no widening to f32 there): linear + bias + GELU and conv + ReLU are ONE
    tensor-core matmul kernel each (the conv's img2col spliced into the template's tile loads, a
    one-element f16 zero bias for the conv), right in GPU emulation and built for sm_90."""
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
    with emulate_gpu("sm_90"):
        cg = CompiledGraph(b.build([y, z]), "cpu", "numpy")
        gy, gz = cg(xa, ia)
    assert [st.kernel.func.name for st in cg.steps] == ["matmul_tc", "matmul_tc"]
    f = lambda a: torch.from_numpy(a).float()  # noqa: E731
    for got, want in ((gy, F.gelu(F.linear(f(xa), f(w), f(bias)))), (gz, F.relu(F.conv2d(f(ia), f(cw), padding=1)))):
        assert got.dtype == np.float16
        err = np.abs(got.astype(np.float32) - want.numpy()).max() / np.abs(want.numpy()).max()
        assert err < 2e-3, err          # f16 output rounding (2^-11 relative) and f16 operands
    for st in cg.steps:
        assert st.kernel.build("cuda", arch="sm_90").binary


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
    x, img = torch.randn(3, 2048), torch.randn(1, 64, 5, 5)
    with emulate_gpu("sm_90"):
        fast = taskmap.compile(model, (x, img), progress=False)
        got = fast(x, img)
    with torch.no_grad():
        want = model(x, img)
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
