"""Complex tensors in compiled graphs: elementwise arithmetic, views and conversions built from
real ops (Meta-LLaMA's rotary embedding with no PyTorch op left), the rest (FFTs) run by
PyTorch under ``fallback=True`` with complex values crossing the graph as real views, complex
inputs and outputs, in-place updates, save/load, and ``torch.compile``."""
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import taskmap
from taskmap.errors import UnsupportedError, UnsupportedOpsError
from taskmap.graph import OpKind

torch.manual_seed(0)
CAPTURES = ["auto", "export", "dynamo"]


def _pytorch_ops(fast):
    return [op for g in fast.graphs for op in g.ops if op.kind is OpKind.TORCH]


def _close(got, want, rtol=1e-5, atol=1e-5):
    if isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want)
        want, got = list(want.values()), list(got.values())
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for a, b in zip(got, want):
            _close(a, b, rtol, atol)
        return
    if not isinstance(want, torch.Tensor):
        assert got == want
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def precompute_freqs_cis(dim, end, theta=10000.0):
    """Meta-LLaMA's ``precompute_freqs_cis``: the rotations as a complex64 table."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs).float())


class LlamaRotary(nn.Module):
    """Meta-LLaMA's ``apply_rotary_emb`` between the q/k projections and their product."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wq, self.wk = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(self.hd, 64))

    def forward(self, x):
        b, s, _ = x.shape
        xq = self.wq(x).view(b, s, self.heads, self.hd)
        xk = self.wk(x).view(b, s, self.heads, self.hd)
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs = self.freqs_cis[:s]
        freqs = freqs.view(*[d if i == 1 or i == xq_.ndim - 1 else 1 for i, d in enumerate(xq_.shape)])
        xq = torch.view_as_real(xq_ * freqs).flatten(3).type_as(xq)
        xk = torch.view_as_real(xk_ * freqs).flatten(3).type_as(xk)
        return torch.einsum("bqhd,bkhd->bhqk", xq, xk) / math.sqrt(self.hd)


@pytest.mark.parametrize("capture", CAPTURES)
def test_llama_rotary_embedding_needs_no_pytorch_op(capture):
    model = LlamaRotary().eval()
    x = torch.randn(2, 12, 32)
    fast = taskmap.compile(model, progress=False, capture=capture)      # (fallback=False)
    with torch.no_grad():
        _close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    assert not _pytorch_ops(fast)


class Arith(nn.Module):
    def __init__(self, op, other):
        super().__init__()
        self.op, self.other = op, other
        self.register_buffer("c", torch.randn(5, 1, 2).mul(0.7).add(0.3) if other == "buffer" else torch.zeros(1))

    def forward(self, x, y):
        z = torch.view_as_complex(x)
        w = {"complex": lambda: torch.view_as_complex(y), "real": lambda: y[..., 0],
             "buffer": lambda: torch.view_as_complex(self.c), "number": lambda: 1.5 - 0.5j,
             "float": lambda: 2.5}[self.other]()
        r = {"mul": lambda: z * w, "rmul": lambda: w * z, "add": lambda: z + w, "sub": lambda: z - w,
             "rsub": lambda: w - z, "div": lambda: z / w, "rdiv": lambda: w / z}[self.op]()
        return torch.view_as_real(r), r.real, r.imag, r.abs(), r.angle()


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["mul", "rmul", "add", "sub", "rsub", "div", "rdiv"]),
       st.sampled_from(["complex", "real", "buffer", "number", "float"]),
       st.sampled_from([((5, 3), (5, 3)), ((5, 3), (3,)), ((1, 3), (5, 1)), ((4, 5, 3), (5, 1))]))
def test_complex_arithmetic_matches_pytorch(op, other, shapes):
    """Each operator with every kind of operand (a complex value, a real tensor, a complex
    buffer, Python numbers), broadcast, against PyTorch's complex arithmetic."""
    sx, sy = shapes
    if other == "buffer":
        sx = (4, 5, 3)
    x, y = torch.randn(*sx, 2), torch.randn(*sy, 2)
    model = Arith(op, other)
    fast = taskmap.compile(model, progress=False)
    _close(fast(x, y), model(x, y), rtol=2e-5, atol=1e-5)
    assert not _pytorch_ops(fast)


class Functions(nn.Module):
    def forward(self, a, b):
        z = torch.complex(a, b)
        p = torch.polar(a.abs(), b)
        e = torch.exp(z * 0.3)
        q = (z.conj() * p - e).neg()
        w = torch.where(a > 0, q, 1j).masked_fill(b > 0.5, 0.25) + torch.where(b > 0, z, a)
        return torch.view_as_real(w), torch.view_as_real(z.conj().resolve_conj()), q.abs()


class Views(nn.Module):
    def forward(self, x):
        z = torch.view_as_complex(x)                                   # [2, 3, 4]
        a = z.permute(2, 0, 1).reshape(4, 6).transpose(0, 1)           # [6, 4]
        b = z[:, 1:, None, ::2].squeeze(2).flatten(0, 1)               # [4, 2]
        c = torch.cat([z.unsqueeze(0), z.unsqueeze(0) * 2], 0).sum(0)  # [2, 3, 4]
        d = torch.stack([z[0], z.select(0, 1).narrow(-1, 0, 4)], -1).mean(-1, keepdim=True)
        e = z.mT.contiguous().expand(5, 2, 4, 3)[..., 1]
        return (torch.view_as_real(a), torch.view_as_real(b), torch.view_as_real(c), torch.view_as_real(d),
                torch.view_as_real(e), z.shape[-1] * torch.ones(2), z.size(1) + z.dim() + z.numel())


@pytest.mark.parametrize("capture", CAPTURES)
def test_complex_functions_and_views_need_no_pytorch_op(capture):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    for model, args in ((Functions(), (a, b)), (Views(), (torch.randn(2, 3, 4, 2),))):
        fast = taskmap.compile(model, progress=False, capture=capture)
        _close(fast(*args), model(*args), rtol=2e-5, atol=2e-5)
        assert not _pytorch_ops(fast), (type(model).__name__, _pytorch_ops(fast))


class FNetMixing(nn.Module):
    """FNet's token mixing: the real part of a 2-d FFT over the hidden and sequence axes, then
    a residual and a layer norm."""

    def __init__(self, dim=16):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        mixed = torch.fft.fft(torch.fft.fft(x, dim=-1), dim=-2).real
        return self.norm(x + mixed)


@pytest.mark.parametrize("capture", CAPTURES)
def test_ffts_run_in_pytorch_under_fallback_and_are_named_without(capture):
    x = torch.randn(2, 8, 16)
    model = FNetMixing().eval()
    with pytest.raises(UnsupportedOpsError) as e:
        taskmap.compile(model, progress=False, capture=capture)(x)
    text = str(e.value)
    assert len(e.value.ops) == 2 and all("fft" in op[0] for op in e.value.ops), e.value.ops
    assert "complex tensors" in text and "fallback=True runs it in PyTorch" in text
    assert "mixed = torch.fft.fft(torch.fft.fft(x, dim=-1), dim=-2).real" in text
    fast = taskmap.compile(model, progress=False, capture=capture, fallback=True)
    with torch.no_grad():
        _close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    assert len(_pytorch_ops(fast)) == 2                 # the two FFTs: the real part and the rest compiled


class Spectrum(nn.Module):
    """A complex input and complex outputs: the graph holds their real views."""

    def forward(self, z, x):
        s = torch.fft.rfft(x) * z
        return s, s.abs().log1p(), {"conj": s.conj(), "phase": torch.angle(s)}


def test_complex_inputs_and_outputs_cross_as_complex_tensors(tmp_path):
    z, x = torch.randn(3, 5, dtype=torch.complex64), torch.randn(3, 8)
    model = Spectrum()
    fast = taskmap.compile(model, progress=False, fallback=True)
    want = model(z, x)
    _close(fast(z, x), want, atol=1e-5)
    assert [op.kind for op in _pytorch_ops(fast)] == [OpKind.TORCH]        # rfft alone
    fast.save(tmp_path / "spectrum.taskmap")
    loaded = taskmap.load(tmp_path / "spectrum.taskmap")
    z2, x2 = torch.randn(3, 5, dtype=torch.complex64), torch.randn(3, 8)
    _close(loaded(z2, x2), model(z2, x2), atol=1e-5)
    _close(loaded(z.conj(), x), model(z.conj(), x), atol=1e-5)              # a conjugate view as input


class InPlace(nn.Module):
    def forward(self, z, x):
        w = torch.view_as_complex(x * 1.0)
        w.mul_(z)
        z.mul_(2j)
        return torch.view_as_real(w), z.abs()


class InPlaceView(nn.Module):
    def forward(self, z, x):
        w = torch.view_as_complex(x)
        w.mul_(z)                     # writes into x, which is read after
        return x * 1.0


def test_in_place_updates_of_complex_values():
    z, x = torch.randn(4, 3, dtype=torch.complex64), torch.randn(4, 3, 2)
    z1, z2 = z.clone(), z.clone()
    want = InPlace()(z1, x)
    got = taskmap.compile(InPlace(), progress=False)(z2, x)
    _close(got, want)
    _close(z2, z1)                                      # the input changed as eager changed it
    with pytest.raises(UnsupportedError, match="writes in place into w, and the tensor it is a view of"):
        taskmap.compile(InPlaceView(), progress=False, capture="dynamo")(z, x)


def test_torch_compile_backend_compiles_around_ffts():
    x = torch.randn(2, 8, 16)
    model = FNetMixing().eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")                  # no graph left to PyTorch whole
        _close(torch.compile(model, backend="taskmap")(x), model(x), rtol=1e-4, atol=1e-4)
    rope = LlamaRotary().eval()
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        _close(torch.compile(rope, backend="taskmap")(x), rope(x), rtol=1e-4, atol=1e-5)


def test_complex_double_and_promotions_match():
    """complex128 arithmetic, and a mix of dtypes (PyTorch's promotion: run by PyTorch)."""
    class Mixed(nn.Module):
        def forward(self, x, y):
            z = torch.view_as_complex(x)
            return torch.view_as_real(z * z + 1j), torch.view_as_real(z * y)

    x, y = torch.randn(4, 3, 2, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float32)
    fast = taskmap.compile(Mixed(), progress=False, fallback=True)
    _close(fast(x, y), Mixed()(x, y), rtol=1e-12, atol=1e-12)
    assert len(_pytorch_ops(fast)) == 1                 # complex128 * float32 only


def test_fnet_from_transformers():
    """transformers' FNet mixes tokens with ``torch.fft.fftn(h, dim=(1, 2)).real``: the FFT runs
    in PyTorch, everything else in taskmap's kernels, by either entry point."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.FNetModel(transformers.FNetConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                                           intermediate_size=128)).eval()
    ids = torch.randint(0, 100, (2, 32))
    with torch.no_grad():
        want = model(ids).last_hidden_state
        fast = taskmap.compile(model, progress=False, fallback=True)
        _close(fast(ids).last_hidden_state, want, rtol=1e-3, atol=1e-4)
        assert [op.attrs.description for op in _pytorch_ops(fast)] == ["torch.fft.fftn"] * 2
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _close(torch.compile(model, backend="taskmap")(ids).last_hidden_state, want, rtol=1e-3, atol=1e-4)


class Spectrogram(nn.Module):
    """A log power spectrogram and the signal rebuilt from the STFT (``istft`` has no meta
    kernel: its output's shape comes from running it on zeros)."""

    def forward(self, x):
        window = torch.hann_window(64)
        s = torch.stft(x, 64, hop_length=16, window=window, return_complex=True)
        return torch.log(s.abs().pow(2) + 1e-6).mean(-1), torch.istft(s * 0.5, 64, hop_length=16, window=window)


def test_spectrogram_and_inverse_stft():
    x = torch.randn(2, 1024)
    fast = taskmap.compile(Spectrogram(), progress=False, fallback=True)
    _close(fast(x), Spectrogram()(x), rtol=1e-4, atol=1e-4)
    assert sorted(op.attrs.description for op in _pytorch_ops(fast)) == ["torch.functional.stft", "torch.istft"]


class SpectralConv2d(nn.Module):
    """The Fourier neural operator's spectral convolution: an rfft2, complex weights on the
    lowest modes (einsums) written into a complex zeros buffer, an irfft2."""

    def __init__(self, cin=4, cout=5, m1=3, m2=3):
        super().__init__()
        self.m1, self.m2 = m1, m2
        self.weights1 = nn.Parameter(torch.randn(cin, cout, m1, m2, dtype=torch.cfloat) / (cin * cout))
        self.weights2 = nn.Parameter(torch.randn(cin, cout, m1, m2, dtype=torch.cfloat) / (cin * cout))

    def forward(self, x):
        x_ft = torch.fft.rfft2(x)
        out_ft = torch.zeros(x.shape[0], self.weights1.shape[1], x.size(-2), x.size(-1) // 2 + 1, dtype=torch.cfloat)
        out_ft[:, :, :self.m1, :self.m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :self.m1, :self.m2],
                                                        self.weights1)
        out_ft[:, :, -self.m1:, :self.m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, -self.m1:, :self.m2],
                                                         self.weights2)
        return torch.fft.irfft2(out_ft, s=(x.size(-2), x.size(-1)))


@pytest.mark.parametrize("capture", CAPTURES)
def test_fourier_neural_operator_layer(capture):
    """Complex einsums with complex weights and item assignment into a complex constant are
    built from real ops; only the FFTs run in PyTorch."""
    model = SpectralConv2d().eval()
    x = torch.randn(2, 4, 12, 12)
    with torch.no_grad():
        fast = taskmap.compile(model, progress=False, fallback=True, capture=capture)
        _close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(_pytorch_ops(fast)) == 2 and all("fft" in op.attrs.description for op in _pytorch_ops(fast))


class Products(nn.Module):
    def forward(self, x, y, r):
        z, w = torch.view_as_complex(x), torch.view_as_complex(y)
        return (torch.view_as_real(z @ w), torch.view_as_real(torch.bmm(z, w) * r),
                torch.view_as_real(torch.einsum("bij,bkj->bik", z, w.transpose(1, 2).conj())))


def test_complex_matrix_products():
    x, y, r = torch.randn(3, 4, 5, 2), torch.randn(3, 5, 6, 2), torch.randn(3, 4, 6)
    fast = taskmap.compile(Products(), progress=False)
    _close(fast(x, y, r), Products()(x, y, r), rtol=1e-5, atol=1e-5)
    assert not _pytorch_ops(fast)


class Rotations(nn.Module):
    """Rotations from positions computed in the forward: ``torch.exp(1j * theta)``, a complex
    number times a real tensor."""

    def forward(self, pos, x):
        theta = pos[:, None] * torch.arange(1, 5).float()
        z = torch.exp(1j * theta) * torch.view_as_complex(x)
        return (torch.view_as_real(z), (theta * 1j + 1).abs(), torch.view_as_real(theta - 2j),
                torch.view_as_real(theta / (1 + 1j)))


@pytest.mark.parametrize("capture", CAPTURES)
def test_complex_numbers_times_real_tensors(capture):
    pos, x = torch.randn(6), torch.randn(6, 4, 2)
    fast = taskmap.compile(Rotations(), progress=False, capture=capture)
    _close(fast(pos, x), Rotations()(pos, x), rtol=1e-5, atol=1e-5)
    assert not _pytorch_ops(fast)
