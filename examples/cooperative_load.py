"""The paper's Figure 8: 128 threads cooperatively load a 64x8 tile with repeat(4, 1) * spatial(16, 8).

Each thread loads 4 elements: worker w takes rows w // 8 + 16 * r (r = 0..3) of column w % 8.
The tile goes through shared memory and is written back transposed, so every element crosses
threads: it only comes out right if the barrier between the two phases works.
"""
import numpy as np

import taskmap
from taskmap import repeat, spatial
from taskmap.lang import attrs, f32, shared_tensor, syncthreads, threadIdx

load_map = repeat(4, 1) * spatial(16, 8)
store_map = repeat(1, 4) * spatial(8, 16)   # the transposed tile, 8x64


@taskmap.kernel
def load_tile(a: f32[64, 8], out: f32[8, 64]):
    attrs.grid_dim = 1
    attrs.block_dim = 128
    tile = shared_tensor(f32, [64, 8])
    for i, k in load_map.on(threadIdx.x):
        tile[i, k] = a[i, k]
    syncthreads()
    for k, i in store_map.on(threadIdx.x):
        out[k, i] = tile[i, k]


if __name__ == "__main__":
    print("tasks of worker 9:", load_map.worker2task(9))
    a = np.random.rand(64, 8).astype(np.float32)
    out = np.empty((8, 64), np.float32)
    load_tile(a, out)
    assert np.array_equal(out, a.T)
    print("cooperative load OK")
