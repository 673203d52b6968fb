"""Benchmark: mixture-of-experts layers on the CPU — the grouped matrix product alone and a
transformers Mixtral with its default experts (``grouped_mm``) — taskmap against eager PyTorch,
in alternating rounds in one process (median per round, ms).

    python benchmarks/moe_cpu.py                          # both parts, default sizes
    python benchmarks/moe_cpu.py --rows 2 256 --k 1024 --n 5632 --experts 8
    python benchmarks/moe_cpu.py --tokens 1 128 --hidden 1024 --intermediate 2816 --no-grouped

The grouped product ``a (rows, k)`` by ``w (experts, k, n)`` in groups of rows (random routing)
is timed against ``F.grouped_mm`` and a loop of ``torch.mm`` over the experts (transformers'
fallback).  The Mixtral has 2 layers, 8 experts, 2 per token, random weights, batch 1.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_description, median_time

import taskmap


class Grouped(torch.nn.Module):
    def __init__(self, experts: int, k: int, n: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(experts, k, n) / k ** 0.5, requires_grad=False)

    def forward(self, a: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return F.grouped_mm(a, self.w, offs=offs)


def rounds(fns: dict[str, object], n: int) -> dict[str, list[float]]:
    """Each function's median time (ms) per round, the functions alternating within a round."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            out[name].append(median_time(fn, repeat=5, min_time=0.3) * 1e3)
    return out


def report(title: str, times: dict[str, list[float]], flops: float | None = None) -> None:
    base = statistics.median(times["taskmap"])
    cells = []
    for name, ts in times.items():
        t = statistics.median(ts)
        rate = f", {flops / t / 1e6:.0f} GFLOP/s" if flops else ""
        ratio = "" if name == "taskmap" else f", {t / base:.2f}x taskmap's time"
        cells.append(f"{name} {t:.2f} ms ({min(ts):.2f}-{max(ts):.2f}{rate}{ratio})")
    print(f"{title}: " + "; ".join(cells))


def grouped(rows: int, k: int, n: int, experts: int, n_rounds: int) -> None:
    torch.manual_seed(0)
    model = Grouped(experts, k, n).eval()
    a = torch.randn(rows, k)
    ids = torch.randint(0, experts, (rows,)).sort().values
    offs = torch.cumsum(torch.bincount(ids, minlength=experts), 0).to(torch.int32)

    def loop() -> torch.Tensor:
        out, start = torch.zeros(rows, n), 0
        for e, end in enumerate(offs.tolist()):
            if end > start:
                torch.mm(a[start:end], model.w[e], out=out[start:end])
            start = end
        return out

    with torch.no_grad():
        fast = taskmap.compile(model, progress=False)
        err = (fast(a, offs) - loop()).abs().max().item()
        times = rounds({"taskmap": lambda: fast(a, offs), "F.grouped_mm": lambda: model(a, offs),
                        "torch.mm loop": loop}, n_rounds)
    report(f"grouped product {rows} rows x {k} -> {n}, {experts} experts (max |diff| {err:.1e})", times,
           2.0 * rows * k * n)


def mixtral(tokens: int, hidden: int, intermediate: int, n_rounds: int) -> None:
    import transformers
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=8,
                                     intermediate_size=intermediate, max_position_embeddings=4096,
                                     num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                                     use_cache=False)
    model = transformers.AutoModel.from_config(cfg).eval()
    ids = torch.randint(3, 1000, (1, tokens))
    with torch.no_grad():
        fast = taskmap.compile(model, progress=False)
        err = (fast(input_ids=ids).last_hidden_state - model(input_ids=ids).last_hidden_state).abs().max().item()
        times = rounds({"taskmap": lambda: fast(input_ids=ids), "eager": lambda: model(input_ids=ids)}, n_rounds)
    report(f"Mixtral 2 x {hidden} (experts {intermediate}, {model.config._experts_implementation}), "
           f"{tokens} token(s) (max |diff| {err:.1e})", times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2, 256])
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--n", type=int, default=5632)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 128])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-grouped", action="store_true")
    parser.add_argument("--no-mixtral", action="store_true")
    args = parser.parse_args()
    print(f"{machine_description()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not args.no_grouped:
        for rows in args.rows:
            grouped(rows, args.k, args.n, args.experts, args.rounds)
    if not args.no_mixtral:
        for tokens in args.tokens:
            mixtral(tokens, args.hidden, args.intermediate, args.rounds)


if __name__ == "__main__":
    main()
