"""How the f32 matmuls and convolutions of a CUDA graph multiply, read when the graph is captured.

By default as PyTorch itself would run them: on TF32 tensor cores (10-bit mantissas, f32 sums)
where PyTorch's settings allow it — for convolutions (cuDNN) by default, for matmuls under
``torch.set_float32_matmul_precision("high")`` — and as IEEE f32 products elsewhere.

``taskmap.compile(..., fp32_precision=...)`` (or the dynamo backend's option of that name)
decides instead (:data:`FP32_PRECISIONS`):

* ``"3xtf32"``: the products PyTorch would run in IEEE f32 run as 3xTF32 on tensor cores (where
  the cost model finds that faster than the SIMT template's f32 FMAs, as accurate) — each
  operand split into a tf32 high part and a tf32 low part (the rest), ``hi*hi + hi*lo + lo*hi``
  summed in f32: errors within a few times those of f32 FMAs (the dropped ``lo*lo`` is ~2^-22
  of a product), at tensor-core speed; TF32 stays where PyTorch allows it.  An infinite operand
  gives NaN where f32 products give +-inf (``inf * lo`` with ``lo = 0``), as in CUTLASS's 3xTF32;
* ``"ieee"``: IEEE f32 products everywhere (convolutions too);
* ``"tf32"``: TF32 everywhere.

CPU graphs multiply in f32 whatever the choice."""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

#: The values of ``fp32_precision`` (None: PyTorch's settings).
FP32_PRECISIONS = (None, "ieee", "tf32", "3xtf32")
_CHOICE: contextvars.ContextVar[str | None] = contextvars.ContextVar("taskmap_fp32_precision", default=None)


@dataclass(frozen=True)
class Tf32:
    """Where TF32 is allowed (the ``tf32`` attribute of the graph's MATMUL / LINEAR and CONV2D ops),
    and whether the f32 products it is not allowed for run as 3xTF32 (their ``tf32x3``)."""

    matmul: bool = False
    conv: bool = False
    x3: bool = False


def check(value: Any) -> str | None:
    """``value`` if it is one of :data:`FP32_PRECISIONS`, else a ``ValueError`` naming them."""
    if value not in FP32_PRECISIONS:
        raise ValueError(f"fp32_precision={value!r}; expected one of {', '.join(map(repr, FP32_PRECISIONS))}")
    return value


@contextlib.contextmanager
def chosen(value: str | None) -> Iterator[None]:
    """Graphs captured inside take ``value`` (one of :data:`FP32_PRECISIONS`) as their f32 precision."""
    token = _CHOICE.set(check(value))
    try:
        yield
    finally:
        _CHOICE.reset(token)


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
    """The settings now, for a graph on ``device`` (none off CUDA): PyTorch's, or what the
    enclosing :func:`chosen` says."""
    choice = _CHOICE.get()
    if not device.startswith("cuda") or choice == "ieee":
        return Tf32()
    if choice == "tf32":
        return Tf32(matmul=True, conv=True)
    b = torch.backends
    cudnn_conv = getattr(b.cudnn, "conv", None)
    return Tf32(matmul=_allowed((b.cuda.matmul, b), lambda: b.cuda.matmul.allow_tf32),
                conv=_allowed((cudnn_conv, b.cudnn, b), lambda: b.cudnn.allow_tf32), x3=choice == "3xtf32")
