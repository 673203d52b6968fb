"""Constant operands packed into the micro-kernels' panels, once per compiled graph.

The CPU templates read a constant matrix ``(rows, k)`` as panels of ``r`` rows stored column by
column, ``[ceil(rows / r)][k][r]``: a transpose per panel.  numpy copies such a transposed view
element by element along the destination, reading ``r`` source rows at once; with ``k`` a
multiple of 1024 floats those rows fall into the same few L1 sets and every read misses (a
ResNet-50 weight of 2048 x 1024 with ``r = 64``: ~30 ms).  PyTorch's copy transposes in blocks
on all its threads (~4x faster on the same operands), so a process that has torch loaded (every
compile of a PyTorch model) packs with it.
"""
from __future__ import annotations

import sys
import warnings

import numpy as np

#: Bytes ahead the CPU micro-kernels prefetch the panels packed at compile time (``prefetch``): the
#: weights, which come from memory when a whole model runs, where the hardware prefetchers stop at
#: each 4 KiB page.  Measured in ResNet-50 (Zen 5, two cores, whole runs): its 26 matmul steps
#: 7.55 -> 6.93 ms at 4 KiB ahead (2 KiB: 7.10, 16 KiB: 7.05).
PREFETCH_BYTES = 4096


def row_panels(a: np.ndarray, r: int, edge: bool = False, transposed: bool = False) -> np.ndarray:
    """``a`` ``(..., rows, k)`` as ``[..., ceil(rows / r), k, r]`` float32, flat; with
    ``transposed`` ``a`` is ``(..., k, rows)``.  The rows past ``rows`` in the last panel are zeros,
    or with ``edge`` copies of the last row."""
    a = np.asarray(a, np.float32)
    *batch, rows, k = a.shape
    if transposed:
        k, rows = rows, k
    panels = -(-rows // r)
    extra = panels * r - rows
    axis = -1 if transposed else -2
    tail_shape = (*batch, k, extra) if transposed else (*batch, extra, k)
    torch = sys.modules.get("torch")
    if torch is not None:
        with warnings.catch_warnings():      # a read-only constant: only read here
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(np.ascontiguousarray(a))
        if extra:
            last = t[..., rows - 1:] if transposed else t[..., rows - 1:, :]
            t = torch.cat([t, last.expand(tail_shape) if edge else t.new_zeros(tail_shape)], dim=axis)
        t = t.reshape(*batch, k, panels, r).transpose(-3, -2) if transposed \
            else t.reshape(*batch, panels, r, k).transpose(-1, -2)
        return t.contiguous().numpy().reshape(-1)
    if extra:
        last = a[..., rows - 1:] if transposed else a[..., rows - 1:, :]
        a = np.concatenate([a, np.broadcast_to(last, tail_shape) if edge else np.zeros(tail_shape, np.float32)],
                           axis=axis)
    a = a.reshape(*batch, k, panels, r).swapaxes(-3, -2) if transposed \
        else a.reshape(*batch, panels, r, k).swapaxes(-1, -2)
    return np.ascontiguousarray(a).reshape(-1)


__all__ = ["row_panels"]
