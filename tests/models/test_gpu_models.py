"""The whole models on an NVIDIA GPU: ``taskmap.compile`` of CUDA models matches eager PyTorch in
f32 (rtol 1e-3, atol 1e-4, against eager with TF32 off) and in f16 (relative L2 error against the
f32 model), over several calls: the second call captures a CUDA graph and later calls replay it
with new inputs.  Skipped without a GPU ("no NVIDIA GPU")."""
import warnings

import pytest
import torch

import taskmap
from cnn_defs import inception_v3, mobilenet_v2, resnet50
from vit_def import ViT

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.cuda

# f16 against the f32 model: ||got - want|| / ||want|| (f16 has 11 bits: 5e-4 per rounding; a model's
# depth of accumulated roundings stays well under 1e-2)
F16_REL_L2 = 1e-2
BF16_REL_L2 = 8 * F16_REL_L2   # bf16 keeps 8 bits: 8x f16's rounding
TF32_REL_L2 = F16_REL_L2   # TF32 operands keep f16's 10-bit mantissas (f32 range and sums)
# mma.sync; Hopper's wgmma (sm_90a, products of >= 64 rows), its TMA form (TASKMAP_WGMMA=tma)
TENSOR_CORES = {"matmul_tc", "matmul_wgmma", "matmul_wgmma_tma"}


@pytest.fixture(autouse=True)
def _no_tf32():
    """Eager's reference in true f32: cuDNN's convolutions use TF32 by default (10-bit mantissas)."""
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def _model(name):
    torch.manual_seed(0)
    tf = transformers
    return {
        "resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "inception_v3": inception_v3,
        "vit": lambda: ViT(image=224, patch=16, dim=768, depth=12, heads=12, classes=1000),
        "bert": lambda: tf.BertModel(tf.BertConfig(attn_implementation="sdpa")),
        "gpt2": lambda: tf.GPT2Model(tf.GPT2Config(use_cache=False)),
    }[name]().eval().cuda()


def _inputs(name, batch, seed):
    g = torch.Generator().manual_seed(seed)
    if name in ("bert", "gpt2"):
        return torch.randint(0, 1000, (batch, 128), generator=g).cuda()
    side = 299 if name == "inception_v3" else 224
    return torch.randn(batch, 3, side, side, generator=g).cuda()


def _main(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out


def _compiled_runs(model, x, calls=3):
    """``taskmap.compile(model)`` and its main output after ``calls`` calls (capture, replays)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = taskmap.compile(model, x, progress=False)
        for _ in range(calls):
            got = _main(fast(x))
    return fast, got


def _rel_l2(got, want):
    got, want = got.double(), want.double()
    return float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want))


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "inception_v3", "vit", "bert", "gpt2"])
def test_model_f32(name, batch):
    model = _model(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = taskmap.compile(model, _inputs(name, batch, 0), progress=False)
    for seed in range(3):                # plain run, capture, replay: each on new inputs
        x = _inputs(name, batch, seed + 1)
        got = _main(fast(x))
        with torch.no_grad():
            want = _main(model(x))
        assert got.device == want.device and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    assert "fallback" not in fast.summary() and "run by PyTorch" not in fast.summary()


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "inception_v3", "vit", "bert", "gpt2"])
def test_model_f16(name, batch):
    _check_half(name, batch, torch.float16, F16_REL_L2)


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "vit", "bert", "gpt2"])
def test_model_bf16(name):
    """bfloat16 weights (``ml_dtypes`` constants, uploaded as they are) on the tensor cores."""
    pytest.importorskip("ml_dtypes", reason="bfloat16 constants need the ml_dtypes package")
    _check_half(name, 8, torch.bfloat16, BF16_REL_L2)


def _check_half(name, batch, dtype, bound):
    model = _model(name)
    half = _model(name).to(dtype)
    x = _inputs(name, batch, 1)
    xh = x.to(dtype) if x.is_floating_point() else x
    _, got = _compiled_runs(half, xh)
    with torch.no_grad():
        want = _main(model(x))
        eager = _main(half(xh))
    assert got.dtype == dtype and bool(torch.isfinite(got).all())
    # as close to f32 as PyTorch's own half-precision run is (with room), and within the table's bound
    assert _rel_l2(got, want) < max(bound, 2 * _rel_l2(eager, want))


@pytest.mark.parametrize("name", ["resnet50", "inception_v3", "bert"])
def test_model_tf32(name):
    """PyTorch's TF32 settings at compile time reach the anchors: convolutions (and, under
    ``set_float32_matmul_precision("high")``, matmuls) run on TF32 tensor cores — as close to the
    true f32 result as eager's own TF32 run is, with room — and the kernels say so."""
    model, x = _model(name), _inputs(name, 8, 1)
    with torch.no_grad():
        want = _main(model(x))                                   # TF32 off (the fixture)
    old = torch.get_float32_matmul_precision()
    try:
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
        fast, got = _compiled_runs(model, x)
        with torch.no_grad():
            eager = _main(model(x))
    finally:
        torch.set_float32_matmul_precision(old)
    assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
    assert _rel_l2(got, want) < max(TF32_REL_L2, 2 * _rel_l2(eager, want)), (_rel_l2(got, want), _rel_l2(eager, want))
    assert _rel_l2(got, want) > 1e-6                              # not f32 products
    (entry,) = fast.entries.values()
    names = [k.func.name for st in entry.compiled.steps for k in st.kernels]
    assert TENSOR_CORES & set(names) and "matmul_simt" not in names, names


@pytest.mark.parametrize("name", ["resnet50", "vit", "bert", "gpt2"])
def test_model_3xtf32(name):
    """``fp32_precision="3xtf32"``: the f32 matmuls and convolutions on 3xTF32 tensor cores (or SIMT
    FMAs where the cost model finds those faster), matching eager's true f32 run at the f32
    tolerance (rtol 1e-3, atol 1e-4) at batch 8."""
    model = _model(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = taskmap.compile(model, _inputs(name, 8, 0), progress=False, fp32_precision="3xtf32")
    for seed in range(2):                 # plain run, then the CUDA graph capture
        x = _inputs(name, 8, seed + 1)
        got = _main(fast(x))
        with torch.no_grad():
            want = _main(model(x))        # TF32 off (the fixture)
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    (entry,) = fast.entries.values()
    names = [k.func.name for st in entry.compiled.steps for k in st.kernels]
    assert TENSOR_CORES & set(names), names
    assert "3xTF32 (fp32_precision='3xtf32') for:" in fast.summary()


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_models_on_the_tma_form(name, monkeypatch):
    """``TASKMAP_WGMMA=tma`` on an H100 / H200: the linears run the wgmma template's TMA form (tensor
    maps made at launch, then baked into the captured CUDA graph, whose replays take new inputs):
    3xTF32 matches eager's true f32 at the f32 tolerance, f16 is as close to f32 as eager's f16."""
    from taskmap.backends.cuda.target import current_cuda_target

    if "wgmma" not in current_cuda_target(0).features:
        pytest.skip("an sm_90a GPU (H100 / H200) runs the TMA form")
    monkeypatch.setenv("TASKMAP_WGMMA", "tma")
    model = _model(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = taskmap.compile(model, _inputs(name, 8, 0), progress=False, fp32_precision="3xtf32")
    for seed in range(3):                 # plain run, capture, replay
        x = _inputs(name, 8, seed + 1)
        got = _main(fast(x))
        with torch.no_grad():
            want = _main(model(x))
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    (entry,) = fast.entries.values()
    assert "matmul_wgmma_tma" in [k.func.name for st in entry.compiled.steps for k in st.kernels]
    half, x = _model(name).half(), _inputs(name, 8, 4)
    _, got = _compiled_runs(half, x)
    with torch.no_grad():
        want, eager16 = _main(model(x)), _main(half(x))
    assert got.dtype == torch.float16 and _rel_l2(got, want) < max(F16_REL_L2, 2 * _rel_l2(eager16, want))


def test_folded_constants_live_on_the_models_device():
    """Constants folded at import (a buffer moved with ``.to(x.device)``, an ``arange`` made on the
    input's device) meet on one device: torch.export records ``_assert_tensor_metadata(device=cuda)``
    on them, which fails if the importer materializes them on the CPU."""

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.linspace(0.5, 2.0, 16))

        def forward(self, x):
            n = x.shape[-1]
            causal = torch.arange(n, device=x.device)[None, :] <= torch.arange(n, device=x.device)[:, None]
            s = self.scale.to(x.device, torch.float32)
            return torch.softmax((x * s).masked_fill(~causal, float("-inf")), dim=-1)

    model = Masked().cuda()
    x = torch.randn(3, 16, 16, device="cuda")
    fast = taskmap.compile(model, x, progress=False, capture="export")
    torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)


class _Small(torch.nn.Module):
    """conv + BN + ReLU, a residual, global pooling and a linear + GELU: the fused GPU paths."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32)
        self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = y + self.conv2(y)
        return torch.nn.functional.gelu(self.fc(y.mean((2, 3))))


def _small():
    torch.manual_seed(0)
    model = _Small().eval()
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 2.0)
    return model.cuda()


def test_dynamo_backend_on_gpu():
    model = _small()
    fast = torch.compile(model, backend="taskmap")
    with torch.no_grad():
        for seed in range(3):
            x = _inputs("resnet50", 2, seed)[:, :, :32, :32].contiguous()
            torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-4)


def test_save_and_load_on_gpu(tmp_path):
    model = _small()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    fast = taskmap.compile(model, x, progress=False)
    fast.save(tmp_path / "small.tm")
    loaded = taskmap.load(tmp_path / "small.tm")
    with torch.no_grad():
        want = model(x)
    got = loaded(x)
    assert got.device == want.device
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


def test_profile_on_gpu_times_steps_by_events():
    # Device time per step, from CUDA events: every step is timed, all positive, and together
    # they take about what one run takes on the device (no synchronisation per step added).
    model = _small()
    x = torch.randn(8, 3, 32, 32, device="cuda")
    fast = taskmap.compile(model, x, progress=False)
    compiled = fast.entries[next(iter(fast.entries))].compiled
    with torch.no_grad():
        rows = compiled.profile(x, rounds=5)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-4)
        for _ in range(2):
            compiled(x)                       # the second call captures the CUDA graph
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        compiled(x)                           # a replay
        end.record()
        torch.cuda.synchronize()
    assert sorted(r[0] for r in rows) == sorted(s.name for s in compiled.steps)
    assert all(0 < r[2] < 1e-2 for r in rows)
    assert sum(r[2] for r in rows) < 2 * start.elapsed_time(end) / 1e3 + 1e-4
