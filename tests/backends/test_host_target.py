"""The host CPU target plans for the threads the kernels will run: OMP_NUM_THREADS caps the
core count the cost models see; AVX-512 hosts get 512-bit vector code, and the cost models the
512-bit FMA rate, the last-level cache's bandwidth and a matmul step's cost of reading B in place
measured on the host."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import taskmap
from taskmap import spatial
from taskmap.backends import host_probe
from taskmap.backends.base import host_cpu_target
from taskmap.errors import TaskmapError
from taskmap.lang import f32


def cores_seen(env_value):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if env_value is not None:
        env["OMP_NUM_THREADS"] = env_value
    code = "from taskmap.backends.base import host_cpu_target; print(host_cpu_target().num_cores)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_omp_num_threads_caps_the_cores():
    cpus = os.cpu_count() or 1
    assert cores_seen(None) == cpus
    assert cores_seen("1") == 1
    assert cores_seen("1,1") == 1                     # nested form: the outer level counts
    assert cores_seen(str(cpus + 8)) == cpus          # never more than the machine has
    assert cores_seen("bogus") == cpus


def test_avx512_hosts_get_512_bit_vector_code():
    """Kernels are written for the target's SIMD width (16 f32 lanes with AVX-512); gcc's
    ``-march=native`` prefers 256-bit vectors on Intel AVX-512 parts (Skylake-SP, Cascade Lake),
    which halves the lanes and spills the kernels' register tiles: the build asks for 512."""
    if "avx512f" not in host_cpu_target().features:
        pytest.skip("the host has no AVX-512")
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")

    @taskmap.kernel
    def axpy(x: f32[4096], y: f32[4096]):
        for i in spatial(4096).vectorize():
            y[i] = y[i] + 2.5 * x[i]

    x, y = np.random.default_rng(0).standard_normal((2, 4096), dtype=np.float32)
    want = y + np.float32(2.5) * x
    axpy(x, y)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)      # fused multiply-add rounds once
    asm = subprocess.run(["objdump", "-d", axpy.build("cpu").binary], capture_output=True, text=True, check=True).stdout
    assert "%zmm" in asm


def test_zmm_fma_probe_measures_the_hosts_512_bit_rate():
    """Run the probe for real: a ratio of zmm to ymm FMA FLOP/s that some x86 part can have
    (about 1 on AMD Zen 4, up to 2 with two 512-bit pipes), and the host target's peak FLOP/s
    follows the rounded value."""
    target = host_cpu_target()
    if "avx512f" not in target.features:
        pytest.skip("the host has no AVX-512")
    ratio = host_probe.measure_zmm_fma_ratio()
    assert ratio is not None and 0.6 < ratio < 2.4, ratio
    cores, lanes, clock = target.num_cores, 16, target.clock_hz
    assert target.peak_flops_f32 == pytest.approx(cores * 2 * lanes * target.fma512_per_cycle * clock)
    assert target.fma512_per_cycle == host_probe.round_ratio(target.fma512_per_cycle)


def test_zmm_fma_ratio_is_read_from_the_cache_and_overridable(tmp_path, monkeypatch):
    """The measurement is made once per CPU (model name and flags) and cached: a stored value is
    read back without measuring; the environment overrides both; a probe that cannot run gives 1
    (the 256-bit-pipe assumption)."""
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(host_probe.ENV_OVERRIDE, raising=False)
    calls = []

    def fake_measure(cc="gcc"):
        calls.append(cc)
        return 1.83
    monkeypatch.setattr(host_probe, "measure_zmm_fma_ratio", fake_measure)
    cpu = ("Some CPU @ 2.50GHz", "avx512f", "fma")
    assert host_probe.zmm_fma_ratio(cpu) == 1.75 and len(calls) == 1
    assert host_probe.zmm_fma_ratio(cpu) == 1.75 and len(calls) == 1          # the cached value
    stored = list((tmp_path / "host").rglob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["ratio"] == 1.83
    assert host_probe.zmm_fma_ratio(("Other CPU", "avx512f")) == 1.75 and len(calls) == 2
    monkeypatch.setenv(host_probe.ENV_OVERRIDE, "1")
    assert host_probe.zmm_fma_ratio(cpu) == 1.0 and len(calls) == 2
    monkeypatch.delenv(host_probe.ENV_OVERRIDE)
    monkeypatch.setattr(host_probe, "measure_zmm_fma_ratio", lambda cc="gcc": None)
    assert host_probe.zmm_fma_ratio(("Third CPU",)) == 1.0


@pytest.mark.parametrize("value", ["fast", "0", "-1", "nan", "inf"])
def test_a_malformed_override_is_refused_by_name(value, monkeypatch):
    monkeypatch.setenv(host_probe.ENV_OVERRIDE, value)
    with pytest.raises(TaskmapError, match=rf"{host_probe.ENV_OVERRIDE}='{value}' is not a positive number"):
        host_probe.zmm_fma_ratio(("Some CPU", "avx512f"))


def test_rounding_keeps_the_target_stable():
    assert [host_probe.round_ratio(r) for r in (0.97, 1.04, 1.12, 1.80, 1.93, 2.6, 0.1)] == \
        [1.0, 1.0, 1.0, 1.75, 2.0, 2.0, 0.5]


def test_fma_rate_follows_the_vector_width():
    """The templates' cost models: 256-bit and narrower vectors at two pipes; 512-bit ones at the
    measured rate (1 when unknown: two 256-bit halves)."""
    cpu = dataclasses.replace(host_cpu_target(), vector_bytes=64, fma512_per_cycle=0.0)
    assert cpu.vector_fma_rate == 1.0
    assert dataclasses.replace(cpu, fma512_per_cycle=1.75).vector_fma_rate == 1.75
    assert dataclasses.replace(cpu, vector_bytes=32, fma512_per_cycle=1.75).vector_fma_rate == 2.0
    assert dataclasses.replace(cpu, vector_bytes=16).vector_fma_rate == 2.0


def test_llc_probe_measures_a_rate_between_dram_and_l1():
    """Run the probe for real: one core reads beyond its L2 at some GB/s to a few hundred (about
    20 on a Cascade Lake VM, about 120 on a Zen 5 one); the host target carries the rounded rate;
    the buffer is four L2s (at least 4 MiB), at most half of a known L3."""
    measured = host_probe.measure_llc_bandwidth(1 << 20, 32 << 20)
    if measured is None:
        pytest.skip("the probe cannot be built here (no C compiler)")
    assert 2e9 < measured < 1e12, measured
    target = host_cpu_target()
    assert target.llc_bandwidth == host_probe.round_bandwidth(target.llc_bandwidth) > 0
    assert host_probe.llc_probe_bytes(1 << 20, 32 << 20) == 4 << 20
    assert host_probe.llc_probe_bytes(2 << 20, 64 << 20) == 8 << 20
    assert host_probe.llc_probe_bytes(2 << 20, 12 << 20) == 6 << 20          # half the L3
    assert host_probe.llc_probe_bytes(1 << 20, 0) == 4 << 20                  # L3 unknown


def test_llc_bandwidth_is_cached_per_cpu_and_cache_sizes_and_overridable(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(host_probe.LLC_ENV_OVERRIDE, raising=False)
    calls = []

    def fake_measure(l2, l3, cc="gcc"):
        calls.append((l2, l3))
        return 118e9
    monkeypatch.setattr(host_probe, "measure_llc_bandwidth", fake_measure)
    cpu = ("Some CPU", "avx512f")
    assert host_probe.llc_bandwidth(cpu, 1 << 20, 32 << 20) == 128e9 and calls == [(1 << 20, 32 << 20)]
    assert host_probe.llc_bandwidth(cpu, 1 << 20, 32 << 20) == 128e9 and len(calls) == 1     # cached
    assert host_probe.llc_bandwidth(cpu, 2 << 20, 32 << 20) == 128e9 and len(calls) == 2     # other sizes
    monkeypatch.setenv(host_probe.LLC_ENV_OVERRIDE, "20")
    assert host_probe.llc_bandwidth(cpu, 1 << 20, 32 << 20) == pytest.approx(22.627e9, rel=1e-3)
    monkeypatch.setenv(host_probe.LLC_ENV_OVERRIDE, "fast")
    with pytest.raises(TaskmapError, match=f"{host_probe.LLC_ENV_OVERRIDE}='fast' is not a positive number"):
        host_probe.llc_bandwidth(cpu, 1 << 20, 32 << 20)
    monkeypatch.delenv(host_probe.LLC_ENV_OVERRIDE)
    monkeypatch.setattr(host_probe, "measure_llc_bandwidth", lambda l2, l3, cc="gcc": None)
    assert host_probe.llc_bandwidth(("Other CPU",), 1 << 20, 0) == 0.0      # unknown: the models' defaults


def test_bandwidth_rounding_is_stable_to_the_probes_noise():
    """Half-octave steps: the probe's run-to-run spread (~10%) rarely crosses one."""
    assert [host_probe.round_bandwidth(x * 1e9) for x in (113, 120, 131)] == [128e9] * 3
    assert host_probe.round_bandwidth(20e9) == pytest.approx(22.627e9, rel=1e-3)
    assert host_probe.round_bandwidth(1e6) == 4e9


def test_in_place_probe_measures_a_matmul_steps_with_b_in_place():
    """Run the probe for real: a K step with B's rows in place, on and off cache lines, over one
    with B packed — about 1 on Zen 4, up to ~2 off a line on Intel parts; the host target carries
    the rounded ratios."""
    target = host_cpu_target()
    if "avx512f" not in target.features:
        pytest.skip("the probe's tile is sixteen lanes wide: the host has no AVX-512")
    measured = host_probe.measure_in_place_steps()
    assert measured is not None and all(0.7 < r < 4 for r in measured), measured
    for ratio in (target.b_in_place_step, target.b_off_line_step):
        assert ratio == host_probe.round_step(ratio) >= 1.0


def test_in_place_steps_are_cached_and_overridable(tmp_path, monkeypatch):
    """Measured once per CPU and cached; the environment's two ratios override it (a malformed
    override is refused by name); a probe that cannot run leaves them unknown (0: the defaults)."""
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(host_probe.IN_PLACE_ENV_OVERRIDE, raising=False)
    calls = []

    def fake_measure(cc="gcc"):
        calls.append(cc)
        return 1.06, 1.63
    monkeypatch.setattr(host_probe, "measure_in_place_steps", fake_measure)
    cpu = ("Some CPU @ 2.50GHz", "avx512f")
    assert host_probe.in_place_steps(cpu) == (1.0, 1.75) and len(calls) == 1
    assert host_probe.in_place_steps(cpu) == (1.0, 1.75) and len(calls) == 1        # the cached value
    monkeypatch.setenv(host_probe.IN_PLACE_ENV_OVERRIDE, "1.3, 2")
    assert host_probe.in_place_steps(cpu) == (1.25, 2.0) and len(calls) == 1
    for bad in ("1", "fast,1", "1,-1", "1,inf"):
        monkeypatch.setenv(host_probe.IN_PLACE_ENV_OVERRIDE, bad)
        with pytest.raises(TaskmapError, match=rf"{host_probe.IN_PLACE_ENV_OVERRIDE}='{bad}' is not two positive"):
            host_probe.in_place_steps(cpu)
    monkeypatch.delenv(host_probe.IN_PLACE_ENV_OVERRIDE)
    monkeypatch.setattr(host_probe, "measure_in_place_steps", lambda cc="gcc": None)
    assert host_probe.in_place_steps(("Other CPU",)) == (0.0, 0.0)
    assert [host_probe.round_step(r) for r in (0.93, 1.07, 1.12, 1.13, 9.0)] == [1.0, 1.0, 1.0, 1.25, 4.0]
