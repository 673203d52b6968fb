"""The host CPU target plans for the threads the kernels will run: OMP_NUM_THREADS caps the
core count the cost models see; AVX-512 hosts get 512-bit vector code."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import taskmap
from taskmap import spatial
from taskmap.backends.base import host_cpu_target
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
