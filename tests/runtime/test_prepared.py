"""``CompiledKernel.prepare``: arguments checked once, then launched again and again."""
import numpy as np
import pytest

import taskmap
from taskmap.errors import LaunchError
from taskmap.lang import f32, symbol

n = symbol("n")


@taskmap.kernel
def axpy(a: f32[n], b: f32[n], c: f32[n]):
    for i in range(n):
        c[i] = 2.0 * a[i] + b[i]


def test_prepared_launch_reuses_the_buffers():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 37)).astype(np.float32)
    c = np.zeros_like(a)
    launch = axpy.build("cpu").prepare(a, b, c)
    launch()
    np.testing.assert_allclose(c, 2 * a + b, rtol=1e-6)
    b += 1.0                                     # same memory, new contents: the launch sees them
    launch()
    np.testing.assert_allclose(c, 2 * a + b, rtol=1e-6)


def test_prepare_checks_like_a_call():
    a = np.ones(8, np.float32)
    with pytest.raises(LaunchError, match="argument 'b'"):
        axpy.build("cpu").prepare(a, np.ones(9, np.float32), a.copy())
    with pytest.raises(LaunchError, match="read-only"):
        ro = np.ones(8, np.float32)
        ro.flags.writeable = False
        axpy.build("cpu").prepare(a, a, ro)
