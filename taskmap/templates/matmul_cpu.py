"""CPU f32 matmul template (BLIS-style; the kernel is in :mod:`.matmul_cpu_kernel`).

Tuning space, in hardware terms (the problem only prunes it):

* ``mr, nr`` — the register tile ``MR x NR`` of C: ``NR`` a multiple of the vector width, and
  ``MR * NR / V`` accumulators plus ``NR / V`` B vectors plus one broadcast within the vector
  register file (32 with AVX-512: 6x64, 8x48, 12x32, 14x32; 16 with AVX2: 6x16, 4x24, 8x8);
* ``kc`` — the K block (256 to 768, at most three per problem; the A micro-panel ``MR x KC``
  must fit L1); ``ncb`` — B panels per block (with ``split="n"`` the ``KC x NCB*NR`` block of B
  stays in L2 and must fit half of it; with ``split="m"`` the A block does, by construction; the
  wide blocks of 16 and 32 panels only where theirs fits: a row tile then writes each row of C in
  one long run, :data:`C_RUN`);
* ``split`` — cores take row panels ("m") or column panels ("n"); ``pack_a`` / ``pack_b`` — pack
  the operand or read it in place (B when its rows are less than a page apart or K fits one
  block, :data:`FAR_IN_PLACE_K`; its last, partial panel is then shifted left onto whole vectors); ``cores`` — all of them, or one for tiny problems.

Not a point of the space: C larger than half the last-level cache is stored past the caches
(:func:`streams_c`; whole tiles, streaming stores): its consumers would find little of it there,
and plain stores would read each line of C from memory first.  ResNet-50 at batch 8 (two Zen 5
cores, A/B in one process): 2.2% faster.

Small-M problems (GEMV-like, a side of at most :data:`SMALL_SIDE`) add more kinds of points:

* ``trans_b``: ``dot=True`` — the dot-product kernel (:mod:`.matmul_cpu_dot`), ``mr`` rows of A
  by ``nr`` rows of B per tile (:data:`DOT_TILES`: the small side by a few rows of the big one),
  vectorized along K, nothing packed;
* ``trans_b`` with a constant B (a linear layer's weights in a compiled graph), M up to
  :data:`THIN_SIDE`: thin register tiles (:data:`SMALL_TILES`) over B packed once into column
  panels — one contiguous stream per panel where the dot kernel streams ``nr`` rows side by side
  (1.2-1.3x faster at M = 1), and all of K one more block (:data:`WHOLE_K`);
* plain B: register tiles with ``MR`` in 1..4 and a wide ``NR`` (:data:`SMALL_TILES`), B read in
  place whatever its row pitch (copying B costs as much as the whole product).

The cost model (:meth:`MatmulCpuTemplate.cost`) is analytic: FMA cycles of the micro-kernel (padded
tiles, a thin last column panel on its narrow tile, its loads per FMA, the per-tile C traffic,
operands read in place: rows of A sharing an L1 set, rows of B off a cache line), load balance over
cores in whole panels, packing traffic (an operand packed before the loops is written and read
again, one packed as used only read), the operand every core reads whole (B with ``split="m"``, A
with ``"n"``: the other cores' shares come from their caches, :data:`SHARED_BANDWIDTH`), and a
fixed cost per parallel region; the operands' memory traffic (at :data:`STREAM_BANDWIDTH` per core)
bounds it from below, which is what ranks small-M points.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..backends.base import Target, TargetKind, host_cpu_target
from ..backends.host_probe import IN_PLACE_PROBE_PITCH, IN_PLACE_PROBE_VECTORS
from ..errors import UnsupportedError
from ..runtime.kernel import Kernel
from .base import KernelFamily, Schedule
from .matmul_cpu_dot import DotConfig, build_dot_kernel
from .matmul_cpu_kernel import CpuConfig, build_kernel, pack_a_panels, pack_b_panels
from .matmul_cpu_rows import ROW_BLOCK, build_rows_kernel
from .matmul_problem import WORKSPACE, MatmulProblem, operand_views, view
from .panels import PREFETCH_BYTES

#: Register tiles (MR, NR in vectors) by vector register count.
TILES = {32: ((6, 4), (8, 3), (12, 2), (14, 2)), 16: ((6, 2), (4, 3), (8, 1))}
#: Rows of A (MR) of the row-streaming kernel, and the rows of B it streams per step (KU).
ROW_TILES, ROW_STEP = (1, 2, 4, 8), 8
#: Small-M register tiles (MR, NR in vectors): B in place, one wide row of C per K step.
SMALL_TILES = {32: ((1, 8), (2, 8), (4, 6)), 16: ((1, 4), (2, 4), (4, 2))}
#: ... and one-row tiles for C narrower than the widest of them (a squeeze-and-excitation block's
#: linears, 20-96 columns): a packed panel padded to 128 columns read 3 lines of every 8 (Zen 4,
#: the tuner: 1 x 1152 x 48 at 7.2 us on 128-column panels, 3.7 on 48-column ones).
NARROW_TILES = {32: ((1, 1), (1, 2), (1, 3), (1, 4)), 16: ((1, 1), (1, 2))}
#: Dot-product tiles (rows of the small side, rows of the big side): ``s * b`` accumulators and
#: ``s + b`` loads within the vector register file.
DOT_TILES = {32: ((1, 4), (1, 8), (2, 4), (2, 8), (4, 4), (8, 2)), 16: ((1, 4), (2, 4), (4, 2))}
#: Problems whose smaller side (m, or n for ``trans_b``) is at most this get the small-M points.
SMALL_SIDE = 8
#: Thin tiles over a constant B packed once (M up to :data:`THIN_SIDE`) also take all of K as one
#: block: a core's panels are then one run of memory, not a run per K block and panel (the stream
#: restarting, unprefetched, every ``kc`` rows).  Measured on Zen 4 (two cores, the weights evicted
#: before each call, alternating, medians of 60 rounds): 1 x 2048 -> 1000 610 -> 466 us, 1 x 1280 ->
#: 1000 493 -> 421 us (kc 768 before).
WHOLE_K = True
#: ... and a constant ``trans_b`` B gets the thin packed tiles up to this M (at M = 8 one 8-row tile
#: beats them: 1280x1000, two cores, 118 us vs 135 for 2 x 128 tiles).
THIN_SIDE = 4
KCS = (256, 384, 512, 768)
#: The A micro-panel (MR x KC floats) stays in L1 (32 KiB on current x86 cores).
L1_BYTES = 32 * 1024
#: B panels per block.  The wider blocks (16, 32) only where the block, ``min(KC, K) x NCB*NR``, fits
#: half of L2: small-K products (pointwise convolutions), whose C is written in longer runs.
NCBS = (4, 8, 16, 32)
#: Seconds a core spends per run of a row of C it writes (a row tile's row across one block of
#: NCB panels) when C goes to memory (:func:`streams_c`): each run starts a new stream for the
#: prefetchers.  Measured with a standalone copy of the kernel (64 -> 256 channels at 56 x 56,
#: batch 8, a residual read in the epilogue, two cores): 3.34 / 3.00 / 2.85 / 2.74 ms with blocks of
#: 4 / 8 / 16 / 32 panels of 48 columns: ~20 ns a run for C, as much again for the residual's.
#: Charged only there: for a C that stays in the LLC the term changed BERT's batch-8 picks to
#: schedules 1.4% slower.
C_RUN = 20e-9
#: B is read in place when its rows are less than a page apart, or when K is at most
#: ``FAR_IN_PLACE_K`` (pointwise convolutions' activations, rows ``H x W`` floats apart: one K
#: block, so a panel spans at most that many pages, which the L2 TLB holds; measured on Zen 4 vs
#: packing B: 16x12544x32 0.13 vs 0.17 ms, 24x3136x96 0.12 vs 0.14, 64x3136x256 0.55 vs 0.58,
#: 64x12544x64 0.68 vs 0.64, 128x16384x128 3.54 vs 3.54).  Else every K step misses the TLB.
PAGE, FAR_IN_PLACE_K = 4096, 256
#: Seconds to start and join a parallel region, and to call a kernel from Python.
FORK_COST = 4e-6
CALL_COST = 3e-6
#: Fraction of the FMA rate the micro-kernel sustains in L1 (measured: ~0.95 on Zen 4), and the
#: bytes per second one core packs (reads + writes, from DRAM / L3).
MICRO_EFFICIENCY = 0.95
COPY_BANDWIDTH = 8e9
#: Slow-downs of the micro-kernel step (fitted to the exhaustive records of the benchmark shapes,
#: ``benchmarks/model_vs_exhaustive.py matmul --threads 1``): per vector of a B row read in place
#: (more streams for the prefetchers), and when the A micro-panel takes over half of L1.
B_IN_PLACE, L1_SHARED = 0.04, 0.05
#: B read in place, per row of ``NR / V`` vectors: one more line (its rows are apart, not one
#: stream), times ``V / NR``.  ``B_ROW`` for every row (fitted on Zen 4 with bases 16 bytes off a
#: line; on Intel Cascade Lake, with aligned bases and rows, NR = 32 in place still costs 1.1-1.3x
#: NR = 48 / 64: 192x768x288, 96x56x56 1x1 convolutions).  ``B_MISALIGNED`` more for each row
#: that starts off a cache line: every vector of it then spans two lines (packed panels are
#: aligned).  Bases are taken as 64-byte aligned (a compiled graph's buffers, PyTorch's CPU
#: tensors and the tuner's example arrays are), so that is the rows whose pitch is not a multiple
#: of 64 bytes (:func:`rows_off_line`).  Measured with the same schedule, B's rows all off a line
#: against all on one: Zen 4 ~0.55 (128x3072x768 at NR = 32 / 48 / 64: 1.37 / 1.21 / 1.17);
#: Cascade Lake 0.5-1.5 (192x768 by 289 vs 288 columns: 1.73 / 1.46 / 1.39; 64x256 by 1225 vs
#: 1232: 1.23 / 1.10 / 1.21).  The larger cost is taken: packing B costs little where in place
#: would have won, and in place costs up to 1.7x where B should have been packed.  These are the
#: defaults: where the host probe measured a K step with B in place (``Target.b_in_place_step``,
#: ``b_off_line_step``) the two come from it, and ``B_IN_PLACE`` too (:func:`in_place_b_costs`).
#: On the Zen 4 of session 43 it measured no difference either way (1.0 and 1.0), and neither did
#: the kernels (128 x 3072 by 768 / 769 columns in place: 3.42 / 3.39 ms, packed 4.10 / 3.89), while
#: the defaults priced in place at up to 1.84x and packed ResNet-50's 1024 -> 256 1x1 layers at
#: 14x14 (0.80 ms in the flow, 0.61 in place).
B_ROW, B_MISALIGNED = 0.4, 1.2
#: L1 associativity (8 ways of 4 KiB on Zen 4 and most x86 cores).  Rows of A read in place whose
#: pitch is a multiple of 4 KiB all fall in one L1 set (a pitch of 2 KiB: two sets, ...); the rows
#: beyond the ways evict each other before their line's 16 K steps are used.  Slow-down of the step
#: per such row (measured: MR = 12 / 14 in place at 1024^3 and 128x3072x768 cost 1.4 / 1.6x the
#: same tile with A packed; MR <= 8 about the same).
L1_WAYS, A_ALIASED_ROW = 8, 0.1
#: Bytes per second one core streams an operand from L3 / DRAM (measured: ~50 GB/s on Zen 4).
STREAM_BANDWIDTH = 40e9
#: Bytes per second a core reads the parts of an operand that the other cores' caches hold (they
#: packed them, or produced them): with ``split="m"`` every core reads all of B (packed by all
#: cores before the loops), with ``split="n"`` all of A.  Not overlapped with the FMAs.  Fitted on
#: the Cascade Lake (2 cores, 1 MB L2 each), side by side against the model without the term:
#: ResNet-50's 1x1 convolutions at 56x56 (64x3136x256: 1.37 -> 1.04 ms, 128x3136x256: 1.41-1.80
#: -> 0.93-0.97 ms, column splits with B packed as used instead of row splits), 28x28 (256x784x512
#: 1.15-1.25 -> 0.96 ms), BERT's 128x3072x768 (3.22 -> 2.92 ms); 14 of 22 picks changed, 0.90x
#: the time in geometric mean.
SHARED_BANDWIDTH = 10e9
#: The narrow tile of a thin last column panel is a second micro-kernel (+20% of gcc's time on a
#: fused matmul kernel): made only where it saves at least this share of the column panels' work
#: (196 columns in panels of 48: 13%; 784: 4%; 3136: 1%, which measured 0.96-1.01 in ResNet-50).
NARROW_MIN_SAVING = 0.03
#: The batch is folded into the columns (``CpuConfig.fold``) only where that saves this share of
#: the columns the tiles compute: a batch of 7x7 images (49 columns each: 64 computed, folded 50),
#: not 14x14 ones (196: 208, folded 196; ResNet-50's 1x1 layers at batch 8 measured 0.93-1.01x as
#: one problem of 1568 columns, two cores) nor 17x17 ones (289: 320 or 304, folded 290).
FOLD_MIN_SAVING = 0.1
#: Cycles a folded tile that straddles two images spends per K block storing (or loading) its
#: rows in runs, one per image, through a tile buffer (fitted: 512 x 2048 x 49 at batch 8, two
#: cores, folded 0.80x the batched kernel's time, 1.07x the same problem with 392 columns).
FOLD_EDGE_CYCLES = 600
#: C is stored past the caches (streaming stores of whole tiles) when it is larger than this share of
#: the last-level cache: its consumers would find little of it there, and plain stores read every
#: line of C from memory before writing it.
STREAM_C = 0.5
#: Below this many FLOPs one core is considered too; above it, only all of them.
SMALL_FLOPS, LARGE_FLOPS = 2e5, 2e7
_ZERO = np.zeros(1, np.float32)
NO_INDEX = np.zeros(1, np.int64)       # the kernels' ``bidx`` for a problem without ``b_groups``


def lanes_of(target: Target) -> int:
    return max(4, target.vector_bytes // 4)


def rows_off_line(pitch: int, line: int = 64) -> float:
    """The fraction of rows of ``pitch`` floats that start off a ``line``-byte cache line when the
    first one starts on one (a pitch of 289 floats: 15 rows in 16; 288: none)."""
    return 1.0 - np.gcd(4 * pitch, line) / line


def in_place_b_costs(target: Target) -> tuple[float, float, float]:
    """``(B_IN_PLACE, B_ROW, B_MISALIGNED)`` on ``target``: from the K step ratios the host probe
    measured (:func:`taskmap.backends.host_probe.in_place_steps`: a tile of two vectors a row of B,
    rows on a line and 15 in 16 off one) — the per-vector term at most what the step on a line
    measured, the per-row term the rest of it —; else the defaults.  (Session 44, the Zen 4 whose
    probe measures 1.0: the per-vector term alone had kept B packed on ResNet-50's and ResNeXt-50's
    1x1 layers at 14x14, 1.02-1.22x slower than in place side by side.)"""
    on, off = target.b_in_place_step, target.b_off_line_step
    if not (on and off):
        return B_IN_PLACE, B_ROW, B_MISALIGNED
    n = IN_PLACE_PROBE_VECTORS
    per_vector = min(B_IN_PLACE, max(0.0, on - 1.0) / n)
    return (per_vector, max(0.0, (on - 1.0 - per_vector * n) * n),
            max(0.0, (off - on) * n / rows_off_line(IN_PLACE_PROBE_PITCH)))


def edge_lanes(n: int, nr: int, lanes: int) -> int:
    """Lanes of the narrow register tile for the last column panel of ``n`` columns in panels of
    ``nr``: one vector when that panel has at most one vector's columns (ResNet-50's 196 = 4 x 48
    + 4, Inception-V3's 289 = 9 x 32 + 1; the remainder of ``H x W`` in whole vectors is mostly
    one) and the narrow tile saves at least :data:`NARROW_MIN_SAVING` of the full tiles' work,
    else 0.  One width only: the kernels of problems with small remainders stay one kernel per
    schedule (compile time)."""
    rem, panels = n % nr, -(-n // nr)
    worth = (nr - lanes) / (panels * nr) >= NARROW_MIN_SAVING
    return lanes if 0 < rem <= lanes < nr and worth else 0


def _panels(units: int, per_batch: int, cores: int, core: int, last: float) -> float:
    """Work of ``core``'s contiguous share of ``units`` column panels (``per_batch`` to a batch),
    the last panel of each batch counted as ``last`` of a whole one."""
    u0, u1 = core * units // cores, (core + 1) * units // cores
    lasts = u1 // per_batch - u0 // per_batch      # the q in [u0, u1) with q % per_batch == per_batch - 1
    return (u1 - u0) - lasts * (1.0 - last)


def padded_columns(n: int, nr: int, lanes: int) -> int:
    """Columns the register tiles compute for ``n``: whole panels, the last one narrow where
    :func:`edge_lanes` says so."""
    return n // nr * nr + (edge_lanes(n, nr, lanes) or (nr if n % nr else 0))


def fold_refusal(p: MatmulProblem) -> str | None:
    """Why the batch of ``p`` cannot be folded into the columns (``CpuConfig.fold``), or None
    where it can: B batched and packable (its panels gather the images' columns), A shared,
    C stored plainly, no bias along the columns."""
    reasons = [why for bad, why in ((p.batch == 1, "the batch is 1"), (not p.b_batched, "B is shared"),
                                    (p.a_batched, "A is batched"), (p.trans_b, "B is transposed"),
                                    (p.trans_c, "C is transposed"), (p.bias, "the product has a bias"),
                                    (p.const_b, "B is a constant packed beforehand")) if bad]
    return ", ".join(reasons) or None


def folds(p: MatmulProblem, nr: int, lanes: int) -> bool:
    """Whether the search offers the folded batch: it is possible (:func:`fold_refusal`) and
    saves at least :data:`FOLD_MIN_SAVING` of the padded columns."""
    if fold_refusal(p) is not None:
        return False
    return padded_columns(p.batch * p.n, nr, lanes) <= (1 - FOLD_MIN_SAVING) * p.batch * padded_columns(p.n, nr, lanes)


def streams_c(p: MatmulProblem, target: Target) -> bool:
    """Whether the kernels of ``p`` store C past the caches (:data:`STREAM_C`)."""
    return bool(target.llc_bytes) and not p.trans_c and 4 * p.batch * p.m * p.n > STREAM_C * target.llc_bytes


def vector_registers(target: Target) -> int:
    return 32 if target.vector_bytes >= 64 else 16


def memory_seconds(p: MatmulProblem, a_reads: int, b_reads: int, cores: int) -> float:
    """Streaming A ``a_reads`` times, B ``b_reads`` times and C once, at a core's bandwidth each."""
    a = (p.batch if p.a_batched else 1) * p.m * p.k
    b = (p.batch if p.b_batched else 1) * p.k * p.n
    return 4 * (a * a_reads + b * b_reads + p.batch * p.m * p.n) / (STREAM_BANDWIDTH * cores)


def overlap(compute: float, memory: float) -> float:
    """Seconds of a kernel that computes while it streams its operands (not perfectly)."""
    return max(compute, memory) + 0.2 * min(compute, memory)


class MatmulCpuTemplate(KernelFamily):
    """f32 matmul (batched, broadcast batch, transposed B, bias) on the CPU."""

    name = "matmul_cpu"
    version = 18  # keys the tuning cache: bump when the kernels or the space change (18: B indexed by batch)


    def applies(self, problem: Any, target: Target) -> bool:
        return (isinstance(problem, MatmulProblem) and target.kind is TargetKind.CPU
                and problem.dtype == "float32" and problem.out_dtype == "float32"
                and (not problem.b_groups or (problem.const_b and problem.b_batched)))

    # ------------------------------------------------------------------ space
    def space(self, problem: MatmulProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        p, regs = problem, vector_registers(target)
        cores = [target.num_cores] if p.flops > LARGE_FLOPS or target.num_cores == 1 else \
            [1] if p.flops < SMALL_FLOPS else [1, target.num_cores]
        in_place = not p.trans_b and (p.n * 4 < PAGE or p.k <= FAR_IN_PLACE_K) and not p.const_b
        gemv = not p.trans_b and p.m <= SMALL_SIDE
        tiles = [t for t in TILES[regs] if not gemv or t[0] < 2 * p.m]    # GEMV: no tile mostly padding
        out = self._blocked(p, target, tiles, cores, (True, False) if in_place else (True,))
        widest = max(w for _, w in SMALL_TILES[regs]) * lanes_of(target)
        small_tiles = [t for t in SMALL_TILES[regs] if t[0] < 2 * p.m] + \
            [t for t in NARROW_TILES[regs] if (t[1] - 1) * lanes_of(target) < p.n < widest]   # C narrower than a panel
        if gemv:          # GEMV-like: B in place whatever its pitch (packed: for prologues that need it)
            out += self._blocked(p, target, small_tiles, cores, (True, False), any_block=True)
            if p.n >= lanes_of(target):                # ... or streamed by rows
                out += [Schedule.of(rows=True, mr=mr, nr=ROW_STEP, pack_a=False, pack_b=False, cores=c)
                        for mr in ROW_TILES if mr < 2 * p.m for c in cores]
        elif p.trans_b and p.const_b and p.m <= THIN_SIDE:      # a constant B^T packed once: one stream per panel
            out += self._blocked(p, target, small_tiles, cores, (True,), any_block=True, whole_k=WHOLE_K)
        small = min(p.m, p.n)
        if p.trans_b and small <= SMALL_SIDE:          # rows by rows: dot products along K
            for s, b in DOT_TILES[regs]:
                if s < 2 * small:
                    mr, nr = (s, b) if p.m <= p.n else (b, s)
                    out += [Schedule.of(dot=True, mr=mr, nr=nr, pack_a=False, pack_b=False, cores=c) for c in cores]
        if p.b_groups:       # B indexed by batch: its matrices packed beforehand, read by the blocked kernel with the
            out = [s for s in out if s.as_dict().get("pack_b") and s.as_dict().get("split") == "n"]   # panels outer
        return out

    def _blocked(self, p: MatmulProblem, target: Target, tiles: Sequence[tuple[int, int]], cores: list[int],
                 pack_bs: tuple[bool, ...], any_block: bool = False, whole_k: bool = False) -> list[Schedule]:
        """The blocked kernel's points with these register tiles (MR, NR in vectors);
        ``any_block``: B in place needs no B block in L2 (GEMV-like: A is a few rows); ``whole_k``:
        also all of K as one block (thin tiles over packed panels: each core's panels then stream
        from memory as one run, see :data:`WHOLE_K`)."""
        V = lanes_of(target)
        l2 = (target.l2_bytes or (1 << 20) * max(1, target.num_cores)) // max(1, target.num_cores)
        kcs = sorted(set([kc for kc in KCS if kc < p.k] + [next((kc for kc in KCS if kc >= p.k), KCS[-1])]))[-3:]
        if whole_k and p.k > kcs[-1]:
            kcs.append(p.k)
        out = []
        for mr, nv in tiles:
            nr = nv * V
            for fold, kc in itertools.product((False, True) if folds(p, nr, V) else (False,), kcs):
                np_ = -(-p.n * (p.batch if fold else 1) // nr)
                if mr * kc * 4 > L1_BYTES:
                    continue
                for ncb in NCBS:
                    if ncb > 4 and ncb // 2 >= np_:        # a block wider than B: same as a smaller one
                        continue
                    if ncb > NCBS[1] and min(kc, p.k) * ncb * nr * 4 > l2 // 2:     # wide blocks: in L2
                        continue
                    for split in ("m", "n"):
                        big = split == "n" and min(kc, p.k) * ncb * nr * 4 > l2 // 2      # its B block not in L2
                        for pack_a in (True,) if p.const_a else (True, False):
                            for pack_b in (True,) if fold else pack_bs:
                                if big and ((pack_b and not p.const_b) or not any_block):
                                    continue
                                for c in cores:
                                    out.append(Schedule.of(mr=mr, nr=nr, kc=kc, ncb=ncb, split=split, pack_a=pack_a,
                                                           pack_b=pack_b, cores=c, **({"fold": True} if fold else {})))
        return out

    # ------------------------------------------------------------------ cost
    def cost(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> float:
        """Seconds: the busiest core's micro-kernel cycles (whole padded tiles, its FMA and load
        rates, stalls for operands read in place, the C tile in and out per K block), plus
        packing traffic, plus the parallel regions; at least the operands' memory traffic.
        Only the ranking matters."""
        p, s = problem, schedule.as_dict()
        if s.get("dot", False):
            return self._dot_cost(p, target, s)
        if s.get("rows", False):
            return self._rows_cost(p, target, s)
        mr, nr, kc, ncb, split, pack_a, pack_b, cores = (s[x] for x in ("mr", "nr", "kc", "ncb", "split", "pack_a",
                                                                         "pack_b", "cores"))
        if s.get("fold", False):      # one problem of batch x n columns, plus the tiles that straddle images
            folded = replace(p, batch=1, n=p.batch * p.n)
            straddle = sum((j * nr) // p.n != min(j * nr + nr - 1, folded.n - 1) // p.n
                           for j in range(-(-folded.n // nr))) * -(-p.m // mr) * -(-p.k // kc)
            return self.cost(folded, target, Schedule.of(**{x: v for x, v in s.items() if x != "fold"})) + \
                straddle / cores * FOLD_EDGE_CYCLES / (target.clock_hz or 2.5e9)
        pack_b = pack_b or p.trans_b
        V = lanes_of(target)
        clock = target.clock_hz or 2.5e9
        mp, np_ = -(-p.m // mr), -(-p.n // nr)
        kb = -(-p.k // kc)
        ne = edge_lanes(p.n, nr, V)
        tile, tile_e = (self._tile_cycles(p, target, s, w, kb) for w in (nr, ne or nr))
        units = p.batch * (mp if split == "m" else np_)
        # the busiest core's tiles, a last column panel of the narrow tile counted at its share
        if split == "m":
            busiest = -(-units // cores) * (np_ - 1 + tile_e / tile) * tile
        else:
            busiest = max(_panels(units, np_, cores, c, tile_e / tile) for c in range(cores)) * mp * tile
        l2 = (target.l2_bytes or (1 << 20) * max(1, target.num_cores)) // max(1, target.num_cores)
        # GEMV-like, B in place: streamed again by every row panel unless its block stays in L2,
        # a few lines of each row at a time (the prefetchers lag: measured ~1.3x the row kernel).
        b_reads = 1
        if not pack_b and p.m <= SMALL_SIDE:
            b_reads = (mp if kc * ncb * nr * 4 > l2 // 2 else 1) * 1.3
        seconds = overlap(busiest / clock, memory_seconds(p, 1, b_reads, min(cores, units)))
        a_elems = (p.batch if p.a_batched else 1) * p.m * p.k
        b_elems = (p.batch if p.b_batched else 1) * p.k * p.n
        # Every core streams the whole of the operand it does not split (B for "m", A for "n"):
        # the shares the other cores' caches hold come over at SHARED_BANDWIDTH, not overlapped.
        used = min(cores, units)
        if used > 1:
            whole = b_elems * b_reads if split == "m" else a_elems
            seconds += 4 * whole * (1 - 1 / used) / SHARED_BANDWIDTH
        if streams_c(p, target):          # C's rows, in runs of one block, to memory
            seconds += p.batch * p.m * -(-np_ // ncb) * C_RUN / used
        # Packing, at a per-core copy bandwidth: the operand packed before the loops (B for "m", A
        # for "n") is read and written, then read again; the other one, packed block by block as it
        # is first used, is read (its block is written into the cache that the micro-kernel reads).
        packed_a = a_elems if pack_a and not p.const_a else 0
        packed_b = b_elems if pack_b and not p.const_b else 0
        before, as_used = (packed_b, packed_a) if split == "m" else (packed_a, packed_b)
        seconds += (8 * before + 4 * as_used) / (COPY_BANDWIDTH * cores)
        regions = 1 + (split == "m" and (pack_b or p.n % nr != 0)) + (split == "n" and pack_a)
        return seconds + FORK_COST * regions * (cores > 1) + CALL_COST

    @staticmethod
    def _tile_cycles(p: MatmulProblem, target: Target, s: dict[str, Any], width: int, kb: int) -> float:
        """Cycles of one ``MR x width`` register tile over all of K (the K loop's steps, the C tile
        in and out per K block)."""
        mr, nr, kc, pack_a = s["mr"], s["nr"], s["kc"], s["pack_a"]
        pack_b = s["pack_b"] or p.trans_b
        V = lanes_of(target)
        # One K step of the micro-kernel: MR*W/V FMAs at ``Target.vector_fma_rate``, or its loads
        # (MR broadcasts, W/V vectors) at two per cycle, whichever is slower.
        fmas = mr * width // V
        loads = mr + width / V
        step = (max(fmas / target.vector_fma_rate, loads / 2.0) + 0.02 * loads) / MICRO_EFFICIENCY
        if not pack_a:            # rows of A in place: their addresses spill; rows a page apart share a set
            sets = min(L1_BYTES // L1_WAYS // 64, 4096 // np.gcd(p.k * 4, 4096))   # L1 sets the MR rows fall in
            step *= 1.03 + A_ALIASED_ROW * max(0, -(-mr // sets) - L1_WAYS)
        if not pack_b:            # B in place: its rows are apart, the hardware prefetcher lags; and
            per_vector, row, off_line = in_place_b_costs(target)
            step *= 1.0 + per_vector * nr / V + (row + off_line * rows_off_line(p.n)) * V / nr
        if mr * kc * 4 > L1_BYTES // 2:  # the A micro-panel and the B stream share L1
            step *= 1.0 + L1_SHARED
        tile = p.k * step + kb * (5 * fmas + 40)
        if p.trans_c:             # partial sums of C^T between K blocks: element by element
            tile += (kb - 1) * 12 * mr * width    # (measured: BERT-base linears, ~12 cycles an element)
        return tile

    def _dot_cost(self, p: MatmulProblem, target: Target, s: dict[str, Any]) -> float:
        """The dot-product kernel: per tile, ``ceil(k / V)`` steps of ``MR * NR`` FMAs and
        ``MR + NR`` loads, then the lane tree; the big operand streamed once per tile row of the
        small side."""
        mr, nr, cores, V = s["mr"], s["nr"], s["cores"], lanes_of(target)
        mp, np_ = -(-p.m // mr), -(-p.n // nr)
        step = max(mr * nr / target.vector_fma_rate, (mr + nr) / 2.0) / MICRO_EFFICIENCY
        tile = -(-p.k // V) * step + 12 * mr * nr + 40
        tiles = p.batch * mp * np_
        compute = -(-tiles // cores) * tile / (target.clock_hz or 2.5e9)
        a_reads, b_reads = (1, mp) if p.m <= p.n else (np_, 1)
        # the big side's rows of a tile are streamed side by side: one prefetch stream each
        # (measured: 1280 x 1000 at M = 1, two cores, 45 us vs 37 us for a packed panel's one stream)
        streams = 1.0 + B_IN_PLACE * (nr if p.m <= p.n else mr)
        memory = memory_seconds(p, a_reads, b_reads, min(cores, tiles)) * streams
        return overlap(compute, memory) + FORK_COST * (cores > 1) + CALL_COST

    def _rows_cost(self, p: MatmulProblem, target: Target, s: dict[str, Any]) -> float:
        """The row-streaming kernel: per vector of C and group of ``KU`` rows of B, ``MR * KU``
        FMAs, ``KU`` loads of B and C in and out of L1; B streamed once per group of MR rows."""
        mr, ku, cores, V = s["mr"], s["nr"], s["cores"], lanes_of(target)
        mp = -(-p.m // mr)
        pieces = -(-cores // (p.batch * mp))                 # column blocks so that every core gets one
        nb = min(max(V, ROW_BLOCK // mr // V * V), -(-p.n // (pieces * V)) * V)
        units = p.batch * mp * -(-p.n // nb)
        # (measured: C through L1 and A re-broadcast cost up to 2x the FMAs at MR = 8)
        step = (max(mr * ku / target.vector_fma_rate, (ku + 2 * mr) / 2.0) * (1 + mr / 8) + 2) / MICRO_EFFICIENCY
        compute = -(-units // cores) * (nb // V) * -(-p.k // ku) * step / (target.clock_hz or 2.5e9)
        memory = memory_seconds(p, 1, mp, min(cores, units))
        return overlap(compute, memory) + FORK_COST * (cores > 1) + CALL_COST

    # ------------------------------------------------------------------ kernels
    def config(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> CpuConfig | DotConfig:
        s = schedule.as_dict()
        if s.get("dot", False) or s.get("rows", False):
            return DotConfig(s["mr"], s["nr"], lanes_of(target), s["cores"], problem.a_batched, problem.b_batched,
                             problem.bias, problem.trans_c, s.get("rows", False))
        l2 = (target.l2_bytes or (1 << 20) * max(1, target.num_cores)) // max(1, target.num_cores)
        mcb = max(1, l2 // 2 // (s["mr"] * s["kc"] * 4))          # the A block: half of L2
        pack_b = s["pack_b"] or problem.trans_b
        V = lanes_of(target)
        fold = s.get("fold", False)
        if fold and (why := fold_refusal(problem)) is not None:
            raise UnsupportedError(f"matmul_cpu: schedule fold=True cannot fold the batch of {problem}: {why}")
        stream = streams_c(problem, target) and not fold
        return CpuConfig(s["mr"], s["nr"], s["kc"], s["ncb"], s["split"], s["pack_a"], pack_b,
                         mcb, V, s["cores"], problem.a_batched, problem.b_batched, problem.trans_b,
                         problem.bias, problem.trans_c, problem.const_a and s["pack_a"], problem.const_b and pack_b,
                         edge_lanes(problem.n * (problem.batch if fold else 1), s["nr"], V), PREFETCH_BYTES // 4,
                         stream, fold, 4 * problem.batch * problem.m * problem.n > l2 and not problem.trans_c,
                         problem.b_groups > 0)

    def instantiate(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> Kernel:
        cfg = self.config(problem, target, schedule)
        if isinstance(cfg, DotConfig):
            return self.kernel(cfg, lambda: build_rows_kernel(cfg) if cfg.rows else build_dot_kernel(cfg))
        return self.kernel(cfg, lambda: build_kernel(cfg))

    def workspace_sizes(self, problem: MatmulProblem, schedule: Schedule, target: Target) -> tuple[int, int]:
        cfg = self.config(problem, target, schedule)
        if problem.b_groups:        # (the blocked kernel's only: the space holds no other)
            return cfg.workspace(problem.batch, problem.m, problem.n, problem.k, problem.b_groups)
        return cfg.workspace(problem.batch, problem.m, problem.n, problem.k)

    def pack_constants(self, problem: MatmulProblem, schedule: Schedule, a: Any, b: Any,
                       target: Target | None = None) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The packed panels a kernel of ``schedule`` takes as ``wa`` / ``wb`` for the constant
        operands of ``problem`` (``const_a`` / ``const_b``; None: that operand is not packed
        beforehand) — a compiled graph packs its weights once, at compile time."""
        cfg = self.config(problem, target or host_cpu_target(), schedule)
        if not isinstance(cfg, CpuConfig):
            return None, None
        wa = pack_a_panels(np.asarray(a, np.float32).reshape(problem.a_shape), cfg.mr) if cfg.pre_a else None
        wb = pack_b_panels(np.asarray(b, np.float32).reshape(problem.b_shape), cfg.nr, problem.trans_b) \
            if cfg.pre_b else None
        return wa, wb

    def arguments(self, problem: MatmulProblem, inputs: Sequence[Any], outputs: Sequence[Any],
                  schedule: Schedule | None = None, target: Target | None = None) -> list[Any]:
        """a, b, bias (a 1-element dummy without one), c, c again as ``cw`` (the partial sums: see
        :mod:`.matmul_cpu_kernel`), then the two workspace buffers — or, for constant operands,
        their packed panels (:meth:`pack_constants`) — and ``bidx`` (the input after the bias;
        a 1-element dummy without ``b_groups``).  Without a schedule (the tuner's call) the
        workspace fits every point of the space."""
        ops = operand_views(problem, inputs, outputs)
        if not problem.bias:
            ops.insert(2, _ZERO)
        ops.append(ops[3])
        target = target or host_cpu_target()
        points = self.space(problem, target) if schedule is None else [schedule]
        sizes = [self.workspace_sizes(problem, s, target) for s in points] or [(1, 1)]
        wa, wb = max(x[0] for x in sizes), max(x[1] for x in sizes)
        pa, pb = self.pack_constants(problem, schedule, ops[0], ops[1], target) if schedule is not None and \
            (problem.const_a or problem.const_b) else (None, None)
        bidx = view(inputs[3 if problem.bias else 2], (problem.batch,)) if problem.b_groups else NO_INDEX
        return ops + [WORKSPACE.get("cpu_a", wa) if pa is None else pa,
                      WORKSPACE.get("cpu_b", wb) if pb is None else pb, bidx]


MATMUL_CPU = MatmulCpuTemplate()

__all__ = ["MATMUL_CPU", "MatmulCpuTemplate", "NO_INDEX", "lanes_of"]
