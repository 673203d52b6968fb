"""taskmap.Tensor: construction, copies, dtypes, freeing, __cuda_array_interface__ and DLPack.

Host tensors (``device="cpu"``) run everywhere; CUDA tensors run on a fake device here (its
memory is a host bytearray behind made-up addresses that nothing may dereference) and on a real
GPU under the ``cuda`` marker.
"""
import gc
import sys

import numpy as np
import pytest

import taskmap
from taskmap.backends.cuda import driver
from taskmap.errors import UnsupportedError
from taskmap.runtime import dlpack
from taskmap.runtime import tensor as tensor_mod

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
          "float32", "float64"]
RNG = np.random.default_rng(11)


def sample(dtype, shape=(3, 5)):
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(dtype)
    return RNG.uniform(-3, 3, shape).astype(dtype)


# ----------------------------------------------------------------------------- host tensors


@pytest.mark.parametrize("dtype", DTYPES)
def test_host_round_trip_and_description(dtype):
    x = sample(dtype)
    t = taskmap.tensor(x, device="cpu")
    assert (t.shape, t.dtype, t.device, t.ndim, t.size) == ((3, 5), dtype, "cpu", 2, 15)
    assert t.nbytes == x.nbytes and t.itemsize == x.itemsize and len(t) == 3 and t.data_ptr() != 0
    back = t.numpy()
    assert back.dtype == x.dtype and np.array_equal(back, x)
    back[0, 0] = back[0, 1]                    # a copy: the tensor keeps its values
    assert np.array_equal(t.numpy(), x)
    assert repr(t) == f"taskmap.Tensor(shape=(3, 5), dtype={dtype}, device='cpu')"


def test_dtype_spellings_and_conversion():
    from taskmap.lang import f16
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    for spelling in ("float32", "f32", np.float32, np.dtype("float32"), taskmap.lang.f32):
        t = taskmap.tensor(x, device="cpu", dtype=spelling)
        assert t.dtype == "float32" and np.array_equal(t.numpy(), x.astype(np.float32))
    assert taskmap.tensor([1.5, 2], device="cpu", dtype=f16).numpy().tolist() == [1.5, 2.0]
    assert taskmap.tensor(3, device="cpu").shape == () and taskmap.tensor(3, device="cpu").numpy() == 3
    with pytest.raises(UnsupportedError, match="unsupported dtype 'complex64'"):
        taskmap.empty(3, "complex64", device="cpu")
    torch = pytest.importorskip("torch")
    assert taskmap.empty(2, torch.float16, device="cpu").dtype == "float16"


def test_bfloat16_rounds_to_nearest_even_like_torch():
    torch = pytest.importorskip("torch")
    x = np.concatenate([RNG.standard_normal(500).astype(np.float32) * 1e3,
                        np.array([0, -0.0, 1 + 2**-8, 1 + 3 * 2**-8, np.inf, -np.inf, np.nan], np.float32)])
    t = taskmap.tensor(x, device="cpu", dtype="bfloat16")
    assert t.dtype == "bfloat16" and t.itemsize == 2 and t.numpy().dtype == np.float32
    want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(t.numpy(), want, equal_nan=True)
    assert np.signbit(t.numpy()[501])


def test_empty_shapes_and_bad_arguments():
    assert taskmap.empty((0, 4), device="cpu").numpy().shape == (0, 4)
    assert taskmap.empty(7, "int32", device="cpu").shape == (7,)
    t = taskmap.empty((2, 2), device="cpu").copy_(np.ones((2, 2)))
    assert t.numpy().tolist() == [[1, 1], [1, 1]]
    with pytest.raises(ValueError, match=r"negative dimension in shape \(2, -1\)"):
        taskmap.empty((2, -1), device="cpu")
    with pytest.raises(taskmap.errors.TaskmapError, match=r"copy_: shape \(3,\) does not match the tensor's \(2, 2\)"):
        t.copy_(np.ones(3))
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(taskmap.empty((), device="cpu"))


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:1", "cuda0", ""])
def test_unknown_devices(device):
    with pytest.raises(UnsupportedError, match=r"unknown device .*use 'cpu', 'cuda', 'cuda:N', 'hip' or 'hip:N'"):
        taskmap.empty(3, device=device)


def test_gpu_tensors_without_a_gpu():
    if driver.cuda_available():
        pytest.skip("an NVIDIA GPU is present")
    with pytest.raises(UnsupportedError, match=r"no NVIDIA GPU in this process: cannot place a tensor on cuda:0"):
        taskmap.tensor(np.ones(3, np.float32))              # device="cuda" is the default
    with pytest.raises(UnsupportedError, match=r"no AMD GPU in this process: cannot place a tensor on hip:1"):
        taskmap.empty(3, device="hip:1")


def test_host_tensor_has_no_cuda_array_interface():
    t = taskmap.empty(3, device="cpu")
    assert not hasattr(t, "__cuda_array_interface__")
    assert t.__dlpack_device__() == (dlpack.CPU, 0)


# ----------------------------------------------------------------------------- a fake CUDA device


class FakeBuffer:
    """Device memory of the fake GPU: a host bytearray behind an address nobody may dereference."""

    def __init__(self, ptr, nbytes, log):
        self.ptr, self.nbytes, self.data, self.log = ptr, nbytes, bytearray(nbytes), log

    def copy_from(self, host):
        host = np.ascontiguousarray(host)
        self.data[:host.nbytes] = host.tobytes()

    def copy_to(self, host):
        host.reshape(-1).view(np.uint8)[:] = np.frombuffer(bytes(self.data[:host.nbytes]), np.uint8)
        return host

    def free(self):
        self.log.append(("free", self.ptr))


class FakeCuda:
    def __init__(self):
        self.log, self.next = [], 0xDEAD_0000_0000

    def alloc(self, nbytes, device):
        ptr, self.next = self.next, self.next + ((max(nbytes, 1) + 255) // 256 + 1) * 256
        self.log.append(("alloc", ptr, nbytes, device))
        return FakeBuffer(ptr, nbytes, self.log)

    def synchronize(self, device):
        self.log.append(("sync", device))


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(driver, "cuda_available", lambda: True)
    monkeypatch.setattr(driver, "device_count", lambda: 2)
    monkeypatch.setattr(driver, "alloc", fake.alloc)
    monkeypatch.setattr(driver, "synchronize", fake.synchronize)
    return fake


def test_fake_cuda_tensor_round_trip(fake_cuda):
    x = sample("float32", (4, 6))
    t = taskmap.tensor(x, device="cuda:1")
    assert (t.device, t.shape, t.dtype, t.nbytes) == ("cuda:1", (4, 6), "float32", 96)
    assert fake_cuda.log[0] == ("alloc", t.data_ptr(), 96, 1)
    assert np.array_equal(t.numpy(), x)
    assert ("sync", 1) in fake_cuda.log                  # numpy() waits for the device first
    assert taskmap.empty(3, "int8", "cuda").device == "cuda:0"
    with pytest.raises(UnsupportedError, match=r"cuda:2 does not exist: this machine has 2 NVIDIA GPU"):
        taskmap.empty(3, device="cuda:2")


def test_cuda_array_interface_v3(fake_cuda):
    t = taskmap.tensor(sample("int16", (2, 3)), device="cuda:1")
    cai = t.__cuda_array_interface__
    assert cai == {"shape": (2, 3), "typestr": "<i2", "descr": [("", "<i2")], "data": (t.data_ptr(), False),
                   "strides": None, "version": 3, "stream": 1}
    assert t.__dlpack_device__() == (dlpack.CUDA, 1)
    with pytest.raises(AttributeError, match="no typestr for bfloat16: use DLPack"):
        _ = taskmap.empty(2, "bfloat16", "cuda").__cuda_array_interface__


def test_device_memory_is_freed_when_the_last_reference_goes(fake_cuda):
    t = taskmap.empty((1024,), "float32", "cuda")
    ptr = t.data_ptr()
    capsule = t.__dlpack__()                             # an export keeps the memory alive
    del t
    gc.collect()
    assert ("free", ptr) not in fake_cuda.log
    view = dlpack.peek(capsule)
    assert (view.ptr, view.shape, view.device_type, view.device_id) == (ptr, (1024,), dlpack.CUDA, 0)
    del capsule                                          # never consumed: the capsule releases it
    gc.collect()
    assert fake_cuda.log.count(("free", ptr)) == 1


def test_freeing_errors_are_swallowed(fake_cuda, monkeypatch):
    calls, reported = [], []

    def broken(self):
        calls.append(self.ptr)
        raise RuntimeError("driver gone")

    monkeypatch.setattr(FakeBuffer, "free", broken)
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    monkeypatch.setattr(sys, "excepthook", lambda *exc: reported.append(exc))
    t = taskmap.empty(4, device="cuda")
    ptr = t.data_ptr()
    del t
    gc.collect()
    assert calls == [ptr] and reported == []            # nothing escapes the collector


# ----------------------------------------------------------------------------- DLPack, on the host


def test_dlpack_export_to_torch_and_numpy_is_zero_copy():
    torch = pytest.importorskip("torch")
    x = sample("float32", (3, 4))
    t = taskmap.tensor(x, device="cpu")
    before = dlpack.live_exports()
    viewed = torch.from_dlpack(t)                        # versioned capsule (torch asks for DLPack 1.0)
    legacy = torch.utils.dlpack.from_dlpack(t.__dlpack__())
    arr = np.from_dlpack(t)
    assert viewed.data_ptr() == legacy.data_ptr() == arr.ctypes.data == t.data_ptr()
    viewed[0, 0] = 42.0
    assert t.numpy()[0, 0] == 42.0 and legacy[0, 0] == 42.0 and arr[0, 0] == 42.0
    del t
    gc.collect()
    assert torch.equal(viewed.cpu(), torch.from_numpy(np.where(np.arange(12).reshape(3, 4) == 0, 42.0, x)))
    assert dlpack.live_exports() >= before + 2
    del viewed, legacy, arr
    gc.collect()
    assert dlpack.live_exports() == before


def test_dlpack_export_options():
    torch = pytest.importorskip("torch")
    t = taskmap.tensor(np.arange(4, dtype=np.int32), device="cpu")
    copied = torch.from_dlpack(t.__dlpack__(copy=True))
    copied[0] = 9
    assert t.numpy()[0] == 0 and copied.data_ptr() != t.data_ptr()
    with pytest.raises(BufferError, match=r"cannot export a cpu tensor to DLPack device \(2, 0\)"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError, match="stream must be an int or None"):
        t.__dlpack__(stream="default")
    assert torch.from_dlpack(taskmap.tensor([1.5, -2], device="cpu", dtype="bfloat16")).dtype == torch.bfloat16
    assert torch.from_dlpack(taskmap.tensor([True, False], device="cpu")).tolist() == [True, False]


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32",
                                   "float64"])
def test_from_dlpack_of_torch_tensors_shares_memory(dtype):
    torch = pytest.importorskip("torch")
    src = torch.zeros(5, dtype=getattr(torch, dtype))
    t = taskmap.from_dlpack(src)
    assert (t.dtype, t.shape, t.device, t.data_ptr()) == (dtype, (5,), "cpu", src.data_ptr())
    src[2] = 1
    assert t.numpy()[2] == 1


def test_from_dlpack_keeps_the_producer_alive_and_releases_it():
    torch = pytest.importorskip("torch")
    t = taskmap.from_dlpack(torch.arange(100, dtype=torch.float64) * 3)   # the torch tensor is a temporary
    gc.collect()
    assert np.array_equal(t.numpy(), np.arange(100) * 3.0)
    view = taskmap.from_dlpack(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert view.numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    capsule = torch.utils.dlpack.to_dlpack(torch.ones(3))
    assert taskmap.from_dlpack(capsule).numpy().tolist() == [1, 1, 1]   # a bare capsule works too
    with pytest.raises(BufferError, match="already consumed"):
        taskmap.from_dlpack(capsule)


def test_from_dlpack_refusals():
    torch = pytest.importorskip("torch")
    with pytest.raises(UnsupportedError, match=r"C-contiguous, got shape \(3, 2\) with strides \(1, 3\)"):
        taskmap.from_dlpack(torch.arange(6).reshape(2, 3).t())
    assert taskmap.from_dlpack(torch.arange(6).reshape(6, 1)[::1]).shape == (6, 1)

    class OnVulkan:
        def __dlpack__(self, **kwargs):
            raise AssertionError("must not be asked for a capsule")

        def __dlpack_device__(self):
            return 7, 0

    with pytest.raises(UnsupportedError, match="DLPack device type 7 is not supported"):
        taskmap.from_dlpack(OnVulkan())


def test_read_only_dlpack_import_is_not_writable():
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    t = taskmap.from_dlpack(a)                           # numpy marks the versioned capsule read-only
    assert not t.writeable
    with pytest.raises(taskmap.errors.TaskmapError, match="read-only"):
        t.copy_(np.zeros(4))


def test_from_dlpack_producers_of_old_protocol_versions():
    torch = pytest.importorskip("torch")
    calls = []

    class Old:                                           # __dlpack__() without keywords, DLPack 0.x
        def __init__(self, x):
            self.x = x

        def __dlpack__(self, *args):
            calls.append(args)
            return torch.utils.dlpack.to_dlpack(self.x)

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

    src = torch.arange(3, dtype=torch.int32)
    assert taskmap.from_dlpack(Old(src)).numpy().tolist() == [0, 1, 2] and calls == [()]


# ----------------------------------------------------------------------------- a real GPU


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES + ["bfloat16"])
def test_cuda_round_trip(dtype):
    x = sample("float32" if dtype == "bfloat16" else dtype, (33, 7))
    t = taskmap.tensor(x, device="cuda", dtype=dtype)
    assert t.device == "cuda:0" and t.data_ptr() != 0 and driver.pointer_device(t.data_ptr()) == 0
    want = tensor_mod.from_bf16_bits(tensor_mod.to_bf16_bits(x)) if dtype == "bfloat16" else x
    assert np.array_equal(t.numpy(), want)
    assert taskmap.empty((0, 3), dtype, "cuda").numpy().shape == (0, 3)


@pytest.mark.cuda
def test_cuda_interchange_with_torch():
    torch = pytest.importorskip("torch")
    x = sample("float32", (64, 3))
    t = taskmap.tensor(x)
    via_cai = torch.as_tensor(t, device="cuda")          # __cuda_array_interface__
    via_dlpack = torch.from_dlpack(t)
    assert via_cai.data_ptr() == via_dlpack.data_ptr() == t.data_ptr()
    via_dlpack[0, 0] = 7.0
    torch.cuda.synchronize()
    assert t.numpy()[0, 0] == 7.0 and via_cai[0, 0].item() == 7.0
    src = torch.arange(10, device="cuda", dtype=torch.float32)
    back = taskmap.from_dlpack(src)
    assert (back.device, back.data_ptr()) == ("cuda:0", src.data_ptr())
    src.mul_(2)
    assert back.numpy().tolist() == [2.0 * i for i in range(10)]


@pytest.mark.cuda
def test_cuda_memory_is_freed(monkeypatch):
    freed = []
    real_free = driver.DeviceBuffer.free
    monkeypatch.setattr(driver.DeviceBuffer, "free", lambda self: (freed.append(self.ptr), real_free(self)))
    t = taskmap.empty(1 << 26, "float32", "cuda")                      # 256 MiB
    ptr = t.data_ptr()
    del t
    gc.collect()
    assert freed == [ptr] and driver.pointer_device(ptr) is None
