"""``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` unrolled by the frontend (``ops_rnn``), and their cells:
every configuration that converts — layers, directions, batch-first, no bias, an initial state or
none, unbatched input, an LSTM's projections — against eager PyTorch through each capture
(torch.fx's leaf module, torch.export's ``aten.lstm.input``, dynamo's ``torch.lstm``), with no op
left to PyTorch; the configurations that do not convert are named; and tensors passed in a tuple
argument are inputs, not constants."""
import pytest
import torch
from torch import nn

import taskmap
from taskmap.errors import UnsupportedOpsError

CONFIGS = [dict(), dict(num_layers=2, batch_first=True), dict(num_layers=2, bidirectional=True),
           dict(bias=False, batch_first=True, bidirectional=True)]


class Recurrent(nn.Module):
    """An RNN layer between converted ops."""

    def __init__(self, kind, **kw):
        super().__init__()
        self.proj = nn.Linear(12, 8)
        self.rnn = kind(8, 16, **kw)
        self.head = nn.Linear(16 * (2 if kw.get("bidirectional") else 1), 4)

    def forward(self, x):
        y, state = self.rnn(torch.tanh(self.proj(x)))
        return self.head(torch.relu(y)), state


def _close(got, want):
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def relu_rnn(*args, **kw):
    return nn.RNN(*args, nonlinearity="relu", **kw)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN, relu_rnn], ids=["lstm", "gru", "rnn", "rnn-relu"])
@pytest.mark.parametrize("config", CONFIGS, ids=["plain", "2-layers-batch-first", "bidirectional", "no-bias"])
@pytest.mark.parametrize("capture", ["auto", "export", "dynamo"])
def test_rnn_layers_match_eager(kind, config, capture):
    torch.manual_seed(0)
    model = Recurrent(kind, **config).eval()
    x = torch.randn(3, 5, 12)   # (5, 3) steps / batch, or (3, 5) batch-first
    fast = taskmap.compile(model, progress=False, capture=capture)
    with torch.no_grad():
        _close(fast(x), model(x))
        x2 = torch.randn(3, 5, 12)
        _close(fast(x2), model(x2))
    assert "run by PyTorch" not in fast.summary()


class Stateful(nn.Module):
    def __init__(self, kind, batch_first):
        super().__init__()
        self.rnn = kind(12, 16, num_layers=2, batch_first=batch_first)

    def forward(self, x, state):
        return self.rnn(x, state)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN], ids=["lstm", "gru", "rnn"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("capture", ["auto", "dynamo"])
def test_initial_states_and_unbatched_inputs(kind, batch_first, batched, capture):
    """The state passed in (a tuple for the LSTM: two graph inputs, not constants) carries over.
    (Dynamo records the unbatched LSTM's output with a symbolic length among fixed-size states:
    the frontend's shape check pairs each output with its own record.)"""
    torch.manual_seed(1)
    model = Stateful(kind, batch_first).eval()
    x = torch.randn(*((2, 5) if batch_first else (5, 2)) if batched else (5,), 12)

    def state():
        s = torch.randn(2, *((2,) if batched else ()), 16)
        return (s, torch.randn_like(s)) if kind is nn.LSTM else s
    fast = taskmap.compile(model, progress=False, capture=capture)
    with torch.no_grad():
        for _ in range(2):
            s = state()
            _close(fast(x, s), model(x, s))


@pytest.mark.parametrize("config", [dict(proj_size=8), dict(proj_size=4, num_layers=2, bidirectional=True),
                                    dict(proj_size=4, bias=False, batch_first=True, num_layers=2)],
                         ids=["plain", "2-layers-bidirectional", "no-bias-batch-first"])
@pytest.mark.parametrize("capture", ["auto", "export", "dynamo"])
def test_lstm_projections_match_eager(config, capture):
    """``proj_size``: each step's state projected by ``W_hr`` (the states of ``proj_size`` and
    ``hidden_size`` features: the initial ones given or zeros)."""
    torch.manual_seed(4)
    model = Recurrent(nn.LSTM, **config).eval()
    model.head = nn.Linear(config["proj_size"] * (2 if config.get("bidirectional") else 1), 4)
    x = torch.randn(3, 5, 12)
    fast = taskmap.compile(model, progress=False, capture=capture)
    with torch.no_grad():
        _close(fast(x), model(x))
    assert "run by PyTorch" not in fast.summary()
    stateful = nn.LSTM(12, 16, proj_size=8, num_layers=2).eval()
    state = (torch.randn(2, 5, 8), torch.randn(2, 5, 16))     # x: 3 steps of a batch of 5
    fast = taskmap.compile(stateful, progress=False, capture=capture)
    with torch.no_grad():
        _close(fast(x, state), stateful(x, state))


class Cells(nn.Module):
    """A decoder-style loop of cells: an LSTM cell, a GRU cell on its state, a plain RNN cell on
    that (its first call without a state)."""

    def __init__(self, bias=True, nonlinearity="tanh"):
        super().__init__()
        self.lstm, self.gru = nn.LSTMCell(12, 16, bias=bias), nn.GRUCell(16, 16, bias=bias)
        self.rnn = nn.RNNCell(16, 8, bias=bias, nonlinearity=nonlinearity)

    def forward(self, x):
        h = c = g = torch.zeros(x.shape[1], 16)
        r, outs = None, []
        for t in range(x.shape[0]):
            h, c = self.lstm(x[t], (h, c))
            g = self.gru(h, g)
            r = self.rnn(g) if r is None else self.rnn(g, r)
            outs.append(r)
        return torch.stack(outs), c


@pytest.mark.parametrize("config", [dict(), dict(bias=False, nonlinearity="relu")], ids=["plain", "no-bias-relu"])
@pytest.mark.parametrize("capture", ["auto", "export", "dynamo"])
def test_cells_match_eager(config, capture):
    torch.manual_seed(5)
    model = Cells(**config).eval()
    x = torch.randn(6, 3, 12)
    fast = taskmap.compile(model, progress=False, capture=capture)
    with torch.no_grad():
        _close(fast(x), model(x))
    assert "run by PyTorch" not in fast.summary()
    cell = nn.LSTMCell(12, 16).eval()        # unbatched, no state
    fast = taskmap.compile(cell, progress=False, capture=capture)
    with torch.no_grad():
        _close(fast(x[0, 0]), cell(x[0, 0]))


def test_rnn_configurations_that_do_not_convert_are_named():
    """... and with ``fallback=True`` run by PyTorch, their nested results ``(output, (h, c))``
    kept in their structure."""
    model = Recurrent(nn.LSTM).eval()
    x = torch.randn(1025, 1, 12)
    with pytest.raises(UnsupportedOpsError, match="lstm over 1025 steps"):
        taskmap.compile(model, progress=False)(x)
    assert all(w.device.type == "cpu" for w in model.rnn._flat_weights)   # the module still runs eagerly
    fast = taskmap.compile(model, progress=False, fallback=True)
    with torch.no_grad():
        _close(fast(x), model(x))
    assert "run by PyTorch: LSTM" in fast.summary()
    train = Recurrent(nn.GRU, num_layers=2, dropout=0.5).train()
    with pytest.raises(UnsupportedOpsError, match="dropout in training mode"):
        taskmap.compile(train, progress=False)(torch.randn(2, 5, 12))


def test_tensors_in_a_tuple_argument_are_inputs():
    """A forward taking tensors in a tuple: each call's tensors are used (the torch.fx capture
    would have kept them as Python values, so such models go through torch.export)."""
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, pair):
            return self.lin(x) + pair[0] * pair[1]

    model = Pair().eval()
    fast = taskmap.compile(model, progress=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            pair = (torch.randn(2, 4), torch.randn(2, 4))
            torch.testing.assert_close(fast(x, pair), model(x, pair))


def test_long_sequences_stack_in_two_levels():
    """40 steps: the outputs stacked as 6 concatenations of 7 steps and one of those (one of 40
    would be a chain of 40 selects)."""
    torch.manual_seed(2)
    model = Recurrent(nn.LSTM).eval()
    x = torch.randn(40, 2, 12)
    fast = taskmap.compile(model, progress=False)
    with torch.no_grad():
        _close(fast(x), model(x))


def test_hundreds_of_steps_compile_each_kernel_once():
    """300 steps of two layers (past the old limit of 128): each step reads its slice of the input
    projection as a view, writes its output inside the stacked sequence (which the next layer's
    projection reads as one array, with no copy), so every step of a layer runs the same few
    kernels, compiled once."""
    torch.manual_seed(3)
    model = Recurrent(nn.LSTM, num_layers=2).eval()
    x = torch.randn(300, 1, 12)
    fast = taskmap.compile(model, progress=False)
    with torch.no_grad():
        _close(fast(x), model(x))
    (entry,) = fast.entries.values()
    cg = entry.compiled
    kernels = {id(k) for st in cg.steps for k in st.kernels}
    assert len(cg.steps) > 4 * 300 and len(kernels) <= 16, len(kernels)
    assert max(len(st.inputs) for st in cg.steps) < 40        # no copy kernel takes a part per step
    assert not [st for st in cg.steps if st.view is not None]
    outputs = {cg.slots[t] for t in cg.graph.outputs}
    concats = [st for st in cg.steps if st.kind.name == "CONCAT"]
    assert len(concats) == 2 and all(st.outputs[0] in outputs for st in concats)   # only the final (h, c)


def test_torch_compile_with_dynamo_allowed_to_trace_rnns():
    """``torch.compile(backend="taskmap")`` gets the recurrent layer's graph once dynamo's
    ``allow_rnn`` is on (without it dynamo runs the layer in PyTorch, as the README says); with
    ``fallback`` off, taskmap converted all of it."""
    from torch._dynamo.utils import counters

    torch.manual_seed(6)
    model = Recurrent(nn.GRU, num_layers=2).eval()
    x = torch.randn(5, 3, 12)
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(allow_rnn=True), torch.no_grad():
        _close(torch.compile(model, backend="taskmap", options={"fallback": False})(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1
