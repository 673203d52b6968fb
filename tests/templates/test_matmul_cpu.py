"""The CPU matmul template: its space and cost model, every code path of the kernel (splits,
packing choices, edges, batches, broadcast operands, transposed B and C, bias, AVX2 tiles)
against numpy in float64 on odd and prime shapes, and the micro-kernel's assembly."""
import dataclasses
import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.backends.base import host_cpu_target
from taskmap.schedule.tune import choose
from taskmap.templates.base import Schedule
from taskmap.templates.matmul_cpu import MATMUL_CPU, TILES, lanes_of
from taskmap.templates.matmul_cpu_kernel import CpuConfig, build_kernel
from taskmap.templates.matmul_problem import MatmulProblem
from taskmap.testing import assert_close

CPU = host_cpu_target()
AVX2 = dataclasses.replace(CPU, vector_bytes=32, features=tuple(f for f in CPU.features if not f.startswith("avx512")))
FEW = settings(max_examples=10, deadline=None)
RNG = np.random.default_rng(7)


def operands(p: MatmulProblem, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(p.a_shape).astype(np.float32)
    b = rng.standard_normal(p.b_shape).astype(np.float32)
    bias = rng.standard_normal(p.c_shape[-1]).astype(np.float32) if p.bias else None
    return a, b, bias


def reference(p: MatmulProblem, a, b, bias):
    bm = np.swapaxes(b, 1, 2) if p.trans_b else b
    c = a.astype(np.float64) @ bm.astype(np.float64)
    if p.trans_c:
        c = np.swapaxes(c, 1, 2)
    return c + bias if bias is not None else c


def run(p: MatmulProblem, schedule: Schedule, target=CPU, seed: int = 0):
    a, b, bias = operands(p, seed)
    c = np.full(p.c_shape, np.nan, np.float32)
    kernel = MATMUL_CPU.instantiate(p, target, schedule)
    ins = [a, b] + ([bias] if bias is not None else [])
    kernel(*MATMUL_CPU.arguments(p, ins, [c], schedule, target))
    return c, reference(p, a, b, bias)


def check(p, schedule, target=CPU, seed=0):
    c, ref = run(p, schedule, target, seed)
    assert_close(c, ref, rtol=1e-5, atol=2e-6 * p.k + 1e-5, err_msg=f"{p} {schedule}")


def sched(mr=12, nr=32, kc=64, ncb=2, split="m", pack_a=True, pack_b=True, cores=CPU.num_cores):
    return Schedule.of(mr=mr, nr=nr, kc=kc, ncb=ncb, split=split, pack_a=pack_a, pack_b=pack_b, cores=cores)


# A few kernels cover every code path; sizes are symbolic, so shapes do not recompile.
PATHS = [sched(), sched(split="n"), sched(pack_a=False, pack_b=False), sched(split="n", pack_a=False, pack_b=False),
         sched(mr=6, nr=64, kc=256, ncb=4, cores=1)]


@pytest.mark.parametrize("schedule", PATHS, ids=str)
@given(m=st.integers(1, 70), n=st.integers(1, 140), k=st.integers(1, 300))
@FEW
def test_kernel_paths_match_numpy(schedule, m, n, k):
    check(MatmulProblem(1, m, n, k), schedule)


@given(batch=st.integers(1, 4), m=st.integers(1, 40), n=st.integers(1, 70), k=st.integers(1, 150),
       a_batched=st.booleans(), trans_b=st.booleans(), bias=st.booleans(), split=st.sampled_from("mn"))
@FEW
def test_batches_broadcasts_transposed_b_and_bias(batch, m, n, k, a_batched, trans_b, bias, split):
    b_batched = not a_batched or batch == 1 or bool(m % 2)
    p = MatmulProblem(batch, m, n, k, a_batched=a_batched, b_batched=b_batched, trans_b=trans_b, bias=bias)
    check(p, sched(split=split))


@pytest.mark.parametrize("split", "mn")
@pytest.mark.parametrize("bias", [False, True])
def test_transposed_output(split, bias):
    """trans_c: c stored (n, m), the bias along m — what ``linear`` uses to compute c^T = w x^T."""
    for shape in [(29, 70, 150), (13, 33, 7), (40, 64, 129)]:
        check(MatmulProblem(1, *shape, trans_b=True, bias=bias, trans_c=True), sched(split=split, pack_a=False))


@pytest.mark.parametrize("shape", [(257, 129, 300), (1, 1, 1), (1, 500, 1), (500, 1, 3), (97, 101, 103)])
def test_fixed_shapes_with_the_model_choice(shape):
    p = MatmulProblem(1, *shape)
    check(p, choose(MATMUL_CPU, p, CPU, mode="model"))


def test_prime_2039_cubed():
    """About 2 s here (not marked slow)."""
    p = MatmulProblem(1, 2039, 2039, 2039)
    check(p, choose(MATMUL_CPU, p, CPU, mode="model"))


@pytest.mark.parametrize("tile", TILES[16], ids=lambda t: f"{t[0]}x{t[1] * 8}")
def test_avx2_tiles(tile):
    """The 8-lane register tiles chosen when the target lacks AVX-512 (same code, V = 8)."""
    mr, nv = tile
    for split in "mn":
        check(MatmulProblem(2, 37, 45, 70, bias=True), sched(mr=mr, nr=nv * 8, split=split), AVX2)


def test_space_is_small_pruned_and_hardware_centric():
    for shape in [(2048, 2048, 2048), (256, 256, 256), (128, 768, 3072), (3, 5, 7)]:
        p = MatmulProblem(1, *shape)
        space = MATMUL_CPU.space(p, CPU)
        assert 0 < len(space) <= 200
        V = lanes_of(CPU)
        regs = 32 if CPU.vector_bytes >= 64 else 16
        for s in space:
            assert s["nr"] % V == 0 and s["mr"] * s["nr"] // V + s["nr"] // V + 1 <= regs
            assert s["mr"] * s["kc"] * 4 <= 32 * 1024                       # the A micro-panel fits L1
            if s["split"] == "n":                                           # the B block, half of L2
                assert s["kc"] * s["ncb"] * s["nr"] * 4 <= (CPU.l2_bytes or 2 << 20) // CPU.num_cores // 2
    assert {s["nr"] // 8 * 8 for s in MATMUL_CPU.space(MatmulProblem(1, 64, 64, 64), AVX2)} <= {8, 16, 24}
    assert not MATMUL_CPU.space(MatmulProblem(1, 4, 4, 4, "float16", "float16"), CPU)


def test_cost_model_ranks_sensibly():
    big = MatmulProblem(1, 2048, 2048, 2048)
    costs = {str(s): MATMUL_CPU.cost(big, CPU, s) for s in MATMUL_CPU.space(big, CPU)}
    assert all(c > 0 and np.isfinite(c) for c in costs.values())
    best = choose(MATMUL_CPU, big, CPU, mode="model")
    assert best["pack_a"] and best["cores"] == CPU.num_cores          # 2048^3: pack A (rows 8 KiB apart)
    tiny = MatmulProblem(1, 4, 4, 4)
    assert choose(MATMUL_CPU, tiny, CPU, mode="model")["cores"] == 1   # no parallel region for 128 FLOPs
    # Padding: a 48-wide tile wastes a third of a 64-column problem; 32 and 64 waste nothing.
    p = MatmulProblem(1, 256, 64, 256)
    base = dict(kc=256, ncb=4, split="m", pack_a=False, pack_b=False, cores=CPU.num_cores)
    assert MATMUL_CPU.cost(p, CPU, Schedule.of(mr=8, nr=48, **base)) > MATMUL_CPU.cost(p, CPU, Schedule.of(mr=12, nr=32,
                                                                                                        **base))


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_micro_kernel_assembly():
    """The hot loop of the 12x32 kernel: 24 FMAs with broadcasts, 2 vector loads, no gathers."""
    cfg = CpuConfig(12, 32, 384, 8, "m", True, True, 24, 16, 2, True, True, False, False)
    src = build_kernel(cfg).build("cpu").source_path
    asm = subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-std=gnu11", "-S", src, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    loops = [body for body in re.split(r"\n\.L\d+:\n", asm) if body.count("vfmadd231ps") == 24]
    assert loops, "no loop with 24 FMAs (the 12 x 32 register tile)"
    hot = loops[0].split("\n\t j")[0]
    assert hot.count("vbroadcastss") == 12
    assert len(re.findall(r"vmovups\s+[-\d]*\(%\w+\), %zmm", hot)) == 2
    assert "gather" not in hot and "scatter" not in hot and "{%k" not in hot
