"""The host CPU target plans for the threads the kernels will run: OMP_NUM_THREADS caps the
core count the cost models see."""
import os
import subprocess
import sys


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
