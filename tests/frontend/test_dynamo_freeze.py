"""``torch.compile(model, backend="taskmap")`` compiles the model's parameters and buffers in as
constants (dynamo passes them as inputs): batch norms fold into the convolution, the graph has
only the real inputs, and an in-place update of a weight compiles again with the new values."""
import torch
from torch import nn

from taskmap.frontend.torch.dynamo import taskmap_backend


class ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def compile_recording(model, **options):
    """``torch.compile`` with the taskmap backend, and the runners it hands back to dynamo."""
    runners = []

    def backend(gm, example_inputs):
        runners.append(taskmap_backend(gm, example_inputs, options=options))
        return runners[-1]
    torch._dynamo.reset()
    return torch.compile(model, backend=backend), runners


def test_parameters_and_buffers_become_constants():
    model = ConvBn().eval()
    x = torch.randn(2, 8, 10, 10)
    fast, runners = compile_recording(model)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    runner, = runners
    assert len(runner.frozen) == 5                 # conv weight, bn weight / bias / mean / var
    (imported, cg), = runner.graphs.values()
    assert len(cg.graph.inputs) == 1               # only x
    assert len(cg.steps) == 1                      # conv + folded bn + relu: one kernel


def test_in_place_weight_update_recompiles():
    model = ConvBn().eval()
    x = torch.randn(1, 8, 9, 9)
    fast, runners = compile_recording(model)
    with torch.no_grad():
        fast(x)
        model.conv.weight.mul_(-2.0)
        model.bn.running_mean.add_(0.25)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    runner, = runners
    assert len(runner.graphs) == 1                 # the stale graph was dropped


def test_freeze_off_keeps_parameters_as_inputs():
    model = ConvBn().eval()
    x = torch.randn(1, 8, 9, 9)
    fast, runners = compile_recording(model, freeze=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
        model.conv.weight.mul_(0.5)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    runner, = runners
    assert not runner.frozen
    (imported, cg), = runner.graphs.values()
    assert len(cg.graph.inputs) == 6
