"""The CPU matmul template: its space and cost model, every code path of the kernel (splits,
packing choices, edges, batches, broadcast operands, transposed B and C, bias, AVX2 tiles)
against numpy in float64 on odd and prime shapes, the small-M paths (the dot-product kernel for
``trans_b``, narrow tiles over B in place), and the micro-kernels' assembly."""
import dataclasses
import itertools
import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap import ops
from taskmap.backends.base import host_cpu_target
from taskmap.backends.cpu.build import CFLAGS
from taskmap.compute import compute, tensor_input
from taskmap.errors import UnsupportedError
from taskmap.fusion import fuse
from taskmap.ir import expr as E
from taskmap.schedule.tune import choose
from taskmap.templates.base import Schedule
from taskmap.templates.matmul_cpu import (
    DOT_TILES,
    MATMUL_CPU,
    ROW_STEP,
    ROW_TILES,
    SMALL_TILES,
    TILES,
    edge_lanes,
    B_IN_PLACE,
    B_MISALIGNED,
    B_ROW,
    fold_refusal,
    folds,
    in_place_b_costs,
    lanes_of,
    rows_off_line,
)
from taskmap.templates.matmul_cpu_dot import DotConfig, build_dot_kernel
from taskmap.templates.matmul_cpu_kernel import CpuConfig, build_kernel
from taskmap.templates.matmul_problem import MatmulProblem
from taskmap.testing import assert_close

#: the C backend's own flags (the assembly checked is what the kernels run)
ASM_FLAGS = tuple(f for f in CFLAGS if f != "-shared")

CPU = host_cpu_target()
AVX2 = dataclasses.replace(CPU, vector_bytes=32, features=tuple(f for f in CPU.features if not f.startswith("avx512")))
#: The machine the cost model's facts below were measured on: a 2-core AMD Zen 4 (one 512-bit FMA
#: a cycle), fixed so that the rankings do not depend on the machine running the tests — B read in
#: place at the model's defaults (no probe), which those facts were fitted to.
ZEN4 = dataclasses.replace(CPU, vector_bytes=64, num_cores=2, l2_bytes=2 << 20, clock_hz=2.6e9, fma512_per_cycle=1.0,
                           llc_bandwidth=0.0, llc_bytes=32 << 20, b_in_place_step=0.0, b_off_line_step=0.0)
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
         sched(mr=6, nr=64, kc=256, ncb=4, cores=1), sched(mr=8, nr=48, ncb=32, split="n")]


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
    for shape, trans_b in itertools.product([(2048, 2048, 2048), (256, 256, 256), (128, 768, 3072), (3, 5, 7),
                                             (1, 1000, 2048), (1000, 4, 2048)], [False, True]):
        p = MatmulProblem(1, *shape, trans_b=trans_b)
        space = MATMUL_CPU.space(p, CPU)
        assert 0 < len(space) <= 200
        V = lanes_of(CPU)
        regs = 32 if CPU.vector_bytes >= 64 else 16
        for s in space:
            if s.get("dot", False):                                         # accumulators + loads
                assert s["mr"] * s["nr"] + s["mr"] + s["nr"] <= regs
                continue
            if s.get("rows", False):                                        # GEMV-like plain B only
                assert not trans_b and shape[0] <= 8 and s["mr"] in ROW_TILES and s["nr"] == ROW_STEP
                continue
            assert s["nr"] % V == 0 and s["mr"] * s["nr"] // V + s["nr"] // V + 1 <= regs
            assert s["mr"] * s["kc"] * 4 <= 32 * 1024                       # the A micro-panel fits L1
            if s["split"] == "n" and s["pack_b"]:                           # the packed B block, half of L2
                assert min(s["kc"], p.k) * s["ncb"] * s["nr"] * 4 <= (CPU.l2_bytes or 2 << 20) // CPU.num_cores // 2
    assert {s["nr"] // 8 * 8 for s in MATMUL_CPU.space(MatmulProblem(1, 64, 64, 64), AVX2)} <= {8, 16, 24}
    assert not MATMUL_CPU.space(MatmulProblem(1, 4, 4, 4, "float16", "float16"), CPU)


def test_cost_model_ranks_sensibly():
    big = MatmulProblem(1, 2048, 2048, 2048)
    costs = {str(s): MATMUL_CPU.cost(big, ZEN4, s) for s in MATMUL_CPU.space(big, ZEN4)}
    assert all(c > 0 and np.isfinite(c) for c in costs.values())
    best = choose(MATMUL_CPU, big, ZEN4, mode="model")
    assert best["pack_a"] and best["cores"] == ZEN4.num_cores         # 2048^3: pack A (rows 8 KiB apart)
    tiny = MatmulProblem(1, 4, 4, 4)
    assert choose(MATMUL_CPU, tiny, CPU, mode="model")["cores"] == 1   # no parallel region for 128 FLOPs
    # Padding: a 48-wide tile wastes a third of a 64-column problem; 32 and 64 waste nothing.
    p = MatmulProblem(1, 256, 64, 256)
    base = dict(kc=256, ncb=4, split="m", pack_a=False, pack_b=False, cores=ZEN4.num_cores)
    assert (MATMUL_CPU.cost(p, ZEN4, Schedule.of(mr=8, nr=48, **base))
            > MATMUL_CPU.cost(p, ZEN4, Schedule.of(mr=12, nr=32, **base)))


def test_small_k_products_get_wide_blocks_and_write_c_in_long_runs():
    """K = 64 (ResNet-50's 64 -> 256 pointwise layer at 56 x 56, batch 8): blocks of 16 and 32 panels
    fit half of L2, and with C going to memory the model prefers them (measured: 3.34 ms in
    blocks of 4 panels of 48 columns against 2.74 in blocks of 32, a standalone copy of the kernel);
    a C that stays in the last-level cache is not charged for its runs."""
    from taskmap.templates.matmul_cpu import C_RUN, NCBS

    zen = ZEN4                                     # 32 MB of LLC: C (25.7 MB) goes to memory
    p = MatmulProblem(8, 256, 3136, 64, a_batched=False, const_a=True)
    space = MATMUL_CPU.space(p, zen)
    assert {s["ncb"] for s in space if not s.get("dot") and not s.get("rows")} == set(NCBS)
    deep = MatmulProblem(8, 256, 3136, 1024, a_batched=False, const_a=True)
    assert max(s["ncb"] for s in MATMUL_CPU.space(deep, zen) if s["kc"] >= 512) <= NCBS[1]

    def cost(q, ncb):
        return MATMUL_CPU.cost(q, zen, Schedule.of(mr=8, nr=48, kc=256, ncb=ncb, split="n", pack_a=True,
                                                    pack_b=True, cores=2))
    def runs(ncb):          # C's rows written per block of ncb panels of 48 columns, 8 images
        return 8 * 256 * -(-(-(-3136 // 48)) // ncb)
    assert cost(p, 4) - cost(p, 32) == pytest.approx((runs(4) - runs(32)) * C_RUN / 2, rel=1e-6)
    assert choose(MATMUL_CPU, p, zen, mode="model")["ncb"] >= 16
    small = MatmulProblem(8, 128, 784, 64, a_batched=False, const_a=True)       # C: 3.2 MB, in the LLC
    assert cost(small, 4) == pytest.approx(cost(small, 8), rel=1e-9)


def test_cost_model_follows_recorded_facts():
    """Facts measured on one Zen 4 core (paired runs, ``benchmarks/model_vs_exhaustive.py matmul``
    shapes) that the model must rank the same way."""
    one = dataclasses.replace(ZEN4, num_cores=1, l2_bytes=1 << 20)

    def cost(p, **s):
        return MATMUL_CPU.cost(p, one, Schedule.of(**{**dict(kc=512, ncb=4, split="n", pack_a=True, pack_b=True,
                                                             cores=1), **s}))
    # A in place, rows a multiple of 4 KiB apart: all MR rows in one 8-way L1 set.  MR = 12 / 14
    # measured 1.4 / 1.6x the packed tile; MR = 6 / 8 about the same as packed.
    for p in (MatmulProblem(1, 1024, 1024, 1024), MatmulProblem(1, 128, 768, 3072)):
        assert cost(p, mr=12, nr=32, pack_a=False) > 1.25 * cost(p, mr=12, nr=32)
        assert cost(p, mr=6, nr=64, pack_a=False) < 1.1 * cost(p, mr=6, nr=64)
    # B in place costs more the fewer vectors a row has: 128x3072x768 measured 1.30 / 1.06 (12x32,
    # in place / packed) but 1.08 / 1.02 (6x64).
    p = MatmulProblem(1, 128, 768, 3072)
    assert (cost(p, mr=12, nr=32, pack_b=False) / cost(p, mr=12, nr=32)
            > cost(p, mr=6, nr=64, pack_b=False) / cost(p, mr=6, nr=64))


def test_b_in_place_is_charged_what_the_host_probe_measured():
    """Where the host probe measured a K step with B's rows in place (``Target.b_in_place_step``,
    ``b_off_line_step``), the model charges that instead of its defaults.  The Zen 4 of session 43
    measured no difference (1.0, 1.0), and so did its kernels; there ResNet-50's 1024 -> 256 1x1
    layers at 14x14 (B 1024 x 196: rows of 784 bytes, three in four off a line) read their input in
    place, 0.80 -> 0.61 ms in the flow.  A part whose rows off a line cost 1.75x gets about the
    defaults back."""
    assert in_place_b_costs(ZEN4) == (B_IN_PLACE, B_ROW, B_MISALIGNED)         # not measured
    measured = dataclasses.replace(ZEN4, b_in_place_step=1.0, b_off_line_step=1.0)
    assert in_place_b_costs(measured) == (0.0, 0.0, 0.0)
    vector, row, off = in_place_b_costs(dataclasses.replace(ZEN4, b_in_place_step=1.25, b_off_line_step=1.75))
    assert vector == B_IN_PLACE
    assert row == pytest.approx((0.25 - 2 * B_IN_PLACE) * 2) and off == pytest.approx(0.5 * 2 / (15 / 16))
    vector, row, _ = in_place_b_costs(dataclasses.replace(ZEN4, b_in_place_step=1.05, b_off_line_step=1.05))
    assert vector == pytest.approx(0.025) and row == 0.0          # a small measured cost: per vector only
    layer = MatmulProblem(1, 256, 196, 1024, a_batched=False, const_a=True, bias=True)
    assert choose(MATMUL_CPU, layer, ZEN4, mode="model")["pack_b"]
    assert not choose(MATMUL_CPU, layer, measured, mode="model")["pack_b"]
    # ResNeXt-50's 1024 -> 512 at 14x14, B of 784-byte rows: in place 0.96-0.98 ms, packed 1.19-1.23
    # side by side (session 44); the probe's step alone priced the vectors of B's rows in place
    wide = MatmulProblem(1, 512, 196, 1024, a_batched=False, const_a=True, bias=True)
    assert not choose(MATMUL_CPU, wide, measured, mode="model")["pack_b"]


def test_b_rows_off_a_cache_line_are_packed():
    """B's rows start off a cache line when its pitch is not a multiple of 64 bytes, and every
    vector of them then spans two lines.  Measured on a Cascade Lake (aligned bases, 6x64 tiles):
    192x768 by 289 columns (Inception-V3's 768 -> 192 1x1 convolutions at 17x17) in place 0.63-0.77
    ms, packed 0.48-0.53; by 288 columns in place 0.48, packed 0.49-0.70."""
    assert rows_off_line(289) == 15 / 16 and rows_off_line(288) == 0 and rows_off_line(196) == 0.75
    cascade = dataclasses.replace(ZEN4, clock_hz=2.5e9, fma512_per_cycle=1.75, llc_bytes=CPU.llc_bytes)
    off, on = (MatmulProblem(1, 192, n, 768, a_batched=False, const_a=True) for n in (289, 288))
    tile = dict(mr=6, nr=64, kc=384, ncb=4, split="m", pack_a=True, cores=2)
    assert (MATMUL_CPU.cost(off, cascade, Schedule.of(**tile, pack_b=False))
            > MATMUL_CPU.cost(off, cascade, Schedule.of(**tile, pack_b=True)))
    assert choose(MATMUL_CPU, off, cascade, mode="model")["pack_b"]

    def in_place_over_packed(p):
        return (MATMUL_CPU.cost(p, cascade, Schedule.of(**tile, pack_b=False))
                / MATMUL_CPU.cost(p, cascade, Schedule.of(**tile, pack_b=True)))
    assert in_place_over_packed(off) > 1.1 * in_place_over_packed(on)


def test_cores_split_the_side_whose_operand_is_large():
    """Every core reads the whole of the operand it does not split: a pointwise convolution over a
    56x56 image (weights 128x256, activations 256x3136) splits the columns, each core packing its
    activations as it uses them (measured on a Cascade Lake, side by side: 0.93-0.97 ms against
    1.41-1.80 ms for the row split with B in place); one over a 14x14 image with many channels
    (weights 1024x256, activations 256x196) splits the rows."""
    cascade = dataclasses.replace(ZEN4, clock_hz=2.5e9, fma512_per_cycle=1.75, llc_bytes=CPU.llc_bytes)
    wide = choose(MATMUL_CPU, MatmulProblem(1, 128, 3136, 256, const_a=True, bias=True), cascade, mode="model")
    assert wide["split"] == "n" and wide["pack_b"]
    tall = choose(MATMUL_CPU, MatmulProblem(1, 1024, 196, 256, const_a=True, bias=True), cascade, mode="model")
    assert tall["split"] == "m"


def test_b_rows_a_page_apart_are_read_in_place_for_short_k():
    """A pointwise convolution's activations (B rows H x W floats apart): read in place when K fits
    one block (measured 16x12544x32: 0.13 vs 0.17 ms packed, 24x3136x96: 0.12 vs 0.14), packed
    beyond; the model takes the in-place point, and it computes the right thing."""
    conv_like = MatmulProblem(1, 16, 12544, 32, a_batched=False, const_a=True)
    assert any(not s["pack_b"] for s in MATMUL_CPU.space(conv_like, CPU))
    assert not choose(MATMUL_CPU, conv_like, CPU, mode="model")["pack_b"]
    long_k = MatmulProblem(1, 64, 12544, 512, a_batched=False, const_a=True)
    assert all(s["pack_b"] for s in MATMUL_CPU.space(long_k, CPU) if not s.get("rows") and not s.get("dot"))
    check(MatmulProblem(2, 19, 1100, 37, bias=True), sched(mr=8, nr=48, kc=256, pack_b=False))
    check(MatmulProblem(1, 19, 1100, 300), sched(mr=6, nr=64, kc=256, split="n", pack_b=False))  # two K blocks


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_b_in_place_is_prefetched_rows_ahead():
    """B read in place: each step of K prefetches the lines of its row ``B_ROWS_AHEAD`` rows on
    (the tile's 3 vectors, wherever the row starts: 4 lines), beside the 24 FMAs; packed B, none
    of its own (its panels are prefetched only when packed beforehand)."""
    from taskmap.templates.matmul_cpu_kernel import B_ROWS_AHEAD

    def hot_loop(pack_b):
        cfg = CpuConfig(8, 48, 256, 4, "n", True, pack_b, 24, 16, 2, False, True, False, False, pre_a=True, pf=1024)
        src = build_kernel(cfg).build("cpu")
        asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", src.source_path, "-o", "-"],
                             capture_output=True, text=True, check=True).stdout
        loops = [body for body in re.split(r"\n\.L\d+:\n", asm) if body.count("vfmadd231ps") == 24]
        assert loops, "no loop with 24 FMAs (the 8 x 48 register tile)"
        return src.source, sorted(body.split("\n\t j")[0].count("prefetcht0") for body in loops)

    source, prefetches = hot_loop(False)      # (a B narrower than a panel is packed: that loop too)
    assert f"+ {B_ROWS_AHEAD})" in source or f"{B_ROWS_AHEAD} +" in source
    assert prefetches[-1] == 1 + 4                  # A's panel, B's row
    assert hot_loop(True)[1] == [1]
    check(MatmulProblem(1, 19, 1100, 300, a_batched=False, const_a=True),
          sched(mr=8, nr=48, kc=256, split="n", pack_b=False))


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
@pytest.mark.parametrize("m", [1, 3])
def test_thin_tiles_prefetch_the_packed_weights_into_l2(m):
    """A linear's weights packed beforehand under thin tiles (A read in place, GEMV-like): each
    step of K prefetches the panel's lines ``2 pf`` elements on into L2 (``prefetcht1``), one per
    line of its 128 columns beside the FMAs (whole and edge tiles); results unchanged."""
    p = MatmulProblem(1, m, 1000, 300, trans_b=True, bias=True, const_b=True)
    s = sched(mr=m, nr=128, kc=128, ncb=4, split="n", pack_a=False)
    cfg = MATMUL_CPU.config(p, CPU, s)
    assert (cfg.pack_a, cfg.pre_b, cfg.pf) == (False, True, 1024)
    src = MATMUL_CPU.instantiate(p, CPU, s).build("cpu")
    assert src.source.count("+ 2048)]), 0, 2);") == 2           # whole tiles and the edge's: into L2
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", src.source_path, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    loops = [body for body in re.split(r"\n\.L\d+:\n", asm) if body.count("vfmadd231ps") == 8 * m]
    assert loops, f"no loop with {8 * m} FMAs (the {m} x 128 register tile)"
    assert {body.split("\n\t j")[0].count("prefetcht1") for body in loops} == {8}
    check(p, s)


def test_thin_tiles_take_all_of_k_as_one_block():
    """Thin tiles over a constant B^T packed once (a classifier's weights at batch 1): all of K is
    one more block of the space (each core's panels one run of memory), the model's choice where A's
    row fits L1; it computes the right thing.  Other problems keep the K blocks of ``KCS``."""
    from taskmap.templates.matmul_cpu import KCS, L1_BYTES

    for m, k, n in [(1, 2048, 1000), (1, 1280, 1000), (2, 1000, 600)]:
        p = MatmulProblem(1, m, n, k, trans_b=True, bias=True, const_b=True)
        kcs = {s["kc"] for s in MATMUL_CPU.space(p, ZEN4) if not s.get("dot")}
        assert k in kcs and k not in KCS
        best = choose(MATMUL_CPU, p, ZEN4, mode="model")
        assert best["kc"] == k and not best["pack_a"], best
        check(p, best)
    wide = MatmulProblem(1, 1, 256, L1_BYTES, trans_b=True, const_b=True)     # A's row past L1: blocks
    assert max(s["kc"] for s in MATMUL_CPU.space(wide, ZEN4) if not s.get("dot")) == max(KCS)
    plain = MatmulProblem(1, 64, 256, 2048)
    assert {s["kc"] for s in MATMUL_CPU.space(plain, ZEN4) if "kc" in s.as_dict()} <= set(KCS)


def test_a_c_larger_than_l2_is_prefetched_for_writing():
    """C larger than a core's L2 (a 1x1 conv's 256 x 3136 output): the last K block prefetches its
    tile's lines of C for writing (``prefetchw``) before its loop; a C that fits, none.  Results
    unchanged."""
    from taskmap.templates.attention_cpu import l2_per_core

    target = dataclasses.replace(CPU, l2_bytes=CPU.num_cores << 20)      # 1 MB a core, whatever the host
    big = MatmulProblem(1, 256, 3136, 64, a_batched=False, const_a=True)
    small = MatmulProblem(1, 64, 256, 64, a_batched=False, const_a=True)
    assert 4 * 256 * 3136 > l2_per_core(target) > 4 * 64 * 256
    s = sched(mr=8, nr=48, kc=64, split="n")
    assert MATMUL_CPU.config(big, target, s).pf_c and not MATMUL_CPU.config(small, target, s).pf_c
    source = MATMUL_CPU.instantiate(big, target, s).build("cpu").source
    hints = [line.strip() for line in source.splitlines() if "__builtin_prefetch((&c[" in line]
    assert hints and all(h.endswith(", 1, 3);") for h in hints), hints
    assert "__builtin_prefetch((&c[" not in MATMUL_CPU.instantiate(small, target, s).build("cpu").source
    check(big, s, target)


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_micro_kernel_assembly():
    """The hot loop of the 12x32 kernel: 24 FMAs with broadcasts, 2 vector loads, no gathers."""
    cfg = CpuConfig(12, 32, 384, 8, "m", True, True, 24, 16, 2, True, True, False, False)
    src = build_kernel(cfg).build("cpu").source_path
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", src, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    loops = [body for body in re.split(r"\n\.L\d+:\n", asm) if body.count("vfmadd231ps") == 24]
    assert loops, "no loop with 24 FMAs (the 12 x 32 register tile)"
    hot = loops[0].split("\n\t j")[0]
    assert hot.count("vbroadcastss") == 12
    assert len(re.findall(r"vmovups\s+[-\d]*\(%\w+\), %zmm", hot)) == 2
    assert "gather" not in hot and "scatter" not in hot and "{%k" not in hot


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
@pytest.mark.parametrize("pack_b", [True, False])
def test_edge_tiles_fused_with_split_k(pack_b):
    """Edge tiles on both sides (100 = 8 x 12 + 4 rows, 49 columns: a single partial panel) with
    K in three blocks: the partial sums go to ``cw`` and come back, the last block's stores carry
    a bias + ReLU epilogue; sizes fixed as the graph compiler fixes them.  The edge path copies
    rows through a tile buffer: plain vector moves, no scatter stores or gather loads."""
    p = MatmulProblem(1, 100, 49, 200)
    schedule = sched(mr=12, nr=64, kc=70, ncb=2, pack_b=pack_b, cores=1)
    cs = p.c_shape
    c_in, eb = tensor_input("c", "float32", list(cs)), tensor_input("eb", "float32", [cs[1]])
    y = compute("y", list(cs), lambda b, i, j: E.maximum(c_in[b, i, j] + eb[i], 0.0))
    sizes = {"batch": p.batch, "m": p.m, "n": p.n, "k": p.k}
    fused = fuse(MATMUL_CPU.instantiate(p, CPU, schedule), {}, {"c": y}, sizes)
    a, b, _ = operands(p)
    wa, wb = MATMUL_CPU.workspace_sizes(p, schedule, CPU)
    arrays = {"a": a, "b": b, "bias": np.zeros(1, np.float32), "bidx": np.zeros(1, np.int64), "eb": RNG.standard_normal(cs[1]).astype(np.float32),
              "y": np.full(cs, np.nan, np.float32), "cw": np.full(cs, np.nan, np.float32),
              "wa": np.zeros(wa, np.float32), "wb": np.zeros(wb, np.float32)}
    fused(*(arrays[q.name] for q in fused.func.params))
    expect = np.maximum(reference(p, a, b, None) + arrays["eb"][None, :, None], 0.0)
    assert_close(arrays["y"], expect, rtol=1e-5, atol=1e-4)
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", fused.build("cpu").source_path, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    assert "vscatter" not in asm and "vgather" not in asm


@pytest.mark.parametrize("split, pack_a, pack_b", [("m", True, True), ("n", True, True), ("m", True, False),
                                                   ("n", False, False)])
def test_a_thin_last_column_panel_runs_the_narrow_tile(split, pack_a, pack_b):
    """A last column panel of at most one vector's columns (``edge_lanes``) runs a register tile of
    one vector, also when it is the only panel; wider remainders and whole panels keep the full
    tile.  Bias, partial sums over three K blocks, B in place shifted onto its last vector."""
    V = lanes_of(CPU)
    for n in (2 * 48 + 1, 2 * 48 + V, 2 * 48 + V + 1, 3 * 48, 2 * 48 + 2 * V + 3, V - 3, V + 4):
        p = MatmulProblem(2, 29, n, 150, bias=True)
        s = sched(mr=8, nr=48, kc=50, ncb=2, split=split, pack_a=pack_a, pack_b=pack_b)
        rem = n % 48
        assert MATMUL_CPU.config(p, CPU, s).ne == (V if 0 < rem <= V else 0)
        check(p, s)
    # 3136 = 65 x 48 + 16: a thin last panel, but the narrow tile would save ~1% of the work
    assert MATMUL_CPU.config(MatmulProblem(1, 64, 3136, 64), CPU, sched(mr=8, nr=48)).ne == 0


def test_cost_counts_the_narrow_tile_of_a_thin_last_panel():
    """196 columns in panels of 48 are four whole panels and a 16-lane tile: the model prices them
    near 192 columns, not 240 (ResNet-50's 14x14 pointwise convolutions)."""
    s = sched(mr=8, nr=48, kc=512, ncb=4, split="m", pack_a=True, pack_b=True, cores=2)
    cost = {n: MATMUL_CPU.cost(MatmulProblem(1, 256, n, 1024, a_batched=False, const_a=True), ZEN4, s)
            for n in (192, 196, 240)}
    assert cost[196] < cost[192] + 0.3 * (cost[240] - cost[192])
    assert cost[192] < cost[196] < cost[240]


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_narrow_tile_assembly():
    """The 8x48 kernel with a 16-lane narrow tile: a loop of 24 FMAs and one of 8, the narrow one
    with a broadcast of A per FMA (``vbroadcastss`` or an ``{1to16}`` operand) and no gathers."""
    cfg = CpuConfig(8, 48, 384, 8, "m", True, True, 24, 16, 2, True, True, False, False, ne=16)
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", build_kernel(cfg).build("cpu").source_path, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    bodies = re.split(r"\n\.L\d+:\n", asm)
    narrow = [b for b in bodies if b.count("vfmadd231ps") == 8 and b.count("vbroadcastss") + b.count("{1to16}") == 8]
    assert [b for b in bodies if b.count("vfmadd231ps") == 24], "no loop of the full 8 x 48 tile"
    assert narrow, "no loop of the 8 x 16 narrow tile"
    assert "gather" not in narrow[0]


# ----------------------------------------------------------------------------- small M (GEMV-like)


def dot(mr, nr, cores=CPU.num_cores):
    return Schedule.of(dot=True, mr=mr, nr=nr, pack_a=False, pack_b=False, cores=cores)


@given(batch=st.integers(1, 3), small=st.integers(1, 8), big=st.integers(1, 90), k=st.integers(1, 300),
       tile=st.sampled_from(DOT_TILES[32]), m_small=st.booleans(), bias=st.booleans(), trans_c=st.booleans(),
       a_batched=st.booleans(), cores=st.sampled_from([1, CPU.num_cores]))
@settings(max_examples=25, deadline=None)
def test_dot_kernel_matches_numpy(batch, small, big, k, tile, m_small, bias, trans_c, a_batched, cores):
    """``trans_b`` with a small side: rows of A by rows of B, dot products along K (masked tail,
    lane tree), either side small, C stored either way, batched and broadcast operands."""
    m, n = (small, big) if m_small else (big, small)
    mr, nr = tile if m_small else tile[::-1]
    b_batched = not a_batched or batch == 1 or bool(k % 2)
    p = MatmulProblem(batch, m, n, k, a_batched=a_batched, b_batched=b_batched, trans_b=True, bias=bias,
                      trans_c=trans_c)
    check(p, dot(mr, nr, cores))


@given(batch=st.integers(1, 3), m=st.integers(1, 8), n=st.integers(1, 300), k=st.integers(1, 300),
       tile=st.sampled_from(SMALL_TILES[32]), split=st.sampled_from("mn"), pack_a=st.booleans(), bias=st.booleans())
@settings(max_examples=25, deadline=None)
def test_small_tiles_read_b_in_place(batch, m, n, k, tile, split, pack_a, bias):
    """Narrow register tiles over B in place, several K blocks (partial sums in cw), the last,
    partial column panel shifted onto whole vectors (or packed when B is narrower than a panel)."""
    mr, nv = tile
    p = MatmulProblem(batch, m, n, k, bias=bias)
    check(p, sched(mr=mr, nr=nv * 16, kc=64, ncb=2, split=split, pack_a=pack_a, pack_b=False))


@given(batch=st.integers(1, 3), m=st.integers(1, 8), n=st.integers(16, 300), k=st.integers(1, 100),
       mr=st.sampled_from(ROW_TILES), a_batched=st.booleans(), bias=st.booleans(), cores=st.sampled_from([1, 2]))
@settings(max_examples=25, deadline=None)
def test_row_kernel_matches_numpy(batch, m, n, k, mr, a_batched, bias, cores):
    """B streamed by rows: groups of rows (the last one partial), column blocks split over
    cores, the last vector of a row shifted onto whole vectors, several row groups of A."""
    b_batched = not a_batched or batch == 1 or bool(k % 2)
    p = MatmulProblem(batch, m, n, k, a_batched=a_batched, b_batched=b_batched, bias=bias)
    check(p, Schedule.of(rows=True, mr=mr, nr=ROW_STEP, pack_a=False, pack_b=False, cores=cores))


def test_row_kernel_infinite_weights_in_the_last_partial_group():
    """The last, partial group of rows of B adds nothing for the missing rows: an inf in B's
    last row gives numpy's inf, not inf * 0 = NaN."""
    p = MatmulProblem(1, 2, 40, ROW_STEP + 3)
    a, b, _ = operands(p)
    a = np.abs(a) + 0.5                       # every product with the inf is +inf
    b[0, -1, 5] = np.inf
    c = np.full(p.c_shape, np.nan, np.float32)
    s = Schedule.of(rows=True, mr=2, nr=ROW_STEP, pack_a=False, pack_b=False, cores=1)
    MATMUL_CPU.instantiate(p, CPU, s)(*MATMUL_CPU.arguments(p, [a, b], [c], s, CPU))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isposinf(c[0, :, 5]).all() and np.isfinite(np.delete(c, 5, axis=2)).all()
    assert_close(np.delete(c, 5, axis=2), np.delete(ref, 5, axis=2), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("tile", DOT_TILES[16], ids=str)
def test_avx2_dot_tiles(tile):
    for m, n in [(tile[0], 45), (37, tile[0])]:
        mr, nr = tile if m <= n else tile[::-1]
        check(MatmulProblem(2, m, n, 70, trans_b=True, bias=True), dot(mr, nr), AVX2)


@pytest.mark.parametrize("p, s", [
    (MatmulProblem(1, 3, 100, 200, bias=True), sched(mr=2, nr=128, kc=64, split="n", pack_a=False, pack_b=False)),
    (MatmulProblem(2, 3, 1000, 77, bias=True), Schedule.of(rows=True, mr=2, nr=ROW_STEP, pack_a=False, pack_b=False,
                                                           cores=2)),
], ids=["shifted-panel", "rows"])
def test_small_m_kernels_write_c_once(p, s):
    """With a separate ``cw`` (as fused kernels get) ``c`` is written only by the last K block
    (or group of rows of B), each element once: a NaN-filled ``cw`` never leaks into ``c``."""
    a, b, bias = operands(p)
    c, cw = np.full(p.c_shape, np.nan, np.float32), np.full(p.c_shape, np.nan, np.float32)
    args = MATMUL_CPU.arguments(p, [a, b, bias], [c], s, CPU)
    args[4] = cw
    MATMUL_CPU.instantiate(p, CPU, s)(*args)
    assert_close(c, reference(p, a, b, bias), rtol=1e-5, atol=1e-3)


def test_cost_model_picks_the_small_m_paths():
    """GEMV-like problems: the dot kernel for ``trans_b`` (``linear``'s weight, in its swapped
    form ``c^T = w x^T`` too), B streamed by rows (or narrow tiles over B in place) otherwise —
    never a copy of the big operand; square problems keep the blocked kernel."""
    for p in [MatmulProblem(1, 1000, 1, 2048, trans_b=True, bias=True, trans_c=True),
              MatmulProblem(1, 1, 1000, 2048, trans_b=True), MatmulProblem(3, 4, 768, 768, trans_b=True)]:
        s = choose(MATMUL_CPU, p, CPU, mode="model")
        assert s.get("dot", False) and s["mr"] * s["nr"] <= 32, (p, s)
    for m in (1, 2, 4, 8):
        for n in (1000, 3072):
            s = choose(MATMUL_CPU, MatmulProblem(1, m, n, 2048), CPU, mode="model")
            assert not s["pack_b"] and s["mr"] <= max(m, 4), (m, n, s)
    assert choose(MATMUL_CPU, MatmulProblem(1, 1, 1000, 2048), CPU, mode="model").get("rows", False)
    for shape in [(1024, 1024, 1024), (128, 3072, 768)]:
        s = choose(MATMUL_CPU, MatmulProblem(1, *shape, trans_b=True), CPU, mode="model")
        assert not s.get("dot", False) and s["mr"] >= 6


@given(lead=st.sampled_from([(), (3,)]), m=st.integers(1, 8), n=st.integers(1, 200), k=st.integers(1, 300),
       bias=st.booleans())
@FEW
def test_small_m_ops_match_torch_semantics(lead, m, n, k, bias):
    """End to end through ``ops.linear`` / ``ops.matmul`` (which swap small-M ``linear``)."""
    x = RNG.standard_normal(lead + (m, k)).astype(np.float32)
    w = RNG.standard_normal((n, k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32) if bias else None
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0.0)
    assert_close(ops.linear(x, w, b), ref, rtol=1e-5, atol=2e-6 * k + 1e-5)
    wt = np.ascontiguousarray(w.T)
    assert_close(ops.matmul(x, wt), x.astype(np.float64) @ wt.astype(np.float64), rtol=1e-5, atol=2e-6 * k + 1e-5)


@pytest.mark.skipif("avx512f" not in CPU.features or shutil.which("gcc") is None, reason="needs gcc and AVX-512")
def test_dot_kernel_assembly():
    """The hot loop of the 1 x 8 dot tile: 8 FMAs on 16-lane vectors of K, 9 loads, no gathers."""
    src = build_dot_kernel(DotConfig(1, 8, 16, 1, True, True, True)).build("cpu").source_path
    asm = subprocess.run(["gcc", *ASM_FLAGS, "-S", src, "-o", "-"],
                         capture_output=True, text=True, check=True).stdout
    loops = [body for body in re.split(r"\n\.L\d+:\n", asm) if body.count("vfmadd231ps") == 8 and "%zmm" in body]
    assert loops, "no loop with 8 FMAs (the 1 x 8 dot tile)"
    hot = loops[0].split("\n\tj")[0]
    assert "gather" not in hot and "(%rsp)" not in hot and hot.count("vmovups") + hot.count("vfmadd231ps\t(") >= 8


@pytest.mark.parametrize("p, schedule", [
    (MatmulProblem(1, 37, 3, 101, trans_b=True, bias=True), dot(8, 1)),
    (MatmulProblem(1, 37, 3, 101, trans_b=True, bias=True, trans_c=True), dot(8, 1)),
    (MatmulProblem(1, 3, 37, 101, bias=True), Schedule.of(rows=True, mr=2, nr=8, pack_a=False, pack_b=False, cores=2)),
], ids=["dot", "dot-trans-c", "rows"])
def test_small_m_kernels_fuse_an_epilogue(p, schedule):
    """The small-M kernels store each element of ``c`` once: a residual + ReLU epilogue spliced
    into their stores (what the graph compiler does for ``linear`` at batch 1..8)."""
    cs = p.c_shape
    c_in, res = tensor_input("c", "float32", list(cs)), tensor_input("res", "float32", list(cs))
    y = compute("y", list(cs), lambda b, i, j: E.maximum(c_in[b, i, j] + res[b, i, j], 0.0))
    fused = fuse(MATMUL_CPU.instantiate(p, CPU, schedule), {}, {"c": y})
    a, b, bias = operands(p)
    arrays = {"a": a, "b": b, "bias": bias, "res": RNG.standard_normal(cs).astype(np.float32),
              "y": np.full(cs, np.nan, np.float32), "cw": np.full(cs, np.nan, np.float32),
              "wa": np.zeros(1, np.float32), "wb": np.zeros(1, np.float32), "bidx": np.zeros(1, np.int64)}
    fused(*(arrays[q.name] for q in fused.func.params))
    expect = np.maximum(reference(p, a, b, bias) + arrays["res"], 0.0)
    assert_close(arrays["y"], expect, rtol=1e-5, atol=1e-4)


# ----------------------------------------------------------------------------- constant operands


@FEW
@given(m=st.integers(1, 70), n=st.integers(1, 90), k=st.integers(1, 300), batch=st.integers(1, 3),
       const=st.sampled_from(["a", "b", "ab"]), split=st.sampled_from(["m", "n"]), trans_b=st.booleans(),
       bias=st.booleans(), trans_c=st.booleans(), a_batched=st.booleans(), b_batched=st.booleans())
def test_constant_operands_packed_beforehand(m, n, k, batch, const, split, trans_b, bias, trans_c, a_batched,
                                             b_batched):
    """``const_a`` / ``const_b``: the kernel reads panels packed by ``pack_constants`` (rows past
    m repeated, columns past n zero) and packs nothing itself; every split, edge and flag."""
    p = MatmulProblem(batch, m, n, k, trans_b=trans_b, bias=bias, trans_c=trans_c, a_batched=a_batched,
                      b_batched=b_batched or not a_batched, const_a="a" in const, const_b="b" in const)
    s = sched(mr=6, nr=32, kc=96, ncb=2, split=split)
    cfg = MATMUL_CPU.config(p, CPU, s)
    assert (cfg.pre_a, cfg.pre_b) == (p.const_a, p.const_b)
    check(p, s)


def test_constant_operands_come_from_the_packed_panels():
    """The kernel computes with the packed panels it is given, not with ``a`` / ``b``: panels of
    other matrices give their product (so nothing is packed again per call)."""
    p = MatmulProblem(2, 37, 45, 130, trans_b=True, const_a=True, const_b=True)
    a, b, _ = operands(p, 1)
    a2, b2, _ = operands(p, 2)
    for split in ("m", "n"):
        s = sched(mr=6, nr=32, kc=64, split=split)
        wa, wb = MATMUL_CPU.pack_constants(p, s, a2, b2)
        args = MATMUL_CPU.arguments(p, [a, b], [np.full(p.c_shape, np.nan, np.float32)], s, CPU)
        args[-3], args[-2] = wa, wb          # (then bidx)
        MATMUL_CPU.instantiate(p, CPU, s)(*args)
        assert_close(args[3], reference(p, a2, b2, None), rtol=1e-5, atol=1e-4)


def test_constant_operands_space_and_cost():
    """Constant operands are always packed (in the layout the micro-kernel streams), and their
    packing is free: a const-weight problem's model cost is below the per-call one."""
    p = MatmulProblem(1, 3072, 128, 768, trans_b=True, trans_c=True)
    pc = dataclasses.replace(p, const_a=True)
    blocked = [s for s in MATMUL_CPU.space(pc, CPU) if "kc" in s.as_dict()]
    assert blocked and all(s["pack_a"] for s in blocked)
    best = min(MATMUL_CPU.cost(p, CPU, s) for s in MATMUL_CPU.space(p, CPU))
    assert min(MATMUL_CPU.cost(pc, CPU, s) for s in MATMUL_CPU.space(pc, CPU)) < best
    pb = MatmulProblem(1, 128, 600, 768, const_b=True)
    assert all(s["pack_b"] for s in MATMUL_CPU.space(pb, CPU) if "kc" in s.as_dict())


@FEW
@given(m=st.integers(1, 4), n=st.integers(1, 300), k=st.integers(1, 700), bias=st.booleans(), data=st.data())
def test_gemv_with_constant_transposed_weights(m, n, k, bias, data):
    """A linear layer's GEMV (a few rows of x times constant weights stored (n, k)): the weights
    packed once into column panels, one stream per panel, a thin register tile (MR 1..4) — every
    such point of the space computes the product."""
    p = MatmulProblem(1, m, n, k, trans_b=True, bias=bias, const_b=True, b_batched=False)
    thin = [s for s in MATMUL_CPU.space(p, CPU) if "kc" in s.as_dict() and s["mr"] <= 4]
    assert thin and all(s["pack_b"] for s in thin)
    check(p, data.draw(st.sampled_from(thin)))


def test_gemv_model_prefers_packed_weight_panels():
    """The 1280 -> 1000 classifier at batch 1: the packed panels (one stream) rank above the dot
    kernel (eight rows streamed side by side; measured 37 vs 45 us on two cores)."""
    p = MatmulProblem(1, 1, 1000, 1280, trans_b=True, bias=True, const_b=True, b_batched=False)
    best = min(MATMUL_CPU.space(p, CPU), key=lambda s: MATMUL_CPU.cost(p, CPU, s))
    assert not best.as_dict().get("dot") and best["mr"] == 1 and best["pack_b"]


@pytest.mark.parametrize("n, k", [(20, 480), (48, 1152), (96, 2304)])
def test_gemv_narrower_than_a_wide_panel_gets_a_panel_of_its_width(n, k):
    """Squeeze-and-excitation's linears (20-96 outputs): one-row tiles of 1-4 vectors, so that
    the panels are not mostly padding (a 128-column panel: measured 7.2 vs 3.7 us for 1152 -> 48)
    — the model's pick pads less than a vector (or is the dot kernel); the tiles match numpy."""
    p = MatmulProblem(1, 1, n, k, trans_b=True, bias=True, const_b=True, b_batched=False)
    V = lanes_of(CPU)
    s = choose(MATMUL_CPU, p, CPU, mode="model")
    assert s.get("dot", False) or (s["mr"] == 1 and -(-n // s["nr"]) * s["nr"] < n + V), s
    narrow = [t for t in MATMUL_CPU.space(p, CPU) if "kc" in t.as_dict() and t["mr"] == 1 and t["nr"] < 8 * V]
    assert {t["nr"] for t in narrow} == {w * V for w in range(1, 5) if (w - 1) * V < n}
    for t in {t["nr"]: t for t in narrow}.values():
        check(p, t)


# ----------------------------------------------------------------------------- the batch folded into the columns


def folded(**kw):
    return Schedule.of(**dict(sched(**kw).params), fold=True)


@FEW
@given(batch=st.integers(2, 9), m=st.integers(1, 40), n=st.integers(1, 70), k=st.integers(1, 300),
       split=st.sampled_from(["m", "n"]), tile=st.sampled_from([(6, 64), (8, 48), (12, 32)]),
       kc=st.sampled_from([48, 256]), const_a=st.booleans(), cores=st.sampled_from([1, CPU.num_cores]))
def test_folded_batch_matches_numpy(batch, m, n, k, split, tile, kc, const_a, cores):
    """``fold``: a shared A times the batch's B side by side as one problem of ``batch x n``
    columns — panels that gather from two or more images (``n`` below, at and above a panel's
    width), K in blocks (partial sums stored per image and read back), the narrow last tile,
    prepacked A, either split, one core or all."""
    p = MatmulProblem(batch, m, n, k, a_batched=False, const_a=const_a)
    s = folded(mr=tile[0], nr=tile[1], kc=kc, split=split, cores=cores)
    cfg = MATMUL_CPU.config(p, CPU, s)
    assert cfg.fold and cfg.ne == edge_lanes(batch * n, tile[1], lanes_of(CPU))     # of the folded columns
    check(p, s, seed=batch * 1000 + n)


def test_folded_batch_fuses_a_residual_epilogue():
    """A folded kernel's stores, per image's run of a tile's columns, carry a residual + ReLU
    epilogue (ResNet-50's 7x7 expansion convolutions at batch 8), K in three blocks."""
    p = MatmulProblem(5, 70, 49, 200, a_batched=False)
    schedule = folded(mr=8, nr=48, kc=70, ncb=2, split="n", cores=2)
    cs = p.c_shape
    c_in, res = tensor_input("c", "float32", list(cs)), tensor_input("res", "float32", list(cs))
    y = compute("y", list(cs), lambda b, i, j: E.maximum(c_in[b, i, j] + res[b, i, j], 0.0))
    sizes = {"batch": p.batch, "m": p.m, "n": p.n, "k": p.k}
    fused = fuse(MATMUL_CPU.instantiate(p, CPU, schedule), {}, {"c": y}, sizes)
    a, b, _ = operands(p)
    wa, wb = MATMUL_CPU.workspace_sizes(p, schedule, CPU)
    arrays = {"a": a, "b": b, "bias": np.zeros(1, np.float32), "bidx": np.zeros(1, np.int64), "res": RNG.standard_normal(cs).astype(np.float32),
              "y": np.full(cs, np.nan, np.float32), "cw": np.full(cs, np.nan, np.float32),
              "wa": np.zeros(wa, np.float32), "wb": np.zeros(wb, np.float32)}
    fused(*(arrays[q.name] for q in fused.func.params))
    assert_close(arrays["y"], np.maximum(reference(p, a, b, None) + arrays["res"], 0.0), rtol=1e-5, atol=1e-4)


def test_folded_batch_gathers_through_a_prologue():
    """A prologue on B (a stride-2 1x1 convolution's gather: B[b, k, j] = X[b, k, 2 (j // 7), 2 (j % 7)])
    is spliced into the folded panels' gathers: each image's run read through it."""
    p = MatmulProblem(6, 40, 49, 90, a_batched=False)
    schedule = folded(mr=8, nr=48, kc=50, ncb=2, split="m", cores=2)
    x_in = tensor_input("x", "float32", [6, 90, 14, 14])
    bdef = compute("b", [6, 90, 49], lambda b, k, j: x_in[b, k, 2 * (j // 7), 2 * (j % 7)])
    sizes = {"batch": p.batch, "m": p.m, "n": p.n, "k": p.k}
    fused = fuse(MATMUL_CPU.instantiate(p, CPU, schedule), {"b": bdef}, {}, sizes)
    a = RNG.standard_normal(p.a_shape).astype(np.float32)
    x = RNG.standard_normal((6, 90, 14, 14)).astype(np.float32)
    wa, wb = MATMUL_CPU.workspace_sizes(p, schedule, CPU)
    arrays = {"a": a, "x": x, "bias": np.zeros(1, np.float32), "bidx": np.zeros(1, np.int64), "c": np.full(p.c_shape, np.nan, np.float32),
              "cw": np.full(p.c_shape, np.nan, np.float32), "wa": np.zeros(wa, np.float32),
              "wb": np.zeros(wb, np.float32)}
    fused(*(arrays[q.name] for q in fused.func.params))
    b = x[:, :, ::2, ::2].reshape(6, 90, 49)
    assert_close(arrays["c"], reference(p, a, b, None), rtol=1e-5, atol=1e-4)


def test_fold_is_offered_where_it_saves_padding_and_chosen_there():
    """Folding is in the space for a shared A and a batched, packable B whose images' columns
    leave a panel mostly padding (7x7: 49 columns of 64), not for 14x14 (196: 208 computed) nor
    one image, A batched, B transposed or a bias along the columns; the model takes it for
    ResNet-50's 7x7 1x1 layers at batch 8, where it measured 1.14-1.27x (Xeon, two cores)."""
    def has_fold(p):
        return any(s.get("fold") for s in MATMUL_CPU.space(p, CPU) if "fold" in dict(s.params))

    seven = MatmulProblem(8, 512, 49, 2048, a_batched=False, const_a=True)
    assert has_fold(seven)
    for p in (MatmulProblem(8, 1024, 196, 256, a_batched=False, const_a=True), dataclasses.replace(seven, batch=1),
              dataclasses.replace(seven, a_batched=True), dataclasses.replace(seven, trans_b=True),
              dataclasses.replace(seven, bias=True)):
        assert not has_fold(p), p
    for m, k in ((512, 2048), (2048, 512)):
        p = MatmulProblem(8, m, 49, k, a_batched=False, const_a=True)
        assert choose(MATMUL_CPU, p, ZEN4).get("fold")


def test_a_fold_that_cannot_be_built_is_refused_by_name():
    """A hand-written ``fold=True`` for a problem the folded kernel cannot run raises
    UnsupportedError naming every reason (never an assert or a wrong answer); without the
    padding it saves, folding stays possible by hand (a 14x14 batch runs and matches)."""
    seven = MatmulProblem(8, 64, 49, 96, a_batched=False)
    for p, reasons in ((dataclasses.replace(seven, batch=1), ["the batch is 1"]),
                       (dataclasses.replace(seven, a_batched=True), ["A is batched"]),
                       (dataclasses.replace(seven, trans_b=True, bias=True), ["B is transposed", "a bias"]),
                       (dataclasses.replace(seven, b_batched=False, const_b=True), ["B is shared", "constant"])):
        with pytest.raises(UnsupportedError, match="fold=True") as info:
            MATMUL_CPU.instantiate(p, CPU, folded())
        assert all(r in str(info.value) for r in reasons), info.value
    fourteen = MatmulProblem(3, 24, 196, 40, a_batched=False)
    assert fold_refusal(fourteen) is None and not folds(fourteen, 32, lanes_of(CPU))
    check(fourteen, folded(), seed=14)


def _residual_epilogue(p: MatmulProblem, target, s):
    """The matmul of ``p`` with ``y = relu(c + eb[row] + res)`` fused into its stores."""
    cs = p.c_shape
    c_in, res, eb = (tensor_input("c", "float32", list(cs)), tensor_input("res", "float32", list(cs)),
                     tensor_input("eb", "float32", [cs[1]]))
    y = compute("y", list(cs), lambda b, i, j: E.maximum(c_in[b, i, j] + eb[i] + res[b, i, j], 0.0))
    return fuse(MATMUL_CPU.instantiate(p, target, s), {}, {"c": y}, {"batch": p.batch, "m": p.m, "n": p.n, "k": p.k})


def _check_residual(fused, p: MatmulProblem, target, s) -> None:
    """``fused`` (:func:`_residual_epilogue`) on random operands against numpy."""
    cs = p.c_shape
    a, b, _ = operands(p)
    wa, wb = MATMUL_CPU.workspace_sizes(p, s, target)
    arrays = {"a": a, "b": b, "bias": np.zeros(1, np.float32), "bidx": np.zeros(1, np.int64), "eb": RNG.standard_normal(cs[1]).astype(np.float32),
              "res": RNG.standard_normal(cs).astype(np.float32), "y": np.full(cs, np.nan, np.float32),
              "cw": np.full(cs, np.nan, np.float32), "wa": np.zeros(wa, np.float32), "wb": np.zeros(wb, np.float32)}
    fused(*(arrays[q.name] for q in fused.func.params))
    expect = np.maximum(reference(p, a, b, None) + arrays["eb"][None, :, None] + arrays["res"], 0.0)
    assert_close(arrays["y"], expect, rtol=1e-5, atol=1e-4)


def test_tiles_of_a_large_c_are_prefetched_with_the_residual():
    """Where C does not fit a core's L2 (``pf_c``) the last K block prefetches its tile of C, and
    fused into a residual epilogue those hints cover the output and the residual at the same
    elements (not the per-row bias); a C that fits stays without.  Results unchanged."""
    small_l2 = dataclasses.replace(CPU, l2_bytes=CPU.num_cores * (256 << 10))
    s = sched(mr=6, nr=64, kc=64, ncb=2, split="n", cores=2)
    assert not MATMUL_CPU.config(MatmulProblem(1, 32, 1000, 64), small_l2, s).pf_c        # 128 KB
    p = MatmulProblem(2, 40, 1000, 70, a_batched=False)                                   # 320 KB
    assert MATMUL_CPU.config(p, small_l2, s).pf_c
    fused = _residual_epilogue(p, small_l2, s)
    source = fused.build("cpu").source
    assert "__builtin_prefetch((&y[" in source and "__builtin_prefetch((&res[" in source
    assert "__builtin_prefetch((&eb[" not in source
    _check_residual(fused, p, small_l2, s)


def test_a_streamed_c_prefetches_only_what_its_epilogue_reads():
    """C streamed past the caches (larger than half the last-level cache): the last K block's hints
    fetch no line of C (its stores do not read them) — nothing unfused — and, fused into a residual
    epilogue, the residual's lines at the tile's elements (not the output's, nor the bias).
    Results unchanged."""
    target = dataclasses.replace(CPU, l2_bytes=CPU.num_cores * (256 << 10), llc_bytes=512 << 10)
    s = sched(mr=6, nr=64, kc=64, ncb=2, split="n", cores=2)
    p = MatmulProblem(2, 40, 1000, 70, a_batched=False)                                   # 320 KB
    cfg = MATMUL_CPU.config(p, target, s)
    assert cfg.stream and cfg.pf_c
    assert "__builtin_prefetch((&c[" not in MATMUL_CPU.instantiate(p, target, s).build("cpu").source
    fused = _residual_epilogue(p, target, s)
    hints = [line.strip() for line in fused.build("cpu").source.splitlines() if "__builtin_prefetch" in line]
    assert any("&res[" in h and h.endswith(", 0, 3);") for h in hints), hints
    assert not any("&y[" in h or "&eb[" in h for h in hints), hints
    _check_residual(fused, p, target, s)


@given(batch=st.integers(1, 6), m=st.integers(1, 20), n=st.integers(1, 80), k=st.integers(1, 300),
       groups=st.integers(1, 4), data=st.data())
@settings(max_examples=12, deadline=None)
def test_b_indexed_by_batch(batch, m, n, k, groups, data):
    """``b_groups``: batch ``j`` multiplies by matrix ``bidx[j]`` of a constant stack packed
    beforehand (negative indices from the end, as an embedding reads them), on points of the space
    (the blocked kernel on column panels only: its panels outer, the batches inner)."""
    p = MatmulProblem(batch, m, n, k, const_b=True, b_groups=groups)
    space = MATMUL_CPU.space(p, CPU)
    assert space and all(s["pack_b"] and s["split"] == "n" for s in space)
    s = data.draw(st.sampled_from(space))
    a = RNG.standard_normal((batch, m, k)).astype(np.float32)
    b = RNG.standard_normal((groups, k, n)).astype(np.float32)
    idx = RNG.integers(-groups, groups, batch).astype(np.int64)
    c = np.full((batch, m, n), np.nan, np.float32)
    MATMUL_CPU.instantiate(p, CPU, s)(*MATMUL_CPU.arguments(p, [a, b, idx], [c], s, CPU))
    assert_close(c, np.einsum("bmk,bkn->bmn", a.astype(np.float64), b[idx].astype(np.float64)), rtol=1e-5, atol=1e-4)
