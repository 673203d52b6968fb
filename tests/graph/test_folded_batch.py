"""A batch of small images through the graph compiler: a bottleneck into a 7x7 stage (stride-2
1x1 convolutions, then a 1x1 expansion with BatchNorm, a residual add and ReLU) at batch 4 runs
the expansion on the matmul kernel with the batch folded into the columns (``CpuConfig.fold``,
the residual epilogue in its per-image stores) and matches PyTorch.  The 1x1 layers are held on
the implicit GEMM (a large channel-kernel edge): on a Zen 4 the cost model sends 7x7 1x1 layers
to the channel kernel, which runs them faster there."""
import pytest
import torch

import taskmap
from taskmap.backends.base import host_cpu_target
from taskmap.graph import kernel_cache
from taskmap.schedule import tune
from taskmap.templates import conv_cpu


class Stage(torch.nn.Module):
    def __init__(self, cin: int, mid: int, cout: int) -> None:
        super().__init__()
        self.down = torch.nn.Conv2d(cin, cout, 1, stride=2, bias=False)
        self.reduce = torch.nn.Conv2d(cin, mid, 1, stride=2)
        self.expand = torch.nn.Conv2d(mid, cout, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.expand(torch.relu(self.reduce(x)))) + self.down(x))


@pytest.fixture
def pointwise_on_the_gemm(monkeypatch):
    """1x1 layers routed to the implicit GEMM; the process's memos of choices and kernels are
    forgotten before and after, so that no other test sees this routing."""
    monkeypatch.setattr(conv_cpu, "pointwise_edge", lambda target: 1e3)
    monkeypatch.setenv("TASKMAP_GRAPH_CACHE", "0")
    tune.clear_memo()
    kernel_cache.clear_memo()
    yield
    tune.clear_memo()
    kernel_cache.clear_memo()


@pytest.mark.skipif(host_cpu_target().vector_bytes < 32, reason="the route is priced for 8- and 16-lane tiles")
def test_small_images_fold_the_batch_and_match_torch(pointwise_on_the_gemm):
    torch.manual_seed(0)
    model = Stage(384, 256, 1024).eval()
    with torch.no_grad():
        for bn in (model.bn,):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
        x = torch.randn(4, 384, 14, 14)
        compiled = taskmap.compile(model, (x,))
        out = compiled(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    kernels = [k for e in compiled.entries.values() for st in e.compiled.steps for k in st.kernels]
    folded = [k for k in kernels if "pack_b_fold" in k.build("cpu").source]
    assert len(folded) >= 1, [k.__name__ for k in kernels]
