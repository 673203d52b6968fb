"""``CompiledKernel.bind_host``: arguments checked once, then launched by the arrays' addresses."""
import numpy as np
import pytest
import torch

import taskmap
from taskmap.errors import LaunchError, TaskmapError, UnsupportedError
from taskmap.lang import attrs, copy16, f32, i32, symbol, threadIdx
from taskmap.runtime.args import data_ptr, numpy_ptr

n = symbol("n")
RNG = np.random.default_rng(5)


@taskmap.kernel
def axpy(a: f32[n], b: f32[n], c: f32[n]):
    for i in range(n):
        c[i] = 2.0 * a[i] + b[i]


@taskmap.kernel
def scaled(alpha: f32, a: f32[n], beta: f32, c: f32[n]):   # scalars among the tensors
    for i in range(n):
        c[i] = alpha * a[i] + beta


@taskmap.kernel
def shifted_copy(x: f32["n"], y: f32["n"], shift: i32):
    attrs.block_dim = 4
    copy16(y[threadIdx.x * 4 + shift], x[threadIdx.x * 4])


def _data(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_numpy_ptr_is_the_arrays_address():
    base = np.arange(40.0)
    for a in (base, base[3:], base.reshape(5, 8)[1:], np.empty(0, np.float32), np.zeros((2, 3), np.int8)[1]):
        assert numpy_ptr(a) == a.ctypes.data
    t = torch.arange(6.0)[2:]
    assert data_ptr(t) == t.data_ptr()


def test_bound_launch_runs_on_new_arrays_of_the_bound_shapes():
    a, b, c = _data(37), _data(37), np.zeros(37, np.float32)
    launch = axpy.build("cpu").bind_host(a, b, c)
    assert launch.arity == 3
    for _ in range(3):                                   # new arrays each time, by address only
        a, b, c = _data(37), _data(37), np.zeros(37, np.float32)
        launch(data_ptr(a), data_ptr(b), data_ptr(c))
        np.testing.assert_allclose(c, 2 * a + b, rtol=1e-6)


def test_bound_launch_with_scalars_between_the_tensors():
    a, c = _data(19), np.zeros(19, np.float32)
    launch = scaled.build("cpu").bind_host(1.5, a, -2.0, c)
    assert launch.arity == 2
    a2 = _data(19)
    launch(data_ptr(a2), data_ptr(c))
    np.testing.assert_allclose(c, 1.5 * a2 - 2.0, rtol=1e-6)


def test_bind_host_checks_like_a_call():
    a = np.ones(8, np.float32)
    k = axpy.build("cpu")
    with pytest.raises(LaunchError, match="argument 'b'"):
        k.bind_host(a, np.ones(9, np.float32), a.copy())
    with pytest.raises(LaunchError, match="dtype float32"):
        k.bind_host(a, np.ones(8), a.copy())
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(LaunchError, match="read-only"):
        k.bind_host(a, a, ro)


def test_bound_launch_takes_one_address_per_tensor():
    a = np.ones(8, np.float32)
    launch = axpy.build("cpu").bind_host(a, a, a.copy())
    with pytest.raises(LaunchError, match="takes 3 addresses, got 2"):
        launch(data_ptr(a), data_ptr(a))
    with pytest.raises(LaunchError, match="takes 3 addresses, got 4"):
        launch(data_ptr(a), data_ptr(a), data_ptr(a), 8)


def test_checked_launch_rejects_arrays_unlike_the_bound_ones():
    a, b, c = _data(16), _data(16), np.zeros(16, np.float32)
    launch = axpy.build("cpu").bind_host(a, b, c)
    a2, b2 = _data(16), _data(16)
    launch.checked(a2, b2, c)
    np.testing.assert_allclose(c, 2 * a2 + b2, rtol=1e-6)
    launch.checked(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c))   # torch CPU: the same
    np.testing.assert_allclose(c, 2 * a + b, rtol=1e-6)
    with pytest.raises(LaunchError, match=r"argument 'b' must be like the bound one, float32\[16\] on cpu; "
                                          r"got float32\[17\]"):
        launch.checked(a, _data(17), c)
    with pytest.raises(LaunchError, match=r"argument 'a' .* got float64\[16\]"):
        launch.checked(a.astype(np.float64), b, c)
    with pytest.raises(LaunchError, match="argument 'c' must be C-contiguous"):
        launch.checked(a, b, np.zeros(32, np.float32)[::2])
    ro = np.zeros(16, np.float32)
    ro.flags.writeable = False
    with pytest.raises(LaunchError, match="argument 'c' is written by the kernel but the array is read-only"):
        launch.checked(a, b, ro)
    with pytest.raises(LaunchError, match="argument 'a' .* got list"):
        launch.checked([0.0] * 16, b, c)
    with pytest.raises(LaunchError, match="takes 3 arrays, got 2"):
        launch.checked(a, b)


def test_bound_launch_raises_the_kernels_status():
    x, y = _data(24), np.zeros(24, np.float32)
    launch = shifted_copy.build("cpu").bind_host(x, y, 0)
    launch(data_ptr(x), data_ptr(y))
    np.testing.assert_array_equal(y[:16], x[:16])
    with pytest.raises(TaskmapError, match=r"shifted_copy\(\): misaligned address: copy16"):
        launch(data_ptr(x), data_ptr(y) + 4)             # 4 bytes off: the GPU would fault
    with pytest.raises(TaskmapError, match="misaligned address"):
        shifted_copy.build("cpu").bind_host(x, y, 1)(data_ptr(x), data_ptr(y))


def test_bind_host_needs_a_cpu_build():
    try:
        built = shifted_copy.build("cuda", arch="sm_90")
    except TaskmapError as exc:       # no NVRTC wheel here
        pytest.skip(f"cannot build for CUDA: {exc}")
    x = np.ones(24, np.float32)
    with pytest.raises(UnsupportedError, match="bind_host\\(\\) launches CPU builds"):
        built.bind_host(x, x.copy(), 0)
