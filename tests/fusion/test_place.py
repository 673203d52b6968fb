"""taskmap.fusion.place: a kernel's output written inside a larger tensor (a concatenation's inputs
in place at batch > 1) — the matmul templates (CPU; SIMT with GPU semantics on the host), with an
epilogue fused first, and rule-based kernels, against numpy on drawn shapes and offsets; the
rest of the larger tensor untouched; refusals."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.compute import compute, tensor_input
from taskmap.errors import FusionError
from taskmap.fusion import fuse, place
from taskmap.ir import expr as E
from taskmap.schedule.rule_based import schedule
from taskmap.templates.base import Schedule
from taskmap.templates.matmul_cpu import MATMUL_CPU
from taskmap.templates.matmul_problem import MatmulProblem
from taskmap.templates.matmul_simt import MATMUL_SIMT
from test_fusion import CPU, CPU_SCHEDULES, SM90, accumulate, call_by_name, close, cpu_extra, rand

FEW = settings(max_examples=5, deadline=None)


def filled(shape, seed):
    """The larger tensor before the kernel runs: random values that must survive outside the range."""
    return rand(shape, seed) + 10.0


@pytest.mark.parametrize("template", ["cpu", "simt"])
@given(batch=st.integers(1, 3), m=st.integers(1, 20), n=st.integers(1, 40), k=st.sampled_from([1, 9, 300]),
       before=st.integers(0, 7), after=st.integers(0, 5))
@FEW
def test_matmul_with_an_epilogue_placed_along_its_rows(template, batch, m, n, k, before, after):
    """c = relu(a @ b + bias) of (batch, m, n) written at rows [before, before + m) of a
    (batch, before + m + after, n) tensor: a channel concat's range at batch > 1."""
    p = MatmulProblem(batch, m, n, k)
    if template == "cpu":
        s = CPU_SCHEDULES[0]
        anchor, extra = MATMUL_CPU.instantiate(p, CPU, s), cpu_extra(p, s)
    else:
        anchor = MATMUL_SIMT.instantiate(p, SM90, Schedule.of(wm=1, wn=1, rm=1, rn=1, tm=4, tn=4, bk=8, split=1))
        extra = lambda c: {}  # noqa: E731
    c_in = tensor_input("c", "float32", [batch, m, n])
    bias = tensor_input("bias_n", "float32", [n])
    y = compute("y", [batch, m, n], lambda b, i, j: E.maximum(c_in[b, i, j] + bias[j], 0.0))
    rows = before + m + after
    into = tensor_input("into", "float32", [batch, rows, n])
    kernel = place(fuse(anchor, epilogues={"c": y}), "y", into, (0, before, 0), (batch, m, n))
    assert [q.name for q in kernel.func.params if q.name in ("y", "into")] == ["into"]
    a, b, bias_v = rand((batch, m, k), 1), rand((batch, k, n), 2), rand((n,), 3)
    out = filled((batch, rows, n), 4)
    want = out.copy()
    want[:, before:before + m] = np.maximum(a.astype(np.float64) @ b + bias_v, 0)
    c = np.zeros((batch, m, n), np.float32)
    call_by_name(kernel, a=a, b=b, bias=np.zeros(1, np.float32), bias_n=bias_v, into=out, c=c, **extra(c))
    close(out.astype(np.float64), want, k)
    np.testing.assert_array_equal(out[:, :before], want[:, :before])      # untouched, bit for bit
    np.testing.assert_array_equal(out[:, before + m:], want[:, before + m:])


@given(n=st.integers(1, 3), c=st.integers(1, 6), hw=st.integers(1, 30), off=st.integers(0, 5))
@FEW
def test_rule_based_kernel_placed(n, c, hw, off):
    x = tensor_input("x", "float32", [n, c, hw])
    y = compute("y", [n, c, hw], lambda b, i, j: x[b, i, j] * 2.0 + 1.0)
    into = tensor_input("into", "float32", [n, c + off + 2, hw])
    kernel = place(schedule(y, CPU, inputs=[x]), "y", into, (0, off, 0), (n, c, hw))
    xv, out = rand((n, c, hw), 5), filled((n, c + off + 2, hw), 6)
    want = out.copy()
    want[:, off:off + c] = xv * 2.0 + 1.0
    call_by_name(kernel, x=xv, into=out)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[:, :off], want[:, :off])


def test_the_same_placement_is_memoised():
    x = tensor_input("x", "float32", [2, 3])
    y = compute("y", [2, 3], lambda i, j: x[i, j] + 1.0)
    k = schedule(y, CPU, inputs=[x])
    into = tensor_input("into", "float32", [2, 5])
    assert place(k, "y", into, (0, 1), (2, 3)) is place(k, "y", into, (0, 1), (2, 3))
    assert place(k, "y", into, (0, 1), (2, 3)) is not place(k, "y", into, (0, 2), (2, 3))


def test_refusals():
    x = tensor_input("x", "float32", [2, 3])
    k = schedule(compute("y", [2, 3], lambda i, j: x[i, j] + 1.0), CPU, inputs=[x])
    with pytest.raises(FusionError, match="not inside"):
        place(k, "y", tensor_input("into", "float32", [2, 5]), (0, 3), (2, 3))
    with pytest.raises(FusionError, match="is f16"):
        place(k, "y", tensor_input("into", "float16", [2, 5]), (0, 1), (2, 3))
    with pytest.raises(FusionError, match="no tensor parameter 'z'"):
        place(k, "z", tensor_input("into", "float32", [2, 5]), (0, 1), (2, 3))
    with pytest.raises(FusionError, match="reads its output"):             # c[i] = c[i] + a[i]
        place(accumulate, "c", tensor_input("into", "float32", [20]), (2,), (16,))
