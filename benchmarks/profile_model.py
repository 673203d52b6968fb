"""Per-kernel times of a compiled model (``CompiledModule.profile``), slowest first: where a
model's time goes, kernel by kernel (on a GPU the device time between CUDA events around each
step, the round queued behind a spin kernel so that the host's launches do not show).

    python benchmarks/profile_model.py resnet50                  # on the CPU
    python benchmarks/profile_model.py bert --device cuda --batch 8 --top 30
"""
from __future__ import annotations

import argparse
import warnings

import torch

from models import MODELS, make_model

import taskmap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", choices=MODELS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for name in args.models:
        model, inputs = make_model(name, args.batch, args.device)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fast = taskmap.compile(model, inputs, progress=False)
            print(fast.summary())
            print(fast.profile(*inputs, rounds=args.rounds, top=args.top), flush=True)


if __name__ == "__main__":
    main()
