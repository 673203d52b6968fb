"""PyTorch frontend: the op registry against eager PyTorch, unsupported-op reporting, fallback,
recompilation, static shapes, save/load, summary, debug dumps."""
import collections
import operator
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.nn.functional as F
from torch import nn

import taskmap
from taskmap.errors import EagerFallbackWarning, LaunchError, UnsupportedOpsError
from taskmap.frontend.torch import registered
from taskmap.testing.strategies import shapes

torch.manual_seed(0)


def check(model, *inputs, rtol=1e-3, atol=1e-4, **options):
    model = model.eval() if isinstance(model, nn.Module) else model
    fast = taskmap.compile(model, progress=False, **options)
    with torch.no_grad():
        want = model(*inputs)
    got = fast(*inputs)
    _same(got, want, rtol, atol)
    return fast


def _same(got, want, rtol, atol):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want)
        for k in want:
            _same(got[k], want[k], rtol, atol)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for a, b in zip(got, want):
            _same(a, b, rtol, atol)
    else:
        assert got == want


class Fn1(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a):
        return self.fn(a)


class Fn2(Fn1):
    def forward(self, a, b):
        return self.fn(a, b)


class Fn3(Fn1):
    def forward(self, a, b, c):
        return self.fn(a, b, c)


def Fn(fn, n=1):
    return (Fn1, Fn2, Fn3)[n - 1](fn)


x4 = torch.randn(2, 3, 8, 8)
x2 = torch.randn(6, 16)


ACTIVATIONS = [
    torch.relu, F.relu6, F.gelu, lambda x: F.gelu(x, approximate="tanh"), F.silu, torch.sigmoid, torch.tanh,
    F.hardswish, lambda x: F.softmax(x, dim=-1), lambda x: F.log_softmax(x, 1), lambda x: torch.clamp(x, -0.5, 0.7),
    lambda x: F.hardtanh(x), torch.exp, lambda x: torch.sqrt(x.abs() + 1), lambda x: -x, lambda x: x.abs(),
    lambda x: F.leaky_relu(x, 0.2), nn.LeakyReLU(), F.elu, nn.ELU(0.5), F.softplus, nn.Softplus(2.0, 3.0), F.mish,
    nn.Hardsigmoid(), F.logsigmoid, nn.SELU(), lambda x: torch.floor(x * 3) + torch.ceil(x) + torch.round(x * 2),
    lambda x: torch.trunc(x * 3) * torch.sign(x), lambda x: torch.reciprocal(x.abs() + 1) + torch.square(x),
    lambda x: torch.expm1(x) + torch.log1p(x.abs()), lambda x: x.clamp_min(0.1) + x.clamp_max(-0.2),
    lambda x: torch.clamp(x, min=x[:1], max=x[1:2].abs()),
    lambda x: torch.atan(x) + torch.arcsin(x.tanh()) + torch.sinh(x) + x.cosh() + torch.tan(x * 0.3),
]


@pytest.mark.parametrize("fn", ACTIVATIONS, ids=lambda f: getattr(f, "__name__", "lambda"))
def test_activations(fn):
    check(Fn(fn), x2)


SHAPE_OPS = [
    lambda x: x.view(2, -1), lambda x: x.reshape(6, 64).contiguous(), lambda x: torch.flatten(x, 1),
    lambda x: x.permute(0, 2, 3, 1), lambda x: x.transpose(1, 3), lambda x: x.unsqueeze(1).squeeze(1),
    lambda x: x[:, 1:, ::2, -1], lambda x: x[0, ..., None], lambda x: x[..., 2:5].expand(3, 2, 3, 8, 3),
    lambda x: torch.cat([x, x * 2], dim=1), lambda x: torch.split(x, 2, dim=2)[1] + 1,
    lambda x: sum(torch.chunk(x, 3, dim=1)), lambda x: torch.stack([x, x], 0), lambda x: F.pad(x, (1, 2, 0, 3)),
    lambda x: x.size(0) * x + x.shape[-1], lambda x: x.mean((2, 3), keepdim=True), lambda x: x.sum(1),
    lambda x: x.amax(-1), lambda x: x.var(1), lambda x: x.narrow(2, 1, 3), lambda x: x.repeat(1, 2, 1, 1),
]


@pytest.mark.parametrize("fn", SHAPE_OPS, ids=lambda f: "shape")
def test_shapes_indexing_joining(fn):
    check(Fn(fn), x4)


ARITHMETIC = [
    lambda a, b: a + b * 2 - 1, lambda a, b: a / (b.abs() + 1), lambda a, b: torch.maximum(a, b) ** 2,
    lambda a, b: (a > b).float() + (a <= 0.5).to(torch.float32), lambda a, b: torch.where(a > b, a, b),
    lambda a, b: torch.where(a > 0, a, 0.0), lambda a, b: a.masked_fill(b > 0, -1e4),
    lambda a, b: a.where(a > b, b * 2), lambda a, b: (a + 1).where(b > 0, -1.0),   # the tensor is the value
    lambda a, b: 2.0 - a, lambda a, b: torch.add(a, b, alpha=0.5), lambda a, b: (a == a).int() * 3,
    lambda a, b: (a * 10) // b, lambda a, b: (a * 10) % b, lambda a, b: torch.fmod(a * 10, b) + a % 0.3,
    lambda a, b: torch.div(a * 10, b, rounding_mode="floor") + torch.div(a, 0.07, rounding_mode="trunc"),
]


@pytest.mark.parametrize("fn", ARITHMETIC)
def test_arithmetic_and_comparisons(fn):
    check(Fn(fn, 2), x2, torch.randn(6, 16))


def test_integer_division_and_remainders():
    # position arithmetic as models write it: ids // k, ids % k, div(..., rounding_mode), fmod
    ids = torch.randint(-50, 50, (3, 17))
    fn = lambda i: torch.stack([i // 4, i % 5, torch.div(i, 3, rounding_mode="trunc"),  # noqa: E731
                                torch.div(i, -6, rounding_mode="floor"), torch.fmod(i, 7), torch.remainder(i, -4)])
    fast = check(Fn(fn), ids)
    assert fast(ids).dtype == torch.int64


MATMULS = [
    (torch.matmul, [(2, 3, 5, 8), (8, 4)]), (torch.bmm, [(3, 5, 8), (3, 8, 4)]),
    (lambda a, b: a @ b.transpose(-1, -2), [(2, 5, 8), (2, 4, 8)]),
    (lambda i, a, b: torch.addmm(i, a, b, beta=0.5, alpha=2.0), [(4,), (3, 8), (8, 4)]),
    (lambda i, a, b: torch.baddbmm(i, a, b, alpha=0.25), [(2, 3, 4), (2, 3, 8), (2, 8, 4)]),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(1, 2, 16, 8)] * 3),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), [(2, 6, 16, 8), (2, 2, 12, 8),
                                                                               (2, 2, 12, 8)]),
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
     [(6, 16, 8), (3, 16, 8), (3, 16, 8)]),
]


@pytest.mark.parametrize("fn, shapes", MATMULS)
def test_matmul_family(fn, shapes):
    check(Fn(fn, len(shapes)), *[torch.randn(s) for s in shapes])


def test_layers():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4), nn.BatchNorm2d(8), nn.ReLU6(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.MaxPool2d(2), nn.AvgPool2d(2, ceil_mode=True), nn.AdaptiveAvgPool2d((2, 2)),
        nn.Flatten(), nn.Dropout(0.3), nn.Linear(32, 10), nn.LayerNorm(10), nn.GELU(), nn.Hardswish())
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    check(model, torch.randn(2, 3, 16, 16))


def test_embedding_and_constants():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.register_buffer("pos", torch.randn(1, 10, 16))

        def forward(self, ids):
            n = ids.shape[1]
            pos = torch.arange(n)                    # folded into a constant
            mask = torch.ones(n, n).tril() > 0       # folded too
            h = self.emb(ids) + self.pos[:, :n] + pos[None, :, None].float() * torch.full((16,), 0.5)
            s = (h @ h.transpose(1, 2)).masked_fill(~mask, float("-inf"))
            return {"h": h, "p": s.softmax(-1), "first": F.embedding(ids[:, 0], self.emb.weight)}

    check(M(), torch.randint(0, 50, (2, 7)))


def test_casts_and_dtypes():
    check(Fn(lambda x: (x * 10).long().float().half().float() + x.to(torch.float64).float()), x2)


def test_registry_coverage():
    reg = registered()
    for f in (F.linear, F.conv2d, F.batch_norm, F.layer_norm, F.embedding, F.relu, F.relu6, F.gelu, F.silu,
              torch.sigmoid, torch.tanh, F.hardswish, F.softmax, F.max_pool2d, F.avg_pool2d, F.adaptive_avg_pool2d,
              F.adaptive_max_pool2d, torch.flatten, torch.reshape, torch.permute, torch.transpose, operator.getitem,
              torch.cat, torch.split, torch.chunk, operator.add, torch.sub, torch.mul, torch.div, torch.eq, torch.lt,
              operator.floordiv, operator.mod, torch.floor_divide, torch.remainder, torch.fmod,
              torch.matmul, torch.bmm, torch.addmm, torch.baddbmm, F.scaled_dot_product_attention, torch.where,
              F.dropout):
        assert f in reg["functions"], f
    for m in ("view", "reshape", "permute", "transpose", "contiguous", "masked_fill", "to", "float", "flatten",
              "size", "split", "chunk"):
        assert m in reg["methods"], m
    for cls in (nn.Linear, nn.Conv2d, nn.BatchNorm2d, nn.LayerNorm, nn.Embedding, nn.ReLU, nn.GELU, nn.MaxPool2d,
                nn.AdaptiveAvgPool2d, nn.Dropout, nn.Flatten):
        assert cls in reg["modules"], cls


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = torch.special.erfcx(self.lin(x))
        z = torch.nanmedian(y, dim=-1, keepdim=True).values
        return torch.relu(z) + torch.digamma(x)


def test_unsupported_ops_all_reported():
    with pytest.raises(UnsupportedOpsError) as e:
        taskmap.compile(Unsupported(), torch.randn(4, 8), progress=False)
    text = str(e.value)
    assert "3 unsupported operator(s)" in text
    for name in ("torch.special.erfcx at node", "torch.nanmedian", "torch.digamma"):
        assert name in text
    assert "fallback=True" in text and len(e.value.ops) == 3
    assert 'test_frontend_torch.py", line' in text and "in forward: y = torch.special.erfcx(self.lin(x))" in text


def test_fallback_runs_in_pytorch():
    fast = check(Unsupported(), torch.randn(4, 8), fallback=True)
    assert "run by PyTorch: torch.digamma, torch.nanmedian, torch.special.erfcx" in fast.summary()


def test_fallback_op_reading_one_tensor_twice():
    """A PyTorch-run op given the same tensor twice gets it twice (WavLM's
    ``multi_head_attention_forward`` reads one zero-size bias in two places)."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            a = self.lin(x).abs() + 1.0
            return torch.igamma(a, a) * 2.0

    fast = check(Twice(), torch.randn(4, 8), fallback=True)
    assert "run by PyTorch: torch.igamma" in fast.summary()


class RandomShuffle(nn.Module):
    """ViT-MAE's random masking: noise drawn in the forward (with sizes only: foldable but random)."""

    def forward(self, x):
        noise = torch.rand(x.shape[0], x.shape[1])
        order = noise.argsort(1)
        return torch.gather(x, 1, order[..., None].expand(x.shape)) * 2


def test_random_draws_are_not_frozen_into_the_graph():
    x = torch.randn(3, 16, 4)
    with pytest.raises(UnsupportedOpsError, match=r"torch.rand at .*draws random numbers, anew on every call"):
        taskmap.compile(RandomShuffle(), progress=False)(x)
    fast = taskmap.compile(RandomShuffle(), progress=False, fallback=True)
    a, b = fast(x), fast(x)
    assert not torch.equal(a, b)              # a new permutation per call, as in eager
    torch.testing.assert_close(a.sort(1).values, (x * 2).sort(1).values)
    assert "run by PyTorch: torch.rand" in fast.summary()


class EmptyParts(nn.Module):
    def forward(self, x):
        rot, rest = x[..., :16], x[..., 16:]            # Phi-3's rotary split with nothing left over
        return (torch.cat([rot * 2, rest], -1) + 1, rest.sum(-1) + x[..., 0], rest.prod(-1),
                torch.nan_to_num(rest.mean(-1), nan=7.0))      # the mean of nothing is NaN


def test_empty_parts_of_concatenations_and_reductions():
    fast = check(EmptyParts(), torch.randn(2, 4, 16))
    assert "run by PyTorch" not in fast.summary()


def test_recompile_static_shapes_summary_and_debug(capsys, monkeypatch):
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    monkeypatch.setenv("TASKMAP_DEBUG", "graph")
    fast = taskmap.compile(model, torch.randn(2, 8), progress=False)
    assert "LINEAR(input_1, 0.weight:f32[4, 8]" in capsys.readouterr().err
    monkeypatch.delenv("TASKMAP_DEBUG")
    for n in (2, 2, 5):
        torch.testing.assert_close(fast(x := torch.randn(n, 8)), model(x).detach())
    assert len(fast.entries) == 2 and fast.cache_hits == 2
    s = fast.summary()
    for word in ("2 graph(s)", "cache hits 2", "ops", "fusion groups", "compiled kernels", "planned memory"):
        assert word in s
    static = taskmap.compile(model, torch.randn(2, 8), static_shapes=True, progress=False)
    msg = r"static_shapes=True for inputs \(float32\[2, 8\]\); got \(float32\[3, 8\]\)"
    with pytest.raises(LaunchError, match=msg):
        static(torch.randn(3, 8))


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x, y=None, scale: float = 2.0):
        out = self.lin(x) * scale
        return out if y is None else out + y


def test_calls_bind_like_the_signature():
    """Positional, keyword and default arguments reach the graph their values were compiled
    for (calls of tensors only take a direct key; the others bind through the signature)."""
    model = Scaled().eval()
    fast = taskmap.compile(model, progress=False)
    x, y = torch.randn(3, 8), torch.randn(3, 4)
    calls = [((x,), {}), ((x,), {"scale": 0.5}), ((x, None, 0.5), {}), ((x, y), {}), ((x,), {"y": y}),
             ((x, y, 3.0), {}), ((x,), {}), ((torch.randn(5, 8),), {})]
    for args, kwargs in calls:
        with torch.no_grad():
            want = model(*args, **kwargs)
        torch.testing.assert_close(fast(*args, **kwargs), want, rtol=1e-3, atol=1e-4)
    # (x,) and (x, None, 0.5) / scale=0.5 share graphs with their equals; (x, y) and y=y too
    assert len(fast.entries) == 5 and fast.cache_hits == 3
    with pytest.raises(TypeError, match="multiple values"):
        fast(x, y, scale=1.0, x=x)


class Summed(nn.Module):
    def forward(self, *xs, scale=1.0):
        if xs[0].shape[0] > 1:                   # control flow on a size: captured by dynamo, not fx
            return sum(xs) * scale
        return xs[0]


class NonZero(nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0)


class DataDependent(nn.Module):
    def forward(self, x):
        return x * 2 if x.sum().item() > 0 else x * 3


def test_var_positional_and_uncapturable_models():
    fast = taskmap.compile(Summed().eval(), progress=False)
    xs = [torch.randn(3, 4) for _ in range(3)]
    torch.testing.assert_close(fast(*xs), sum(xs))
    torch.testing.assert_close(fast(*xs[:2], scale=2.0), (xs[0] + xs[1]) * 2.0)
    assert len(fast.entries) == 2
    with pytest.raises(taskmap.errors.UnsupportedError, match=r"torch.nonzero at node .*shape cannot be known"):
        taskmap.compile(NonZero().eval(), torch.randn(3, 4), progress=False)
    with pytest.raises(taskmap.errors.CaptureError, match=r"(?s)DataDependent: taskmap.compile captures the whole "
                       r"forward.*line \d+, in forward.*x.sum\(\).item\(\).*backend=\"taskmap\""):
        taskmap.compile(DataDependent().eval(), torch.randn(3), progress=False)


@pytest.mark.parametrize("which", ["encoder_layer", "encoder", "decoder_layer", "transformer"])
def test_pytorch_transformer_modules_as_the_model(which):
    """PyTorch's transformer modules compiled themselves: the encoder layer as the root module
    (traced with PyTorch's fused fast path off), the encoder (captured by dynamo, which inlines
    attention into ``F.multi_head_attention_forward``), the decoder layer and ``nn.Transformer``
    (no converter: traced through, into the layers they call)."""
    torch.manual_seed(0)
    make = {"encoder_layer": lambda: nn.TransformerEncoderLayer(16, 4, 32, batch_first=True),
            "encoder": lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True,
                                                                                 norm_first=True, activation="gelu"),
                                                     2, enable_nested_tensor=False),
            "decoder_layer": lambda: nn.TransformerDecoderLayer(16, 4, 32, batch_first=True),
            "transformer": lambda: nn.Transformer(16, 4, 1, 1, 32, batch_first=True)}
    model = make[which]().eval()
    args = (torch.randn(2, 6, 16),) + ((torch.randn(2, 7, 16),) if which in ("decoder_layer", "transformer") else ())
    fast = check(model, *args)
    assert not any(u for e in fast.entries.values() for u in e.imported.unsupported)


class CausalTransformer(nn.Module):
    """``nn.Transformer`` with the causal target mask made in the forward, as its docs show: the
    layers compare it against a causal mask to pick a kernel (a branch on data, which the capture
    skips: the mask is applied as given)."""

    def __init__(self):
        super().__init__()
        self.t = nn.Transformer(16, 4, 1, 1, 32, batch_first=True)

    def forward(self, src, tgt):
        return self.t(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1]))


def test_transformer_with_a_causal_mask_made_in_the_forward():
    torch.manual_seed(1)
    fast = check(CausalTransformer().eval(), torch.randn(2, 6, 16), torch.randn(2, 7, 16))
    assert not any(u for e in fast.entries.values() for u in e.imported.unsupported)


def test_training_mode_is_reported():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.5), nn.ReLU()).train()
    with pytest.raises(UnsupportedOpsError, match=r"(?s)2 unsupported.*BatchNorm2d.*training mode \(call "
                       r"model.eval\(\)\).*Dropout"):
        taskmap.compile(model, torch.randn(2, 3, 8, 8), progress=False)


Pair = collections.namedtuple("Pair", "scaled shifted")


class Named(nn.Module):
    def forward(self, x):
        p = Pair(x * 2.0, x + 1.0)
        return Pair(p.scaled.relu(), p[1] * p.scaled)


def test_namedtuple_outputs():
    x = torch.randn(3, 5)
    want = Named()(x)
    for fast in (taskmap.compile(Named(), progress=False), torch.compile(Named(), backend="taskmap")):
        got = fast(x)
        assert type(got) is Pair
        torch.testing.assert_close(tuple(got), tuple(want))


class AddsInPlace(nn.Module):
    def forward(self, x, y):
        x.add_(1.0)
        y[:, 0] = 0.0
        return x * y


class CountsCalls(nn.Module):
    def __init__(self, shaped=False):
        super().__init__()
        self.shaped = shaped
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        if self.shaped and x.shape[0] > 1:          # control flow on a size: captured by dynamo
            x = x * 1.0
        self.count += 1
        return x + self.count


def test_inputs_changed_in_place_are_written_back():
    for compiled in (taskmap.compile(AddsInPlace(), progress=False), torch.compile(AddsInPlace(), backend="taskmap")):
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        xe, ye = x.clone(), y.clone()
        with torch.no_grad():
            for _ in range(2):                      # the second call sees the first one's changes
                torch.testing.assert_close(compiled(x, y), AddsInPlace()(xe, ye))
        torch.testing.assert_close((x, y), (xe, ye))


class BuildsInPlace(nn.Module):
    def forward(self, x):
        m = torch.zeros(4)              # folded to a constant, then changed in place: still constant
        m[1] = 5.0
        m.add_(1.0)
        return x + m


def test_constants_changed_in_place_while_folding():
    x = torch.randn(2, 4)
    torch.testing.assert_close(check(BuildsInPlace(), x)(x), BuildsInPlace()(x))


@pytest.mark.parametrize("shaped", [False, True])
def test_forward_changing_its_buffers_is_refused(shaped):
    model = CountsCalls(shaped).eval()
    with pytest.raises(taskmap.errors.UnsupportedError, match="the forward changes .*count.* in place"):
        taskmap.compile(model, torch.randn(2, 3), progress=False)
    assert type(model.count) is torch.Tensor          # not the fake tensor an export leaves behind


def test_weights_changed_after_compiling_compile_again():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(),
                          nn.Linear(16 * 6 * 6, 10)).eval()
    x = torch.randn(1, 16, 6, 6)
    fast = taskmap.compile(model, x, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-4)
        model[0].weight.mul_(2.0)                     # in place (packed conv weights, folded batch norm)
        model[1].running_mean.add_(0.5)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-4)
        state = {k: torch.rand_like(v) + 0.5 if v.is_floating_point() else v for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-4)
    assert len(fast.entries) == 1


def test_calls_from_many_threads():
    """Threads calling one compiled module at once, from its first call on: the graph compiles
    once, runs one at a time (they share the memory plan's buffers) and every result is right."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 4, 3, padding=1)).eval()
    xs = [torch.randn(1, 3, 24, 24) for _ in range(4)]
    with torch.no_grad():
        wants = [model(x) for x in xs]
    fast = taskmap.compile(model, progress=False)
    errors = []

    def work(k):
        try:
            for _ in range(20):
                torch.testing.assert_close(fast(xs[k]), wants[k], rtol=1e-3, atol=1e-4)
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(fast.entries) == 1


class Bits(nn.Module):
    def forward(self, a, b, m):
        return ((a & 6) | (b ^ a), a << 2, a >> 1, ~a, torch.bitwise_and(a, b), torch.logical_and(a, b),
                torch.logical_not(a), torch.logical_xor(a, m), ~m, m & (a > 0), (a | 1) ^ 3)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_bitwise_and_logical_ops_on_integers(dtype):
    """``&``, ``|``, ``^``, ``~`` and shifts are bitwise on integers and logical on bools;
    ``torch.logical_*`` take any dtype (nonzero is true) and give bools — as in PyTorch."""
    a, b = torch.randint(-20, 20, (4, 5)), torch.randint(-20, 20, (4, 5))
    if dtype == torch.uint8:
        a, b = a.abs(), b.abs()
    a, b, m = a.to(dtype), b.to(dtype), torch.rand(4, 5) > 0.5
    got, want = taskmap.compile(Bits(), progress=False)(a, b, m), Bits()(a, b, m)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


class Padded(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.conv2 = nn.Conv2d(3, 4, 3, padding=(1, 2), padding_mode=mode)
        self.conv1 = nn.Conv1d(3, 4, 3, padding=2, padding_mode=mode)

    def forward(self, x):
        return self.conv2(x), self.conv1(x[:, :, 0]), F.pad(x, (1, 2, 2, 1), mode=self.mode)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_padding_modes(mode):
    """Convolutions with ``padding_mode`` (the input padded first, as PyTorch does) and
    ``F.pad``'s modes (circular: the far ends' slices concatenated)."""
    check(Padded(mode), torch.randn(2, 3, 6, 7))


def test_save_load(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(5)).eval()
    x = torch.randn(1, 3, 6, 6)
    model(x)
    fast = taskmap.compile(model, x, progress=False)
    fast.save(tmp_path / "m.taskmap")
    loaded = taskmap.load(tmp_path / "m.taskmap")
    torch.testing.assert_close(loaded(x), model(x).detach())
    with pytest.raises(LaunchError, match="Pass model= to taskmap.load"):
        loaded(torch.randn(2, 3, 6, 6))
    again = taskmap.load(tmp_path / "m.taskmap", model=model)
    torch.testing.assert_close(again(torch.cat([x, x])), model(torch.cat([x, x])).detach())


def test_torch_compile_backend():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).eval()
    fast = torch.compile(model, backend="taskmap")
    with torch.no_grad():
        for n in (3, 5):
            x = torch.randn(n, 8)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-4)


def test_torch_compile_fallback():
    model = Unsupported().eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="taskmap")(x), model(x), rtol=1e-3, atol=1e-4)


def test_torch_compile_backend_when_gradients_are_needed():
    """Grad mode on and parameters requiring grad: the graph runs in PyTorch (one warning), so
    backward gives eager's gradients; under no_grad the same model runs taskmap's kernels."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    twin = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    twin.load_state_dict(model.state_dict())
    runners = []

    def backend(gm, example_inputs):
        runners.append(taskmap.frontend.torch.taskmap_backend(gm, example_inputs))
        return runners[-1]
    torch._dynamo.reset()
    fast = torch.compile(model, backend=backend)
    x = torch.randn(5, 4)
    with pytest.warns(UserWarning, match="gradients may be needed"):
        fast(x).square().sum().backward()
    twin(x).square().sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert all(not r.graphs for r in runners)          # nothing compiled for the differentiable call
    with torch.no_grad():
        torch.testing.assert_close(fast(x), twin(x), rtol=1e-4, atol=1e-5)
    assert any(r.graphs for r in runners)


def test_backend_registered_by_entry_point():
    code = ("import sys, torch; assert 'taskmap' in torch._dynamo.list_backends(); assert 'taskmap' not in sys.modules;"
            "m = torch.nn.Linear(4, 2); x = torch.randn(3, 4);"
            "torch.testing.assert_close(torch.compile(m, backend='taskmap')(x), m(x).detach()); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_torch_compile_runs_an_uncompilable_graph_in_pytorch():
    """A dynamo graph taskmap cannot compile (here a size read from a tensor after a graph break,
    as in LED's global attention) runs in PyTorch with a warning naming why; with
    ``fallback=False`` the error is raised."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            n = (x > 0).sum()
            torch._dynamo.graph_break()
            y = self.lin(x)
            return y * 2, torch.arange(n) * 3 + y.sum()

    model = M().eval()
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    with torch.no_grad():
        fast = torch.compile(model, backend="taskmap")
        with pytest.warns(taskmap.errors.EagerFallbackWarning, match=r"runs in PyTorch.*torch.arange at node"):
            got = fast(x)
        for a, b in zip(got, model(x)):
            torch.testing.assert_close(a, b)
        torch._dynamo.reset()
        with pytest.raises(Exception, match="torch.arange at node .*shape cannot be known"):
            torch.compile(model, backend="taskmap", options={"fallback": False})(x)
    torch._dynamo.reset()


def test_torch_compile_vmap_runs_in_pytorch():
    """Dynamo inlines ``torch.vmap`` as functorch's batching calls (Mamba's scan under
    torch.compile): the region from its level's opening to its closing runs in PyTorch as one
    op, the rest of the graph in taskmap's kernels; without fallback it is named."""
    class V(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.head = nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            h = torch.relu(self.head(x))
            return torch.vmap(lambda r: self.lin(r).sum() * r)(x).sum(-1, keepdim=True) * 2 + h

    model, x = V().eval(), torch.randn(4, 8)
    seen = []
    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")                  # the graph is not left to PyTorch whole
        got = torch.compile(model, backend=lambda gm, ex: seen.append(taskmap.frontend.torch.taskmap_backend(gm, ex))
                            or seen[-1])(x)
    torch.testing.assert_close(got, model(x))
    (imported, cg), = seen[0].graphs.values()
    assert [op.attrs.description for op in cg.graph.ops if op.kind.name == "TORCH"] == ["torch.vmap (its region)"]
    assert any(op.kind.name == "LINEAR" for op in cg.graph.ops)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match="torch.vmap"):
        torch.compile(model, backend="taskmap", options={"fallback": False})(x)
    torch._dynamo.reset()


def test_torch_compile_write_through_a_view():
    """BEiT's relative position index under dynamo: ``rel[:, :, 0] += k`` on a view that is read
    after.  The torch-level import refuses it; the graph is traced again by torch.export (ATen
    calls, the writes made functional) and compiled — not run in PyTorch."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(9, 9)

        def forward(self, x):
            coords = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(3), indexing="ij")).flatten(1)
            rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
            rel[:, :, 0] += 2
            rel[:, :, 0] *= 5
            return self.lin(x) + rel.sum(-1).float()

    runners = []

    def backend(gm, example_inputs):
        runners.append(taskmap.frontend.torch.taskmap_backend(gm, example_inputs))
        return runners[-1]
    model, x = M().eval(), torch.randn(9, 9)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x), rtol=1e-4, atol=1e-5)
    [runner] = runners
    assert runner.compiles == 1 and all(g is not None for g in runner.graphs.values())
    torch._dynamo.reset()


class Chunks(nn.Module):
    """Longformer's overlapping chunks: ``as_strided`` over a view whose memory is laid out
    differently from its shape (PyTorch's strides, not a contiguous tensor's)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        q = self.lin(x).view(16, 2, 4, 16).transpose(0, 1).transpose(1, 2).reshape(8, 16, 16)   # a view
        h = q.view(8, 4, 4, 16)
        size, stride = list(h.size()), list(h.stride())
        size[1], stride[1] = 7, stride[1] // 2
        c = h.as_strided(size=size, stride=stride)
        return torch.einsum("bcxd,bcyd->bcxy", c, c)


@pytest.mark.parametrize("how", ["torch.compile", "taskmap.compile"])
def test_as_strided_reads_pytorch_layout(how):
    model, x = Chunks().eval(), torch.randn(16, 2, 64)
    torch._dynamo.reset()
    with torch.no_grad():
        fast = torch.compile(model, backend="taskmap") if how == "torch.compile" else \
            taskmap.compile(model, (x,), progress=False)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


def test_torch_compile_dynamic_and_options():
    model = Unsupported().eval()
    fast = torch.compile(model, backend="taskmap", dynamic=True, options={"fallback": True})
    with torch.no_grad():
        for n in (3, 4, 6):
            x = torch.randn(n, 8)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-4)
        torch._dynamo.reset()
        with pytest.raises(Exception, match="torch.special.erfcx"):
            torch.compile(model, backend="taskmap", options={"fallback": False})(torch.randn(4, 8))
        torch._dynamo.reset()
        with pytest.raises(Exception, match="unknown taskmap backend options"):
            torch.compile(model, backend="taskmap", options={"fallbak": False})(torch.randn(4, 8))


def test_torch_compile_keeps_the_most_recently_used_graphs():
    """Dynamic sizes: a graph per concrete shape, the ``max_graphs`` used last kept (a decode loop
    meets a new length every step); a shape dropped and met again compiles again."""
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    runners = []

    def backend(gm, example_inputs):
        runners.append(taskmap.frontend.torch.taskmap_backend(   # every shape compiles at its first call
            gm, example_inputs, options={"max_graphs": 2, "compile_at": 1}))
        return runners[-1]
    torch._dynamo.reset()
    fast = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for n in (2, 3, 4, 5, 5, 4, 2):
            x = torch.randn(n, 8)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-4)
    runner = max(runners, key=lambda r: r.compiles)
    sizes = [[e[1] for e in key if isinstance(e, tuple) and e[0] == "value"] for key in runner.graphs]
    assert sizes == [[4], [2]]                  # dynamo passes the dynamic size as a value
    assert runner.compiles == 5                 # 2, 3, 4, 5, then 2 again (4 was still kept)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="max_graphs"):
        torch.compile(model, backend="taskmap", options={"max_graphs": 0})(torch.randn(4, 8))
    torch._dynamo.reset()


def test_structured_outputs_and_creation_ops():
    class M(nn.Module):
        def forward(self, x, scale: float = 2.0):
            z = torch.zeros_like(x) + x.new_ones(x.shape[-1]) + torch.full_like(x, 0.5)
            return {"a": x * scale, "pair": (z, x.max(dim=1).values), "n": x.shape[0]}

    fast = check(M(), torch.randn(3, 5), fallback=True)
    got = fast(torch.randn(3, 5), scale=3.0)  # another value of a non-tensor argument: another graph
    assert len(fast.entries) == 2 and got["n"] == 3


def test_new_tensors_with_sizes_as_arguments():
    """``x.new_ones(2, 3)`` (sizes as separate arguments, Longformer's masks) as well as
    ``x.new_zeros((3, 4))`` and ``x.new_full((2, 3), v)``."""
    class M(nn.Module):
        def forward(self, x):
            a = x.new_ones(x.shape[0], x.shape[1] + 1).tril().flip(dims=[0])
            b = x.new_zeros((x.shape[1], 4)) + x.new_full((1, 4), 0.5, dtype=torch.float32)
            return x @ a[:, :-1].T + 1, b * x.new_empty(2, 3).shape[1]

    check(M(), torch.randn(3, 5))


def test_advanced_indexing_and_logical_ops():
    class M(nn.Module):
        def forward(self, x, m):
            b, k = torch.arange(2)[:, None], torch.arange(5)[None, :]
            i = torch.tensor([[0, -1], [1, 0]])
            keep = (m[b, k] & (x[b, k, 0] > 0)) | ~m[:, :5]
            lists = x[..., [-2], :], x[None, :, [2, 1], 1:], x[1:, None, ..., [0, -1]]   # one list among slices
            return x[b, k], x[i], keep, x[1, i], keep ^ m[:, 1:], torch.logical_not(keep), *lists

    check(M(), torch.randn(2, 5, 3), torch.rand(2, 6) > 0.5)


class AfterSlices(nn.Module):
    """Index tensors on adjacent dimensions after full slices (DLRM's interaction ``z[:, li, lj]``;
    ``...`` too): the broadcast index dimensions take their place; index tensors apart: those come
    first; integers apart select first (torch's rules)."""

    def forward(self, z, i, j):
        li, lj = torch.triu_indices(4, 4, 1)
        w = z.unsqueeze(-1).expand(5, 4, 4, 4)
        return (z[:, li, lj], z[:, i], z[..., i, i], z[:, 1, j], z[:, i.view(2, 1), j.view(1, 3)],
                w[i, ..., 1], w[i, :, j[:2]], w[1, :, j], w[:, i, :, i], w[:, 0, :, j])


@pytest.mark.parametrize("capture", ["auto", "export", "dynamo"])
def test_index_tensors_after_full_slices(capture):
    torch.manual_seed(7)
    fast = taskmap.compile(AfterSlices(), progress=False, capture=capture)
    args = (torch.randn(5, 4, 4), torch.tensor([0, -1]), torch.tensor([1, 2, 3]))
    for got, want in zip(fast(*args), AfterSlices()(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert "run by PyTorch" not in fast.summary()


def test_transformers_padding_mask():
    transformers = pytest.importorskip("transformers")
    model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=1, attn_implementation="sdpa")).eval()
    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    fast = taskmap.compile(model, progress=False)
    got = fast(input_ids=ids, attention_mask=mask)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("norm_first, act, batch_first", [(False, "relu", True), (True, "gelu", False)])
def test_transformer_layers(norm_first, act, batch_first):
    """nn.TransformerEncoder(Layer) and nn.MultiheadAttention (leaves of symbolic_trace)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, activation=act, batch_first=batch_first, norm_first=norm_first)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(32), enable_nested_tensor=False)
            self.mha = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x, pad):
            y = self.enc(x, src_key_padding_mask=pad)
            yb = y if batch_first else y.transpose(0, 1)
            out, weights = self.mha(yb, yb, yb, key_padding_mask=pad)
            return y, out, weights

    x = torch.randn(3, 10, 32) if batch_first else torch.randn(10, 3, 32)
    pad = torch.zeros(3, 10, dtype=torch.bool)
    pad[1, 7:] = True
    check(M(), x, pad)


class FastPath(nn.Module):
    """PyTorch's eval-mode fused encoder layer, which dynamo records with grad off (its attention
    module is inlined as ``F.multi_head_attention_forward`` instead)."""

    def __init__(self, norm_first, act, mask):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, activation=act, batch_first=True, norm_first=norm_first)
        self.mask = mask

    def forward(self, x, m):
        return self.layer(x, **{"src_key_padding_mask" if self.mask == "padding" else "src_mask": m})


def masks(kind):
    if kind == "padding":
        m = torch.zeros(3, 10, dtype=torch.bool)
        m[1, 7:] = True
        return m
    return torch.triu(torch.full((10, 10), float("-inf")), 1)


@pytest.mark.parametrize("norm_first, act, mask", [(False, "relu", "padding"), (True, "gelu", "causal")])
def test_torch_compile_of_the_fused_encoder_layer(norm_first, act, mask):
    """``torch._transformer_encoder_layer_fwd`` converts: the layer compiles under torch.compile
    (``fallback=False`` would raise on any op left to PyTorch)."""
    torch.manual_seed(0)
    model, x, m = FastPath(norm_first, act, mask).eval(), torch.randn(3, 10, 32), masks(mask)
    seen = []

    def spy(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return gm
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=spy)(x, m)
        assert any("_transformer_encoder_layer_fwd" in t for t in seen)
        torch._dynamo.reset()
        got = torch.compile(model, backend="taskmap", options={"fallback": False})(x, m)
        want = model(x, m)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class NativeMHA(nn.Module):
    """``torch._native_multi_head_attention`` called as ``nn.MultiheadAttention``'s fast path does."""

    def __init__(self, mask_type, need_weights, average):
        super().__init__()
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)
        self.mask_type, self.need_weights, self.average = mask_type, need_weights, average

    def forward(self, x, m):
        a = self.mha
        return torch._native_multi_head_attention(x, x, x, 32, 4, a.in_proj_weight, a.in_proj_bias, a.out_proj.weight,
                                                  a.out_proj.bias, m, self.need_weights, self.average, self.mask_type)


@pytest.mark.parametrize("mask_type, need_weights, average", [(None, False, True), (0, True, True), (1, True, False),
                                                              (2, True, True)])
def test_native_multi_head_attention(mask_type, need_weights, average):
    torch.manual_seed(0)
    x = torch.randn(3, 10, 32)
    pad = torch.zeros(3, 10).masked_fill(masks("padding"), float("-inf"))
    m = {None: None, 0: masks("causal"), 1: masks("padding"),      # 2: merged as merge_masks does (0 / -inf)
         2: masks("causal").expand(3, 4, 10, 10) + pad.view(3, 1, 1, 10)}[mask_type]
    model = NativeMHA(mask_type, need_weights, average).eval()
    fast = taskmap.compile(model, progress=False)
    got = fast(x, m)
    with torch.no_grad():
        want = model(x, m)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
    if need_weights:
        torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)
    else:
        assert got[1] is None and want[1] is None
    assert "run by PyTorch" not in fast.summary()


@settings(max_examples=5, deadline=None)
@given(shapes(min_dims=2, max_dims=4, max_side=9), st.integers(0, 3), st.booleans())
def test_random_shapes(shape, axis, keepdim):
    """A small block on random shapes: broadcast arithmetic, softmax, a reduction, a transpose."""
    axis = axis % len(shape)
    bias = torch.randn(shape[-1])

    def block(x):
        y = torch.softmax(x * 0.5 + bias, dim=axis)
        return y.sum(dim=axis, keepdim=keepdim), torch.relu(x).transpose(0, -1).contiguous()

    check(Fn(block), torch.randn(shape))


def test_inplace_ops_are_rebindings():
    class M(nn.Module):
        def forward(self, x):
            y = x * 2
            alias = y
            y.add_(1)                      # alias sees the mutation
            z = torch.relu_(x * 1)
            w = alias.clone()
            w.digamma_()                   # unsupported in-place: runs in PyTorch on a copy
            out = alias + 0
            y += x
            return out, z, w, F.relu(y, inplace=True)

    check(M(), torch.randn(4, 5), fallback=True)


class InPlaceVariants(nn.Module):
    """In-place variants with no handler of their own; each keeps its tensor's dtype."""

    def __init__(self):
        super().__init__()
        self.act = nn.SiLU(inplace=True)

    def forward(self, x):
        y = x * 2
        y.sigmoid_()
        torch.tanh_(y)
        F.elu_(y, 0.5)
        h = (x * 3).half()
        h.add_(x)                          # float32 operand, float16 result
        h.mul_(y)
        z = self.act(x - 1)
        return y + 1, h, z


@pytest.mark.parametrize("capture", ["auto", "export", "dynamo"])
def test_inplace_variants_take_their_out_of_place_handler(capture):
    """``x.sigmoid_()``, ``torch.tanh_``, ``F.elu_`` and ATen's ``silu_`` (torch.export keeps
    in-place overloads) compute as their out-of-place ops, and the written tensor keeps its dtype."""
    fast = check(InPlaceVariants(), torch.randn(4, 6), rtol=1e-3, atol=1e-3, capture=capture)
    assert not next(iter(fast.entries.values())).imported.unsupported


class Augmented(nn.Module):
    def forward(self, x, w):
        h = x * 2
        g = h
        g += 1                             # h is g: it changes too
        n = x.shape[0]
        n += 1                             # a Python number: a new value
        y = x * 3
        y -= h
        y **= 2
        y @= w
        y //= 0.3
        y %= 0.7
        return h * n, y, g


class AugmentedView(nn.Module):
    def forward(self, x):
        h = x * 2
        v = h[:, :2]
        v *= 3                             # through a view of h, which is read after
        return h + 1


def test_augmented_assignments_are_in_place():
    """torch.fx traces ``g += 1`` as ``g = g + 1``; taskmap's tracer records the in-place operator,
    so other names of the tensor see the update, and a view's update is not lost: torch.export's
    graph makes it functional (dynamo's torch-level graph refuses it, with the line)."""
    fast = check(Augmented(), torch.randn(3, 4), torch.randn(4, 4), rtol=1e-5, atol=1e-5, capture="auto")
    assert next(iter(fast.entries.values())).capture.tracer == "torch.fx"
    fast = check(AugmentedView(), torch.randn(3, 4), capture="auto")
    assert next(iter(fast.entries.values())).capture.tracer == "torch.export"
    with pytest.raises(taskmap.errors.UnsupportedError, match=r"v \*= 3.*writes in place into .*read after"):
        taskmap.compile(AugmentedView(), progress=False, capture="dynamo")(torch.randn(3, 4))


def test_unsupported_op_of_a_torch_module_compiled_directly_points_at_its_forward():
    # no user frame between taskmap and torch: the message names torch's forward, not taskmap's code
    with pytest.raises(UnsupportedOpsError) as e:
        taskmap.compile(nn.Bilinear(3, 3, 2), progress=False)(torch.randn(2, 3), torch.randn(2, 3))
    text = str(e.value)
    assert "torch.bilinear at node bilinear" in text and "nn/modules/linear.py" in text and "in forward" in text
    assert "taskmap/frontend" not in text


class ChunksBySizeTensors(nn.Module):
    """Longformer's overlapping chunks: a chunk count from ``torch.div(n, w, rounding_mode="trunc")``
    (a 0-d tensor, which PyTorch reads as an int) in an ``as_strided`` size, with the ``stride()``
    it reads."""

    def forward(self, x):
        n = torch.div(x.size(1), 4, rounding_mode="trunc")
        chunks = x.as_strided(size=(x.size(0), n, 4 * x.size(2)), stride=(x.stride(0), 4 * x.size(2), 1))
        return torch.relu(chunks) * 2.0


class PadByBuffers(nn.Module):
    """Encodec's extra padding, computed from buffers: a 0-d tensor in ``F.pad``'s amounts."""

    def __init__(self):
        super().__init__()
        self.register_buffer("step", torch.tensor(3), persistent=False)

    def forward(self, x):
        extra = torch.ceil(x.shape[-1] / self.step).to(torch.int64) * self.step - x.shape[-1]
        return F.pad(x, (1, extra)) * 2, F.pad(x, (self.step, self.step - 1))     # (all amounts tensors)


class ViewBySizeTensor(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), torch.div(x.size(1), 4, rounding_mode="trunc"), -1) + 1


@pytest.mark.parametrize("capture", ["auto", "export"])       # (torch._dynamo.export fails on these itself)
def test_integer_tensors_as_sizes(capture):
    x = torch.randn(2, 16, 7)
    for model in (ChunksBySizeTensors(), PadByBuffers(), ViewBySizeTensor()):
        fast = check(model, x, capture=capture)
        assert "run by PyTorch" not in fast.summary()
    # torch.fx's graph asks for x.stride(0), a Python value, and has no strides for as_strided:
    # torch.export's graph has them
    for model in (ChunksBySizeTensors(), Fn(lambda t: t.as_strided((2, 3, 7), (112, 7, 1), 7) * 2.0)):
        fast = check(model, x, capture=capture)
        assert next(iter(fast.entries.values())).capture.tracer == "torch.export"
    torch._dynamo.reset()
    with torch.no_grad():
        for model in (ChunksBySizeTensors(), PadByBuffers()):
            _same(torch.compile(model, backend="taskmap", options={"fallback": False})(x), model(x), 1e-5, 1e-6)


class PadByInputs(nn.Module):
    def forward(self, x, p0, p1):
        return F.pad(x, (p0, p1), mode="reflect") * 2.0


def test_sizes_from_data_under_torch_compile():
    """Encodec under torch.compile: its pad amounts, tensors, come into a graph as inputs, so
    the graph's shapes depend on data: refused clearly (PyTorch runs it, with a warning), and no
    second trace by torch.export disturbs dynamo's guards."""
    x, p0, p1 = torch.randn(1, 1, 40), torch.tensor(3), torch.tensor(2)
    model = PadByInputs()
    torch._dynamo.reset()
    with torch.no_grad(), pytest.warns(EagerFallbackWarning, match=r"pad at node pad .*shape cannot be known"):
        _same(torch.compile(model, backend="taskmap")(x, p0, p1), model(x, p0, p1), 0, 0)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match=r"pad at node pad .*shape cannot be known"):
        torch.compile(model, backend="taskmap", options={"fallback": False})(x, p0, p1)
