"""An analytic, Roller-style micro-performance model that templates use to rank their schedules.

A template describes what one schedule of its kernel does as a :class:`Workload` — FLOPs, bytes
moved at each memory level, how many parallel work items (thread blocks, CPU tasks) it has,
what each one occupies — and :func:`estimate` turns that into seconds on a ``Target``:

    time = waves x per-wave time, where a core (an SM, a CU, a CPU core) runs up to
    ``occupancy`` items at once and one item's time is the slowest of
    compute (FLOPs / the core's share of peak), global memory (bytes / the transaction
    efficiency of the innermost access / the core's share of DRAM bandwidth, as ROLLER splits a
    shared level evenly), the shared level (shared memory, CPU L2) and registers;
    too few resident threads to hide latency (GPU) slow a core down.

On a full device this is ROLLER's ``max(compute time, memory time)`` times the wave quantization
``waves x slots / work items``; with fewer items than cores it is one item's time on one core.
The model is only meant to be accurate for aligned tiles (ROLLER §3.3): misalignment enters as a
multiplicative penalty, and only the ranking of a template's points matters.

Example (a tile of C = A @ B per block, f32, on an H100)::

    w = Workload(flops=2 * M * N * K, global_bytes=4 * (M * N + K * (M * N / tn + M * N / tm)),
                 cache_bytes=..., work_items=ceil(M / tm) * ceil(N / tn), threads_per_item=128,
                 registers_per_thread=96, shared_per_item=stages * 4 * (tm + tn) * tk,
                 inner_bytes=4 * tk)
    seconds = estimate_time(cuda_target("sm_90"), w)

Peak numbers come from the ``Target`` (``peak_flops_f32``, ``mem_bandwidth``, ...); where a target
leaves one at 0 (unknown), a rough per-core default stands in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..backends.base import Target

#: Fraction of a core's maximum resident threads at which latency is taken to be fully hidden
#: (GPU: 16 of 64 warps); fewer resident threads slow the core down proportionally.
LATENCY_HIDING_OCCUPANCY = 0.25

# Stand-ins (per core) for peak numbers a Target leaves at 0: a GPU multiprocessor at 1 GHz.
_DEFAULT_FLOPS_PER_CORE = 256e9
_DEFAULT_BYTES_PER_CORE = 10e9


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * int(b)


# ---------------------------------------------------------------------------------------------
# Components


@dataclass(frozen=True)
class Occupancy:
    """How many work items (blocks) one core keeps resident, and what limits it."""

    items_per_core: int      # 0: the item does not fit on a core at all
    limited_by: str          # "threads", "registers", "shared memory", "blocks", "block size", or "none"
    thread_fraction: float   # resident threads / the core's maximum (1.0 where there is no limit)


def occupancy(target: Target, threads_per_item: int = 1, registers_per_thread: int = 0,
              shared_per_item: int = 0) -> Occupancy:
    """Items resident per core from the target's per-core limits (threads, 32-bit registers,
    shared memory, blocks; threads are allocated by whole warps).  A limit the target leaves at 0
    does not apply; with none at all a core holds one item."""
    threads = round_up(max(threads_per_item, 1), max(target.warp_size, 1))
    if threads_per_item > target.max_threads_per_block or shared_per_item > target.max_shared_memory_optin:
        return Occupancy(0, "block size", 0.0)
    limits: dict[str, int] = {}
    if target.max_blocks_per_core:
        limits["blocks"] = target.max_blocks_per_core
    if target.max_threads_per_core:
        limits["threads"] = target.max_threads_per_core // threads
    if target.registers_per_core and registers_per_thread:
        limits["registers"] = target.registers_per_core // (registers_per_thread * threads)
    if target.shared_memory_per_core and shared_per_item:
        limits["shared memory"] = target.shared_memory_per_core // shared_per_item
    if not limits:
        return Occupancy(1, "none", 1.0)
    name = min(limits, key=lambda k: limits[k])
    items = max(limits[name], 0)
    fraction = items * threads / target.max_threads_per_core if target.max_threads_per_core else 1.0
    return Occupancy(items, name, min(fraction, 1.0))


def waves(target: Target, work_items: int, items_per_core: int = 1) -> int:
    """``ceil(work items / (cores x items per core))``: rounds of the whole device."""
    return ceil_div(max(work_items, 1), max(target.num_cores, 1) * max(items_per_core, 1))


def wave_efficiency(target: Target, work_items: int, items_per_core: int = 1) -> float:
    """Fraction of the device's slots busy over all waves (1.0: the last wave is full)."""
    slots = max(target.num_cores, 1) * max(items_per_core, 1)
    return max(work_items, 1) / (waves(target, work_items, items_per_core) * slots)


def transaction_efficiency(contiguous_bytes: float, transaction_bytes: int, offset_bytes: int = 0) -> float:
    """Useful / transferred bytes for a contiguous run of ``contiguous_bytes`` starting
    ``offset_bytes`` past a transaction boundary (ROLLER's alignment with memory transactions).
    ``contiguous_bytes`` <= 0 means aligned (unknown): 1.0."""
    if contiguous_bytes <= 0 or transaction_bytes <= 0:
        return 1.0
    start = offset_bytes % transaction_bytes
    moved = round_up(math.ceil(start + contiguous_bytes), transaction_bytes)
    return contiguous_bytes / moved


def lane_efficiency(used: int, width: int) -> float:
    """Fraction of ``width`` lanes (SIMD lanes, threads of a warp) doing useful work when ``used``
    elements are spread over them: ``used / round_up(used, width)``."""
    if used <= 0 or width <= 1:
        return 1.0
    return used / round_up(used, width)


def peak_flops(target: Target, matrix_units: bool = False) -> float:
    """FLOP/s of the whole device (f16 matrix units when asked for and present)."""
    if matrix_units and target.peak_flops_f16 > 0:
        return target.peak_flops_f16
    return target.peak_flops_f32 or _DEFAULT_FLOPS_PER_CORE * max(target.num_cores, 1)


def memory_bandwidth(target: Target) -> float:
    return target.mem_bandwidth or _DEFAULT_BYTES_PER_CORE * max(target.num_cores, 1)


# ---------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class Workload:
    """What one schedule of a kernel does, in totals over the whole kernel (ROLLER's rTile
    quantities times the number of tiles).

    ``global_bytes``: DRAM / HBM traffic; ``cache_bytes``: traffic at the shared level (GPU
    shared memory, CPU L2 -> L1); ``register_bytes``: loads into registers (CPU: from L1).
    ``footprint_per_item``: bytes one item keeps live in the shared level (CPU: its working set,
    checked against the core's L2; the part of ``cache_bytes`` that does not fit goes to DRAM).
    ``inner_bytes``: length of the contiguous runs global memory is read in (the innermost tile
    dimension; 0: aligned).  ``compute_efficiency``: the template's own factor for lanes left
    idle (see :func:`lane_efficiency`), dependency stalls, ...
    """

    flops: float
    global_bytes: float
    cache_bytes: float = 0.0
    register_bytes: float = 0.0
    work_items: int = 1
    threads_per_item: int = 1
    registers_per_thread: int = 0
    shared_per_item: int = 0
    footprint_per_item: int = 0
    inner_bytes: int = 0
    offset_bytes: int = 0
    matrix_units: bool = False
    compute_efficiency: float = 1.0


@dataclass(frozen=True)
class Estimate:
    """The model's verdict, with its parts (seconds, for the whole kernel)."""

    time: float
    compute_time: float
    memory_time: float
    cache_time: float
    register_time: float
    waves: int
    wave_efficiency: float
    alignment: float
    occupancy: Occupancy
    bound: str                # "compute", "memory", "cache", "registers" or "infeasible"

    def __float__(self) -> float:
        return self.time


def estimate(target: Target, w: Workload) -> Estimate:
    """Estimated run time of ``w`` on ``target`` (``inf`` when an item does not fit on a core)."""
    occ = occupancy(target, w.threads_per_item, w.registers_per_thread, w.shared_per_item)
    cores = max(target.num_cores, 1)
    items = max(int(w.work_items), 1)
    align = transaction_efficiency(w.inner_bytes, target.transaction_bytes, w.offset_bytes)
    if occ.items_per_core == 0:
        inf = math.inf
        return Estimate(inf, inf, inf, inf, inf, 0, 0.0, align, occ, "infeasible")

    # Per item, at the full throughput of one core (ROLLER splits shared levels evenly).
    per_core_cache = target.l2_bytes / cores if target.l2_bytes else 0.0
    items_per_core = ceil_div(items, cores)
    resident = min(occ.items_per_core, items_per_core)
    spilled = 0.0
    if per_core_cache and w.footprint_per_item:
        live = w.footprint_per_item * resident
        spilled = max(0.0, 1.0 - per_core_cache / live) * w.cache_bytes
    parts = {
        "compute": w.flops / (peak_flops(target, w.matrix_units) * max(w.compute_efficiency, 1e-9)),
        "memory": (w.global_bytes / align + spilled) / memory_bandwidth(target),
        "cache": w.cache_bytes / target.cache_bandwidth if target.cache_bandwidth else 0.0,
        "registers": w.register_bytes / target.register_bandwidth if target.register_bandwidth else 0.0,
    }
    # Whole-device times -> one item on one core: x cores / items.
    per_item = {k: v * cores / items for k, v in parts.items()}
    bound = max(per_item, key=lambda k: per_item[k])

    # A core runs ``resident`` items at once, sharing its throughput; too few resident threads
    # leave latency exposed.  Rounds of the device: waves.
    threads_resident = round_up(max(w.threads_per_item, 1), max(target.warp_size, 1)) * resident
    hidden = 1.0
    if target.max_threads_per_core:
        fraction = threads_resident / target.max_threads_per_core
        hidden = min(1.0, fraction / LATENCY_HIDING_OCCUPANCY)
    n_waves = ceil_div(items_per_core, occ.items_per_core)
    time = n_waves * resident * per_item[bound] / hidden
    return Estimate(time=time, compute_time=parts["compute"], memory_time=parts["memory"],
                    cache_time=parts["cache"], register_time=parts["registers"], waves=n_waves,
                    wave_efficiency=wave_efficiency(target, items, occ.items_per_core), alignment=align,
                    occupancy=occ, bound=bound)


def estimate_time(target: Target, w: Workload) -> float:
    """:func:`estimate`'s time alone (what ``Template.cost`` returns)."""
    return estimate(target, w).time


def roofline_time(target: Target, flops: float, global_bytes: float, matrix_units: bool = False) -> float:
    """The ideal: ``max(flops / peak, bytes / bandwidth)`` on the whole device."""
    return max(flops / peak_flops(target, matrix_units), global_bytes / memory_bandwidth(target))
