"""Mixture-of-experts routing (``ops_moe``): ``torch.histc`` and the grouped matrix product
(``F.grouped_mm``, ATen's ``_grouped_mm``, transformers' ``grouped_mm_fallback``) against eager
PyTorch on random inputs, with no op left to PyTorch; the experts' matrices read packed, by
block (``MatmulProblem.b_groups``); a transformers MoE model with its default experts."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskmap
from taskmap.errors import UnsupportedOpsError
from taskmap.frontend.torch.ops_moe import MAX_BLOCK_ROWS, block_rows
from taskmap.graph import lower_anchor


class Fn(nn.Module):
    """``fn(self, x)`` or ``fn(self, a, b, offs)`` (named arguments: torch.fx traces it — the export and
    dynamo captures would meet ``_grouped_mm``'s fake kernel, which takes bfloat16 only)."""

    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for name, value in params.items():
            setattr(self, name, nn.Parameter(value, requires_grad=False))

    def forward(self, a, b=None, offs=None):
        return self.fn(self, *(t for t in (a, b, offs) if t is not None))


def compiled(model, *xs):
    fast = taskmap.compile(model, progress=False)
    got = fast(*xs)
    assert "run by PyTorch" not in fast.summary()
    return fast, got


# ----------------------------------------------------------------------------- histc


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bins, lo, hi", [(7, -1.5, 2.0), (1, -1.0, 1.0), (10, 0.0, 0.0), (4, 0.5, 0.5)])
def test_histc_matches_torch(dtype, bins, lo, hi):
    torch.manual_seed(bins)
    x = torch.randn(5, 31, dtype=dtype)
    x[0, :4] = torch.tensor([lo, hi, -7.0, 9.0], dtype=dtype)    # the ends (inside) and far outside
    if lo != hi:           # values on inner edges: each lands in the bin above, as torch's edges put it
        x[1, :3] = torch.linspace(lo, hi, bins + 1, dtype=dtype)[1:4][:3] if bins >= 3 else x[1, :3]
    model = Fn(lambda self, x: torch.histc(x, bins, lo, hi))
    _, got = compiled(model, x)
    want = model(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert want.sum() > 0


def test_histc_counts_expert_ids_as_transformers_does():
    """transformers' routing: expert ids as floats, one bin per expert, ``max`` the last id."""
    torch.manual_seed(0)
    ids = torch.randint(0, 6, (40,)).float()
    model = Fn(lambda self, x: torch.histc(x, bins=6, min=0, max=5).cumsum(0))
    _, got = compiled(model, ids)
    torch.testing.assert_close(got, model(ids), rtol=0, atol=0)


# ----------------------------------------------------------------------------- grouped_mm


def test_block_rows():
    assert block_rows(2, 8) == 1 and block_rows(31, 8) == 1          # decoding: a few rows an expert
    assert block_rows(32, 8) == 2 and block_rows(256, 8) == 16
    assert block_rows(1 << 20, 8) == MAX_BLOCK_ROWS


def reference(a, w, offs):
    """Row blocks by ``offs`` times their expert's matrix; rows past ``offs[-1]`` zeros."""
    out, start = torch.zeros(a.shape[0], w.shape[2], dtype=torch.float64), 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end].double() @ w[e].double()
        start = end
    return out


def routed(rows, experts, seed, empty=(), unused_tail=0):
    """``offs`` for ``rows`` rows over ``experts`` groups, the ``empty`` ones given no row and
    the last ``unused_tail`` rows in no group."""
    g = torch.Generator().manual_seed(seed)
    live = [e for e in range(experts) if e not in empty]
    ids = torch.tensor(live)[torch.randint(0, len(live), (rows - unused_tail,), generator=g)].sort().values
    return torch.cumsum(torch.bincount(ids, minlength=experts), 0).to(torch.int32)


@pytest.mark.parametrize("rows, experts, k, n, empty, tail", [
    (3, 4, 24, 40, (1,), 0),         # decoding: one row a block
    (64, 4, 40, 72, (0, 2), 0),      # blocks of 8 rows, empty experts
    (200, 3, 33, 50, (), 5),         # blocks of 16, rows past the last group
])
def test_grouped_mm_matches_torch(rows, experts, k, n, empty, tail, monkeypatch):
    """Against a loop of products (torch's own CPU kernel wants rows of 16 bytes); the experts'
    matrices are read packed beforehand, each batch of rows indexing its own (``_indexed_b``)."""
    indexed = []
    spy = lower_anchor._indexed_b
    monkeypatch.setattr(lower_anchor, "_indexed_b", lambda *a: indexed.append(spy(*a)) or indexed[-1])
    torch.manual_seed(rows)
    w = torch.randn(experts, k, n) / k ** 0.5
    model = Fn(lambda self, a, offs: F.grouped_mm(a, self.w, offs=offs), w=w)
    a = torch.randn(rows, k)
    offs = routed(rows, experts, rows, empty, tail)
    fast, got = compiled(model, a, offs)
    want = reference(a, w, offs)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    if tail:
        assert not got[-tail:].any()
    # another routing, same compiled graph: the groups are data
    offs2 = routed(rows, experts, rows + 1)
    torch.testing.assert_close(fast(a, offs2).double(), reference(a, w, offs2), rtol=1e-5, atol=1e-5)
    assert indexed and all(stack is not None for stack in indexed)


def test_grouped_mm_of_batches_and_aten_overload():
    torch.manual_seed(5)
    w = torch.randn(3, 16, 24)
    model = Fn(lambda self, a, b, offs: (F.grouped_mm(a, b), torch.ops.aten._grouped_mm.default(a[0], self.w, offs)),
               w=w)
    a, b = torch.randn(3, 5, 16), torch.randn(3, 16, 24)
    offs = torch.tensor([2, 2, 5], dtype=torch.int32)
    _, (batched, grouped) = compiled(model, a, b, offs)
    torch.testing.assert_close(batched, a @ b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped.double(), reference(a[0], w, offs), rtol=1e-5, atol=1e-5)


def test_grouped_mm_refuses_groups_along_k():
    """The weight-gradient form (groups along K) is named in the error (bfloat16: the operands torch's
    meta kernel takes)."""
    model = Fn(lambda self, a, b, offs: F.grouped_mm(a, b, offs=offs))
    a, b = torch.randn(16, 4).t().contiguous().bfloat16(), torch.randn(16, 8).bfloat16()
    with pytest.raises(UnsupportedOpsError, match="grouped_mm of 2-d by 2-d operands with offs"):
        taskmap.compile(model, progress=False)(a, b, torch.tensor([8, 16], dtype=torch.int32))


@pytest.mark.parametrize("tokens", [1, 24])
def test_mixtral_default_experts_compile_whole(tokens):
    """transformers' default experts (``grouped_mm``: histc, sort, ``grouped_mm_fallback``)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=96, max_position_embeddings=64, num_key_value_heads=2,
                                     num_local_experts=4, num_experts_per_tok=2, use_cache=False)
    model = transformers.AutoModel.from_config(cfg).eval()
    assert model.config._experts_implementation == "grouped_mm"
    ids = torch.randint(3, 100, (1, tokens))
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state
        fast = taskmap.compile(model, progress=False)       # fallback off: every op converted
        got = fast(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_gpt_oss_experts_with_biases_and_transposed_weights():
    """gpt-oss: experts stored (E, K, N) with biases gathered by expert, its own gate (clamped
    SwiGLU of interleaved halves), a router whose weights are random here."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    cfg = transformers.GptOssConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, intermediate_size=64, num_local_experts=4,
                                    num_experts_per_tok=2, max_position_embeddings=64, use_cache=False)
    model = transformers.AutoModel.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if not p.abs().max():
                p.normal_(0, 0.5)
    ids = torch.randint(3, 100, (1, 20))
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state
        got = taskmap.compile(model, progress=False)(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

