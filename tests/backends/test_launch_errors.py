"""Bad launches raise clear errors (LaunchError, BuildError, UnsupportedError), never crash."""
import os
import re
import shlex
import stat
import subprocess
import uuid

import numpy as np
import pytest

import taskmap
from taskmap.backends import host_cpu_target
from taskmap.backends.cpu import build_c
from taskmap.backends.cpu.runtime_c import RUNTIME_C
from taskmap.errors import BuildError, LaunchError, TaskmapError, UnsupportedError
from taskmap import spatial
from taskmap.lang import attrs, bf16, blockIdx, f32, i32, i64, parallel, shared_tensor, threadIdx, u8, vectorize


@taskmap.kernel
def axpy(x: f32["n", 4], y: f32["n", 4], s: i32, alpha: f32, small: u8):
    for i in range(x.shape[0]):
        for j in range(4):
            y[i, j] = x[i, j] * alpha + f32(s + i32(small))


def ok_args():
    x = np.random.default_rng(0).uniform(-1, 1, (3, 4)).astype(np.float32)
    return [x, np.empty_like(x), 2, 0.5, 7]


def launch(**changes):
    args = ok_args()
    names = ["x", "y", "s", "alpha", "small"]
    for k, v in changes.items():
        args[names.index(k)] = v
    axpy(*args)
    return args


def test_good_launch_is_correct():
    x, y, *_ = launch()
    np.testing.assert_allclose(y, x * 0.5 + 9, rtol=1e-6)


BAD_ARRAYS = {
    "wrong dtype": (dict(x=np.ones((3, 4))), r"argument 'x' must have dtype float32, got float64"),
    "wrong int dtype": (dict(y=np.ones((3, 4), np.int32)), r"argument 'y' must have dtype float32, got int32"),
    "wrong ndim": (dict(x=np.ones(12, np.float32)), r"argument 'x' must have 2 dimensions .*got shape \(12,\)"),
    "wrong constant dim": (dict(x=np.ones((3, 5), np.float32)),
                           r"argument 'x': dimension 1 must be 4, got shape \(3, 5\)"),
    "inconsistent symbolic size": (dict(y=np.ones((5, 4), np.float32)),
                                   r"argument 'y': dimension 0 must be size 'n' = 3 bound by an earlier argument"),
    "zero symbolic size": (dict(x=np.ones((0, 4), np.float32), y=np.ones((0, 4), np.float32)),
                           r"size 'n' \(dimension 0\) must be positive, got 0"),
    "numpy slice": (dict(x=np.ones((6, 4), np.float32)[::2]), r"argument 'x' must be C-contiguous"),
    "numpy transpose": (dict(y=np.ones((4, 3), np.float32).T), r"argument 'y' must be C-contiguous"),
    "column slice": (dict(x=np.ones((3, 8), np.float32)[:, :4]), r"argument 'x' must be C-contiguous"),
    "read-only output": (dict(y=np.frombuffer(bytes(48), np.float32).reshape(3, 4)),
                         r"argument 'y' is written by the kernel but the array is read-only"),
    "list for a tensor": (dict(x=[[1.0] * 4] * 3), r"argument 'x' must be a numpy array or torch tensor .*got list"),
    "number for a tensor": (dict(x=1.0), r"argument 'x' must be a numpy array or torch tensor .*got float"),
    "float for int": (dict(s=1.5), r"argument 's' must be an int \(i32\), got float"),
    "bool for int": (dict(s=True), r"argument 's' must be an int \(i32\), got bool"),
    "array for int": (dict(s=np.ones(2, np.int32)), r"argument 's' must be an int \(i32\), got ndarray"),
    "int too large": (dict(s=2**31), r"argument 's' = 2147483648 does not fit in i32"),
    "int too small": (dict(s=-(2**31) - 1), r"argument 's' = -2147483649 does not fit in i32"),
    "negative unsigned": (dict(small=-1), r"argument 'small' = -1 does not fit in u8"),
    "unsigned too large": (dict(small=256), r"argument 'small' = 256 does not fit in u8"),
    "string for float": (dict(alpha="0.5"), r"argument 'alpha' must be a number \(f32\), got str"),
    "None for float": (dict(alpha=None), r"argument 'alpha' must be a number \(f32\), got NoneType"),
}


@pytest.mark.parametrize("case", list(BAD_ARRAYS))
def test_bad_arguments_raise_launch_error(case):
    changes, match = BAD_ARRAYS[case]
    with pytest.raises(LaunchError, match=match):
        launch(**changes)


K_ = taskmap.symbol("K_")


@taskmap.kernel
def doubled(a: f32[K_], b: f32[2 * K_ + 1]):
    for i in range(K_):
        b[2 * i] = a[i]


@taskmap.kernel
def only_derived(b: f32[2 * K_]):
    b[0] = 1.0


def test_dimensions_derived_from_sizes():
    with pytest.raises(LaunchError, match=r"argument 'b': dimension 0 must be 2 \* K_ \+ 1 = 7, got shape \(6,\)"):
        doubled(np.ones(3, np.float32), np.ones(6, np.float32))
    with pytest.raises(LaunchError, match=r"cannot infer symbolic sizes \['K_'\] from the arguments"):
        only_derived(np.ones(4, np.float32))
    b = np.zeros(7, np.float32)
    doubled(np.ones(3, np.float32), b)
    assert b.tolist() == [1, 0, 1, 0, 1, 0, 0]


def test_bad_launch_does_not_write_outputs():
    x, y = ok_args()[:2]
    y[:] = np.nan
    with pytest.raises(LaunchError):
        axpy(x, y, 2**40, 0.5, 7)
    assert np.isnan(y).all()


def test_numpy_scalars_are_accepted():
    x, y, *_ = launch(s=np.int64(2), alpha=np.float32(0.5), small=np.uint8(7))
    np.testing.assert_allclose(y, x * 0.5 + 9, rtol=1e-6)


@pytest.mark.parametrize("args, match", [
    ((), r"axpy\(\) takes 5 arguments \(x, y, s, alpha, small\), got 0"),
    ((np.ones((3, 4), np.float32),) * 2 + (1, 1.0), r"takes 5 arguments .*got 4"),
    ((np.ones((3, 4), np.float32),) * 2 + (1, 1.0, 1, 2), r"takes 5 arguments .*got 6"),
])
def test_wrong_argument_count(args, match):
    with pytest.raises(LaunchError, match=match):
        axpy(*args)


def test_launch_error_is_a_value_error_and_taskmap_error():
    with pytest.raises(ValueError):
        launch(x=np.ones((3, 5), np.float32))
    with pytest.raises(TaskmapError):
        launch(x=np.ones((3, 5), np.float32))


@taskmap.kernel
def bf16_copy(a: bf16["n"], out: bf16["n"]):
    for i in range(a.shape[0]):
        out[i] = a[i]


@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_bf16_needs_torch_tensors(dtype):
    a = np.ones(8, dtype)
    with pytest.raises(LaunchError, match=r"argument 'a' is a bfloat16 parameter: pass a torch bfloat16 tensor"):
        bf16_copy(a, a.copy())


def test_torch_errors():
    torch = pytest.importorskip("torch", reason="torch tensor arguments")
    x, y = torch.ones(3, 4), torch.empty(3, 4)
    with pytest.raises(LaunchError, match=r"argument 'x' must be C-contiguous"):
        axpy(torch.ones(4, 3).t(), y, 1, 1.0, 1)
    with pytest.raises(LaunchError, match=r"argument 'y' must have dtype float32, got float64"):
        axpy(x, y.double(), 1, 1.0, 1)
    with pytest.raises(LaunchError, match=r"argument 'y': dimension 0 must be size 'n' = 3"):
        axpy(x, torch.empty(2, 4), 1, 1.0, 1)
    with pytest.raises(LaunchError, match=r"must have dtype float32, got bfloat16"):
        axpy(x.bfloat16(), y, 1, 1.0, 1)
    # A contiguous view with a storage offset is fine: the kernel sees the view, not its base.
    base = torch.arange(20, dtype=torch.float32).reshape(5, 4)
    out = torch.zeros(6, 4)
    axpy(base[1:4], out[2:5], 1, 2.0, 0)
    assert torch.equal(out[2:5], base[1:4] * 2 + 1)
    assert torch.equal(out[:2], torch.zeros(2, 4)) and torch.equal(out[5:], torch.zeros(1, 4))


def test_mixed_and_unsupported_devices():
    torch = pytest.importorskip("torch", reason="torch tensors on the meta device")
    meta = torch.empty(3, 4, device="meta")
    with pytest.raises(LaunchError, match=r"arguments are on different devices: \['cpu', 'meta'\]"):
        axpy(torch.ones(3, 4), meta, 1, 1.0, 1)
    with pytest.raises(UnsupportedError, match=r"cannot run on tensors on device 'meta'"):
        axpy(meta, torch.empty(3, 4, device="meta"), 1, 1.0, 1)
    if torch.cuda.is_available():
        with pytest.raises(LaunchError, match=r"different devices: \['cpu', 'cuda:0'\]"):
            axpy(torch.ones(3, 4), torch.empty(3, 4, device="cuda"), 1, 1.0, 1)


# ----------------------------------------------------------------------------- launch configuration


@taskmap.kernel
def too_many_threads(a: f32[2048]):
    attrs.block_dim = 2048
    a[threadIdx.x] = 1.0


@taskmap.kernel
def too_many_threads_2d(a: f32[64, 32]):
    attrs.block_dim = (32, 64)
    a[threadIdx.y, threadIdx.x] = 1.0


@taskmap.kernel
def quarter_grid(a: f32["n"]):
    attrs.grid_dim = a.shape[0] // 4
    attrs.block_dim = 4
    a[blockIdx.x * 4 + threadIdx.x] = 2.0


@taskmap.kernel
def huge_smem(a: f32[4]):
    attrs.block_dim = 4
    s = shared_tensor(f32, [1024, 1024])
    s[0, threadIdx.x] = 1.0
    a[threadIdx.x] = s[0, threadIdx.x]


def test_too_many_threads_per_block():
    limit = host_cpu_target().max_threads_per_block
    with pytest.raises(LaunchError, match=rf"2048 threads per block exceeds the limit of {limit} "
                                          r"\(max_threads_per_block\)"):
        too_many_threads(np.zeros(2048, np.float32))
    with pytest.raises(LaunchError, match=r"2048 threads per block .*max_threads_per_block"):
        too_many_threads_2d(np.zeros((64, 32), np.float32))


def test_grid_dims_evaluating_to_zero():
    a = np.zeros(3, np.float32)
    with pytest.raises(LaunchError, match=r"grid \(0, 1, 1\) and block \(4, 1, 1\) dimensions must be positive"):
        quarter_grid(a)
    assert (a == 0).all()
    b = np.zeros(9, np.float32)
    quarter_grid(b)  # two blocks of four: the ninth element is nobody's
    assert b.tolist() == [2.0] * 8 + [0.0]


def test_too_much_shared_memory():
    with pytest.raises(LaunchError, match=r"4194304 bytes of shared memory per block exceeds the limit"):
        huge_smem(np.zeros(4, np.float32))


# ----------------------------------------------------------------------------- build errors


def test_build_error_from_invalid_c():
    with pytest.raises(BuildError, match=r"gcc failed to compile the generated C for k") as info:
        build_c("this is not C", host_cpu_target(), "k_invalid_" + uuid.uuid4().hex)
    err = info.value
    assert "this" in err.log and "error" in err.log
    assert os.path.isfile(err.source_path)
    with open(err.source_path) as f:
        assert f.read() == "this is not C"
    text = str(err)
    assert f"generated source: {err.source_path}" in text and "reproduce with: " in text
    assert "compiler log:" in text
    # The command reproduces the failure on the saved source.
    cmd = shlex.split(err.command) if isinstance(err.command, str) else list(err.command)
    assert err.source_path in cmd
    out = cmd.index("-o") + 1
    cmd[out] = os.path.join(os.path.dirname(err.source_path), "never-" + uuid.uuid4().hex + ".so")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode != 0 and "error" in proc.stderr
    assert not os.path.exists(cmd[out])


def test_the_log_has_the_source_lines(tmp_path, monkeypatch):
    """A compiler error's line numbers are those of the saved, self-contained source."""
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path))
    source = RUNTIME_C + "\nint broken_" + uuid.uuid4().hex + "(void) { return no_such_name; }\n"
    with pytest.raises(BuildError) as info:
        build_c(source, host_cpu_target(), "k_lines")
    line = source.count("\n", 0, source.index("no_such_name")) + 1
    assert re.search(rf"kernel\.c:{line}:\d+: error: .no_such_name. undeclared", info.value.log), info.value.log
    with open(info.value.source_path) as f:
        assert f.read() == source


FAKE_CC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fakecc 1.0 ({tag})"; exit 0; fi
echo "fakecc: error: the fake compiler refuses everything ({tag})" >&2
exit 1
"""


def test_build_error_from_the_compiler(tmp_path, monkeypatch):
    tag = uuid.uuid4().hex
    cc = tmp_path / "fakecc"
    cc.write_text(FAKE_CC.format(tag=tag))
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("TASKMAP_CC", str(cc))
    unique = int(tag[:6], 16)   # a constant of its own: a cache key nobody built before

    @taskmap.kernel
    def fresh(a: f32[4]):
        for i in range(4):
            a[i] = f32(unique)

    a = np.zeros(4, np.float32)
    with pytest.raises(BuildError, match=r"failed to compile the generated C for fresh \(exit 1\)") as info:
        fresh(a)
    err = info.value
    assert f"the fake compiler refuses everything ({tag})" in err.log
    assert os.path.isfile(err.source_path)
    with open(err.source_path) as f:
        source = f.read()
    assert "tm_entry_fresh" in source and str(unique) in source
    assert str(cc) in err.command and err.source_path in err.command
    assert f"the fake compiler refuses everything ({tag})" in str(err)
    # Nothing half-built was kept: with the real compiler the same kernel builds and runs.
    monkeypatch.delenv("TASKMAP_CC")
    fresh(a)
    assert (a == unique).all()


def test_missing_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKMAP_CC", str(tmp_path / "no-such-cc"))

    @taskmap.kernel
    def fresh2(a: i64[2]):
        a[0] = 1

    with pytest.raises(BuildError, match=r"compiler not found: .*no-such-cc"):
        fresh2(np.zeros(2, np.int64))


def test_unknown_target():
    with pytest.raises(UnsupportedError, match=r"target 'opencl'"):
        axpy.build("opencl")


# ----------------------------------------------------------------------------- loops that cannot run in parallel


def racy_sum(a: f32[64], out: f32[1]):
    s = 0.0
    for i in parallel(64):
        s += a[i]
    out[0] = s


def racy_lanes(a: f32[64], out: f32[1]):
    s = 0.0
    for i in vectorize(64):
        s = max(s, a[i])
    out[0] = s


def parallel_break(a: f32[64], out: f32[1]):
    for i in parallel(64):
        if a[i] > 0.0:
            break
        out[0] = a[i]


def parallel_return(a: f32[64], out: f32[1]):
    for i in spatial(64).parallel():
        if a[i] > 0.0:
            return
        out[0] = a[i]


@pytest.mark.parametrize("fn, match", [
    (racy_sum, r"racy_sum: the parallel loop over 'i' assigns 's', a variable declared outside the loop, so its "
               r"iterations would race"),
    (racy_lanes, r"racy_lanes: the vectorized loop over 'i' assigns 's'"),
    (parallel_break, r"parallel_break: the parallel loop over 'i' breaks out of the loop"),
    (parallel_return, r"parallel_return: the parallel loop over '\w+' returns from inside the loop"),
])
def test_parallel_loops_with_dependent_iterations_are_rejected(fn, match):
    kern = taskmap.kernel(fn)
    a, out = np.ones(64, np.float32), np.zeros(1, np.float32)
    with pytest.raises(UnsupportedError, match=match):
        kern(a, out)
    assert out[0] == 0


@taskmap.kernel
def parallel_ok(a: f32["n", 8], out: f32["n"]):
    for i in parallel(a.shape[0]):
        s = 0.0                        # declared inside: private to the iteration
        for j in range(8):
            if a[i, j] < 0.0:
                break                  # leaves the inner, serial loop only
            s += a[i, j]
        out[i] = s


def test_parallel_loop_with_private_scalars_and_inner_break():
    a = np.random.default_rng(5).uniform(-0.5, 2, (37, 8)).astype(np.float32)
    out = np.empty(37, np.float32)
    parallel_ok(a, out)
    want = [sum(row[: np.argmax(row < 0)] if (row < 0).any() else row) for row in a.astype(np.float64)]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
