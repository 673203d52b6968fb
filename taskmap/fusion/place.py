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

from collections.abc import Sequence
from typing import Any

from ..compute.nodes import TensorNode
from ..runtime.kernel import Kernel
from .splice import Placement, fuse


def place(anchor: Any, param: str, into: TensorNode, offset: Sequence[int], shape: Sequence[int]) -> Kernel:
    """``anchor`` (a kernel) with its output parameter ``param`` (of ``shape``) written inside
    ``into`` at ``offset`` (see the module docstring; memoised as :func:`fuse` is).  Raises
    :class:`FusionError` when it cannot."""
    pl = Placement(into, tuple(int(o) for o in offset), tuple(int(d) for d in shape))
    return fuse(anchor, placements={param: pl})


__all__ = ["place"]
