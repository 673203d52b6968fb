"""DESIGN.md §1, as written: mapping values and vec_add on numpy arrays (the CPU parts)."""
import numpy as np

import taskmap
from taskmap import repeat, spatial
from taskmap.lang import attrs, blockIdx, f32, register_tensor, shared_tensor, syncthreads, threadIdx  # noqa: F401


def test_mapping_values():
    m = spatial(2, 2) * repeat(2, 2)
    assert m.num_workers == 4 and m.task_shape == (4, 4)
    assert m.worker2task(3) == [(2, 2), (2, 3), (3, 2), (3, 3)]
    col = spatial(4, 8, ranks=[1, 0])
    assert col.worker2task(1) == [(1, 0)] and col.worker2task(4) == [(0, 1)]
    assert repeat(2, 3, ranks=[1, 0]).worker2task(0) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]


@taskmap.kernel
def vec_add(a: f32[1024], b: f32[1024], c: f32[1024]):
    attrs.grid_dim = 4
    attrs.block_dim = 256
    for i in spatial(1024).on(blockIdx.x * 256 + threadIdx.x):
        c[i] = a[i] + b[i]


def test_vec_add_on_numpy():
    a, b = np.random.rand(2, 1024).astype(np.float32)
    c = np.full_like(a, np.nan)
    vec_add(a, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_build_cpu_gives_source_and_library():
    k = vec_add.build("cpu")
    assert "tm_entry_vec_add" in k.source
    assert k.binary.endswith(".so")
    assert k.source_path is not None and open(k.source_path).read() == k.source
