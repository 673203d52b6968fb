"""Hand-written CNNs (torchvision's architectures, random weights; EfficientNet-B0, DenseNet-121,
ResNeXt-50 and a U-Net too)
compiled with taskmap.compile match eager PyTorch (f32: rtol 1e-3, atol 1e-4)."""
import pytest
import torch

import taskmap
from cnn_defs import inception_v3, mobilenet_v2, resnet50
from more_defs import densenet121, efficientnet_b0, resnext50_32x4d, unet

from taskmap.graph import OpKind


def compare(model, x):
    fast = taskmap.compile(model, progress=False)
    got = fast(x)
    with torch.no_grad():
        want = model(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    return fast


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_resnet50(batch):
    torch.manual_seed(0)
    fast = compare(resnet50(), torch.randn(batch, 3, 224, 224))
    assert "fallback" not in fast.summary()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_mobilenet_v2(batch):
    torch.manual_seed(0)
    compare(mobilenet_v2(), torch.randn(batch, 3, 224, 224))


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_inception_v3(batch):
    torch.manual_seed(0)
    compare(inception_v3(), torch.randn(batch, 3, 299, 299))


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3])
def test_efficientnet_b0(batch):
    """SiLU / sigmoid epilogues, squeeze-and-excitation (its x * s a prologue of the projection's
    packing), 3x3 and 5x5 depthwise convolutions: no op left to PyTorch, fewer steps than ops."""
    torch.manual_seed(0)
    fast = compare(efficientnet_b0(), torch.randn(batch, 3, 224, 224))
    (entry,) = fast.entries.values()
    steps = entry.ready(False).steps
    assert "fallback" not in fast.summary() and len(steps) <= 120
    # every block's x * s: spliced into its 1x1 projection's packing where that runs on the implicit
    # GEMM; a kernel of its own before a projection on the direct kernel (which reads x in place)
    kernel = [st.kernels[0].__name__ if st.kernels else "" for st in steps]
    fused = [i for i, st in enumerate(steps) if st.name.startswith("binary") and "+conv2d" in st.name]
    alone = [i for i, st in enumerate(steps) if kernel[i] == "binary_cpu"]
    assert len(fused) + len(alone) == 16 and all(kernel[i] == "matmul_cpu" for i in fused)
    assert all(kernel[i + 1] == "conv_cpu_cvec" for i in alone)


@pytest.mark.slow
@pytest.mark.parametrize("batch,side", [(1, 224), (2, 64)])
def test_densenet121(batch, side):
    """Growing concatenations before batch norm + ReLU (one kernel each, computed part by part),
    and transitions whose 2x2 average pool runs before their 1x1 conv (graph pass reorder_pool)."""
    torch.manual_seed(0)
    fast = compare(densenet121(), torch.randn(batch, 3, side, side))
    assert "fallback" not in fast.summary()
    (entry,) = fast.entries.values()
    graph = entry.compiled.graph
    pools = [op for op in graph.ops if op.kind is OpKind.AVG_POOL2D]
    assert len(pools) == 3
    for pool in pools:
        (reader,) = [op for op in graph.ops if pool.output in op.inputs]
        assert reader.kind is OpKind.CONV2D and reader.inputs[1].shape[2:] == (1, 1)
        assert reader.output.shape[1] * 2 == pool.output.shape[1]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_resnext50(batch):
    """32 groups in every 3x3 conv (4 to 32 channels a group): on the direct kernel's pixel tiles,
    whose channels stay in one group, or where a group's channels are whole vectors on the channel
    kernel's panels, the batch norm and ReLU in their stores."""
    torch.manual_seed(0)
    fast = compare(resnext50_32x4d(), torch.randn(batch, 3, 160 if batch > 1 else 224, 160 if batch > 1 else 224))
    assert "fallback" not in fast.summary()
    (entry,) = fast.entries.values()
    steps = entry.ready(False).steps
    kernels = [st.kernels[0].__name__ for st in steps if st.kernels and "conv2d" in st.name]
    # the pixel kernel: the 3x3 layers of 4 and 8 channels a group (7), and those of 16 at stride 1 where
    # the model prefers it (up to 5); the 32-channel groups and the stride-2 16-channel one: channel kernel
    assert len(steps) == 56 and 7 <= kernels.count("conv_cpu") <= 12


@pytest.mark.slow
def test_unet():
    torch.manual_seed(0)
    fast = compare(unet(), torch.randn(2, 3, 96, 80))
    assert "fallback" not in fast.summary()


@pytest.mark.slow
def test_inception_v3_concats_in_place_on_gpu_kernels():
    """At batch 2 in GPU emulation (sm_90: the CUDA templates' semantics on the host), every
    branch of Inception's concatenations writes into its range of the concat's output — the
    convolutions' implicit GEMMs (split-K ones through their reduction) and the pools placed with
    the output's image stride, the nested concats of its last blocks too — and the model still
    matches eager."""
    from taskmap.ops import emulate_gpu

    torch.manual_seed(0)
    with emulate_gpu("sm_90"):
        fast = compare(inception_v3(), torch.randn(2, 3, 299, 299))
    (entry,) = fast.entries.values()
    steps = entry.compiled.steps
    assert not [st.name for st in steps if st.kind.name == "CONCAT"]
    placed = [st for st in steps if any(p.name.startswith("placed") for k in st.kernels for p in k.func.params)]
    assert len(placed) == 40 and {st.kernel.func.name for st in placed} >= {"matmul_simt"}
    # split-K chains too: the reduction, which writes the output, is the launch placed
    assert any(st.more and any(p.name.startswith("placed") for p in st.more[-1].func.params) for st in placed)
