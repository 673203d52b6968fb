"""``taskmap.lang.bitcast`` in kernels: the IR it builds, Python numbers as operands, and the
bits it gives on the CPU (numpy's ``view``)."""
import numpy as np

import taskmap
from taskmap.ir import BitCast, collect
from taskmap.lang import bitcast, f32, i32, u32, vectorize


@taskmap.kernel
def float_bits(a: f32[64], b: i32[64], c: f32[64]):
    for i in vectorize(64):
        b[i] = bitcast(a[i], i32) ^ bitcast(-0.0, i32)  # flip the sign bit
        c[i] = bitcast((bitcast(a[i], u32) & 0x7FFFFFFF), f32)  # |a|


def test_bitcast_builds_bitcast_nodes():
    casts = collect(float_bits.module.entry_function.body, BitCast)
    assert sorted(c.type.short for c in casts) == ["f32", "i32", "i32", "u32"]


def test_bitcast_on_the_cpu_matches_numpy_view():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(64).astype(np.float32)
    a[:4] = [0.0, -0.0, np.inf, -np.inf]
    b = np.empty(64, np.int32)
    c = np.empty_like(a)
    float_bits(a, b, c)
    assert (b == (a.view(np.int32) ^ np.int32(-2**31))).all()
    assert (c.view(np.uint32) == np.abs(a).view(np.uint32)).all()
