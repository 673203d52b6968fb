"""The rule-based scheduler: compute DAGs -> kernels for the CPU and GPU-style kernels (run on the
CPU with GPU semantics, and built for sm_90 and gfx90a), checked against numpy on drawn shapes."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.backends import cuda_target, hip_target, host_cpu_target
from taskmap.compute import compute, reduce, tensor_input
from taskmap.errors import UnsupportedError
from taskmap.ops.transform import concat_compute
from taskmap.ir import bf16, f16, f32, f64, i32
from taskmap.ir import expr as E
from taskmap.ir.expr import Intrinsic
from taskmap.ir.func import FuncKind
from taskmap.ir.mapping import MappingLoopKind
from taskmap.ir import stmt as S
from taskmap.ir.stmt import MappingFor
from taskmap.ir.functor import collect
from taskmap.schedule.rule_based import build_module, plan, schedule
from taskmap.testing import assert_close, shapes

FEW = settings(max_examples=10, deadline=None)
RNG = np.random.default_rng(7)
TARGETS = [pytest.param(host_cpu_target(), id="cpu"), pytest.param(cuda_target("sm_90"), id="sm_90"),
           pytest.param(hip_target("gfx90a"), id="gfx90a")]


def _rand(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("target", TARGETS)
@given(shape=shapes(min_dims=1, max_dims=4, max_side=40, max_elements=1 << 14))
@FEW
def test_elementwise_with_broadcast(target, shape):
    x = tensor_input("x", f32, shape)
    b = tensor_input("b", f32, shape[-1:])
    y = compute("y", shape, lambda *i: E.call(Intrinsic.TANH, x[i]) * b[i[-1]] + 1.0)
    xs, bs = _rand(shape), _rand(shape[-1:])
    out = np.empty(shape, np.float32)
    schedule(y, target)(xs, bs, out)
    assert_close(out, np.tanh(xs) * bs + 1.0)


@pytest.mark.parametrize("target", TARGETS)
@given(rows=st.integers(1, 40), cols=st.integers(1, 300), op=st.sampled_from(["sum", "max", "min"]))
@FEW
def test_inner_reduction(target, rows, cols, op):
    x = tensor_input("x", f32, [rows, cols])
    s = reduce("s", [rows], lambda i, k: x[i, k], [cols], op)
    xs = _rand((rows, cols))
    out = np.empty(rows, np.float32)
    schedule(s, target)(xs, out)
    assert_close(out, getattr(np, op)(xs.astype(np.float64), axis=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@given(shape=shapes(min_dims=2, max_dims=3, max_side=30, max_elements=1 << 13))
@FEW
def test_outer_reduction_with_epilogue(target, shape):
    """mean over axis 0 (the reduced axis is not the contiguous one), an epilogue dividing."""
    n = shape[0]
    x = tensor_input("x", f32, shape)
    s = reduce("s", shape[1:], lambda *a: x[(a[-1], *a[:-1])], [n], "sum")
    m = compute("m", shape[1:], lambda *i: s[i] / float(n))
    xs = _rand(shape)
    out = np.empty(shape[1:], np.float32)
    schedule(m, target)(xs, out)
    assert_close(out, xs.mean(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_multi_axis_reduction_and_full_reduction(target):
    x = tensor_input("x", f32, [3, 5, 7])
    s = reduce("s", [5], lambda j, a, c: x[a, j, c] * x[a, j, c], [3, 7], "sum")
    total = reduce("total", [], lambda a, b, c: x[a, b, c], [3, 5, 7], "sum")
    xs = _rand((3, 5, 7))
    out, tot = np.empty(5, np.float32), np.empty((), np.float32)
    schedule(s, target)(xs, out)
    schedule(total, target)(xs, tot)
    assert_close(out, (xs.astype(np.float64) ** 2).sum(axis=(0, 2)), rtol=1e-5, atol=1e-4)
    assert_close(tot, xs.astype(np.float64).sum(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32])
def test_dtypes(target, dtype):
    t = {np.float16: f16, np.float64: f64, np.int32: i32}[dtype]
    x = tensor_input("x", t, [9, 70])
    s = reduce("s", [9], lambda i, k: x[i, k], [70], "max")
    y = compute("y", [9, 70], lambda i, j: x[i, j] * 2)
    xs = (RNG.standard_normal((9, 70)) * 100).astype(dtype)
    out, yo = np.empty(9, dtype), np.empty((9, 70), dtype)
    schedule(s, target)(xs, out)
    schedule(y, target)(xs, yo)
    assert_close(out, xs.max(axis=1))
    assert_close(yo, xs * 2)


def test_bf16_and_sum_accumulates_in_f32():
    torch = pytest.importorskip("torch")
    x = tensor_input("x", bf16, [5, 333])
    s = reduce("s", [5], lambda i, k: x[i, k], [333], "sum")
    xs = torch.randn(5, 333, dtype=torch.bfloat16)
    out = torch.empty(5, dtype=torch.bfloat16)
    schedule(s, "cpu")(xs, out)
    assert_close(out, xs.float().sum(1), atol=0.1)


def test_nan_propagates_through_max():
    x = tensor_input("x", f32, [4, 40])
    s = reduce("s", [4], lambda i, k: x[i, k], [40], "max")
    xs = _rand((4, 40))
    xs[1, 17] = np.nan
    for target in ("cpu", cuda_target("sm_90")):
        out = np.empty(4, np.float32)
        schedule(s, target)(xs, out)
        assert np.isnan(out[1]) and np.array_equal(out[[0, 2, 3]], xs.max(axis=1)[[0, 2, 3]])


def test_cpu_schedule_uses_parallel_and_vector_mappings():
    x = tensor_input("x", f32, [512, 1024])
    y = compute("y", [512, 1024], lambda i, j: x[i, j] + 1.0)
    m = build_module(y, "cpu")
    loops = collect(m.entry_function.body, MappingFor)
    assert [lp.kind for lp in loops] == [MappingLoopKind.PARALLEL, MappingLoopKind.VECTORIZE]
    src = schedule(y, "cpu").build("cpu").source
    assert "#pragma omp parallel for" in src and "#pragma omp simd" in src


@pytest.mark.parametrize("c, h, w, inner", [(96, 7, 7, 49), (64, 3, 3, 576), (32, 28, 28, 784), (8, 2, 40, 80)])
def test_cpu_vector_loop_stops_at_a_per_channel_broadcast(c, h, w, inner):
    """``x * scale[c]`` over NCHW: the vector loop spans a channel's pixels (a scalar scale per
    channel), not several channels (a gather of the scale at ``j // (h * w)`` per element) — unless
    a channel's pixels are fewer than a vector's lanes.  Numerics against numpy."""
    x = tensor_input("x", f32, [8, c, h, w])
    s = tensor_input("s", f32, [8, c, 1, 1])
    y = compute("y", [8, c, h, w], lambda n, k, i, j: x[n, k, i, j] * s[n, k, 0, 0])
    loops = collect(build_module(y, "cpu").entry_function.body, MappingFor)
    widths = [math.prod(lp.mapping.task_shape) for lp in loops if lp.kind is MappingLoopKind.VECTORIZE]
    assert widths == [inner], widths
    xs, ss = _rand((8, c, h, w)), _rand((8, c, 1, 1))
    out = np.empty_like(xs)
    schedule(y, "cpu")(xs, ss, out)
    np.testing.assert_array_equal(out, xs * ss)


@pytest.mark.parametrize("rows, cols, partials", [(8, 49, 16), (8, 7, 2), (64, 300, 64), (8, 1, 1)])
def test_cpu_inner_reduction_sums_its_partials_in_halves(rows, cols, partials):
    """A power-of-two count of partial results per output (up to four vectors, at most half of
    the row), combined in halves — vector steps of partials / 2, ..., 1 lanes — not one after the
    other (a global pool's 49 partials did: 2.6x PyTorch's time): long rows, and short ones with
    fewer outputs than a block (test_cpu_short_rows_in_blocks_of_outputs).  Numerics:
    test_inner_reduction."""
    x = tensor_input("x", f32, [rows, cols])
    s = reduce("s", [rows], lambda i, k: x[i, k], [cols], "sum")
    loops = collect(build_module(s, "cpu").entry_function.body, MappingFor)
    widths = [math.prod(lp.mapping.task_shape) for lp in loops if lp.kind is MappingLoopKind.VECTORIZE]
    halves = [partials >> j for j in range(1, partials.bit_length())]
    assert widths[0] == partials and widths[len(widths) - len(halves):] == halves, widths
    xs = _rand((rows, cols))
    out = np.empty(rows, np.float32)
    schedule(s, "cpu")(xs, out)
    assert_close(out, xs.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("outputs, cols", [(37, 49), (64, 7), (16, 1), (1088, 49), (40, 64), (33, 17)])
@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_cpu_short_rows_in_blocks_of_outputs(outputs, cols, op):
    """Rows of at most four vectors, at least a block of outputs: blocks of ``SHORT_BLOCK`` outputs
    in parallel (a partial block after them), each row folded into one vector of partials (its
    last step masked), then a vector loop over the block's outputs sums each one's lanes — no
    halving per output.  Sums, maxima (NaN rows included) and means with their epilogue, against
    numpy."""
    from taskmap.schedule.rule_based import PARALLEL_MIN_WORK, SHORT_BLOCK, SHORT_ROW_VECTORS

    lanes = max(4, host_cpu_target().vector_bytes // 4)
    assert cols <= SHORT_ROW_VECTORS * lanes and outputs >= SHORT_BLOCK
    x = tensor_input("x", f32, [outputs, cols])
    r = reduce("r", [outputs], lambda i, k: x[i, k], [cols], "max" if op == "max" else "sum")
    node = compute("m", [outputs], lambda i: r[i] / float(cols)) if op == "mean" else r
    fn = build_module(node, "cpu").entry_function
    vector = [lp for lp in collect(fn.body, S.For) if lp.kind is S.ForKind.VECTORIZE]
    width = min(lanes, 1 << (cols.bit_length() - 1))
    assert {int(lp.stop.value) - int(lp.start.value) for lp in vector} <= {width, SHORT_BLOCK, outputs % SHORT_BLOCK}
    parallel = [lp for lp in collect(fn.body, MappingFor) if lp.kind is MappingLoopKind.PARALLEL]
    assert bool(parallel) == (outputs * cols >= PARALLEL_MIN_WORK and outputs >= 2 * SHORT_BLOCK
                              and host_cpu_target().num_cores > 1)
    xs = _rand((outputs, cols))
    if op == "max":
        xs[3, cols // 2] = np.nan
    out = np.full(outputs, np.nan, np.float32)
    schedule(node, "cpu")(xs, out)
    ref = {"sum": np.sum, "max": np.max, "mean": np.mean}[op](xs.astype(np.float64), axis=1)
    assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_gpu_schedules_build_for_cuda_and_hip():
    x = tensor_input("x", f32, [33, 1500])
    s = reduce("s", [33], lambda i, k: x[i, k], [1500], "sum")  # block per row: shared memory + shuffles
    y = compute("y", [33, 1500], lambda i, j: x[i, j] * 3.0)
    for node in (s, y):
        k = schedule(node, cuda_target("sm_90"))
        assert k.func.kind is FuncKind.GPU_KERNEL
        built = k.build("cuda", arch="sm_90")
        assert built.binary[:4] == b"\x7fELF"
        hip = schedule(node, hip_target("gfx90a")).build("hip", arch="gfx90a")
        assert hip.binary[:4] == b"\x7fELF"
    assert "__shfl_xor_sync" in schedule(s, cuda_target("sm_90")).build("cuda", arch="sm_90").source


def test_gpu_reduction_kernels_pick_lanes_by_extent():
    for cols, lanes in ((5, None), (20, 16), (700, 32), (5000, 256)):
        x = tensor_input("x", f32, [10, cols])
        s = reduce("s", [10], lambda i, k: x[i, k], [cols])
        body = build_module(s, cuda_target("sm_90")).entry_function
        text = repr(body)
        if lanes is None:
            assert "shfl" not in text  # a thread per output
        else:
            assert f"spatial({256 // lanes}, {lanes})" in text if lanes < 256 else "partials" in text


def test_unsupported_dags():
    x = tensor_input("x", f32, [4, 6])
    s = reduce("s", [4], lambda i, k: x[i, k], [6])
    softmax_like = compute("p", [4, 6], lambda i, j: x[i, j] / s[i])  # reads the reduction at another index
    with pytest.raises(UnsupportedError, match="template"):
        plan(softmax_like)
    mean = compute("mean", [4], lambda i: s[i] / 6.0)
    var = reduce("v", [4], lambda i, k: (x[i, k] - mean[i]) * (x[i, k] - mean[i]), [6])
    with pytest.raises(UnsupportedError, match="nested"):
        plan(var)
    sym = tensor_input("y", f32, ["n"])
    with pytest.raises(UnsupportedError, match="static shapes"):
        plan(compute("z", [E.SizeVar("n")], lambda i: sym[i]))
    with pytest.raises(ValueError, match="exactly the DAG's inputs"):
        plan(s, inputs=[])


def test_constant_output_and_rank_zero_outputs():
    c = compute("c", [3, 5], lambda i, j: E.cast(i * 5 + j, f32))
    out = np.empty((3, 5), np.float32)
    schedule(c, "cpu")(out)
    assert_close(out, np.arange(15, dtype=np.float32).reshape(3, 5))
    assert math.prod(plan(c).shape) == 15
    x = tensor_input("x", f32, [5, 7])
    s = reduce("s", [], lambda a, b: x[a, b], [5, 7], "sum")
    mean = compute("mean", [], lambda: s[()] / 35.0)
    pick = compute("pick", [], lambda: x[1, 2] * 2.0)
    xs = _rand((5, 7))
    for target in ("cpu", cuda_target("sm_90")):
        for node, ref in ((mean, xs.mean()), (pick, xs[1, 2] * 2)):
            out = np.empty((), np.float32)
            schedule(node, target)(xs, out)
            assert_close(out, np.float32(ref), rtol=1e-5, atol=1e-6)


def test_gather_at_an_index_computed_by_a_producer():
    """A gather from a computed table at a computed index (CLIP's token embedding: ids + offset
    into a reshaped table): inlining expands the producers inside the index as well."""
    ids = tensor_input("ids", i32, [5])
    off = tensor_input("off", i32, [5])
    w = tensor_input("w", f32, [12, 4])
    pos = compute("pos", [5], lambda i: ids[i] + off[i])
    table = compute("table", [4, 12], lambda c, r: w[r, c] * 2.0)
    emb = compute("emb", [5, 4], lambda i, j: table[j, pos[i]])
    assert {ld.tensor.name for ld in collect(plan(emb).value, E.Load)} == {"ids", "off", "w"}
    ids_v = RNG.integers(0, 6, 5).astype(np.int32)
    off_v = RNG.integers(0, 6, 5).astype(np.int32)
    w_v = _rand((12, 4))
    out = np.empty((5, 4), np.float32)
    schedule(emb, host_cpu_target(), inputs=[ids, off, w])(ids_v, off_v, w_v, out)
    assert_close(out, w_v[ids_v + off_v] * 2.0)


@pytest.mark.parametrize("target", TARGETS)
@given(batch=st.integers(1, 3), parts=st.lists(st.integers(1, 40), min_size=2, max_size=9),
       side=st.sampled_from([1, 3, 7, 14, 56]), mixed=st.booleans())
@FEW
def test_a_concatenation_runs_piece_by_piece(target, batch, parts, side, mixed):
    """A channel concat with per-channel arithmetic after it (DenseNet's concat -> batch norm ->
    ReLU) is computed part by part: every store reads one part — on the CPU whichever dimensions
    the vector loop covers (rows per channel at 56 x 56, channels inside it at 7 x 7, rows split
    over the cores at batch 1), on GPUs in a branch per part —; the results match numpy's.
    ``mixed``: a second concat along the last axis, whose selects stay."""
    xs = [tensor_input(f"x{k}", f32, [batch, c, side, side]) for k, c in enumerate(parts)]
    cat = concat_compute(xs, 1)
    total = sum(parts)
    s = tensor_input("s", f32, [total])
    y = compute("y", cat.shape, lambda n, c, h, w: E.maximum(cat[n, c, h, w] * s[c] + 1.0, 0.0))
    if mixed:
        z = tensor_input("z", f32, [batch, total, side, 2])
        y = concat_compute([y, z], 3)
    arrays = [_rand((batch, c, side, side)) for c in parts]
    scale = _rand(total)
    ins = [*arrays, scale] + ([_rand((batch, total, side, 2))] if mixed else [])
    out = np.empty(y.shape, np.float32)
    schedule(y, target)(*ins, out)
    want = np.maximum(np.concatenate(arrays, 1) * scale[:, None, None] + 1.0, 0.0)
    if mixed:
        want = np.concatenate([want, ins[-1]], 3)
    assert_close(out, want, rtol=1e-6, atol=1e-6)
    body = build_module(y, target).entry_function.body
    names = {x.var.name for x in xs}
    stores = collect(body, S.Store)
    read = [{ld.tensor.name for ld in collect(st.value, E.Load)} & names for st in stores]
    assert all(len(r) == 1 for r in read) and set().union(*read) == names
