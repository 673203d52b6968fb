"""Annotations see the enclosing function's locals even when the body does not mention them."""
import numpy as np
import pytest

import taskmap
from taskmap.lang import f32, f64


def make_fill(dt):
    @taskmap.kernel
    def fill(a: dt["n"], value: dt):
        for i in range(3):
            a[i] = value
    return fill


@pytest.mark.parametrize("dt, np_dt", [(f32, np.float32), (f64, np.float64)])
def test_annotation_uses_enclosing_local(dt, np_dt):
    k = make_fill(dt)
    assert k.func.params[0].type.dtype is dt
    x = np.random.default_rng(0).random(5).astype(np_dt)
    expected = x.copy()
    expected[:3] = 2.5
    k(x, 2.5)
    np.testing.assert_array_equal(x, expected)
