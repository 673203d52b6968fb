"""The backend interface and the ``Target`` every other layer reads capabilities from.

A backend is three steps: ``render(module, target) -> source``, ``build(source, target) ->
Binary`` and ``load(binary) -> callable``.  Code outside ``backends/`` reads ``Target`` fields
(warp size, shared memory, vector width, ...) and never branches on a backend's name.
"""
from __future__ import annotations

import ctypes
import enum
import functools
import os
import platform
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Sequence

from ..ir.dtypes import ScalarType
from ..ir.func import Function, Module
from ..ir.types import TensorType
from .host_probe import in_place_steps, llc_bandwidth, zmm_fma_ratio


class TargetKind(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    HIP = "hip"


@dataclass(frozen=True)
class Target:
    """What code is generated for.  Frozen and hashable: it is part of every cache key."""

    kind: TargetKind
    arch: str                         # "x86-64-native", "sm_90", "gfx90a"
    warp_size: int = 32               # GPU-style kernels: threads per warp (64 on CDNA)
    max_threads_per_block: int = 1024
    max_shared_memory: int = 48 * 1024  # bytes per block without opting in
    max_shared_memory_optin: int = 48 * 1024
    vector_bytes: int = 16            # widest vector load/store (CPU: SIMD register width)
    num_cores: int = 1                # CPU cores, or GPU multiprocessors
    features: tuple[str, ...] = field(default=())
    # Performance numbers for the analytic cost model (taskmap.schedule.cost_model); 0 means
    # unknown (the model falls back to rough defaults).  GPUs: the datasheet of the arch's
    # flagship part; the host CPU: derived from its flags, core count and clock (see below).
    peak_flops_f32: float = 0.0       # FLOP/s of the whole device, an FMA counting 2
    peak_flops_f16: float = 0.0       # dense f16 matrix units (tensor cores, MFMA), f32 accumulate
    mem_bandwidth: float = 0.0        # bytes/s of DRAM / HBM
    cache_bandwidth: float = 0.0      # bytes/s of the shared level, all cores: GPU shared memory, CPU L2
    register_bandwidth: float = 0.0   # bytes/s into registers from L1 (CPU); 0: never the bottleneck
    l2_bytes: int = 0                 # L2 capacity of the whole device (CPU: per-core L2 x cores)
    clock_hz: float = 0.0
    fma512_per_cycle: float = 0.0     # CPU: 512-bit FMAs per cycle and core, measured (0: unknown, taken as 1)
    llc_bandwidth: float = 0.0        # CPU: bytes/s one core reads from the last-level cache, measured (0: unknown)
    llc_bytes: int = 0                # CPU: capacity of the last-level cache (0: unknown)
    # CPU: a matmul K step's time with B's rows read in place, all on cache lines / all off them,
    # over its time with B packed, measured (0: unknown; see :func:`.host_probe.in_place_steps`)
    b_in_place_step: float = 0.0
    b_off_line_step: float = 0.0
    transaction_bytes: int = 64       # smallest global-memory transaction (GPU sector, CPU cache line)
    max_threads_per_core: int = 0     # occupancy limits per SM / CU (0: no such limit; CPU: 1 task)
    max_blocks_per_core: int = 0
    registers_per_core: int = 0       # 32-bit registers per SM / CU
    shared_memory_per_core: int = 0   # bytes of shared memory per SM / CU

    @property
    def name(self) -> str:
        return f"{self.kind.value}:{self.arch}"

    @property
    def vector_fma_rate(self) -> float:
        """CPU: FMAs of the full SIMD width (``vector_bytes``) per cycle and core — two pipes of up
        to 256 bits; 512-bit ones at the measured ``fma512_per_cycle`` (1 when unknown: two
        256-bit halves, as on AMD Zen 4)."""
        lanes = max(4, self.vector_bytes // 4)
        return (self.fma512_per_cycle or 1.0) if lanes >= 16 else 2.0 * min(lanes, 8) / lanes


def _cpu_flags() -> tuple[str, ...]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return tuple(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ()


#: DRAM bandwidth (bytes/s) assumed for the host: it cannot be read from the system without
#: measuring, and the Target must not vary between runs (it keys the compile cache).  A typical
#: share of a server's memory channels; the 2-core development VM copies at about 17 GB/s.
HOST_MEM_BANDWIDTH = 20e9


def _cpuinfo_field(name: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def _cpu_clock_hz() -> float:
    """The nominal clock: from the model name ("@ 2.60GHz"), else the TSC rate (x86 BogoMIPS / 2),
    else 2.5 GHz.  Deterministic (the current MHz changes from second to second)."""
    model = _cpuinfo_field("model name") or ""
    if "@" in model and model.rstrip().endswith("GHz"):
        try:
            return float(model.rsplit("@", 1)[1].strip()[:-3]) * 1e9
        except ValueError:
            pass
    try:
        return float(_cpuinfo_field("bogomips") or "") / 2 * 1e6
    except ValueError:
        return 2.5e9


def _cpu_cache_bytes(level: int, default: int) -> int:
    """The size of cpu0's unified or data cache of ``level`` from sysfs (``default`` when it
    cannot be read)."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            with open(f"{base}/{index}/level") as f:
                if f.read().strip() != str(level):
                    continue
            with open(f"{base}/{index}/type") as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(f"{base}/{index}/size") as f:
                text = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default


def _cpu_l2_bytes() -> int:
    """Per-core L2 data-cache size from sysfs (1 MiB when it cannot be read)."""
    return _cpu_cache_bytes(2, 1 << 20)


@functools.cache
def host_cpu_target() -> Target:
    """The machine this process runs on (``-march=native``): its SIMD width, core count, and the
    cost model's peak numbers derived from them.  FMA rate: two pipes for 256-bit vectors; for
    512-bit ones, what :mod:`.host_probe` measured (one zmm FMA per cycle on AMD Zen 4, nearly two
    on Intel's server parts, whose two 512-bit pipes run at a lower clock), at the nominal clock;
    and what one core reads from the last-level cache, also measured (:func:`.host_probe.llc_bandwidth`),
    as is a matmul's K step reading B in place (AVX-512 hosts, :func:`.host_probe.in_place_steps`).
    Memoized: the host does not change while a process runs.  Cores: the CPUs, or fewer when
    ``OMP_NUM_THREADS`` says so (the kernels' parallel regions run that many threads: the cost
    models must plan for them)."""
    flags = _cpu_flags()
    simd = 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
    keep = tuple(f for f in flags if f.startswith(("avx", "fma", "sse", "f16c", "amx")))
    cores = os.cpu_count() or 1
    threads = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if threads.isdigit() and int(threads) > 0:
        cores = min(cores, int(threads))
    clock = _cpu_clock_hz()
    identity = (_cpuinfo_field("model name") or "", *flags)
    fma512 = zmm_fma_ratio(identity) if simd == 64 else 0.0
    l2 = _cpu_l2_bytes()
    l3 = _cpu_cache_bytes(3, 0)
    llc = llc_bandwidth(identity, l2, l3)
    on_line, off_line = in_place_steps(identity) if simd == 64 else (0.0, 0.0)
    target = Target(TargetKind.CPU, f"{platform.machine()}-native", warp_size=32,
                    max_threads_per_block=1024, max_shared_memory=1 << 20, max_shared_memory_optin=1 << 20,
                    vector_bytes=simd, num_cores=cores, features=keep, mem_bandwidth=HOST_MEM_BANDWIDTH,
                    cache_bandwidth=cores * 64 * clock, register_bandwidth=cores * 2 * min(simd, 32) * clock,
                    l2_bytes=cores * l2, clock_hz=clock, fma512_per_cycle=fma512, llc_bandwidth=llc,
                    llc_bytes=l3 or cores * l2, b_in_place_step=on_line, b_off_line_step=off_line,
                    transaction_bytes=64, max_blocks_per_core=1)
    lanes = simd // 4
    flops_per_cycle = 2 * lanes * target.vector_fma_rate if "fma" in flags else 2 * min(lanes, 8)
    return replace(target, peak_flops_f32=cores * flops_per_cycle * clock)


@dataclass(frozen=True)
class Binary:
    """A built artifact: the generated source and the binary (bytes or a file path)."""

    target: Target
    source: str
    binary: Any
    source_path: str | None = None
    entry: str = ""
    extra: Any = None  # the toolchain's own result (e.g. a CudaBinary with cubin, PTX and log)


_CTYPES = {
    "bool": ctypes.c_bool, "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32,
    "int64": ctypes.c_int64, "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32,
    "uint64": ctypes.c_uint64, "float16": ctypes.c_float, "bfloat16": ctypes.c_float,
    "float32": ctypes.c_float, "float64": ctypes.c_double,
}


def ctypes_type(t: ScalarType | TensorType) -> Any:
    """The ctypes type an argument of type ``t`` is passed as (tensors: a pointer; half floats as
    float, which the generated entry converts)."""
    return ctypes.c_void_p if isinstance(t, TensorType) else _CTYPES[t.name]


def param_ctypes(func: Function) -> list[Any]:
    """ctypes of a kernel's arguments: its parameters, then its symbolic sizes (int32)."""
    return [ctypes_type(p.type) for p in func.params] + [ctypes.c_int32 for _ in func.size_vars]


class Launcher(Protocol):
    """Runs a built kernel: ``values`` are the parameters then the sizes (pointers as ints), on
    device ordinal ``device`` of the launcher's kind, on ``stream`` (None: the default stream)."""

    def __call__(self, values: Sequence[Any], grid: tuple[int, int, int], block: tuple[int, int, int],
                 smem_bytes: int, stream: Any, device: int = 0) -> int: ...


class Backend(Protocol):
    def render(self, module: Module, target: Target) -> str: ...

    def build(self, source: str, target: Target, entry: str) -> Binary: ...

    def load(self, binary: Binary, func: Function) -> Launcher | None:
        """A launcher, or None when the device is not present in this process."""
