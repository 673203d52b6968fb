"""More model families than ``models.py``: ``taskmap.compile`` against eager PyTorch on
``transformers`` models and recurrent nets at working sizes (random weights, batch 1, f32, CPU).

    python benchmarks/model_zoo.py                  # every family
    python benchmarks/model_zoo.py llama t5 --rounds 7

Each model is compiled, its main output checked against eager (relative error of the largest
value), then both are timed in alternating rounds (reverse order every other round); the ratio is
the median of the rounds' ratios (eager / taskmap).  The table also gives the time of
``taskmap.compile`` and the first call (with the cache directory as it is: cold on a fresh one),
the compiled graph's steps and its slowest step.  Sizes: 6 layers of width 768 with 12 heads
(sequence 128) for the text models (``llama_meta``: Meta's reference LLaMA code, its rotary
embedding in complex64; ``fnet``: FNet, whose token-mixing FFTs PyTorch runs inside the compiled
graph) and wav2vec2's encoder (over one second of 16 kHz audio: its feature convolutions and its
128-tap positional convolution), 224 x 224 images for ConvNeXt-T / Swin-T / RegNetY /
PoolFormer-S12 / SegFormer-B0 / LeViT-128S, 1500 frames for Whisper's encoder; the recurrent nets
(``nn.LSTM``, a bidirectional ``nn.GRU``) two layers of 512 over 64 steps of 256 features
(``lstm_long``: 1000 steps), unrolled by taskmap's frontend.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from common import machine_description, print_table, timed  # noqa: E402
from models import first_tensor  # noqa: E402

import taskmap  # noqa: E402

TEXT = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=6, num_attention_heads=12, vocab_size=1000)


class Recurrent(torch.nn.Module):
    """Two recurrent layers of 512 and a linear head."""

    def __init__(self, kind: type, **kw: Any) -> None:
        super().__init__()
        self.rnn = kind(256, 512, num_layers=2, batch_first=True, **kw)
        self.head = torch.nn.Linear(512 * (2 if kw.get("bidirectional") else 1), 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


def _families() -> dict[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]]:
    import transformers as tf
    import meta_llama
    ids = (torch.randint(0, 1000, (1, 128)),)
    image = (torch.randn(1, 3, 224, 224),)
    gqa = dict(TEXT, intermediate_size=2048, num_key_value_heads=4, use_cache=False)
    return {
        "llama": lambda: (tf.LlamaModel(tf.LlamaConfig(**gqa)), ids),
        "llama_meta": lambda: (meta_llama.Transformer(), ids),         # Meta's code: complex rotary embedding
        "mistral": lambda: (tf.MistralModel(tf.MistralConfig(**gqa)), ids),
        "qwen2": lambda: (tf.Qwen2Model(tf.Qwen2Config(**gqa)), ids),
        "t5": lambda: (tf.T5EncoderModel(tf.T5Config(vocab_size=1000, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                                                      num_heads=8)), ids),
        "gptneox": lambda: (tf.GPTNeoXModel(tf.GPTNeoXConfig(**TEXT, use_cache=False)), ids),
        "phi": lambda: (tf.PhiModel(tf.PhiConfig(**TEXT, use_cache=False)), ids),
        "fnet": lambda: (tf.FNetModel(tf.FNetConfig(**TEXT)), ids),      # fftn run by PyTorch (FALLBACK)
        "deberta": lambda: (tf.DebertaV2Model(tf.DebertaV2Config(**TEXT)), ids),
        "falcon": lambda: (tf.FalconModel(tf.FalconConfig(hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                                                          vocab_size=1000, use_cache=False)), ids),
        "bloom": lambda: (tf.BloomModel(tf.BloomConfig(hidden_size=768, n_layer=6, n_head=12, vocab_size=1000,
                                                       use_cache=False)), ids),
        "convnext": lambda: (tf.ConvNextModel(tf.ConvNextConfig(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3])),
                             image),
        "regnet": lambda: (tf.RegNetModel(tf.RegNetConfig()), image),      # RegNetY: SE, groups of 64 channels
        "swin": lambda: (tf.SwinModel(tf.SwinConfig(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                                                    window_size=7)), image),
        "whisper_encoder": lambda: (tf.WhisperModel(tf.WhisperConfig(
            vocab_size=1000, d_model=512, encoder_layers=6, decoder_layers=1, encoder_attention_heads=8,
            decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, num_mel_bins=80,
            max_source_positions=750, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1)).encoder, (torch.randn(1, 80, 1500),)),
        "wav2vec2": lambda: (tf.Wav2Vec2Model(tf.Wav2Vec2Config(**TEXT)), (torch.randn(1, 16000),)),
        "poolformer": lambda: (tf.PoolFormerModel(tf.PoolFormerConfig()), image),      # s12
        "segformer": lambda: (tf.SegformerModel(tf.SegformerConfig()), image),         # MiT-b0
        "levit": lambda: (tf.LevitModel(tf.LevitConfig()), image),                     # LeViT-128S
        "lstm": lambda: (Recurrent(torch.nn.LSTM), (torch.randn(1, 64, 256),)),
        "gru_bidirectional": lambda: (Recurrent(torch.nn.GRU, bidirectional=True), (torch.randn(1, 64, 256),)),
        "lstm_long": lambda: (Recurrent(torch.nn.LSTM), (torch.randn(1, 1000, 256),)),
    }


#: families compiled with ``fallback=True``: their ops taskmap does not build run in PyTorch
FALLBACK = {"fnet"}


def bench(name: str, make: Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]], rounds: int,
          seconds: float) -> list[str]:
    torch.manual_seed(0)
    model, args = make()
    model.eval()
    with torch.no_grad():
        t0 = time.perf_counter()
        fast = taskmap.compile(model, args, progress=False, fallback=name in FALLBACK)
        got = first_tensor(fast(*args))
        compile_s = time.perf_counter() - t0
        want = first_tensor(model(*args))
        err = ((got - want).abs().max() / want.abs().max()).item()
        calls: dict[str, Callable[[], Any]] = {"taskmap": lambda: fast(*args), "eager": lambda: model(*args)}
        samples: dict[str, list[float]] = {k: [] for k in calls}
        for r in range(rounds):
            for k, fn in (list(calls.items()) if r % 2 == 0 else reversed(calls.items())):
                samples[k].append(timed(fn, seconds))
        cg = next(iter(fast.entries.values())).compiled
        slowest = cg.profile(*args, rounds=3)[0]
    ratio = statistics.median(e / t for e, t in zip(samples["eager"], samples["taskmap"]))
    ms = {k: f"{statistics.median(v) * 1e3:.1f}" for k, v in samples.items()}
    return [name, ms["taskmap"], ms["eager"], f"{ratio:.2f}", f"{err:.1e}", f"{compile_s:.1f}", str(len(cg.steps)),
            f"{slowest[0][:48]} ({slowest[2] * 1e3:.2f} ms)"]


def main() -> None:
    families = _families()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(families), help=f"of {list(families)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5, help="of runs per side and round")
    args = parser.parse_args()
    unknown = set(args.models) - set(families)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {list(families)}")
    warnings.simplefilter("ignore")
    rows = []
    for name in args.models:
        rows.append(bench(name, families[name], args.rounds, args.seconds))
        print("  " + " | ".join(rows[-1]), flush=True)
    print(f"\n{machine_description()}, {datetime.date.today()}; batch 1, f32, median of {args.rounds} rounds")
    print_table(["model", "taskmap ms", "eager ms", "eager/taskmap", "rel. error", "compile s", "steps",
                 "slowest step"], rows)


if __name__ == "__main__":
    main()
