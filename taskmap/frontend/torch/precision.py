"""PyTorch's TF32 settings, read when a graph is captured: whether the f32 matmuls and convolutions
of a CUDA graph may multiply on TF32 tensor cores (10-bit mantissas, f32 sums), as PyTorch itself
would run them.  By default PyTorch allows it for convolutions (cuDNN) and not for matmuls."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Tf32:
    """Where TF32 is allowed (the ``tf32`` attribute of the graph's MATMUL / LINEAR and CONV2D ops)."""

    matmul: bool = False
    conv: bool = False


def _allowed(chain: tuple[Any, ...], legacy: Callable[[], bool]) -> bool:
    """``fp32_precision`` (PyTorch 2.9+) of the most specific setting that says ``"tf32"`` or
    ``"ieee"`` ("none" defers to the next, more general one; none at all: IEEE); older PyTorch:
    the ``allow_tf32`` flag."""
    values = [getattr(obj, "fp32_precision", None) for obj in chain if obj is not None]
    if values and values[0] is not None:
        return next((v == "tf32" for v in values if v in ("tf32", "ieee")), False)
    try:
        return bool(legacy())
    except RuntimeError:             # legacy and new settings mixed: PyTorch refuses to answer
        return False


def current(device: str) -> Tf32:
    """The settings now, for a graph on ``device`` (no TF32 off CUDA)."""
    if not device.startswith("cuda"):
        return Tf32()
    b = torch.backends
    cudnn_conv = getattr(b.cudnn, "conv", None)
    return Tf32(matmul=_allowed((b.cuda.matmul, b), lambda: b.cuda.matmul.allow_tf32),
                conv=_allowed((cudnn_conv, b.cudnn, b), lambda: b.cudnn.allow_tf32))
