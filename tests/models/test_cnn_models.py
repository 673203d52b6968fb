"""Hand-written CNNs (torchvision's architectures, random weights) compiled with taskmap.compile
match eager PyTorch (f32: rtol 1e-3, atol 1e-4)."""
import pytest
import torch

import taskmap
from cnn_defs import inception_v3, mobilenet_v2, resnet50


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
