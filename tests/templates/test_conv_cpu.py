"""The CPU direct-convolution template: its kernel against torch in float64 on hypothesis-drawn
shapes (odd and prime sizes, kernels 1/3/5/7, strides 1/2, every padding, dilation, batches,
edges), the routing between it and the implicit GEMM, a fused epilogue, and the hot loop's
assembly."""
import dataclasses
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from taskmap import ops
from taskmap.backends.base import host_cpu_target
from taskmap.backends.cpu.build import CFLAGS
from taskmap.compute.nodes import compute, tensor_input
from taskmap.errors import UnsupportedError
from taskmap.fusion import fuse
from taskmap.ir.expr import maximum, minimum
from taskmap.ops.conv import _plan, direct_sizes
from taskmap.templates.base import Schedule
from taskmap.templates.conv_cpu import CONV_CPU, select
from taskmap.templates.conv_cpu_cvec import CvecConfig, pack_weights
from taskmap.templates.conv_cpu_cvec import build_kernel as build_cvec
from taskmap.templates.conv_cpu_kernel import ConvCpuConfig, build_kernel, valid
from taskmap.templates.conv_problem import ConvProblem
from taskmap.testing import assert_close

#: the C backend's own flags (the assembly checked is what the kernels run)
ASM_FLAGS = tuple(f for f in CFLAGS if f != "-shared")

CPU = host_cpu_target()
FEW = settings(max_examples=6, deadline=None)
V = max(4, CPU.vector_bytes // 4)


def problem(n, cin, h, w, cout, k, s, p, d=1, bias=False):
    return ConvProblem(n, cin, h, w, cout, k, k, s, s, p, p, p, p, d, d, 1, "float32", bias)


def data(p: ConvProblem, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((p.n, p.cin, p.h, p.w)).astype(np.float32)
    w = rng.standard_normal((p.cout, p.cin, p.kh, p.kw)).astype(np.float32)
    b = rng.standard_normal(p.cout).astype(np.float32)
    return x, w, b


def reference(p: ConvProblem, x, w, b=None):
    t = torch.from_numpy
    return torch.nn.functional.conv2d(t(x).double(), t(w).double(), None if b is None else t(b).double(),
                                      (p.sh, p.sw), (p.pt, p.pl), (p.dh, p.dw)).numpy()


def tol(p: ConvProblem):
    return {"rtol": 1e-5, "atol": 2e-6 * p.cin * p.kh * p.kw + 1e-5}


def run_direct(p: ConvProblem, schedule: Schedule):
    x, w, _ = data(p)
    c = np.full((p.n, p.cout, p.oh, p.ow), np.nan, np.float32)
    kernel = CONV_CPU.instantiate(p, CPU, schedule)          # symbolic sizes: one build per window
    kernel(*CONV_CPU.arguments(p, [x, w], [c], schedule, CPU))
    assert_close(c, reference(p, x, w), **tol(p), err_msg=f"{p} {schedule}")


SMALL = Schedule.of(mr=6, nr=2 * V, cores=CPU.num_cores, shift=False)
SHIFTED = Schedule.of(mr=6, nr=2 * V, cores=CPU.num_cores, shift=True)      # planes per tap column
#: (kernel, stride, padding, dilation): each one kernel build (the window and the top / left
#: padding are compiled in; the sizes are symbolic), paddings 0 .. k // 2 among them.
WINDOWS = [(3, 1, 1, 1), (3, 2, 1, 1), (5, 2, 2, 1), (5, 1, 1, 1), (7, 2, 3, 1), (7, 1, 0, 1), (1, 2, 0, 1),
           (3, 1, 0, 2), (3, 2, 1, 2)]


@pytest.mark.parametrize("window,schedule", [(w, SMALL) for w in WINDOWS] +
                         [(w, SHIFTED) for w in [(3, 1, 1, 1), (5, 2, 2, 1), (3, 1, 0, 2)]],
                         ids=lambda v: "k{}s{}p{}d{}".format(*v) if isinstance(v, tuple) else
                         "shift" if v["shift"] else "phases")
@given(n=st.integers(1, 2), cin=st.integers(1, 7), h=st.integers(1, 23), w=st.integers(1, 29),
       cout=st.integers(1, 19))
@FEW
def test_direct_kernel_matches_torch(window, schedule, n, cin, h, w, cout):
    k, s, pad, d = window
    span = d * (k - 1) + 1 - 2 * pad                       # the padded input holds the dilated window
    h, w = max(h, span), max(w, span)
    run_direct(problem(n, cin, h, w, cout, k, s, pad, d), schedule)


@pytest.mark.parametrize("tile", [(14, 2), (8, 3)], ids=lambda t: f"{t[0]}x{t[1]}v")
def test_other_tiles_and_single_pixel_rows(tile):
    mr, nv = tile
    sched = Schedule.of(mr=mr, nr=nv * V, cores=CPU.num_cores, shift=mr == 14)
    for shape in [(1, 5, 13, 1, 29), (2, 3, 1, 17, 15), (1, 11, 31, 37, 14)]:
        run_direct(problem(*shape, 3, 1, 1), sched)


def test_layer_sized_problem_with_the_model_choice():
    p = problem(1, 64, 28, 28, 64, 3, 1, 1)
    sched = select(p, CPU)
    assert sched is not None, "a 3x3 stride-1 ResNet layer runs on the direct template"
    x, w, _ = data(p)
    assert_close(ops.conv2d(x, w, None, 1, 1), reference(p, x, w), **tol(p))


def test_routing():
    """The template's applicability and cost model decide; the other shapes stay on the
    implicit GEMM (and still match torch)."""
    assert select(problem(1, 64, 56, 56, 64, 3, 1, 1), CPU) is not None
    assert select(problem(1, 64, 56, 56, 64, 1, 1, 0), CPU) is None               # 1x1 stride 1: a matmul
    grouped = ConvProblem(1, 8, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, "float32", False)
    assert {s.get("vec", "pixels") for s in CONV_CPU.space(grouped, CPU)} == {"pixels"}     # groups: pixels only
    assert not CONV_CPU.applies(dataclasses.replace(grouped, kh=1, kw=1, pt=0, pb=0, pl=0, pr=0, const_weights=True),
                                CPU)                          # a grouped 1x1 layer: the implicit GEMM
    odd = ConvProblem(1, 3, 20, 20, 5, 2, 2, 3, 3, 0, 0, 0, 0, 2, 2, 1, "float32", False)
    space = CONV_CPU.space(odd, CPU)       # stride 3, dilation 2, k 2: taps skip phase 1 ...
    assert space and all(s.get("vec") == "channels" for s in space)     # ... only the channel kernel
    x, w, _ = data(odd)
    assert_close(ops.conv2d(x, w, None, 3, 0, 2), reference(odd, x, w), **tol(odd))
    x, w, _ = data(grouped)
    w = w[:, :4]
    got = ops.conv2d(x, w, None, 1, 1, 1, 2)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), None, 1, 1, 1, 2)
    assert_close(got, ref.numpy(), **tol(grouped))


def test_space_and_cost_model():
    p = problem(1, 64, 56, 56, 64, 3, 1, 1)
    space = CONV_CPU.space(p, CPU)
    assert 0 < len(space) <= 48
    regs = 32 if CPU.vector_bytes >= 64 else 16
    for s in space:
        extra = 0 if s.get("vec") == "channels" else 1       # the channel kernel broadcasts from memory
        over = 2 if (s.get("vec"), s["mr"], s["nr"] // V) == ("channels", 16, 2) else 0   # 16 x 2: two over
        assert s["nr"] % V == 0 and s["mr"] * s["nr"] // V + s["nr"] // V + extra <= regs + over
        assert CONV_CPU.cost(p, CPU, s) > 0
    assert not CONV_CPU.space(ConvProblem(1, 4, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, "float16", False), CPU)


@pytest.mark.parametrize("n, cin, hw, cout", [(1, 5, 7, 13), (2, 3, 11, 6)])
def test_bias_and_fused_epilogue(n, cin, hw, cout):
    """ops.conv2d's bias, and a residual + bias + ReLU epilogue spliced into the stores of c
    (which the kernel writes exactly once and never reads)."""
    p = problem(n, cin, hw, hw + 2, cout, 3, 1, 1, bias=True)
    x, w, b = data(p)
    ref = reference(p, x, w, b)
    assert_close(ops.conv2d(x, w, b, 1, 1), ref, **tol(p))
    shape = [p.n, p.cout, p.oh, p.ow]
    c = tensor_input("c", "float32", shape)
    bias = tensor_input("eb", "float32", [p.cout])
    res = tensor_input("res", "float32", shape)
    y = compute("y", shape, lambda i, co, r, s: maximum(c[i, co, r, s] + bias[co] + res[i, co, r, s], 0.0))
    fused = fuse(CONV_CPU.instantiate(p, CPU, SMALL), {}, {"c": y}, direct_sizes(p))
    residual = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    out = np.full(shape, np.nan, np.float32)
    avail = {"x": x, "wt": w, "eb": b, "res": residual, "y": out,
             "xp": np.zeros(CONV_CPU.workspace_size(p, SMALL, CPU), np.float32)}
    fused(*[avail[q.name] for q in fused.func.params])
    assert_close(out, np.maximum(ref + residual, 0.0), **tol(p))


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_micro_kernel_assembly():
    """The hot loop of the 8 x 48 tile, 3x3 stride 1: per tap 8 broadcasts, 3 vector loads of
    the input and 24 FMAs (72 taps' worth: the 9 taps are unrolled), no gathers."""
    src = build_kernel(ConvCpuConfig(8, 48, 16, 1, 3, 3, 1, 1, 1, 1, 1, 1)).build("cpu").source_path
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", src, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    loops = [body for body in re.split(r"\n\.L\d+:\n", asm) if body.count("vfmadd") >= 9 * 24]
    assert loops, "no loop with the 9 taps' 216 FMAs"
    hot = loops[0]
    assert hot.count("vbroadcastss") + hot.count("{1to16}") >= 9 * 8 - 9
    loads = len(re.findall(r"vmovups\s+[-\d]*\(%\w+(,%\w+,\d)?\), %zmm", hot)) + \
        len(re.findall(r"vfmadd\w+\s+[-\d]*\(%\w+(,%\w+,\d)?\), %zmm", hot))
    assert loads >= 9 * 3 - 3
    assert "gather" not in hot and "scatter" not in hot


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_a_big_window_unrolls_one_row_of_taps():
    """7x7 stride 2 on the 8 x 48 tile: the 49 taps unrolled made 1176 FMAs per input channel and
    took gcc ~25 s per kernel (its alias walk is quadratic in a block's loads and stores); the
    window's rows stay a loop, each row's 7 taps unrolled (168 FMAs)."""
    src = build_kernel(ConvCpuConfig(8, 48, 16, 1, 7, 7, 2, 2, 1, 1, 3, 3)).build("cpu").source_path
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", src, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    fmas = [body.count("vfmadd") for body in re.split(r"\n\.L\d+:\n", asm)]
    assert max(fmas) >= 7 * 24, "a row's 7 taps are not one unrolled block"
    assert max(fmas) < 2 * 7 * 24, "more than a row of the window unrolled"


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_a_very_wide_window_keeps_its_taps_a_loop():
    """A 1x128 window (wav2vec2's positional convolution): its 128 taps unrolled on the 8 x 48 tile
    made 3072 FMAs in one block and took gcc 34 s; they stay a loop, and still match torch."""
    src = build_kernel(ConvCpuConfig(8, 48, 16, 1, 1, 128, 1, 1, 1, 1, 0, 64)).build("cpu").source_path
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", src, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    fmas = [body.count("vfmadd") for body in re.split(r"\n\.L\d+:\n", asm)]
    assert 24 <= max(fmas) < 8 * 24, "the taps are unrolled"
    p = ConvProblem(2, 3, 2, 150, 19, 1, 128, 1, 1, 0, 0, 64, 64, 1, 1, 1, "float32", False)
    run_direct(p, SMALL)


# ----------------------------------------------------------------------------- channel kernel

def channel_schedule(mr, nv, kc=0, packed=False, cores=CPU.num_cores):
    return Schedule.of(vec="channels", mr=mr, nr=nv * V, cores=cores, kc=kc, packed=packed)


#: (kernel, stride, padding, dilation) — any stride and dilation (no phase planes here).
CHANNEL_WINDOWS = [(3, 1, 1, 1), (3, 2, 1, 1), (7, 2, 3, 1), (1, 2, 0, 1), (3, 3, 0, 2), (2, 1, 1, 1), (5, 1, 2, 2)]


@pytest.mark.parametrize("window", CHANNEL_WINDOWS, ids=lambda v: "k{}s{}p{}d{}".format(*v))
@pytest.mark.parametrize("sched", [channel_schedule(7, 2), channel_schedule(6, 1, kc=3, packed=True),
                                   channel_schedule(5, 2, packed=True)],
                         ids=["7x2v", "6x1v-kc3-packed", "5x2v-packed"])
@given(n=st.integers(1, 3), cin=st.integers(1, 9), h=st.integers(1, 19), w=st.integers(1, 23),
       cout=st.integers(1, 37))
@FEW
def test_channel_kernel_matches_torch(window, sched, n, cin, h, w, cout):
    """Lanes along the output channels: last panels and row tiles partial, reduction blocks
    (``kc`` = 3: partial sums in the workspace), weights packed by the kernel or beforehand;
    packed weights without reduction blocks sweep a batch image by image."""
    k, s, pad, d = window
    span = d * (k - 1) + 1 - 2 * pad
    h, w = max(h, span), max(w, span)
    p = ConvProblem(n, cin, h, w, cout, k, k, s, s, pad, pad, pad, pad, d, d, 1, "float32", False, sched["packed"])
    assert CONV_CPU.config(p, CPU, sched).by_image == (sched["packed"] and not sched["kc"] and n > 1)
    run_direct(p, sched)


def test_pack_weights_layout():
    """Panels of NR output channels, channels innermost, zeros past C_out."""
    w = np.random.default_rng(3).standard_normal((5, 3, 2, 2)).astype(np.float32)
    packed = pack_weights(w, 4).reshape(2, 3 * 2 * 2, 4)
    assert_close(packed[0], w[:4].reshape(4, -1).T)
    assert_close(packed[1][:, 0], w[4].reshape(-1))
    assert not packed[1][:, 1:].any()


@pytest.mark.parametrize("kc", [2, 0], ids=["kc2", "by-image"])
def test_channel_kernel_fused_epilogue_and_asymmetric_padding(kc):
    """A bias + ReLU epilogue spliced into the transposed stores; bottom / right padding larger
    than top / left (ceil-style)."""
    p = ConvProblem(2, 5, 11, 9, 19, 3, 3, 2, 2, 0, 2, 1, 2, 1, 1, 1, "float32", True, True)
    sched = channel_schedule(7, 1, kc=kc, packed=True)
    x, w, b = data(p)
    shape = [p.n, p.cout, p.oh, p.ow]
    c = tensor_input("c", "float32", shape)
    bias = tensor_input("eb", "float32", [p.cout])
    y = compute("y", shape, lambda i, co, r, s: maximum(c[i, co, r, s] + bias[co], 0.0))
    fused = fuse(CONV_CPU.instantiate(p, CPU, sched), {}, {"c": y}, direct_sizes(p))
    out = np.full(shape, np.nan, np.float32)
    avail = {"x": x, "wt": CONV_CPU.weights(p, sched, w), "eb": b, "y": out,
             "xp": np.zeros(CONV_CPU.workspace_size(p, sched, CPU), np.float32)}
    fused(*[avail[q.name] for q in fused.func.params])
    ref = torch.nn.functional.conv2d(torch.nn.functional.pad(torch.from_numpy(x).double(), (1, 2, 0, 2)),
                                     torch.from_numpy(w).double(), torch.from_numpy(b).double(), 2).numpy()
    assert_close(out, np.maximum(ref, 0.0), **tol(p))


#: The host, and the host seen as an AVX2 machine (8 lanes: 8 x 8 block transposes).
LANE_TARGETS = [pytest.param(CPU, id=f"{V}lanes")] + \
    ([pytest.param(dataclasses.replace(CPU, vector_bytes=32), id="8lanes")] if V == 16 else [])


@pytest.mark.parametrize("target", LANE_TARGETS)
@pytest.mark.parametrize("mr, nv, hw, cout", [(7, 2, 14, 37), (14, 1, 28, 16), (6, 2, 23, 21), (15, 2, 17, 40),
                                              (3, 1, 5, 9), (16, 2, 37, 40)])
def test_channel_kernel_blocked_stores_and_packing(target, mr, nv, hw, cout):
    """Weights packed per call (whole ``V x V`` blocks transposed in registers, a last block of
    channels crossing C_out and a tail of taps through the scalar path) and the stores through
    the transposed tile, with a per-channel scale, bias and ReLU6 fused: whole tiles (unmasked)
    and a row's last partial tile (masked), tiles of more than one vector of pixels (15), the
    last panel partial."""
    lanes = max(4, target.vector_bytes // 4)
    p = ConvProblem(2, 5, hw, hw, cout, 3, 3, 2 if hw > 20 else 1, 2 if hw > 20 else 1, 1, 1, 1, 1, 1, 1, 1,
                    "float32", False, False)
    sched = Schedule.of(vec="channels", mr=mr, nr=nv * lanes, cores=CPU.num_cores, kc=0, packed=False)
    x, w, b = data(p, seed=mr)
    scale = np.random.default_rng(hw).uniform(0.5, 2.0, p.cout).astype(np.float32)
    shape = [p.n, p.cout, p.oh, p.ow]
    c = tensor_input("c", "float32", shape)
    es, eb = tensor_input("es", "float32", [p.cout]), tensor_input("eb", "float32", [p.cout])
    y = compute("y", shape, lambda i, co, r, q: minimum(maximum(c[i, co, r, q] * es[co] + eb[co], 0.0), 6.0))
    kernel = CONV_CPU.instantiate(p, target, sched)
    assert CONV_CPU.config(p, target, sched).lanes == lanes
    fused = fuse(kernel, {}, {"c": y}, direct_sizes(p))
    assert "tm_transpose_block_f32(" in fused.build("cpu").source
    out = np.full(shape, np.nan, np.float32)
    avail = {"x": x, "wt": CONV_CPU.weights(p, sched, w, target), "es": scale, "eb": b, "y": out,
             "xp": np.zeros(CONV_CPU.workspace_size(p, sched, target), np.float32)}
    fused(*[avail[q.name] for q in fused.func.params])
    ref = reference(p, x, w) * scale[None, :, None, None] + b[None, :, None, None]
    assert_close(out, np.clip(ref, 0.0, 6.0), **tol(p))
    plain = np.full(shape, np.nan, np.float32)       # the kernel alone: every element stored once
    kernel(*CONV_CPU.arguments(p, [x, w], [plain], sched, target))
    assert_close(plain, reference(p, x, w), **tol(p))


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_channel_kernel_epilogue_stores_are_vectorized():
    """A whole tile's stores with a fused per-channel bias + ReLU6: vector max / min and vector
    stores (no libm call per element; the masked last tile of a row stays scalar); the weight
    packing: in-register 16 x 16 transposes."""
    p = ConvProblem(1, 3, 224, 224, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, "float32", False, False)
    sched = Schedule.of(vec="channels", mr=16, nr=32, cores=1, kc=0, packed=False)
    shape = [p.n, p.cout, p.oh, p.ow]
    c = tensor_input("c", "float32", shape)
    eb = tensor_input("eb", "float32", [p.cout])
    y = compute("y", shape, lambda i, co, r, q: minimum(maximum(c[i, co, r, q] + eb[co], 0.0), 6.0))
    fused = fuse(CONV_CPU.instantiate(p, CPU, sched), {}, {"c": y}, direct_sizes(p))
    src = fused.build("cpu").source_path
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", src, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    assert not re.search(r"call\s+f(max|min)f", asm)
    assert re.search(r"v(max|min|cmp)ps\t[^\n]*%zmm", asm)                # ... a compare and a blend
    assert re.search(r"vmovups\t%zmm\d+, \d*\(%r\w+(,%r\w+,\d)?\)", asm)
    assert asm.count("vshuff32x4") + asm.count("vshuff64x2") >= 32      # 2 transposes of 16 shuffles


@pytest.mark.parametrize("hw, s", [(14, 1), (14, 2), (15, 1)])
def test_channel_kernel_reads_unpadded_input_in_place(hw, s):
    """No padding and whole tiles inside the image (14 = 2 x 7 pixels): the tiles read x itself
    (no padded copy); 15 columns leave a partial tile, which reads the padded copy."""
    p = ConvProblem(2, 6, hw, hw, 21, 1, 1, s, s, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
    sched = channel_schedule(7, 2, packed=True)
    cfg = CONV_CPU.config(p, CPU, sched)
    assert cfg.direct(p.h, p.w, p.oh, p.ow) == (hw == 14)
    run_direct(p, sched)


def test_constant_weights_route_resnet_layers_to_packed_panels():
    """With constant weights (a compiled graph) the cost model takes the channel kernel with
    pre-packed panels for the 3x3 ResNet layers of stride 2 and the smallest image (the others
    take the Winograd kernel: tests/templates/test_conv_wino.py)."""
    for hw, cin, cout, s in [(56, 64, 128, 2), (28, 128, 256, 2), (7, 512, 512, 1)]:
        p = ConvProblem(1, cin, hw, hw, cout, 3, 3, s, s, 1, 1, 1, 1, 1, 1, 1, "float32", False, True)
        sched = select(p, CPU)
        assert sched is not None and sched.get("vec") == "channels" and sched["packed"], (p, sched)
    # 1x1 on a 7x7 image: the channel kernel (the implicit GEMM's tiles waste lanes there)
    pointwise = ConvProblem(1, 512, 7, 7, 2048, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
    assert select(pointwise, CPU) is not None
    assert select(dataclasses.replace(pointwise, const_weights=False), CPU) is None      # no packing per call


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
@pytest.mark.parametrize("pf", [0, 1024])
def test_channel_micro_kernel_assembly(pf):
    """The channel kernel's hot loop (one tap of a 7 x 4-vector tile): 4 aligned vector loads of
    the panel, 7 broadcasts, 28 FMAs, the accumulators in registers.  The tile fills the 32
    registers exactly: gcc's tuning for Intel parts (``-march=native`` on a Cascade Lake) keeps
    one accumulator on the stack (a load and a store per tap), its AMD tuning none — the check
    allows that one and no more.  With ``pf``, a prefetch per cache line of the tap's panel row
    (4), and the input rows' prefetches outside the tap loop."""
    cfg = CvecConfig(7, 64, 16, 1, 3, 3, 1, 1, 1, 1, 1, 1, 0, True, pf=pf)
    src = build_cvec(cfg).build("cpu").source_path
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", src, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    loops = [body.split("\tj")[0] for body in re.split(r"\n\.L\d+:\n", asm) if body.count("vfmadd") >= 28]
    assert loops, "no loop with the tile's 28 FMAs"
    hot = loops[0]
    assert hot.count("vfmadd") == 28
    assert hot.count("vbroadcastss") + hot.count("{1to16}") == 7
    assert hot.count("(%rsp)") <= 2 and "gather" not in hot
    assert hot.count("prefetcht0") == (4 if pf else 0)
    assert asm.count("prefetcht0") > hot.count("prefetcht0") or not pf       # the input rows'


def test_channel_kernel_prefetches_in_the_graph_config():
    """The template's configurations prefetch (``pf``: the matmul's distance along the weight
    stream); the input ``pf / (kh kw NR)`` channels ahead, past the last channel and image
    harmlessly (a prefetch never faults: every kernel test here runs with it)."""
    from taskmap.templates.panels import PREFETCH_BYTES

    p = ConvProblem(1, 576, 14, 14, 96, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
    assert CONV_CPU.config(p, CPU, channel_schedule(14, 2, packed=True)).pf == PREFETCH_BYTES // 4
    src = CONV_CPU.instantiate(p, CPU, channel_schedule(14, 2, packed=True)).build("cpu").source
    assert src.count("__builtin_prefetch(") >= 3


def test_channel_kernel_prefetches_its_output_for_writing_where_it_overflows_l2():
    """A stem (3 -> 32 at 224x224, stride 2: 1.6 MB of output) prefetches each tile's output
    lines for writing before its reduction (``pf_c``); a layer whose output fits a core's L2 does
    not.  Results exact either way (checked against torch, with a fused bias + ReLU6 splicing
    the hint onto the epilogue's output)."""
    from taskmap.templates.attention_cpu import l2_per_core

    target = dataclasses.replace(CPU, l2_bytes=CPU.num_cores << 20)      # 1 MB a core, whatever the host
    sched = channel_schedule(16, 2, packed=True)
    stem = ConvProblem(1, 3, 224, 224, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, "float32", False, True)
    small = ConvProblem(1, 3, 56, 56, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, "float32", False, True)
    assert 4 * 32 * 112 * 112 > l2_per_core(target) > 4 * 32 * 28 * 28
    assert CONV_CPU.config(stem, target, sched).pf_c and not CONV_CPU.config(small, target, sched).pf_c
    assert ", 1, 3)" in CONV_CPU.instantiate(stem, target, sched).build("cpu").source      # prefetchw
    assert ", 1, 3)" not in CONV_CPU.instantiate(small, target, sched).build("cpu").source
    x, w, b = data(stem, seed=4)
    shape = [1, 32, 112, 112]
    c = tensor_input("c", "float32", shape)
    bias = tensor_input("eb", "float32", [32])
    y = compute("y", shape, lambda i, co, r, s: minimum(maximum(c[i, co, r, s] + bias[co], 0.0), 6.0))
    fused = fuse(CONV_CPU.instantiate(stem, target, sched), {}, {"c": y}, direct_sizes(stem))
    hints = [line for line in fused.build("cpu").source.splitlines() if "__builtin_prefetch((&y[" in line]
    assert hints and all(h.rstrip().endswith(", 1, 3);") for h in hints)      # the epilogue's output, written
    out = np.full(shape, np.nan, np.float32)
    avail = {"x": x, "wt": CONV_CPU.weights(stem, sched, w, target), "eb": b, "y": out,
             "xp": np.zeros(CONV_CPU.workspace_size(stem, sched, target), np.float32)}
    fused(*[avail[q.name] for q in fused.func.params])
    assert_close(out, np.clip(reference(stem, x, w, b), 0.0, 6.0), **tol(stem))


@pytest.mark.parametrize("window", [(3, 2, 1, 1), (7, 2, 3, 1), (1, 1, 0, 1)], ids=lambda v: "k{}s{}p{}d{}".format(*v))
@given(n=st.integers(1, 2), cin=st.integers(1, 5), h=st.integers(7, 30), w=st.integers(7, 30),
       cout=st.integers(1, 40), kc=st.sampled_from([0, 2]))
@FEW
def test_channel_kernel_with_output_prefetches_matches_torch(window, n, cin, h, w, cout, kc):
    """The output prefetches on any shape (partial panels and row tiles, reduction blocks,
    lines past the output's end): results unchanged."""
    k, s, pad, d = window
    p = ConvProblem(n, cin, h, w, cout, k, k, s, s, pad, pad, pad, pad, d, d, 1, "float32", False, True)
    sched = channel_schedule(5, 2, kc=kc, packed=True)
    cfg = dataclasses.replace(CONV_CPU.config(p, CPU, sched), pf_c=True, planes=False)      # planes: none
    x, wn, _ = data(p, seed=n + cin + h)
    c = np.full((p.n, p.cout, p.oh, p.ow), np.nan, np.float32)
    args = CONV_CPU.arguments(p, [x, wn], [c], sched, CPU)
    kernel = build_cvec(cfg)
    assert ", 1, 3)" in kernel.build("cpu").source
    kernel(*args)
    assert_close(c, reference(p, x, wn), **tol(p), err_msg=f"{p} {cfg}")


@pytest.mark.parametrize("schedule", [Schedule.of(mr=6, nr=64, cores=1, shift=False),
                                      Schedule.of(vec="channels", mr=7, nr=32, cores=1, kc=0, packed=False)])
@pytest.mark.parametrize("shape, pad", [((1, 1, 3, 2), (1, 0)), ((2, 3, 5, 4), (2, 1))])
def test_padding_rows_with_the_sizes_specialised(schedule, shape, pad):
    """Both kernels specialised to the problem's sizes (as ``ops.conv2d`` and the graph build
    them): the padded input's rows are right.  (gcc 12.2 at -O3 miscompiled the former per-row
    condition of the padding loop once the row count was a constant: a middle row read as 0.)"""
    n, cin, h, w = shape
    p = ConvProblem(n, cin, h, w, 2, 1, 1, 1, 1, pad[0], pad[0], pad[1], pad[1], 1, 1, 1, "float32", False, False)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(np.float32)
    wt = rng.standard_normal((2, cin, 1, 1)).astype(np.float32)
    c = np.full((n, 2, p.oh, p.ow), np.nan, np.float32)
    fuse(CONV_CPU.instantiate(p, CPU, schedule), {}, {}, direct_sizes(p))(*CONV_CPU.arguments(p, [x, wt], [c], schedule, CPU))
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(wt).double(), padding=pad).numpy()
    assert_close(c, ref, rtol=1e-5, atol=1e-5)


# A fixed 2-core AVX-512 host with 1 MB of L2 per core and the 512-bit FMA rate the probe measures
# (the cost model's view of a Cascade Lake), so that the routing below does not depend on the
# machine running the tests.
CASCADE = dataclasses.replace(CPU, vector_bytes=64, num_cores=2, l2_bytes=2 << 20, clock_hz=2.5e9,
                              fma512_per_cycle=1.75, peak_flops_f32=280e9, cache_bandwidth=320e9,
                              register_bandwidth=320e9, llc_bandwidth=0.0, b_in_place_step=0.0,
                              b_off_line_step=0.0)


def test_strided_pointwise_layers_route_to_the_implicit_gemm():
    """ResNet-50's stride-2 1x1 layers (constant weights): the implicit GEMM, whose img2col is a
    strided copy, measured 1.5-2x faster than the channel kernel; they take the 1x1 edge."""
    for cin, cout, hw in [(256, 512, 56), (512, 1024, 28), (1024, 2048, 14)]:
        p = ConvProblem(1, cin, hw, hw, cout, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
        assert select(p, CASCADE) is None, p


def test_pointwise_layers_whose_input_spills_l2_route_to_the_implicit_gemm():
    """Every core sweeps the whole input once per channel panel; past half of L2 that comes from
    L3 (measured side by side on a Cascade Lake: 512 -> 128 at 28x28 0.61 ms on the channel
    kernel, 0.46 ms on the implicit GEMM; Inception-V3's 288 -> 64 at 35x35 0.42 vs 0.33 ms).
    Inputs that stay in L2 keep the channel kernel where it won (2048 -> 512 at 7x7: 0.84 vs
    0.92 ms); 1024 -> 256 at 14x14 went to the implicit GEMM once its last, 4-column panel ran
    the narrow tile (0.82 vs 0.86 ms; before it, 0.93 vs 0.86)."""
    def pointwise(cin, cout, hw):
        return ConvProblem(1, cin, hw, hw, cout, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, "float32", True, True)
    assert select(pointwise(512, 128, 28), CASCADE) is None
    assert select(pointwise(288, 64, 35), CASCADE) is None
    assert select(pointwise(1024, 256, 14), CASCADE) is None
    assert select(pointwise(2048, 512, 7), CASCADE)["vec"] == "channels"


def test_channel_kernel_cost_counts_the_image_read_again_per_panel():
    """An image larger than half a core's L2 is streamed from L3 for every channel panel of a
    core, its first included: the cost grows by those reads, and not when the image stays in L2."""
    from taskmap.templates.conv_cpu import LLC_BANDWIDTH

    big_l2 = dataclasses.replace(CASCADE, l2_bytes=2 * (64 << 20))
    p = ConvProblem(1, 256, 56, 56, 512, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
    sched = Schedule.of(vec="channels", mr=7, nr=64, cores=2, kc=0, packed=True)
    cfg = CONV_CPU.config(p, CASCADE, sched)
    panels = -(-p.cout // cfg.nr)
    image = 4 * p.cin * p.oh * p.w                  # the even rows, whole
    extra = CONV_CPU.cost(p, CASCADE, sched) - CONV_CPU.cost(p, big_l2, sched)
    assert extra == pytest.approx(panels // 2 * image / LLC_BANDWIDTH, rel=1e-6)
    small = dataclasses.replace(p, h=14, w=14, cin=64)        # 25 KB: stays in L2
    assert CONV_CPU.cost(small, CASCADE, sched) == pytest.approx(CONV_CPU.cost(small, big_l2, sched), rel=1e-9)


@pytest.mark.parametrize("n, cores", [(3, 2), (5, 2), (4, 1)], ids=["image-shared-by-two-cores", "n5", "one-core"])
@pytest.mark.parametrize("window", [(3, 2, 1, 1), (7, 2, 3, 1), (3, 1, 1, 2)], ids=lambda v: "k{}s{}p{}d{}".format(*v))
def test_channel_kernel_pads_each_image_on_its_core(n, cores, window):
    """Batches swept image by image, each core padding the images it reaches into its own copy
    (``pad_each``): an image whose tiles two cores share is padded by both; the workspace holds
    one padded image per core, not the batch."""
    k, s, pad, d = window
    p = ConvProblem(n, 5, 13, 11, 21, k, k, s, s, pad, pad, pad, pad, d, d, 1, "float32", False, True)
    sched = channel_schedule(5, 1, packed=True, cores=cores)
    cfg = dataclasses.replace(CONV_CPU.config(p, CPU, sched), pad_each=True)
    assert cfg.by_image
    hp, wp = cfg.padded(p.oh, p.ow)
    assert cfg.workspace(p.n, p.cin, p.oh, p.ow) == cores * p.cin * hp * wp
    x, w, _ = data(p, seed=n)
    c = np.full((p.n, p.cout, p.oh, p.ow), np.nan, np.float32)
    kernel = build_cvec(cfg)
    avail = {"x": x, "wt": pack_weights(w, cfg.nr), "c": c,
             "xp": np.full(cfg.workspace(p.n, p.cin, p.oh, p.ow), np.nan, np.float32)}
    kernel(*[avail[q.name] for q in kernel.func.params])
    assert_close(c, reference(p, x, w), **tol(p))


def test_pad_each_is_chosen_when_every_core_gets_two_images():
    from taskmap.templates.conv_cpu import PAD_EACH_IMAGES

    sched = channel_schedule(7, 2, packed=True, cores=2)
    for n in (1, 2, 3, 4, 8):
        p = problem(n, 64, 28, 28, 64, 3, 2, 1)
        p = dataclasses.replace(p, const_weights=True)
        assert CONV_CPU.config(p, CPU, sched).pad_each == (n >= PAD_EACH_IMAGES * 2)
        assert not CONV_CPU.config(p, CPU, channel_schedule(7, 2, kc=64, packed=True, cores=2)).pad_each


@pytest.mark.parametrize("window", [(3, 1, 1, 1), (3, 2, 1, 1), (5, 1, 2, 1), (3, 1, 0, 2)],
                         ids=lambda v: "k{}s{}p{}d{}".format(*v))
@given(n=st.integers(1, 2), groups=st.sampled_from([2, 3, 4, 8]), cig=st.integers(1, 5), cog=st.sampled_from([1, 2, 4, 6, 8]),
       h=st.integers(3, 19), w=st.integers(3, 23), shift=st.booleans())
@FEW
def test_grouped_convolutions_on_the_pixel_kernel(window, n, groups, cig, cog, h, w, shift):
    """Groups of ``cig`` input and ``cog`` output channels (ResNeXt's 3x3 layers, RegNets): each
    tile's channels in one group, its reduction over that group's inputs alone (a wrong group
    would read other channels: compared against torch in float64)."""
    k, s, pad, d = window
    h, w = max(h, d * (k - 1) + 1 - 2 * pad), max(w, d * (k - 1) + 1 - 2 * pad)
    p = ConvProblem(n, groups * cig, h, w, groups * cog, k, k, s, s, pad, pad, pad, pad, d, d, groups, "float32",
                    False)
    space = CONV_CPU.space(p, CPU)
    assert space and all(not sc.get("vec") and cog % sc["mr"] == 0 for sc in space)
    sched = next(sc for sc in space if sc["shift"] == shift and sc["mr"] == max(x["mr"] for x in space))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((p.n, p.cin, p.h, p.w)).astype(np.float32)
    wt = rng.standard_normal((p.cout, cig, k, k)).astype(np.float32)
    c = np.full((p.n, p.cout, p.oh, p.ow), np.nan, np.float32)
    CONV_CPU.instantiate(p, CPU, sched)(*CONV_CPU.arguments(p, [x, wt], [c], sched, CPU))
    t = torch.from_numpy
    want = torch.nn.functional.conv2d(t(x).double(), t(wt).double(), None, s, pad, d, groups).numpy()
    assert_close(c, want, rtol=1e-5, atol=2e-6 * cig * k * k + 1e-5, err_msg=f"{p} {sched}")


@pytest.mark.parametrize("window", [(3, 1, 1, 1), (3, 2, 1, 1), (5, 2, 2, 1)], ids=lambda v: "k{}s{}p{}d{}".format(*v))
@given(n=st.integers(1, 3), groups=st.sampled_from([1, 2, 4]), cig=st.integers(1, 5), cog=st.sampled_from([2, 4, 8]),
       h=st.integers(5, 17), shift=st.booleans(), cores=st.sampled_from([1, 2, 3]))
@FEW
def test_each_core_packing_a_group_as_it_reaches_it_matches_torch(window, n, groups, cig, cog, h, shift, cores):
    """``pack_each``: every core packs the planes of the group (the image, with one group) its
    tiles reach into its own buffer — ranges of tiles that start inside a group, groups two cores
    share, images split between cores, each read from a NaN-filled workspace (a plane read before
    it is packed, or another core's, shows)."""
    k, s, pad, d = window
    p = ConvProblem(n, groups * cig, h, h + 3, groups * cog, k, k, s, s, pad, pad, pad, pad, d, d, groups, "float32",
                    False)
    sched = Schedule.of(mr=math.gcd(cog, 4), nr=CPU.vector_bytes // 4 * 2, cores=cores, shift=shift)
    cfg = dataclasses.replace(CONV_CPU.config(p, CPU, sched), pack_each=True)
    assume(valid(cfg))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((p.n, p.cin, p.h, p.w)).astype(np.float32)
    wt = rng.standard_normal((p.cout, cig, k, k)).astype(np.float32)
    c = np.full((p.n, p.cout, p.oh, p.ow), np.nan, np.float32)
    xp = np.full(cfg.workspace(p.n, p.cin, p.oh, p.ow, groups), np.nan, np.float32)
    build_kernel(cfg)(x, wt, c, xp)
    t = torch.from_numpy
    want = torch.nn.functional.conv2d(t(x).double(), t(wt).double(), None, s, pad, d, groups).numpy()
    assert_close(c, want, rtol=1e-5, atol=2e-6 * cig * k * k + 1e-5, err_msg=f"{p} {cfg}")


def test_pack_each_is_chosen_where_the_batch_planes_outgrow_the_last_level_cache():
    """ResNeXt-50's grouped 3x3 layers at batch 8 on a 32 MB L3: stride 2 at 56x56 (27.6 MB of phase
    planes) and 28x28 (14.7 MB) pack group by group; at 14x14 (8.4 MB), at batch 1, or where the
    last-level cache is unknown, the batch is packed in one pass."""
    from taskmap.templates.conv_cpu import PACK_EACH_LLC

    l3 = dataclasses.replace(CASCADE, llc_bytes=32 << 20)
    sched = Schedule.of(mr=8, nr=32, cores=2, shift=False)

    def each(target, n, c, hw, stride):
        p = ConvProblem(n, c, hw, hw, c, 3, 3, stride, stride, 1, 1, 1, 1, 1, 1, 32, "float32", True, True)
        return CONV_CPU.config(p, target, sched).pack_each

    assert each(l3, 8, 256, 56, 2) and each(l3, 8, 512, 28, 2)
    assert not each(l3, 8, 1024, 14, 2) and not each(l3, 1, 512, 28, 2) and not each(dataclasses.replace(l3, llc_bytes=0), 8, 256, 56, 2)
    assert PACK_EACH_LLC * l3.llc_bytes < 4 * 8 * 512 * 4 * 15 * 15


@pytest.mark.parametrize("window", [(3, 1, 1, 1), (3, 2, 1, 1), (1, 2, 0, 1), (3, 1, 0, 2)],
                         ids=lambda v: "k{}s{}p{}d{}".format(*v))
@pytest.mark.parametrize("mr, nv, packed", [(7, 1, True), (5, 1, False), (6, 2, True)],
                         ids=["7x1v-packed", "5x1v", "6x2v-packed"])
@given(n=st.integers(1, 5), groups=st.sampled_from([2, 3]), cig=st.integers(1, 6), panels=st.sampled_from([1, 2]),
       h=st.integers(1, 16), w=st.integers(1, 19), cores=st.sampled_from([1, 2, 3]))
@FEW
def test_grouped_channel_kernel_matches_torch(window, mr, nv, packed, n, groups, cig, panels, h, w, cores):
    """Groups whose output channels are whole panels of the channel kernel (ResNeXt-50's 16 and 32
    channels a group): each panel's broadcasts read its own group's input channels — a wrong
    group reads other channels, compared against torch in float64 — with the weights packed
    beforehand or per call, a batch image by image, each core padding its images, whole planes
    (rows shorter than a vector), all from a NaN-filled workspace."""
    k, s, pad, d = window
    span = d * (k - 1) + 1 - 2 * pad
    h, w = max(h, span), max(w, span)
    cog = nv * V * panels
    p = ConvProblem(n, groups * cig, h, w, groups * cog, k, k, s, s, pad, pad, pad, pad, d, d, groups, "float32",
                    False, packed)
    sched = channel_schedule(mr, nv, packed=packed, cores=cores)
    cfg = CONV_CPU.config(p, CPU, sched)
    assert cfg.groups == groups and cfg.panel(p.cin) == cig * k * k * nv * V
    rng = np.random.default_rng(4)
    x = rng.standard_normal((p.n, p.cin, p.h, p.w)).astype(np.float32)
    wt = rng.standard_normal((p.cout, cig, k, k)).astype(np.float32)
    c = np.full((p.n, p.cout, p.oh, p.ow), np.nan, np.float32)
    args = CONV_CPU.arguments(p, [x, wt], [c], sched, CPU)
    args[3] = np.full(CONV_CPU.workspace_size(p, sched, CPU), np.nan, np.float32)
    CONV_CPU.instantiate(p, CPU, sched)(*args)
    t = torch.from_numpy
    want = torch.nn.functional.conv2d(t(x).double(), t(wt).double(), None, s, pad, d, groups).numpy()
    assert_close(c, want, rtol=1e-5, atol=2e-6 * cig * k * k + 1e-5, err_msg=f"{p} {cfg}")


def test_grouped_channel_tiles_keep_a_panel_in_one_group():
    """The channel kernel takes a grouped layer where a group's output channels are whole vectors:
    its panels (``NR`` dividing them) never straddle two groups, and take no reduction blocks."""
    for cog in (V // 2, V, 3 * V // 2, 2 * V, 3 * V):
        p = ConvProblem(1, 4 * cog, 14, 14, 4 * cog, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, "float32", False, True)
        channels = [sc for sc in CONV_CPU.space(p, CPU) if sc.get("vec") == "channels"]
        assert bool(channels) == (cog % V == 0), cog
        assert all(cog % sc["nr"] == 0 and not sc["kc"] for sc in channels)
        assert not channels or V in {sc["nr"] for sc in channels}
    p = ConvProblem(1, 4 * V, 14, 14, 4 * V, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 8, "float32", False, True)
    with pytest.raises(UnsupportedError, match="one group's channels"):       # V / 2 channels a group
        CONV_CPU.instantiate(p, CPU, channel_schedule(7, 1, packed=True))


def test_grouped_layers_route_by_the_cost_model_and_match_torch():
    """ResNeXt-50's first 3x3 layer (32 groups of 4 channels), its stride-2 one of 16 channels a group,
    a RegNet-like one and one of two vectors of channels a group at 7x7: ``ops.conv2d`` (whichever
    route the model takes, the pixel or the channel kernel among them) against torch."""
    rng = np.random.default_rng(2)
    for cin, hw, groups, stride in [(128, 20, 32, 1), (96, 14, 4, 2), (512, 14, 32, 2), (8 * V, 7, 4, 1)]:
        x = rng.standard_normal((1, cin, hw, hw)).astype(np.float32)
        w = rng.standard_normal((cin, cin // groups, 3, 3)).astype(np.float32)
        b = rng.standard_normal(cin).astype(np.float32)
        got = ops.conv2d(x, w, b, stride, 1, 1, groups)
        t = torch.from_numpy
        want = torch.nn.functional.conv2d(t(x).double(), t(w).double(), t(b).double(), stride, 1, 1, groups)
        assert_close(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-4)


def test_padding_each_image_in_its_cores_caches_is_charged_a_share_of_a_pass(monkeypatch):
    """ResNeXt-50's 3x3 layers of 16-channel groups at 14x14, batch 8: the channel kernel pads each
    image on its core, in that core's caches, and is charged ``PAD_EACH_SHARE`` of the pass through
    memory that the pixel kernel makes for the whole batch (in the model's flow 1.38-1.47 against
    1.9-2.1 ms); the model takes it on a fixed Zen-4-like host.  At batch 1 (no per-core padding)
    the pass is charged in full."""
    import taskmap.templates.conv_cpu as conv_cpu

    zen4 = dataclasses.replace(CPU, vector_bytes=64, num_cores=2, l2_bytes=2 << 20, clock_hz=2.6e9,
                               fma512_per_cycle=1.0, llc_bandwidth=0.0, llc_bytes=32 << 20)
    for n in (8, 1):
        p = ConvProblem(n, 512, 14, 14, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 32, "float32", False, True)
        best = min(CONV_CPU.space(p, zen4), key=lambda sc: CONV_CPU.cost(p, zen4, sc))
        cfg = CONV_CPU.config(p, zen4, best)
        if n == 8:
            assert best.get("vec") == "channels" and cfg.pad_each, best
        sched = Schedule.of(vec="channels", mr=14, nr=16, cores=2, kc=0, packed=True)
        hp, wp = CONV_CPU.config(p, zen4, sched).padded(p.oh, p.ow)
        full_pass = 8 * n * p.cin * hp * wp / (conv_cpu.PACK_BANDWIDTH * 2)
        share = conv_cpu.PAD_EACH_SHARE if CONV_CPU.config(p, zen4, sched).pad_each else 1.0
        assert (n == 8) == (share < 1.0)
        charged = CONV_CPU.cost(p, zen4, sched)
        monkeypatch.setattr(conv_cpu, "PAD_EACH_SHARE", 1.0)
        assert math.isclose(CONV_CPU.cost(p, zen4, sched) - charged, (1 - share) * full_pass, rel_tol=1e-9, abs_tol=1e-12)
        monkeypatch.undo()


def test_grouped_layers_that_tie_alone_take_the_channel_kernel(monkeypatch):
    """ResNeXt-50's 16-channel groups at 14x14 and RegNetY's 64-channel groups at 56x56, batch 1:
    alone the two kernels tie (the model's costs within 2%), in a model's flow the channel kernel
    ran 1.04-1.17x faster; the pixel kernel's cost on grouped layers is scaled by
    ``GROUPED_PIXEL_FLOW``.  Ungrouped layers are not."""
    import taskmap.templates.conv_cpu as conv_cpu

    zen4 = dataclasses.replace(CPU, vector_bytes=64, num_cores=2, l2_bytes=2 << 20, clock_hz=2.6e9,
                               fma512_per_cycle=1.0, llc_bandwidth=0.0, llc_bytes=32 << 20)

    def kinds(p):
        best = {}
        for sc in CONV_CPU.space(p, zen4):
            k, c = sc.get("vec") or "pixels", CONV_CPU.cost(p, zen4, sc)
            best[k] = min(best.get(k, c), c)
        return best
    for cin, hw, groups in [(512, 14, 32), (128, 56, 2)]:
        p = ConvProblem(1, cin, hw, hw, cin, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, groups, "float32", False, True)
        best = kinds(p)
        assert min(best, key=best.get) == "channels", (p, best)
        monkeypatch.setattr(conv_cpu, "GROUPED_PIXEL_FLOW", 1.0)
        alone = kinds(p)
        monkeypatch.undo()
        assert math.isclose(best["pixels"], alone["pixels"] * conv_cpu.GROUPED_PIXEL_FLOW)
        assert abs(alone["pixels"] / alone["channels"] - 1) < 0.02          # (nearly) a tie without it
    plain = ConvProblem(1, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, "float32", False, True)
    sched = Schedule.of(mr=8, nr=32, cores=2, shift=False)
    cost = CONV_CPU.cost(plain, zen4, sched)
    monkeypatch.setattr(conv_cpu, "GROUPED_PIXEL_FLOW", 2.0)
    assert CONV_CPU.cost(plain, zen4, sched) == cost


def _silu_epilogue(p: ConvProblem):
    """``y = silu(c + bias[co])`` over the conv's output ``c``."""
    from taskmap.ir import expr as E
    from taskmap.ir.expr import Intrinsic

    shape = [p.n, p.cout, p.oh, p.ow]
    c = tensor_input("c", "float32", shape)
    eb = tensor_input("eb", "float32", [p.cout])
    return compute("y", shape, lambda i, co, r, q: (c[i, co, r, q] + eb[co]) /
                   (1.0 + E.call(Intrinsic.EXP, -(c[i, co, r, q] + eb[co]))))


@pytest.mark.parametrize("window, hw", [((1, 1, 0, 1), 7), ((3, 1, 1, 1), 7), ((3, 2, 1, 1), 13), ((1, 1, 0, 1), 5)],
                         ids=["1x1-7x7-in-place", "3x3-7x7-padded", "3x3s2-13x13", "1x1-5x5"])
@pytest.mark.parametrize("n, cores", [(1, CPU.num_cores), (2, 2), (5, 2), (3, 1)])
@pytest.mark.parametrize("target", LANE_TARGETS)
def test_channel_kernel_whole_planes(window, hw, n, cores, target):
    """Rows shorter than a vector, one tile each: a unit is a channel panel of one image, its rows
    written into the core's planes, then each channel's plane stored by one vector loop with a
    fused bias + SiLU — in place or from the padded copy, image by image and padded per core
    (``n`` 5), the last panel partial (85 channels), the 1x1 layers' rows prefetching the panel of
    the core's next unit, against torch in float64; 16 and 8 lanes."""
    k, s, pad, d = window
    lanes = max(4, target.vector_bytes // 4)
    p = ConvProblem(n, 6, hw, hw, 85, k, k, s, s, pad, pad, pad, pad, d, d, 1, "float32", False, True)
    sched = Schedule.of(vec="channels", mr=7, nr=lanes, cores=cores, kc=0, packed=True)
    cfg = CONV_CPU.config(p, target, sched)
    assert cfg.planes and cfg.workspace(p.n, p.cin, p.oh, p.ow) >= cores * cfg.nr * (p.oh * p.ow + cfg.mrp)
    assert cfg.pf_next == (k == 1)          # 1x1 on planes of 7x7 and less: the next panel prefetched
    x, w, b = data(p, seed=n + hw)
    plain = np.full((p.n, p.cout, p.oh, p.ow), np.nan, np.float32)     # the kernel alone
    kernel = CONV_CPU.instantiate(p, target, sched)
    kernel(*CONV_CPU.arguments(p, [x, w], [plain], sched, target))
    ref = reference(p, x, w)
    assert_close(plain, ref, **tol(p))
    fused = fuse(kernel, {}, {"c": _silu_epilogue(p)}, direct_sizes(p))
    out = np.full(plain.shape, np.nan, np.float32)
    avail = {"x": x, "wt": CONV_CPU.weights(p, sched, w, target), "eb": b, "y": out,
             "xp": np.full(CONV_CPU.workspace_size(p, sched, target), np.nan, np.float32)}
    fused(*[avail[q.name] for q in fused.func.params])
    z = ref + b[None, :, None, None]
    assert_close(out, z / (1.0 + np.exp(-z)), **tol(p))


def test_whole_planes_are_taken_where_they_balance_the_cores():
    """``planes``: packed panels without reduction blocks, rows of one tile shorter than a vector,
    and enough (image, panel) units for the cores."""
    from taskmap.templates.conv_cpu import PLANE_BYTES

    two = channel_schedule(7, 2, packed=True, cores=2)

    def config(n, hw, cout, sched=two):
        p = ConvProblem(n, 64, hw, hw, cout, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
        return CONV_CPU.config(p, CPU, sched)

    assert config(1, 7, 1152).planes                    # 36 panels
    assert not config(1, 7, 2 * V).planes               # one panel for two cores: rows balance them
    assert config(2, 7, 2 * V).planes                   # ... an image each
    assert not config(1, 7, 5 * 2 * V).planes           # 5 panels: 3 / 2
    assert not config(1, 16 if V == 16 else 8, 1152).planes           # rows of a whole vector
    assert not config(1, 14, 1152).planes               # 14 pixels: two tiles of 7 a row
    assert not config(1, 7, 1152, channel_schedule(7, 2, packed=False, cores=2)).planes
    assert not config(1, 7, 1152, channel_schedule(7, 2, kc=64, packed=True, cores=2)).planes
    big = ConvProblem(1, 64, 7, 7, 1152, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
    cfg = CONV_CPU.config(big, CPU, two)
    assert cfg.nr * cfg.plane_stride(7, 7) * 4 <= PLANE_BYTES


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_whole_planes_store_in_vector_loops():
    """The planes' stores with a fused bias + SiLU at 7x7: gcc vectorizes each plane's loop with
    whole zmm vectors (the rows of 7 pixels went in 4 + 2 + 1 lanes)."""
    p = ConvProblem(1, 64, 7, 7, 256, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, "float32", False, True)
    sched = channel_schedule(7, 2, packed=True, cores=2)
    assert CONV_CPU.config(p, CPU, sched).planes
    fused = fuse(CONV_CPU.instantiate(p, CPU, sched), {}, {"c": _silu_epilogue(p)}, direct_sizes(p))
    src = fused.build("cpu").source_path
    lines = Path(src).read_text().splitlines()
    loop = next(i for i, line in enumerate(lines, 1) if "tm_fn_store_planes(" in line and "{" in line)
    report = subprocess.run(["gcc", *ASM_FLAGS, "-fopt-info-vec-optimized", "-S", src, "-o", "/dev/null"],
                            capture_output=True, text=True, check=True).stderr
    vectorized = [int(m.group(1)) for m in re.finditer(r":(\d+):\d+: optimized: loop vectorized using 64 byte", report)]
    assert any(loop < line < loop + 10 for line in vectorized), report


def test_whole_plane_units_prefetch_the_next_panel_into_l2():
    """``pf_next``: a 1x1 layer on whole planes of at most :data:`PF_NEXT_PIXELS` prefetches, in
    its first rows' reduction steps, the panel of the core's next unit into L2 (``prefetcht1``);
    3x3 layers and larger planes do not (measured slower there: the hints cost more than the
    first row's wait for the panel)."""
    from taskmap.templates.conv_cpu import PF_NEXT_PIXELS

    sched = Schedule.of(vec="channels", mr=7, nr=V, cores=2, kc=0, packed=True)

    def config(k, hw):
        p = ConvProblem(1, 64, hw, hw, 8 * V, k, k, 1, 1, k // 2, k // 2, k // 2, k // 2, 1, 1, 1, "float32", False,
                        True)
        return CONV_CPU.config(p, CPU, sched)

    assert PF_NEXT_PIXELS == 49 and config(1, 7).pf_next and config(1, 5).pf_next
    assert not config(3, 7).pf_next and not config(1, 14).pf_next
    on = build_cvec(config(1, 7)).build("cpu").source
    off = build_cvec(dataclasses.replace(config(1, 7), pf_next=False)).build("cpu").source
    assert on.count(", 0, 2)") > off.count(", 0, 2)")       # level 2: prefetcht1
