"""Capturing a model for ``taskmap.compile`` stays cheap: the fx trace records only the model's
source line per node (without importing ``torch._dynamo``), and the model is not run eagerly —
unless ``TASKMAP_DEBUG=shapes`` asks for every inferred shape to be checked against PyTorch's.
A forward that fx traces and that returns a dict subclass (transformers' ``ModelOutput``) returns
that type compiled too (fx records a plain dict)."""
import collections
import subprocess
import sys

import pytest

import torch
from torch import nn

import taskmap
from taskmap.frontend.torch.capture import try_symbolic_trace


class Counting(nn.Module):
    """Counts the calls of its layer on real tensors (a forward hook; tracing does not run it)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.eager_calls = 0
        self.lin.register_forward_hook(self._count)

    def _count(self, module, args, out) -> None:
        if isinstance(args[0], torch.Tensor):
            self.eager_calls += 1

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2.0


def test_nodes_record_the_models_source_line():
    gm = try_symbolic_trace(Counting())
    (relu,) = [n for n in gm.graph.nodes if n.target is torch.relu]
    assert 'test_capture.py", line' in relu.stack_trace
    assert "in forward" in relu.stack_trace and "return torch.relu(self.lin(x)) * 2.0" in relu.stack_trace


def test_compile_does_not_run_the_model(monkeypatch):
    monkeypatch.delenv("TASKMAP_DEBUG", raising=False)
    model = Counting().eval()
    x = torch.randn(3, 8)
    fast = taskmap.compile(model, x, progress=False)
    got = fast(x)
    assert model.eager_calls == 0
    torch.testing.assert_close(got, torch.relu(model.lin(x)) * 2.0)
    (graph_module,) = fast._traces.values()
    assert all("tensor_meta" not in n.meta for n in graph_module.graph.nodes)


def test_debug_shapes_checks_against_pytorch(monkeypatch):
    monkeypatch.setenv("TASKMAP_DEBUG", "shapes")
    model = Counting().eval()
    fast = taskmap.compile(model, torch.randn(3, 8), progress=False)
    assert model.eager_calls == 1
    metas = [n.meta["tensor_meta"] for n in next(iter(fast._traces.values())).graph.nodes if n.op == "call_function"]
    assert metas and all(tuple(m.shape) == (3, 4) for m in metas)


def test_tracing_does_not_import_dynamo():
    code = ("import sys, torch\n"
            "from taskmap.frontend.torch.capture import try_symbolic_trace\n"
            "gm = try_symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))\n"
            "assert gm is not None\n"
            "assert 'torch._dynamo' not in sys.modules, 'tracing imported torch._dynamo'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_many_models_sharing_a_forward_that_only_dynamo_captures():
    # nn.ConvTranspose2d's forward defeats fx; captured by torch._dynamo.export, each instance adds
    # an entry to that forward's code cache: past dynamo's recompile limit (8) the ninth export
    # failed outright.  Twelve instances compile and match.
    assert try_symbolic_trace(nn.ConvTranspose2d(2, 3, 3)) is None
    x = torch.randn(1, 2, 5, 5)
    for k in range(12):
        m = nn.ConvTranspose2d(2, 3, 3, stride=1 + k % 2).eval()
        fast = taskmap.compile(m, progress=False, capture="dynamo")
        torch.testing.assert_close(fast(x), m(x), rtol=1e-4, atol=1e-5)
        assert next(iter(fast.entries.values())).capture.tracer == "torch._dynamo.export"


class Result(collections.OrderedDict):
    """A result type of a forward, as transformers' ``ModelOutput`` is (a dict subclass)."""


class Keyed(nn.Module):
    def __init__(self, wrap) -> None:
        super().__init__()
        self.lin, self.wrap = nn.Linear(8, 4), wrap

    def forward(self, x):
        return self.wrap(torch.relu(self.lin(x)), x * 2.0)


def _model_output(y, z):
    from transformers.modeling_outputs import BaseModelOutput
    return BaseModelOutput(last_hidden_state=y, hidden_states=(z,))


@pytest.mark.parametrize("kind", ["ordered-dict", "model-output", "dict"])
def test_a_traced_forward_returns_its_dict_type(kind):
    if kind == "model-output":
        pytest.importorskip("transformers")
    wrap = {"ordered-dict": lambda y, z: Result(y=y, z=z), "model-output": _model_output,
            "dict": lambda y, z: {"y": y, "z": z}}[kind]
    model = Keyed(wrap).eval()
    assert try_symbolic_trace(model) is not None
    x = torch.randn(3, 8)
    fast = taskmap.compile(model, x, progress=False)
    got, want = fast(x), model(x)
    assert type(got) is type(want) and list(got.keys()) == list(want.keys())
    for g, w in zip(torch.utils._pytree.tree_leaves(dict(got)), torch.utils._pytree.tree_leaves(dict(want))):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
