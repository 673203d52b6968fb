"""The analytic cost model: sanity properties (monotonic in work, alignment, waves, occupancy)
and worked numeric examples on fixed targets, plus the targets' peak numbers."""
import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.backends import TargetKind, cuda_target, hip_target, host_cpu_target
from taskmap.backends.base import Target
from taskmap.backends.cuda.driver import DeviceProperties
from taskmap.backends.cuda.target import target_from_properties
from taskmap.schedule.cost_model import (Workload, estimate, estimate_time, lane_efficiency, occupancy,
                                         roofline_time, transaction_efficiency, wave_efficiency, waves)

# A 2-core CPU with round numbers: 100 GFLOP/s, 10 GB/s DRAM, 100 GB/s L2, 1 MiB L2 per core.
CPU = Target(TargetKind.CPU, "test", vector_bytes=64, num_cores=2, peak_flops_f32=100e9, mem_bandwidth=10e9,
             cache_bandwidth=100e9, l2_bytes=2 << 20, transaction_bytes=64, max_blocks_per_core=1,
             max_shared_memory_optin=1 << 20)
H100 = cuda_target("sm_90")
FEW = settings(max_examples=40, deadline=None)


# ---------------------------------------------------------------------------------------------
# Worked examples


def test_roofline_numbers_on_a_full_cpu():
    # 1 GFLOP on 100 GFLOP/s: 10 ms; 50 MB at 10 GB/s: 5 ms -> compute-bound, 10 ms.
    e = estimate(CPU, Workload(flops=1e9, global_bytes=50e6, work_items=2))
    assert e.bound == "compute" and e.time == pytest.approx(10e-3)
    assert e.compute_time == pytest.approx(10e-3) and e.memory_time == pytest.approx(5e-3)
    e = estimate(CPU, Workload(flops=1e8, global_bytes=200e6, work_items=4))
    assert e.bound == "memory" and e.time == pytest.approx(20e-3) and e.waves == 2
    assert roofline_time(CPU, 1e9, 50e6) == pytest.approx(10e-3)


def test_wave_quantization_on_two_cores():
    w = Workload(flops=1e9, global_bytes=0, work_items=2)
    full = estimate_time(CPU, w)
    # 3 tasks on 2 cores: 2 waves, the second half empty -> 4/3 of the ideal.
    assert estimate_time(CPU, dataclasses.replace(w, work_items=3)) == pytest.approx(full * 4 / 3)
    assert estimate_time(CPU, dataclasses.replace(w, work_items=4)) == pytest.approx(full)
    # 1 task leaves a core idle: twice the time.
    assert estimate_time(CPU, dataclasses.replace(w, work_items=1)) == pytest.approx(2 * full)
    assert waves(CPU, 3) == 2 and wave_efficiency(CPU, 3) == 0.75 and waves(CPU, 4) == 2
    assert waves(H100, 132 * 4 + 1, items_per_core=4) == 2


def test_occupancy_limits_on_an_h100():
    assert occupancy(H100, 256, 64) == occupancy(H100, 256, 64, 0)
    o = occupancy(H100, 256, registers_per_thread=64)               # 65536 / (64 * 256) = 4
    assert (o.items_per_core, o.limited_by, o.thread_fraction) == (4, "registers", 0.5)
    o = occupancy(H100, 128, registers_per_thread=32, shared_per_item=100 * 1024)   # 228 KB / 100 KB
    assert (o.items_per_core, o.limited_by) == (2, "shared memory")
    o = occupancy(H100, 1024, registers_per_thread=16)               # 2048 threads / 1024
    assert (o.items_per_core, o.limited_by) == (2, "threads")
    o = occupancy(H100, 32, registers_per_thread=16)                 # 32 resident blocks at most
    assert (o.items_per_core, o.limited_by) == (32, "blocks")
    assert occupancy(H100, 48).items_per_core == 32                  # 48 threads use 2 warps
    assert occupancy(H100, 2048).items_per_core == 0                 # more than a block may have
    assert occupancy(H100, 128, shared_per_item=300 * 1024).items_per_core == 0
    assert occupancy(CPU, 1).items_per_core == 1


def test_items_that_do_not_fit_are_infinitely_slow():
    e = estimate(H100, Workload(flops=1e9, global_bytes=1e6, work_items=100, threads_per_item=2048))
    assert e.time == math.inf and e.bound == "infeasible"


def test_alignment_numbers():
    assert transaction_efficiency(64, 64) == 1.0
    assert transaction_efficiency(60, 64) == pytest.approx(60 / 64)
    assert transaction_efficiency(96, 64) == pytest.approx(96 / 128)
    assert transaction_efficiency(64, 64, offset_bytes=4) == pytest.approx(64 / 128)
    assert transaction_efficiency(0, 64) == 1.0
    assert lane_efficiency(16, 16) == 1.0 and lane_efficiency(17, 16) == pytest.approx(17 / 32)
    assert lane_efficiency(5, 1) == 1.0
    w = Workload(flops=0, global_bytes=1e8, work_items=2, inner_bytes=96)
    assert estimate_time(CPU, w) == pytest.approx(1e8 / (96 / 128) / 10e9)


def test_matrix_units_and_latency_hiding_on_an_h100():
    mm = Workload(flops=2 * 4096 ** 3, global_bytes=1e8, work_items=132 * 4, threads_per_item=128,
                  registers_per_thread=64)
    simt, tc = estimate_time(H100, mm), estimate_time(H100, dataclasses.replace(mm, matrix_units=True))
    assert simt == pytest.approx(2 * 4096 ** 3 / 67e12) and tc < simt / 10
    # One 32-thread block per SM cannot hide latency: slower per item than 8 of them.
    thin = Workload(flops=1e9, global_bytes=0, work_items=132, threads_per_item=32)
    wide = dataclasses.replace(thin, threads_per_item=256)
    assert estimate_time(H100, thin) > estimate_time(H100, wide)


def test_a_working_set_that_overflows_the_l2_costs_dram_traffic():
    w = Workload(flops=0, global_bytes=1e6, cache_bytes=1e9, work_items=2, footprint_per_item=512 << 10)
    spilled = dataclasses.replace(w, footprint_per_item=4 << 20)     # 4 MiB vs 1 MiB per core
    assert estimate(CPU, w).bound == "cache" and estimate(CPU, spilled).bound == "memory"
    assert estimate_time(CPU, spilled) == pytest.approx((1e6 + 0.75 * 1e9) / 10e9)


# ---------------------------------------------------------------------------------------------
# Properties


work = st.builds(Workload, flops=st.floats(1e3, 1e12), global_bytes=st.floats(1e3, 1e10),
                 cache_bytes=st.floats(0, 1e10), work_items=st.integers(1, 5000),
                 threads_per_item=st.sampled_from([32, 64, 128, 256]), registers_per_thread=st.integers(16, 128),
                 inner_bytes=st.integers(0, 512))


@given(work, st.floats(1.01, 8), st.sampled_from([CPU, H100, cuda_target("sm_80"), hip_target("gfx90a")]))
@FEW
def test_more_bytes_or_flops_never_take_less_time(w, factor, target):
    t = estimate_time(target, w)
    assert estimate_time(target, dataclasses.replace(w, global_bytes=w.global_bytes * factor)) >= t
    assert estimate_time(target, dataclasses.replace(w, flops=w.flops * factor)) >= t
    assert estimate_time(target, dataclasses.replace(w, cache_bytes=w.cache_bytes * factor + 1)) >= t


@given(work, st.sampled_from([CPU, H100]))
@FEW
def test_aligned_runs_never_take_more_time(w, target):
    aligned = dataclasses.replace(w, inner_bytes=512)
    ragged = dataclasses.replace(w, inner_bytes=500)
    assert estimate_time(target, aligned) <= estimate_time(target, ragged)


@given(st.integers(1, 64), st.integers(1, 16))
@FEW
def test_more_tasks_than_cores_quantize_into_waves(items, cores):
    target = dataclasses.replace(CPU, num_cores=cores)
    w = Workload(flops=1e9 * items, global_bytes=0, work_items=items)    # fixed work per task
    ideal = 1e9 * items / 100e9
    assert estimate_time(target, w) == pytest.approx(ideal * waves(target, items) * cores / items)
    assert estimate_time(target, w) >= ideal * (1 - 1e-9)


# ---------------------------------------------------------------------------------------------
# Targets


def test_host_target_has_deterministic_peak_numbers():
    a, b = host_cpu_target(), host_cpu_target()
    assert a == b and hash(a) == hash(b)                            # it keys the compile cache
    assert a.peak_flops_f32 > 1e9 * a.num_cores and a.mem_bandwidth == 20e9
    assert a.l2_bytes >= a.num_cores * 64 * 1024 and a.max_blocks_per_core == 1


def test_gpu_targets_carry_datasheet_numbers():
    a100, h100 = cuda_target("sm_80"), cuda_target("sm_90")
    assert (a100.peak_flops_f32, a100.peak_flops_f16, a100.mem_bandwidth) == (19.5e12, 312e12, 2039e9)
    assert (h100.peak_flops_f32, h100.peak_flops_f16, h100.mem_bandwidth) == (67e12, 989e12, 3350e9)
    assert h100.shared_memory_per_core == 228 * 1024 and h100.max_threads_per_core == 2048
    assert cuda_target("sm_90a").peak_flops_f16 == h100.peak_flops_f16
    mi250 = hip_target("gfx90a")
    assert mi250.peak_flops_f32 == 23.9e12 and mi250.mem_bandwidth == 1638e9 and mi250.transaction_bytes == 64


def test_a_live_device_with_fewer_sms_scales_the_peaks():
    props = DeviceProperties(name="NVIDIA H100 PCIe", compute_capability=(9, 0), multiprocessor_count=114,
                             max_threads_per_block=1024, shared_memory_per_block=48 * 1024,
                             shared_memory_per_block_optin=227 * 1024, shared_memory_per_multiprocessor=228 * 1024,
                             registers_per_block=65536, warp_size=32, total_memory=80 << 30,
                             l2_cache_size=50 << 20)
    t = target_from_properties(props)
    assert t.num_cores == 114 and t.peak_flops_f32 == pytest.approx(67e12 * 114 / 132)
    assert t.l2_bytes == 50 << 20 and t.mem_bandwidth == 3350e9
