"""Transformers (random weights, seq 128) and a ViT-style encoder compiled with taskmap.compile
match eager PyTorch; outputs keep their structure (transformers' ModelOutput)."""
import warnings

import pytest
import torch

import taskmap
from taskmap.backends.base import host_cpu_target
from taskmap.frontend.torch import taskmap_backend
from taskmap.frontend.torch.dynamo import SplitDynamoGraph
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


def _small(name):
    """Small configurations of popular model families (2 layers, width 64): their default
    forward, with an attention mask (padding), caches returned (``use_cache`` on)."""
    t = transformers
    return {
        "gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100)),
        "llama": lambda: t.LlamaModel(t.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                    num_key_value_heads=2, intermediate_size=128, vocab_size=100)),
        "roberta": lambda: t.RobertaModel(t.RobertaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                          intermediate_size=128, vocab_size=100)),
        "t5": lambda: t.T5EncoderModel(t.T5Config(num_layers=2, d_model=64, num_heads=4, d_ff=128, d_kv=16,
                                                  vocab_size=100)),
        "distilbert": lambda: t.DistilBertModel(t.DistilBertConfig(n_layers=2, dim=64, n_heads=4, hidden_dim=128,
                                                                   vocab_size=100)),
        "bloom": lambda: t.BloomModel(t.BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=100)),
        "bart": lambda: t.BartModel(t.BartConfig(encoder_layers=1, decoder_layers=1, d_model=64, encoder_attention_heads=4,
                                                 decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                                 vocab_size=100)),
        "clip_text": lambda: t.CLIPTextModel(t.CLIPTextConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                              intermediate_size=128, vocab_size=100, eos_token_id=2)),
        "falcon": lambda: t.FalconModel(t.FalconConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                       vocab_size=100)),
    }[name]()


@pytest.mark.parametrize("name", ["gpt2", "llama", "roberta", "t5", "distilbert", "bloom", "bart", "clip_text",
                                  "falcon"])
def test_model_families_with_masks_and_caches(name):
    # RoBERTa's position ids are a cumsum; GPT-2 / Llama return a DynamicCache by default, BART an
    # EncoderDecoderCache and shifts its decoder inputs by slice assignment; BLOOM calls baddbmm
    # with keyword arguments; CLIP gathers its position embeddings at computed ids and pools at the
    # end-of-text token; Falcon splits its fused q / k / v with list indices
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _small(name).eval()
        ids = torch.randint(3, 100, (2, 12))
        mask = torch.ones(2, 12, dtype=torch.long)
        mask[1, 9:] = 0
        fast = taskmap.compile(model, progress=False)
        got = fast(input_ids=ids, attention_mask=mask)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask)
    assert type(got) is type(want) and list(got.keys()) == list(want.keys())
    for k in want.keys():
        assert type(got[k]) is type(want[k])
        leaves, spec = torch.utils._pytree.tree_flatten(got[k])      # caches: registered pytree nodes
        want_leaves, want_spec = torch.utils._pytree.tree_flatten(want[k])
        assert spec == want_spec and len(leaves) == len(want_leaves) > 0
        for a, b in zip(leaves, want_leaves):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=2e-4)
    assert "run by PyTorch" not in fast.summary()
    # captured as ATen calls (torch.export), several times faster than torch._dynamo.export
    assert next(iter(fast.entries.values())).capture.tracer == "torch.export"


def test_generate_with_a_kv_cache_through_torch_compile():
    """A common serving loop: transformers' greedy ``generate`` with its forward under
    ``torch.compile(backend="taskmap")``: a prefill, then decode steps whose key / value cache grows
    by one position per step (dynamo recompiles, then marks the length dynamic: from then on one
    split graph serves every length, its static regions compiled once)."""
    torch.manual_seed(0)
    runners = []

    def backend(gm, example_inputs):
        runners.append(taskmap_backend(gm, example_inputs, options={"progress": False}))
        return runners[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=100)).eval()
        ids = torch.randint(3, 100, (2, 9))
        kw = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True,
                  pad_token_id=0)
        with torch.no_grad():
            want = model.generate(ids, **kw)
            torch._dynamo.reset()
            model.forward = torch.compile(model.forward, backend=backend)
            got = model.generate(ids, **kw)
    assert torch.equal(got.sequences, want.sequences)
    split = [r for r in runners if isinstance(r, SplitDynamoGraph)]
    assert len(split) == 1 and split[0].compiles == 1 and len(split[0].split[1].compiled) >= 2
    assert all(r.compiles == 1 for r in split[0].split[1].compiled)
    assert len(got.scores) == len(want.scores) == 6
    for a, b in zip(got.scores, want.scores):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def _small_vision_and_more(name):
    t = transformers
    sizes = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)
    return {
        # Funnel updates attention scores in place through reshapes and slices (`*= cls_mask`)
        "funnel": lambda: (t.FunnelModel(t.FunnelConfig(vocab_size=100, block_sizes=[1, 1], d_model=64, n_head=4,
                                                        d_head=16, d_inner=128)), torch.randint(0, 100, (2, 16))),
        # BEiT builds its relative position index with in-place adds into a contiguous permutation
        "beit": lambda: (t.BeitModel(t.BeitConfig(image_size=64, patch_size=8, use_relative_position_bias=True,
                                                  **sizes)), torch.randn(2, 3, 64, 64)),
        # LeViT: batch norms over flattened tokens, reshaped back with reshape_as
        "levit": lambda: (t.LevitModel(t.LevitConfig(image_size=64)), torch.randn(2, 3, 64, 64)),
        # ConvNeXt: 7x7 depthwise convs permuted to channels-last for a LayerNorm (the channel-lane
        # kernel's pixel-major stores), a 56x56 plane of 24 channels in bands of rows
        "convnext": lambda: (t.ConvNextModel(t.ConvNextConfig(hidden_sizes=[24, 48, 96, 192], depths=[1, 1, 2, 1])),
                             torch.randn(2, 3, 224, 224)),
        # Swin: shifted windows (rolls as slices + concatenations), patch merging's four strided
        # parts concatenated before a LayerNorm (written apart, the shared row slices recomputed)
        "swin": lambda: (t.SwinModel(t.SwinConfig(image_size=56, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                                                  window_size=7)), torch.randn(2, 3, 56, 56)),
    }[name]()


@pytest.mark.parametrize("name", ["funnel", "beit", "levit", "convnext", "swin"])
def test_more_model_families(name):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, x = _small_vision_and_more(name)
        model = model.eval()
        with torch.no_grad():        # batch norms with statistics of their own (LeViT's output is ~1e-6 at init)
            for m in model.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.weight.uniform_(0.5, 1.5), m.bias.normal_(0, 0.1)
                    m.running_mean.normal_(0, 0.1), m.running_var.uniform_(0.5, 1.5)
        fast = taskmap.compile(model, progress=False)
        got = fast(x)
    with torch.no_grad():
        want = model(x)
    assert want.last_hidden_state.std() > 0.05
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-3, atol=2e-4)
    assert "run by PyTorch" not in fast.summary()
    if name == "convnext" and host_cpu_target().vector_bytes >= 64:
        kernels = [k.__name__ for e in fast.entries.values() for s in e.compiled.steps for k in s.kernels]
        assert kernels.count("depthwise_conv2d_cpu_chan_nhwc") == 5, kernels
