"""Transformers (random weights, seq 128) and a ViT-style encoder compiled with taskmap.compile
match eager PyTorch; outputs keep their structure (transformers' ModelOutput)."""
import warnings

import pytest
import torch

import taskmap
from vit_def import ViT

transformers = pytest.importorskip("transformers")


def compare_outputs(got, want):
    assert type(got) is type(want)
    assert list(got.keys()) == list(want.keys())
    for k in want.keys():
        torch.testing.assert_close(got[k], want[k], rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_bert_base(batch):
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(attn_implementation="sdpa")).eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, 128))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = taskmap.compile(model, progress=False)
        got = fast(input_ids=ids)
    with torch.no_grad():
        want = model(input_ids=ids)
    compare_outputs(got, want)
    assert "fallback" not in fast.summary()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_gpt2(batch):
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(use_cache=False)).eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, 128))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = taskmap.compile(model, progress=False)
        got = fast(ids)
    with torch.no_grad():
        want = model(ids)
    compare_outputs(got, want)


@pytest.mark.parametrize("batch", [1, 8])
def test_vit_encoder(batch):
    torch.manual_seed(0)
    model = ViT().eval()
    x = torch.randn(batch, 3, 64, 64)
    fast = taskmap.compile(model, progress=False)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(fast(x), want, rtol=1e-3, atol=1e-4)
