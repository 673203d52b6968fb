"""Kernels in a module with ``from __future__ import annotations`` (annotations are strings)."""
from __future__ import annotations

from taskmap.lang import attrs, f32, func, i32, spatial, symbol, threadIdx

N = symbol("N")
TILE = 32


@func
def twice(x: f32) -> f32:
    return x * 2


def scale(a: f32[N, TILE], b: f32[N, TILE], k: i32):
    attrs.grid_dim = N
    attrs.block_dim = TILE
    for j in spatial(TILE).on(threadIdx.x):
        for i in range(a.shape[0]):
            b[i, j] = twice(a[i, j]) * k


def quoted(a: "f32[8]", s: "f32") -> None:
    for i in range(8):
        a[i] = s
