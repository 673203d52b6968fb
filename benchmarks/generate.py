"""Benchmark: text generation (transformers' greedy ``generate`` with a key / value cache) with the
forward under ``torch.compile(backend="taskmap")``, against PyTorch eager and ``torch.compile``
(inductor), in one process.

    python benchmarks/generate.py                                  # GPT-2 124M, 32 + 32 tokens
    python benchmarks/generate.py --model llama --prompt 64 --new 32 --rounds 3 --peers eager taskmap
    python benchmarks/generate.py --device cuda --peers eager taskmap
    python benchmarks/generate.py --dtype bfloat16 --peers eager taskmap

Random weights (the architectures' default sizes; ``llama`` is a 12-layer, 768-wide Llama with
grouped key / value heads).  Per peer:

* **first generate s**: the first ``generate`` call, compiles included (dynamo's and the
  backend's; taskmap's kernel cache as it is — clear it with ``python -m taskmap cache clear``
  for a cold number);
* **prefill ms** and **decode ms/token**: later ``generate`` calls, each forward timed; the
  prompt's forward and the median of the decode steps' (each decode step has a longer cache);
* with ``--prompts 20 27 35 27``: then the seconds of one ``generate`` per prompt of those
  lengths, in turn — what a length not seen before costs, and one seen before.

Peers take turns for ``--rounds`` rounds; the medians over rounds are reported, and ratios are
peer time / taskmap time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from common import machine_description, print_table  # noqa: E402

PEERS = ("eager", "torch.compile", "taskmap")


def make_model(name: str) -> torch.nn.Module:
    import transformers as t
    if name == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config())
    if name == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                                num_attention_heads=12, num_key_value_heads=4, vocab_size=32000))
    raise SystemExit(f"unknown model {name!r}: gpt2 or llama")


class Timed:
    """A forward that records each call's wall time."""

    def __init__(self, forward, device: str):
        self.forward = forward
        self.times: list[float] = []
        self.sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def __call__(self, *args, **kwargs):
        self.sync()
        t0 = time.perf_counter()
        out = self.forward(*args, **kwargs)
        self.sync()
        self.times.append(time.perf_counter() - t0)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--new", type=int, default=32, help="tokens generated")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="the models' weights (every peer)")
    parser.add_argument("--prompts", type=int, nargs="*", default=[],
                        help="then one generate per prompt of each length, in order (new lengths cost a compile, "
                             "or run in PyTorch at first: dynamo's and taskmap's policies)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    base = make_model(args.model).eval()
    ids = torch.randint(10, 1000, (args.batch, args.prompt), device=args.device)
    kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, pad_token_id=0)
    timers, first, reference = {}, {}, None
    with torch.no_grad():
        for peer in args.peers:
            model = make_model(args.model).eval()
            model.load_state_dict(base.state_dict())
            model.to(args.device, getattr(torch, args.dtype))
            torch._dynamo.reset()
            if peer != "eager":
                model.forward = torch.compile(model.forward, backend="taskmap" if peer == "taskmap" else "inductor")
            timers[peer] = model.forward = Timed(model.forward, args.device)
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            first[peer] = time.perf_counter() - t0
            print(f"{peer}: first generate {first[peer]:.1f} s", flush=True)
            if reference is None:
                reference = out
            elif not torch.equal(out, reference):
                print(f"  note: {peer}'s tokens differ from {args.peers[0]}'s", flush=True)
            timers[peer].model = model
        prefill = {p: [] for p in args.peers}
        decode = {p: [] for p in args.peers}
        for _ in range(args.rounds):
            for peer in args.peers:
                timer = timers[peer]
                timer.times.clear()
                timer.model.generate(ids, **kw)
                prefill[peer].append(timer.times[0])
                decode[peer].append(statistics.median(timer.times[1:]))
    pre = {p: statistics.median(v) * 1e3 for p, v in prefill.items()}
    dec = {p: statistics.median(v) * 1e3 for p, v in decode.items()}
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else \
        f"{machine_description()}, {torch.get_num_threads()} threads"
    print(f"\n{args.model} ({args.dtype}), batch {args.batch}, prompt {args.prompt}, {args.new} new tokens; "
          f"{where}, {args.rounds} rounds\n")
    rows = [[p, f"{first[p]:.1f}", f"{pre[p]:.1f}", f"{dec[p]:.2f}",
             f"{dec[p] / dec['taskmap']:.2f}" if "taskmap" in dec else "-"] for p in args.peers]
    print_table(["peer", "first generate s", "prefill ms", "decode ms/token", "decode ratio vs taskmap"], rows)
    if args.prompts:
        print(f"\nseconds per generate of {args.new} tokens, prompts of these lengths in turn:\n")
        rows = []
        with torch.no_grad():
            for peer in args.peers:
                row = [peer]
                for n in args.prompts:
                    t0 = time.perf_counter()
                    timers[peer].model.generate(torch.randint(10, 1000, (args.batch, n), device=args.device), **kw)
                    row.append(f"{time.perf_counter() - t0:.2f}")
                rows.append(row)
        print_table(["peer", *(f"{n} tokens" for n in args.prompts)], rows)


if __name__ == "__main__":
    main()
