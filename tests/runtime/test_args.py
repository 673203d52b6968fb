"""Which objects kernels accept as tensor arguments (runtime/args.py ``array_info``), described
without ever touching their memory: the GPU arrays here are fakes whose pointers are made up."""
import numpy as np
import pytest

import taskmap
from taskmap.backends.cuda import driver
from taskmap.errors import LaunchError
from taskmap.runtime import dlpack
from taskmap.runtime.args import ArrayInfo, array_info

BOGUS = 0xBAD0_0000_0000        # dereferencing this crashes: the runtime must not


class FakeCai:
    """A CuPy / Numba-like device array: only ``__cuda_array_interface__`` (and optionally a device)."""

    def __init__(self, shape=(4,), typestr="<f4", ptr=BOGUS, readonly=False, version=3, dlpack_device=None,
                 device=None, **extra):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, readonly),
                                         "version": version, "strides": None, **extra}
        if dlpack_device is not None:
            self.__dlpack_device__ = lambda: dlpack_device
        if device is not None:
            self.device = device


class CupyDevice:
    def __init__(self, ident):
        self.id = ident


def test_numpy_taskmap_and_torch_arrays():
    a = np.zeros((2, 3), np.float32)
    assert array_info(a) == ArrayInfo(a.ctypes.data, (2, 3), "float32", True, True, "cpu")
    assert not array_info(a.T).contiguous
    t = taskmap.tensor(a, device="cpu")
    assert array_info(t) == ArrayInfo(t.data_ptr(), (2, 3), "float32", True, True, "cpu")
    assert array_info([1, 2]) is None and array_info(3.0) is None and array_info("x") is None
    torch = pytest.importorskip("torch")
    x = torch.zeros(2, 3, dtype=torch.float16)
    assert array_info(x) == ArrayInfo(x.data_ptr(), (2, 3), "float16", True, True, "cpu")
    assert array_info(torch.empty(2, device="meta")).device == "meta"


@pytest.mark.parametrize("fake, device", [
    (FakeCai(dlpack_device=(2, 1)), "cuda:1"),           # CuPy: __dlpack_device__
    (FakeCai(device=CupyDevice(3)), "cuda:3"),           # CuPy's Device object
    (FakeCai(device=2), "cuda:2"),
    (FakeCai(device="cuda:1"), "cuda:1"),
    (FakeCai(dlpack_device=(10, 0)), "hip:0"),           # CuPy on ROCm
])
def test_cuda_array_interface_devices(fake, device):
    info = array_info(fake)
    assert info == ArrayInfo(BOGUS, (4,), "float32", True, True, device)


def test_cuda_array_interface_without_a_device_asks_the_driver():
    if driver.cuda_available():
        with pytest.raises(LaunchError, match=r"pointer 0xbad000000000 is not memory of any CUDA device"):
            array_info(FakeCai())
    else:
        assert array_info(FakeCai()).device == "cuda:0"   # nothing to ask; no launch can happen


@pytest.mark.parametrize("typestr, dtype", [("<f4", "float32"), ("<f2", "float16"), ("<f8", "float64"),
                                            ("|b1", "bool"), ("|i1", "int8"), ("<i2", "int16"), ("<i4", "int32"),
                                            ("<i8", "int64"), ("|u1", "uint8"), ("<u2", "uint16"),
                                            ("<u4", "uint32"), ("<u8", "uint64")])
def test_cuda_array_interface_typestr(typestr, dtype):
    assert array_info(FakeCai(typestr=typestr, device=0)).dtype == dtype


@pytest.mark.parametrize("strides, contiguous", [
    (None, True), ((36, 12, 4), True), ((36, 12, 8), False), ((4, 12, 36), False),
    ((999, 12, 4), False), ((6, 12, 4), False)])
def test_cuda_array_interface_strides(strides, contiguous):
    fake = FakeCai(shape=(2, 3, 3), device=0)
    fake.__cuda_array_interface__["strides"] = strides
    assert array_info(fake).contiguous is contiguous
    single = FakeCai(shape=(1, 3), device=0)          # a dimension of size 1 may have any stride
    single.__cuda_array_interface__["strides"] = (7, 4)
    assert array_info(single).contiguous


def test_cuda_array_interface_read_only_and_versions():
    assert array_info(FakeCai(readonly=True, device=0)).writeable is False
    for version in (0, 1, 2):
        assert array_info(FakeCai(version=version, device=0)).shape == (4,)


@pytest.mark.parametrize("fake, match", [
    (FakeCai(version=4, device=0), r"__cuda_array_interface__ version 4 is not supported \(versions 0 to 3 are\)"),
    (FakeCai(version=None, device=0), r"version None is not supported"),
    (FakeCai(mask=(BOGUS, False), device=0), r"has a mask: masked arrays are not supported"),
    (FakeCai(typestr=">f4", device=0), r"typestr '>f4' is not in this machine's byte order"),
    (FakeCai(typestr="<q9", device=0), r"typestr '<q9' is not a dtype taskmap supports"),
])
def test_cuda_array_interface_refusals(fake, match):
    with pytest.raises(LaunchError, match=match):
        array_info(fake)


def test_cuda_array_interface_malformed():
    class NotADict:
        __cuda_array_interface__ = [1, 2]

    class Missing:
        __cuda_array_interface__ = {"version": 3, "shape": (2,)}

    with pytest.raises(LaunchError, match="must be a dict, got list"):
        array_info(NotADict())
    with pytest.raises(LaunchError, match=r"needs 'shape', 'typestr' and 'data'"):
        array_info(Missing())


class DLPackOnly:
    """A JAX-like array: only the DLPack protocol (here over a host array)."""

    def __init__(self, x, device=None):
        self.x, self.device_ = x, device

    def __dlpack__(self, **kwargs):
        return self.x.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device_ or self.x.__dlpack_device__()


def test_dlpack_capable_objects():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    before = dlpack.live_exports()
    info = array_info(DLPackOnly(a))
    assert info == ArrayInfo(a.ctypes.data, (2, 3), "int32", True, True, "cpu")
    assert not array_info(DLPackOnly(a.T)).contiguous
    assert dlpack.live_exports() == before              # the capsule was read, not kept
    with pytest.raises(LaunchError, match="DLPack device type 4 is not supported"):
        array_info(DLPackOnly(a, device=(4, 0)))


def test_kernels_run_on_taskmap_and_dlpack_host_arrays():
    @taskmap.kernel
    def twice(a: taskmap.lang.f32["n"], out: taskmap.lang.f32["n"]):
        for i in range(a.shape[0]):
            out[i] = a[i] * 2.0

    x = np.arange(5, dtype=np.float32)
    out = taskmap.empty(5, device="cpu")
    twice(taskmap.tensor(x, device="cpu"), out)
    assert out.numpy().tolist() == [0, 2, 4, 6, 8]
    res = np.zeros(5, np.float32)
    twice(DLPackOnly(x), DLPackOnly(res))
    assert res.tolist() == [0, 2, 4, 6, 8]
    frozen = np.zeros(5, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(LaunchError, match="argument 'out' is written by the kernel but the array is read-only"):
        twice(x, taskmap.from_dlpack(frozen))
    with pytest.raises(LaunchError, match=r"argument 'a': __cuda_array_interface__ has a mask"):
        twice(FakeCai(shape=(5,), mask=1, device=0), out)


def test_aligned():
    """Arrays that start off a cache line are copied to one that starts on it (same values);
    aligned ones and strided views are returned as they are."""
    import torch
    from taskmap.runtime.args import CACHE_LINE, aligned
    buf = np.arange(200, dtype=np.float32)
    start = (-buf.ctypes.data % CACHE_LINE) // 4
    on, off = buf[start:start + 64], buf[start + 1:start + 65]
    assert aligned(on) is on
    fixed = aligned(off.reshape(8, 8))
    assert fixed.ctypes.data % CACHE_LINE == 0 and fixed.shape == (8, 8)
    np.testing.assert_array_equal(fixed.reshape(-1), off)
    strided = buf[start + 1::2]
    assert aligned(strided) is strided
    t = torch.arange(100, dtype=torch.float32)[1:65]
    ta = aligned(t)
    assert t.data_ptr() % CACHE_LINE and ta.data_ptr() % CACHE_LINE == 0 and torch.equal(ta, t)
    # what taskmap allocates on the CPU starts on a line: numpy buffers, taskmap tensors
    from taskmap.ops.arrays import ArrayKind, empty_like_kind
    from taskmap.runtime.tensor import empty
    for _ in range(8):
        a = empty_like_kind(ArrayKind("numpy", "cpu"), (3, 5), "float32")
        assert a.ctypes.data % CACHE_LINE == 0 and a.shape == (3, 5) and a.dtype == np.float32
        assert empty((7,), "float32", "cpu").data_ptr() % CACHE_LINE == 0
