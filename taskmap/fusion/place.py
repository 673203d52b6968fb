"""Placing a kernel's output inside a larger tensor: the kernel writes its result straight into
its range of, say, a concatenation's output, instead of a buffer of its own that a copy then
moves there.

``place(kernel, "c", into, offset, shape)`` rewrites every store to the output parameter ``c``
(viewed as ``shape``) into a store to a new parameter, ``into`` (a ``tensor_input`` of the
larger shape), at the index shifted by ``offset``; ``c``'s symbolic sizes are bound to
``shape``.  Everything else is :func:`~taskmap.fusion.fuse`'s machinery — an epilogue whose
index map is the shift — with its limits: a kernel that reads its output back, or hands it to
a primitive that accesses memory, is refused (:class:`~taskmap.errors.FusionError`).  The other
elements of ``into`` are never touched: several kernels can fill one tensor.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ..compute.nodes import TensorNode
from ..errors import FusionError, IRError
from ..ir.verify import verify
from ..runtime.kernel import Kernel
from .splice import Placement, _single_kernel, splice

_MEMO: "weakref.WeakKeyDictionary[Kernel, dict[Any, Kernel]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def place(anchor: Any, param: str, into: TensorNode, offset: Sequence[int], shape: Sequence[int]) -> Kernel:
    """``anchor`` (a kernel) with its output parameter ``param`` (of ``shape``) written inside
    ``into`` at ``offset`` (see the module docstring).  Raises :class:`FusionError` when it cannot."""
    kernel = _single_kernel(anchor)
    pl = Placement(into, tuple(int(o) for o in offset), tuple(int(d) for d in shape))
    key = (param, into.name, repr(into.dtype), tuple(into.shape), pl.offset, pl.shape)
    with _LOCK:
        hit = _MEMO.get(kernel, {}).get(key)
    if hit is not None:
        return hit
    module = splice(kernel.module, {}, {}, {}, {param: pl})
    try:
        verify(module)
    except IRError as e:
        raise FusionError(f"{kernel.__name__} placed in {into.name} does not verify: {e}") from None
    placed = Kernel(module)
    placed.__doc__ = (f"{kernel.__name__} with '{param}' written inside {into.name}{list(into.shape)} "
                      f"at {list(pl.offset)}")
    with _LOCK:
        return _MEMO.setdefault(kernel, {}).setdefault(key, placed)


__all__ = ["place"]
