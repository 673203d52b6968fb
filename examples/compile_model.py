"""Compile a PyTorch model with taskmap: a small residual CNN (conv-bn-relu blocks, a residual add,
pooling and a classifier) becomes a handful of fused kernels.

    python examples/compile_model.py

``taskmap.compile(model)`` traces the model (torch.fx), folds the batch norms into the
convolutions' weights, partitions the graph into fusion groups (an anchor — a convolution, a
matmul, a reduction — with its injective producers and element-wise consumers), schedules each
anchor with its template and splices the rest into its loads and stores (post-scheduling
fusion): each conv + bn + relu (+ residual add) below is one kernel.  The same works through
``torch.compile(model, backend="taskmap")``.
"""
import time

import torch
from torch import nn

import taskmap


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.blocks = nn.Sequential(Block(32), Block(32))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def randomize_bn(model: nn.Module) -> None:
    """Batch-norm statistics that are not the identity, so folding them is really tested."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)


def median_ms(fn, runs: int = 20) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    torch.manual_seed(0)
    model = SmallNet().eval()
    randomize_bn(model)
    x = torch.randn(1, 3, 64, 64)
    t0 = time.perf_counter()
    fast = taskmap.compile(model, x, progress=False)
    print(f"taskmap.compile: {time.perf_counter() - t0:.1f} s")
    print(fast.summary())
    with torch.no_grad():
        want, got = model(x), fast(x)
        err = (got - want).abs().max().item()
        print(f"max |taskmap - eager| = {err:.2e}:", "OK" if err < 1e-3 else "WRONG")
        print(f"latency: taskmap {median_ms(lambda: fast(x)):.2f} ms, eager {median_ms(lambda: model(x)):.2f} ms")


if __name__ == "__main__":
    main()
