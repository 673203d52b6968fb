"""Post-scheduling fusion (taskmap.fusion): prologues spliced into the loads and epilogues into the
stores of the matmul templates (CPU; SIMT and tensor cores run on the CPU with GPU semantics) and
of rule-based kernels, against numpy in float64 on drawn odd shapes; CUDA / HIP builds of the
fused kernels; refusals."""
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap.backends import cuda_target, hip_target, host_cpu_target
from taskmap.backends.hip import hiprtc_available
from taskmap.compute import compute, reduce, tensor_input
from taskmap.errors import FusionError
from taskmap.fusion import can_fuse, fuse
from taskmap.ir import expr as E
from taskmap.ir.expr import Intrinsic
from taskmap.ir.functor import collect
from taskmap.ir.primitives import Prim, PrimCall
from taskmap.lang import f32
from taskmap.schedule.rule_based import schedule
from taskmap.templates.base import Schedule
from taskmap.templates.matmul_cpu import MATMUL_CPU
from taskmap.templates.matmul_problem import MatmulProblem
from taskmap.templates.matmul_simt import MATMUL_SIMT
from taskmap.templates.matmul_tc import MATMUL_TC
from taskmap.testing import assert_close

FEW = settings(max_examples=5, deadline=None)
CPU = host_cpu_target()
SM90 = cuda_target("sm_90")


def rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def close(out, ref, k, tol=2e-6):
    assert_close(out, ref, rtol=10 * tol, atol=4 * tol * max(1.0, math.sqrt(k)) + tol)


def call_by_name(kernel, **arrays):
    kernel(*(arrays[p.name] for p in kernel.func.params))


# ----------------------------------------------------------------------------- definitions

def prologue_a(kind, m, k, dtype="float32"):
    """``a`` (1, m, k) from a new input: a transpose times 2, or a cast to ``dtype``."""
    if kind == "transpose":
        xt = tensor_input("xt", "float32", [1, k, m])
        return compute("a", [1, m, k], lambda b, i, j: xt[b, j, i] * 2.0), lambda x: 2 * np.swapaxes(x, 1, 2), \
            (1, k, m)
    x = tensor_input("xt", "float32", [1, m, k])
    return compute("a", [1, m, k], lambda b, i, j: x[b, i, j], dtype=dtype), lambda v: v, (1, m, k)


def gelu(v):
    return 0.5 * v * (1.0 + E.call(Intrinsic.ERF, v * 0.7071067811865476))


def np_gelu(v):
    from math import erf
    return 0.5 * v * (1.0 + np.vectorize(erf)(v / math.sqrt(2.0)))


def epilogue_c(kind, m, n, dtype="float32"):
    """``y`` from the anchor's ``c`` (1, m, n): returns the definition, extra inputs (name ->
    shape) and the numpy reference of ``y`` given ``c`` and the extra arrays."""
    c = tensor_input("c", dtype, [1, m, n])
    if kind == "bias_relu":
        bias = tensor_input("bias_n", dtype, [n])
        y = compute("y", [1, m, n], lambda b, i, j: E.maximum(c[b, i, j] + bias[j], 0.0))
        return y, {"bias_n": (n,)}, lambda cv, ex: np.maximum(cv + ex["bias_n"], 0)
    if kind == "bias_gelu":
        bias = tensor_input("bias_n", dtype, [n])
        y = compute("y", [1, m, n], lambda b, i, j: gelu(c[b, i, j] + bias[j]), dtype=dtype)
        return y, {"bias_n": (n,)}, lambda cv, ex: np_gelu(cv + ex["bias_n"])
    if kind == "residual":
        r = tensor_input("res", dtype, [1, m, n])
        y = compute("y", [1, m, n], lambda b, i, j: c[b, i, j] + r[b, i, j])
        return y, {"res": (1, m, n)}, lambda cv, ex: cv + ex["res"]
    assert kind == "transpose"
    y = compute("y", [n, m], lambda j, i: c[0, i, j] * 0.5)
    return y, {}, lambda cv, ex: 0.5 * cv[0].T


PROLOGUES = st.sampled_from(["none", "transpose"])
EPILOGUES = st.sampled_from(["none", "bias_relu", "bias_gelu", "residual", "transpose"])


def check_fused(template, p, schedule_, pro, epi, extra_args, seed=0, dtype="float32", tol=2e-6):
    """Fuse ``pro`` / ``epi`` into the template's kernel for ``p``, run it with GPU / CPU
    semantics on the host and compare with numpy (float64)."""
    m, n, k = p.m, p.n, p.k
    np_dt = np.float16 if dtype == "float16" else np.float32
    anchor = template.instantiate(p, CPU if template is MATMUL_CPU else SM90, schedule_)
    prologues, epilogues = {}, {}
    b = rand((1, k, n), seed + 1, np_dt)
    arrays = {"b": b, "bias": np.zeros(1, np_dt)}
    if pro != "none":
        node, ref_a, shape = prologue_a(pro, m, k, dtype)
        prologues["a"] = node
        arrays["xt"] = rand(shape, seed, np.float32)
        a_val = ref_a(arrays["xt"].astype(np.float64)).astype(np_dt)
    else:
        arrays["a"] = rand((1, m, k), seed, np_dt)
        a_val = arrays["a"]
    cval = np.asarray(a_val, np.float64) @ np.asarray(b, np.float64)
    c = np.zeros((1, m, n), np_dt)
    arrays["c"] = c
    if epi != "none":
        node, extra, ref_y = epilogue_c(epi, m, n, dtype)
        epilogues["c"] = node
        ex = {name: rand(shape, seed + 5 + i, np_dt) for i, (name, shape) in enumerate(extra.items())}
        arrays.update(ex)
        expect = ref_y(cval, {kk: v.astype(np.float64) for kk, v in ex.items()})
        out = arrays["y"] = np.zeros(node.shape, np_dt)
    else:
        expect, out = cval, c
    arrays.update(extra_args(c))
    fused = fuse(anchor, prologues, epilogues)
    call_by_name(fused, **arrays)
    close(out.astype(np.float64), expect, k, tol)
    return fused


# ----------------------------------------------------------------------------- CPU template

def cpu_extra(p, s):
    wa, wb = MATMUL_CPU.workspace_sizes(p, s, CPU)
    return lambda c: {"cw": np.zeros_like(c), "wa": np.zeros(wa, np.float32), "wb": np.zeros(wb, np.float32),
                      "bidx": np.zeros(1, np.int64)}


LANES = max(4, CPU.vector_bytes // 4)
#: K blocks of 256 (several per drawn K), both splits, packed and in-place operands.
CPU_SCHEDULES = [Schedule.of(mr=6, nr=2 * LANES, kc=256, ncb=4, split=split, pack_a=pa, pack_b=pb, cores=c)
                 for split, pa, pb, c in (("m", True, True, 2), ("n", False, True, 1), ("m", False, False, 1))]


@pytest.mark.parametrize("schedule_", CPU_SCHEDULES, ids=str)
@given(m=st.integers(1, 40), n=st.integers(1, 70), k=st.sampled_from([1, 7, 255, 300, 531]), pro=PROLOGUES,
       epi=EPILOGUES)
@FEW
def test_cpu_matmul_template(schedule_, m, n, k, pro, epi):
    p = MatmulProblem(1, m, n, k)
    check_fused(MATMUL_CPU, p, schedule_, pro, epi, cpu_extra(p, schedule_), seed=m * n + k)


def test_cpu_template_writes_its_output_once():
    """Partial sums over K blocks go to ``cw``; ``c`` is stored once (the last K block) and never
    read, so an epilogue sees final values even when K has several blocks."""
    p, s = MatmulProblem(1, 9, 20, 600), CPU_SCHEDULES[0]
    kernel = MATMUL_CPU.instantiate(p, CPU, s)
    a, b = rand((1, 9, 600), 1), rand((1, 600, 20), 2)
    c = np.full((1, 9, 20), np.nan, np.float32)
    extra = cpu_extra(p, s)(c)
    call_by_name(kernel, a=a, b=b, bias=np.zeros(1, np.float32), c=c, **extra)
    cw = extra["cw"]
    close(c, a.astype(np.float64) @ b, 600)
    assert np.abs(cw).max() > 0          # the partial sums went there


# ----------------------------------------------------------------------------- GPU templates (emulated)

@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 50), pro=PROLOGUES, epi=EPILOGUES)
@FEW
def test_simt_template(m, n, k, pro, epi):
    p = MatmulProblem(1, m, n, k)
    s = Schedule.of(wm=1, wn=1, rm=1, rn=2, tm=4, tn=4, bk=8, split=1)
    check_fused(MATMUL_SIMT, p, s, pro, epi, lambda c: {}, seed=m + n * k)


@pytest.mark.parametrize("aligned", [True, False], ids=["cp_async", "elementwise"])
@given(m=st.integers(1, 40), n=st.integers(1, 5), k=st.integers(1, 6), epi=st.sampled_from(["none", "bias_gelu"]))
@FEW
def test_tensor_core_template(aligned, m, n, k, epi):
    """f32 -> f16 cast as a prologue of A: with k and n multiples of 8 the template copies tiles
    with cp_async (expanded to synchronous element loads), otherwise element by element."""
    n, k = (8 * n, 8 * k) if aligned else (8 * n + 1, 8 * k + 3)
    p = MatmulProblem(1, m, n, k, "float16", "float16")
    s = Schedule.of(bm=32, bn=32, bk=32, wm=2, wn=1, stages=3, split=1)
    check_fused(MATMUL_TC, p, s, "cast", epi, lambda c: {}, seed=m + n + k, dtype="float16", tol=2e-3)


@pytest.mark.parametrize("kind", ["gather", "computed"])
def test_cp_async_stays_asynchronous_for_a_gathering_prologue(kind):
    """The TF32 tensor-core template copies A with 16-byte ``cp_async``.  A prologue that only
    gathers (a zero-padded transpose, as img2col is) keeps the copies asynchronous, 4 bytes each,
    zero-filled where its guard fails; one that computes is stored element by element.  Both
    against numpy, with GPU semantics on the CPU."""
    m, n, k = 37, 24, 40
    p = MatmulProblem(1, m, n, k, tf32=True)
    xt = tensor_input("xt", "float32", [1, k, m - 3])         # a's last 3 rows are padding
    if kind == "gather":
        a = compute("a", [1, m, k], lambda b, i, j: E.select(i < m - 3, xt[b, j, E.minimum(i, m - 4)], 0.0))
    else:
        a = compute("a", [1, m, k], lambda b, i, j: E.select(i < m - 3, xt[b, j, E.minimum(i, m - 4)], 0.0) * 2.0)
    anchor = MATMUL_TC.instantiate(p, SM90, Schedule.of(bm=32, bn=32, bk=16, wm=2, wn=1, stages=3, split=1))
    fused = fuse(anchor, prologues={"a": a}, sizes={"batch": 1, "m": m, "n": n, "k": k, "cz": 1})
    assert fused.build("cuda", arch="sm_90").binary
    copies = [c for f in fused.module.functions for c in collect(f.body, PrimCall) if c.op is Prim.CP_ASYNC]
    four = [c for c in copies if c.args[2].value == 4]
    assert all(c.args[1].tensor.name == "xt" for c in four) and bool(four) == (kind == "gather")
    assert any(c.args[2].value == 16 for c in copies)          # B's copies are untouched
    xv, bv = rand((1, k, m - 3), 1), rand((1, k, n), 2)
    c = np.zeros((1, m, n), np.float32)
    call_by_name(fused, xt=xv, b=bv, bias=np.zeros(1, np.float32), bidx=np.zeros(1, np.int64), c=c)
    a_ref = np.concatenate([np.swapaxes(xv, 1, 2), np.zeros((1, 3, k), np.float32)], axis=1)
    if kind == "computed":
        a_ref = 2 * a_ref
    ref = taskmap.testing.round_tf32(a_ref).astype(np.float64) @ taskmap.testing.round_tf32(bv).astype(np.float64)
    close(c, ref, k)


def test_fused_gpu_kernels_build_for_cuda_and_hip():
    p = MatmulProblem(1, 33, 24, 40, "float16", "float16")
    tc = check_fused(MATMUL_TC, p, Schedule.of(bm=32, bn=32, bk=32, wm=2, wn=1, stages=3, split=1), "cast",
                     "bias_gelu", lambda c: {}, dtype="float16", tol=2e-3)
    built = tc.build("cuda", arch="sm_90")
    assert built.binary and "erf" in built.source
    p32 = MatmulProblem(1, 17, 19, 23)
    simt = check_fused(MATMUL_SIMT, p32, Schedule.of(wm=1, wn=1, rm=1, rn=1, tm=4, tn=4, bk=8, split=1),
                       "transpose", "bias_relu", lambda c: {})
    assert simt.build("cuda", arch="sm_90").binary
    if hiprtc_available():
        assert simt.build("hip", arch="gfx90a").binary


# ----------------------------------------------------------------------------- rule-based anchors

@pytest.mark.parametrize("target", [CPU, SM90, hip_target("gfx90a")], ids=["cpu", "sm_90", "gfx90a"])
@given(rows=st.integers(1, 9), cols=st.integers(1, 300))
@FEW
def test_reduction_anchor_with_elementwise_prologue(target, rows, cols):
    """mean(exp(x), axis=1) rule-scheduled; x = 2 * z^T + 1 spliced into its loads, a scale of
    the output spliced into its stores."""
    x = tensor_input("x", "float32", [rows, cols])
    s = reduce("s", [rows], lambda i, j: E.call(Intrinsic.EXP, x[i, j]), [cols], "sum")
    mean = compute("mean", [rows], lambda i: s[i] / float(cols))
    anchor = schedule(mean, target, inputs=[x])
    out_name = anchor.func.params[-1].name
    zt = tensor_input("zt", "float32", [cols, rows])
    pro = compute("x", [rows, cols], lambda i, j: zt[j, i] * 0.5 + 1.0)
    c = tensor_input(out_name, "float32", [rows])
    epi = compute("out", [rows], lambda i: c[i] * 3.0)
    fused = fuse(anchor, {"x": pro}, {out_name: epi})
    assert [p.name for p in fused.func.params] == ["zt", "out"]
    z = rand((cols, rows), rows * cols)
    out = np.zeros(rows, np.float32)
    fused(z, out)
    xv = 0.5 * z.T.astype(np.float64) + 1.0
    assert_close(out, 3.0 * np.exp(xv).mean(1), rtol=1e-5, atol=1e-6)


def test_sum_anchor_with_prologue():
    x = tensor_input("x", "float32", [5, 7])
    total = reduce("total", [5], lambda i, j: x[i, j], [7], "sum")
    anchor = schedule(total, CPU, inputs=[x])
    u = tensor_input("u", "float32", [5, 7])
    v = tensor_input("v", "float32", [7])
    fused = fuse(anchor, {"x": compute("x", [5, 7], lambda i, j: u[i, j] * v[j])})
    assert [p.name for p in fused.func.params] == ["u", "v", anchor.func.params[-1].name]
    uu, vv = rand((5, 7), 1), rand((7,), 2)
    out = np.zeros(5, np.float32)
    fused(uu, vv, out)
    assert_close(out, (uu.astype(np.float64) * vv).sum(1), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- caching

def test_same_fusion_is_memoised_and_keys_differ():
    p, s = MatmulProblem(1, 8, 8, 8), Schedule.of(wm=1, wn=1, rm=1, rn=1, tm=4, tn=4, bk=8, split=1)
    anchor = MATMUL_SIMT.instantiate(p, SM90, s)
    y1, _, _ = epilogue_c("bias_relu", 8, 8)
    y1b, _, _ = epilogue_c("bias_relu", 8, 8)
    y2, _, _ = epilogue_c("residual", 8, 8)
    k1, k1b = fuse(anchor, epilogues={"c": y1}), fuse(anchor, epilogues={"c": y1b})
    k2 = fuse(anchor, epilogues={"c": y2})
    assert k1 is k1b and k1 is not k2
    assert k1.build("cpu").source != k2.build("cpu").source


# ----------------------------------------------------------------------------- refusals

def _simt(m=8, n=8, k=8):
    p = MatmulProblem(1, m, n, k)
    return MATMUL_SIMT.instantiate(p, SM90, Schedule.of(wm=1, wn=1, rm=1, rn=1, tm=4, tn=4, bk=8, split=1))


@taskmap.kernel
def accumulate(a: f32[16], c: f32[16]):
    for i in range(16):
        c[i] = c[i] + a[i]


def _refusals():
    c = tensor_input("c", "float32", [1, 8, 8])
    x = tensor_input("x", "float32", [1, 8, 8])
    q = tensor_input("q", "float32", [8, 8, 8])
    summed = reduce("a", [1, 8, 8], lambda b, i, j, r: q[i, j, r], [8])
    return [
        ("reduction prologue", dict(prologues={"a": summed}), "has a reduction"),
        ("broadcast epilogue", dict(epilogues={"c": compute("y", [1, 8, 8], lambda b, i, j: c[b, i, 0])}),
         "not a bijective"),
        ("no output input", dict(epilogues={"c": compute("y", [1, 8, 8], lambda b, i, j: x[b, i, j])}),
         "tensor_input named 'c'"),
        ("unknown parameter", dict(prologues={"zz": x}), "no tensor parameter 'zz'"),
        ("rank", dict(prologues={"a": tensor_input("x2", "float32", [8, 8])}), r"the definition has shape \[8, 8\]"),
        ("shape", dict(prologues={"a": tensor_input("x3", "float32", [1, 8, 9]),
                                  "b": tensor_input("x5", "float32", [1, 8, 8])}), "size 'k' would be both"),
        ("dtype", dict(prologues={"a": tensor_input("x4", "float16", [1, 8, 8])}), "add a cast"),
        ("name clash", dict(prologues={"a": compute("a", [1, 8, 8], lambda b, i, j: tensor_input(
            "b", "float32", [1, 8, 8])[b, i, j])}), "clashes with the anchor's parameter 'b'"),
        ("both", dict(prologues={"c": x}, epilogues={"c": compute("y", [1, 8, 8], lambda b, i, j: c[b, i, j])}),
         "more than one of a prologue, an epilogue"),
    ]


@pytest.mark.parametrize("case", _refusals(), ids=lambda c: c[0])
def test_refusals_raise_fusion_error(case):
    _, kwargs, match = case
    anchor = _simt()
    with pytest.raises(FusionError, match=match):
        fuse(anchor, **kwargs)
    ok, why = can_fuse(anchor, **kwargs)
    assert not ok and re.search(match, why)


def test_epilogue_of_an_output_that_is_read_back_is_refused():
    c = tensor_input("c", "float32", [16])
    y = compute("y", [16], lambda i: c[i] + 1.0)
    with pytest.raises(FusionError, match="reads its output 'c'"):
        fuse(accumulate, epilogues={"c": y})
    u = tensor_input("u", "float32", [16])
    assert can_fuse(accumulate, prologues={"a": compute("a", [16], lambda i: u[i] * 2.0)}) == (True, "")


def test_split_k_chains_and_other_objects_are_refused():
    p = MatmulProblem(1, 8, 8, 512)
    chain = MATMUL_SIMT.instantiate(p, SM90, Schedule.of(wm=1, wn=1, rm=1, rn=1, tm=4, tn=4, bk=8, split=2))
    with pytest.raises(FusionError, match="kernel chain"):
        fuse(chain, epilogues={})
    with pytest.raises(FusionError, match="must be a taskmap.Kernel"):
        fuse(object())


def test_atomics_on_a_fused_tensor_are_refused():
    from taskmap.lang import atomic_add

    @taskmap.kernel
    def hist(a: f32[16], c: f32[16]):
        for i in range(16):
            atomic_add(c[i], a[i])

    c = tensor_input("c", "float32", [16])
    with pytest.raises(FusionError, match="atomic_add"):
        fuse(hist, epilogues={"c": compute("y", [16], lambda i: c[i] + 1.0)})
