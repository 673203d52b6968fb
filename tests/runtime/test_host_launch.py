"""``CompiledKernel.bind_host``: arguments checked once, then launched by the arrays' addresses."""
import numpy as np
import pytest
import torch

import taskmap
from taskmap.errors import LaunchError, TaskmapError, UnsupportedError
from taskmap.backends import resolve_target
from taskmap.backends.cpu.chain import HostChain
from taskmap.lang import attrs, bf16, bool_, cast, copy16, f16, f32, f64, i8, i32, i64, symbol, threadIdx
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


@taskmap.kernel
def mixed_scalars(a: f32[n], k: i32, big: i64, s: f64, h: f16, neg: i8, flag: bool_, c: f32[n], b16: bf16):
    for i in range(n):
        c[i] = a[i] * cast(s, f32) + cast(k, f32) + cast(big - 4000000000, f32) + cast(h, f32) + cast(neg, f32) \
            + cast(flag, f32) + cast(b16, f32)


def _chain(*bound_and_ptrs):
    """A HostChain of ``(bound launch, addresses of its tensors)`` pairs, all stable slots."""
    launches, values = [], []
    for launch, ptrs in bound_and_ptrs:
        words, positions = launch.words()
        slots = []
        for pos, p in zip(positions, ptrs):
            slots.append((pos, len(values)))
            values.append(p)
        launches.append((launch.packed, launch.name, words, slots))
    return HostChain(resolve_target("cpu"), launches, values, set(range(len(values))), lambda p: p), values


def test_a_chain_runs_packed_entries_with_every_scalar_type():
    """The packed entry (``tm_packed_<kernel>``) reads each scalar from the start of its word:
    int32 sizes, i64 beyond 32 bits, f64, f16 and bf16 (passed as float), negative i8, bool."""
    a, c, c2 = _data(29), np.zeros(29, np.float32), np.zeros(29, np.float32)
    args = (a, -7, 4000000003, 0.25, 1.5, -3, True, c, 2.0)
    kernel = mixed_scalars.build("cpu")
    launch = kernel.bind_host(*args)
    assert launch.packed is not None
    chain, _ = _chain((launch, [data_ptr(a), data_ptr(c2)]))
    assert chain([]) is None
    np.testing.assert_allclose(c2, a * 0.25 - 7 + 3 + 1.5 - 3 + 1 + 2, rtol=1e-6, atol=1e-6)
    kernel(*args)                                        # the plain entry agrees
    np.testing.assert_array_equal(c, c2)


def test_a_chain_runs_in_order_and_stops_at_a_failure():
    x, y, z = _data(24), np.zeros(24, np.float32), np.zeros(24, np.float32)
    first = axpy.build("cpu").bind_host(x, x, y)          # y = 3x
    ok = shifted_copy.build("cpu").bind_host(y, z, 0)    # z[:16] = y[:16]: reads what ran before it
    chain, _ = _chain((first, [data_ptr(x), data_ptr(x), data_ptr(y)]), (ok, [data_ptr(y), data_ptr(z)]))
    assert len(chain) == 2 and chain([]) is None
    np.testing.assert_allclose(z[:16], 3 * x[:16], rtol=1e-6)
    bad = shifted_copy.build("cpu").bind_host(x, y, 1)   # misaligned: the GPU would fault
    z2 = np.zeros(24, np.float32)
    after = shifted_copy.build("cpu").bind_host(x, z2, 0)
    chain, _ = _chain((bad, [data_ptr(x), data_ptr(y)]), (after, [data_ptr(x), data_ptr(z2)]))
    assert chain([]) == ("shifted_copy", 3)
    assert not z2.any()                                  # nothing after the failure ran


def test_a_chain_writes_the_volatile_addresses_before_each_run():
    a, b = _data(11), _data(11)
    launch = axpy.build("cpu").bind_host(a, b, np.zeros(11, np.float32))
    words, positions = launch.words()
    chain = HostChain(resolve_target("cpu"), [(launch.packed, launch.name, words, list(zip(positions, range(3))))],
                      [a, b, None], {0, 1}, data_ptr)          # slot 2 (the output) is new every run
    for _ in range(3):
        out = np.zeros(11, np.float32)
        assert chain([a, b, out]) is None
        np.testing.assert_allclose(out, 2 * a + b, rtol=1e-6)
