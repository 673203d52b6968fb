"""Vector add: the DESIGN.md §1 kernel, GPU-style, run on whatever is here (the CPU if no GPU)."""
import numpy as np

import taskmap
from taskmap import spatial
from taskmap.lang import attrs, blockIdx, f32, threadIdx


@taskmap.kernel
def vec_add(a: f32[1024], b: f32[1024], c: f32[1024]):
    attrs.grid_dim = 4
    attrs.block_dim = 256
    for i in spatial(1024).on(blockIdx.x * 256 + threadIdx.x):
        c[i] = a[i] + b[i]


if __name__ == "__main__":
    a, b = np.random.rand(2, 1024).astype(np.float32)
    c = np.empty_like(a)
    vec_add(a, b, c)
    assert np.allclose(c, a + b)
    print("vec_add OK:", c[:4], "==", (a + b)[:4])
