"""Dynamic sizes under ``torch.compile``: the parts of a graph that depend on a symbolic size run
in PyTorch, the static regions between them compile once (:mod:`taskmap.frontend.torch.dynamic`)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskmap.frontend.torch import dynamic, taskmap_backend
from taskmap.frontend.torch.dynamo import DynamoGraph, SplitDynamoGraph


class Conv1D(nn.Module):
    """GPT-2's linear: ``addmm`` with the weight stored (in, out)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) / n_in ** 0.5)
        self.bias = nn.Parameter(torch.randn(n_out) * 0.1)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Decoder(nn.Module):
    """A decode step of a small transformer: projections and an MLP on the new tokens, attention
    over a key / value cache that grows by the new tokens each step."""

    def __init__(self, dim=32, heads=4, layers=3):
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.proj = nn.ModuleList(Conv1D(dim, dim) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(),
                                               nn.Linear(2 * dim, dim)) for _ in range(layers))

    def forward(self, x, *cache):
        b, t, d = x.shape
        new = []
        for i, (qkv, proj, mlp) in enumerate(zip(self.qkv, self.proj, self.mlp)):
            q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in qkv(x).chunk(3, dim=-1))
            k = torch.cat([cache[2 * i], k], dim=2)
            v = torch.cat([cache[2 * i + 1], v], dim=2)
            new += [k, v]
            a = F.scaled_dot_product_attention(q, k, v)
            x = x + proj(a.transpose(1, 2).reshape(b, t, d))
            x = x + mlp(x)
        return (x, *new)


def _compiled(model, dynamic=None, **options):
    runners = []

    def backend(gm, example_inputs):
        runners.append(taskmap_backend(gm, example_inputs, options={"progress": False, **options}))
        return runners[-1]
    torch._dynamo.reset()
    return torch.compile(model, backend=backend, dynamic=dynamic), runners


def _cache(layers, length, batch=2, heads=4, dim=32):
    return [torch.randn(batch, heads, length, dim // heads) for _ in range(2 * layers)]


def test_decode_loop_compiles_once():
    """Every cache length runs through one split graph: its static regions (the layers' linears,
    norms and MLP, which do not depend on the length) compile once; the concatenations and the
    attention run in PyTorch.  Numerics match eager at every length."""
    torch.manual_seed(0)
    model = Decoder().eval()
    fast, runners = _compiled(model)
    with torch.no_grad():
        for length in (5, 6, 9, 17):
            x, cache = torch.randn(2, 1, 32), _cache(3, length)
            got, want = fast(x, *cache), model(x, *cache)
            assert len(got) == len(want) == 7 and got[1].shape == (2, 4, length + 1, 8)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    first, runner = runners
    assert type(first) is DynamoGraph and isinstance(runner, SplitDynamoGraph) and runner.compiles == 1
    split = runner.split[1]
    compiled = split.compiled
    # the first layer's qkv, then one region per attention (proj + MLP + next qkv), the last MLP
    assert len(compiled) == 4 and all(isinstance(r, DynamoGraph) and r.compiles == 1 for r in compiled)
    names = [[dynamic._name(n) for n in r.nodes] for r in split.regions if not r.static]
    assert all("cat" in n and "scaled_dot_product_attention" in n for n in names)
    assert not any("linear" in n or "addmm" in n or "layer_norm" in n for n in names)
    assert dynamic.static_share(split.regions) > 0.9
    # the frozen weights (get_attr) keep their shapes: the same work estimates as with them as inputs
    assert [r.work for r in split.regions] == [r.work for r in dynamic.regions(runner.gm)]


def test_in_place_weight_update_splits_again():
    torch.manual_seed(1)
    model = Decoder(layers=1).eval()
    fast, runners = _compiled(model)
    x = torch.randn(2, 1, 32)
    with torch.no_grad():
        for length in (6, 7):
            cache = _cache(1, length)
            torch.testing.assert_close(fast(x, *cache)[0], model(x, *cache)[0], rtol=1e-3, atol=1e-4)
        model.proj[0].weight.mul_(-2.0)
        cache = _cache(1, 8)
        torch.testing.assert_close(fast(x, *cache)[0], model(x, *cache)[0], rtol=1e-3, atol=1e-4)
    assert isinstance(runners[-1], SplitDynamoGraph) and runners[-1].compiles == 2


def test_auto_specializes_when_the_work_depends_on_the_size():
    """``dynamic=True`` makes the batch symbolic too: every matmul's shape is, so splitting
    would leave nothing to compile; ``auto`` compiles a graph per shape instead.  ``split``
    forced runs it all in PyTorch.  Specialized, a shape met once runs in PyTorch: a prompt
    length is not worth a compile until it comes again.  (Dynamo passes the layer norms' ``eps`` as 0-d tensors read
    by ``.item()`` here: they are compiled in as values.)"""
    torch.manual_seed(2)
    model = Decoder(layers=2).eval()
    for mode, kind in (("auto", DynamoGraph), ("split", SplitDynamoGraph), ("specialize", DynamoGraph)):
        fast, runners = _compiled(model, dynamic=True, dynamic_sizes=mode)
        with torch.no_grad():
            for batch, length in ((3, 5), (2, 7), (3, 5), (2, 7), (3, 5)):
                x, cache = torch.randn(batch, 1, 32), _cache(2, length, batch)
                for a, b in zip(fast(x, *cache), model(x, *cache)):
                    torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
        [runner] = runners
        assert type(runner) is kind and len(runner.scalars) == 2, mode
        if kind is SplitDynamoGraph:
            assert runner.split[1].compiled == []
        else:   # a shape compiles at its second call (COMPILE_AT): its first ran in PyTorch
            assert runner.compiles == 2 and runner.eager_calls == 2 and len(runner.graphs) == 2
    with pytest.raises(Exception, match="dynamic_sizes: one of auto, split, specialize"):
        _compiled(model, dynamic_sizes="always")[0](x, *cache)
    with pytest.raises(Exception, match="compile_at: a positive int"):
        _compiled(model, compile_at=0)[0](x, *cache)
    torch._dynamo.reset()


def test_regions_as_soon_as_possible():
    """A call joins the first region of its kind after everything it reads: independent static
    work placed after a dynamic call in program order still lands in the first region."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x, y):
            s = torch.cat([y, y], dim=0).sum(0, keepdim=True)     # depends on y's dynamic length
            u = self.a(x)                                           # does not: region 0
            return self.b(u + s)                                    # reads both: region 2
    seen = []

    def backend(gm, example_inputs):
        seen.append(dynamic.regions(gm))
        return gm
    torch._dynamo.reset()
    model = M().eval()
    y = torch.randn(5, 4)
    torch._dynamo.mark_dynamic(y, 0)
    torch.compile(model, backend=backend)(torch.randn(2, 4), y)
    parts = seen[-1]
    kinds = [(r.index, r.static, sorted({dynamic._name(n) for n in r.nodes})) for r in parts]
    assert [k[:2] for k in kinds] == [(0, True), (1, False), (2, True)]
    assert "linear" in kinds[0][2] and "cat" in kinds[1][2] and "linear" in kinds[2][2]
    assert parts[0].compiled and parts[2].compiled and not parts[1].compiled
    torch._dynamo.reset()


def test_debug_prints_the_regions(monkeypatch, capsys):
    monkeypatch.setenv("TASKMAP_DEBUG", "dynamic")
    torch.manual_seed(3)
    model = Decoder(layers=2).eval()
    fast, _ = _compiled(model)
    with torch.no_grad():
        for length in (5, 6):
            fast(torch.randn(2, 1, 32), *_cache(2, length))
    err = capsys.readouterr().err
    assert "a graph with symbolic sizes: split; the compiled regions would hold" in err
    lines = [line for line in err.splitlines() if line.strip().startswith("region")]
    assert len(lines) == 5 and "compiled" in lines[0] and "linear" in lines[0]
    assert "PyTorch" in lines[1] and "cat, scaled_dot_product_attention" in lines[1]
    torch._dynamo.reset()


def test_a_graph_writing_in_place_is_not_split():
    """RWKV's reference recurrence: a zero tensor of the dynamic length written step by step
    (``out[:, t] = ...``) and read after.  Split, a reader placed before the writes read zeros;
    such graphs are specialized per shape, even when a split is asked for."""
    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            out = torch.zeros_like(x)
            state = torch.zeros_like(x[:, 0])
            for t in range(4):
                state = torch.tanh(self.lin(x[:, t]) + state)
                out[:, t] = state
            return out * 2 + 1

    torch.manual_seed(4)
    model = Recurrent().eval()
    fast, runners = _compiled(model, dynamic_sizes="split")
    with torch.no_grad():
        for length in (6, 7, 7, 9):
            x = torch.randn(2, length, 8)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    assert dynamic.writes(runners[-1].gm) and type(runners[-1]) is DynamoGraph
    torch._dynamo.reset()
