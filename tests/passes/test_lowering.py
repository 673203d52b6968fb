"""The lowering passes: mapping loops keep the paper's semantics, guards appear exactly when
needed, indexing flattens through each tensor's layout, and the IR can be dumped after each pass."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap import repeat, spatial
from taskmap.ir import expr as E
from taskmap.ir import stmt as S
from taskmap.ir.dtypes import f32, i32
from taskmap.ir.func import FuncKind, Function, Module
from taskmap.ir.functor import collect, substitute
from taskmap.ir.simplify import simplify_expr
from taskmap.ir.types import TensorType, column_major, row_major
from taskmap.lang import attrs, blockIdx, threadIdx, transpile
from taskmap.passes import PASSES, flatten_indexing, lower, lower_mappings
from taskmap.passes.lower_mappings import UNROLL_LIMIT


# ----------------------------------------------------------------------------- mapping semantics

@st.composite
def grid_factor(draw):
    kind = draw(st.sampled_from([spatial, repeat]))
    shape = draw(st.tuples(st.integers(1, 4), st.integers(1, 4)))
    ranks = draw(st.sampled_from([None, [0, 1], [1, 0]]))
    return kind(*shape, ranks=ranks)


def compose(factors):
    m = factors[0]
    for f in factors[1:]:
        m = m * f
    return m


mappings = st.lists(grid_factor(), min_size=1, max_size=3).map(compose).filter(
    lambda m: m.num_workers <= 1020 and m.tasks_per_worker <= 256)


def make_ordinal_kernel(m, threads):
    @taskmap.kernel
    def ordinals(out: i32["r", "c"]):
        attrs.block_dim = threads
        for q, (i, j) in enumerate(m.on(threadIdx.x)):
            out[i, j] = threadIdx.x * 1000 + q
    return ordinals


def expected_ordinals(m):
    want = np.full(m.task_shape, -1, np.int64)
    for w in range(m.num_workers):
        for q, t in enumerate(m.worker2task(w)):
            assert want[t] == -1, "a task mapped twice"
            want[t] = w * 1000 + q
    return want


@given(mappings, st.integers(0, 3))
@settings(max_examples=15, deadline=None)
def test_lowered_mapping_loops_follow_worker2task(m, extra_threads):
    """Each thread runs its tasks in the order worker2task gives; extra threads do nothing."""
    kern = make_ordinal_kernel(m, m.num_workers + extra_threads)
    out = np.full(m.task_shape, -1, np.int32)
    kern(out)
    assert (out == expected_ordinals(m)).all(), repr(m)


def test_paper_mapping_example():
    m = spatial(2, 2) * repeat(2, 2)
    assert m.worker2task(3) == [(2, 2), (2, 3), (3, 2), (3, 3)]
    out = np.full((4, 4), -1, np.int32)
    make_ordinal_kernel(m, 4)(out)
    assert out[2:, 2:].ravel().tolist() == [3000, 3001, 3002, 3003]
    assert (out == expected_ordinals(m)).all()


# ----------------------------------------------------------------------------- guards

GUARD_MAP = spatial(4, 8) * repeat(2, 2)   # 32 workers


def guard_kernel(threads):
    @taskmap.kernel
    def guarded(out: i32[8, 16]):
        attrs.block_dim = threads
        for i, j in GUARD_MAP.on(threadIdx.x):
            out[i, j] = threadIdx.x
    return guarded


def worker_guards(func):
    """The conditions of the Ifs that test threadIdx.x (mapping-loop guards)."""
    return [s.cond for s in collect(func.body, S.If) if collect(s.cond, E.Special)]


def test_guard_inserted_when_more_threads_than_workers():
    k = guard_kernel(100)
    after_pass = lower_mappings(k.module).entry_function
    (g,) = worker_guards(after_pass)                            # 0 <= worker < 32
    assert g == E.logical_and(E.compare(E.CmpOp.GE, threadIdx.x, 0), E.compare(E.CmpOp.LT, threadIdx.x, 32))
    guards = worker_guards(k.lower().entry_function)           # threadIdx.x >= 0 is known
    assert len(guards) == 1
    g = guards[0]
    assert g.op is E.CmpOp.LT and g.a == threadIdx.x and g.b == E.const(32)
    out = np.full((8, 16), -1, np.int32)
    k(out)
    assert out.max() < 32 and (out >= 0).all()


def test_guard_removed_when_every_thread_is_a_worker():
    k = guard_kernel(32)
    assert len(worker_guards(lower_mappings(k.module).entry_function)) == 1  # the pass always guards
    lowered = k.lower().entry_function
    assert worker_guards(lowered) == [] and collect(lowered.body, S.If) == []   # simplify drops it
    out = np.full((8, 16), -1, np.int32)
    k(out)
    assert sorted(set(out.ravel().tolist())) == list(range(32))


@taskmap.kernel
def guarded_grid(a: f32[1024], c: f32[1024]):
    attrs.grid_dim = 4
    attrs.block_dim = 256
    for i in spatial(1024).on(blockIdx.x * 256 + threadIdx.x):
        c[i] = a[i]


@taskmap.kernel
def guarded_symbolic_grid(a: f32["n"], c: f32["n"]):
    attrs.grid_dim = (a.shape[0] + 255) // 256
    attrs.block_dim = 256
    for i in spatial(1024).on(blockIdx.x * 256 + threadIdx.x):
        c[i] = a[i]


SHIFTED = spatial(4, 8)


@taskmap.kernel
def shifted_worker(out: i32[64]):
    attrs.block_dim = 64
    for i, j in SHIFTED.on(threadIdx.x - 32):
        out[32 + i * 8 + j] = threadIdx.x


def test_negative_workers_have_no_tasks():
    """Threads 0..31 have workers -32..-1: outside the mapping, so they must do nothing."""
    (g,) = worker_guards(shifted_worker.lower().entry_function)
    assert g == E.compare(E.CmpOp.GE, threadIdx.x - 32, 0)      # the upper bound is proved, the lower is not
    out = np.full(64, -1, np.int32)
    shifted_worker(out)
    assert out.tolist() == [-1] * 32 + list(range(32, 64))


def test_guard_with_block_and_thread_indices():
    assert collect(guarded_grid.lower().entry_function.body, S.If) == []      # 4 * 256 workers exactly
    assert len(collect(guarded_symbolic_grid.lower().entry_function.body, S.If)) == 1   # grid unknown
    a = np.arange(1024, dtype=np.float32)
    c = np.full(1024, np.nan, np.float32)
    guarded_grid(a, c)
    assert (c == a).all()


def test_cpu_mapping_loop_kinds_and_unrolling():
    small, big = repeat(2, 4) * spatial(3, 1), repeat(UNROLL_LIMIT + 1, 1) * spatial(2, 8)

    def body(out: f32[6, 4], wide: f32[130, 8]):
        for i, j in small.parallel():
            out[i, j] = 1.0
        for i, j in big.vectorize():
            wide[i, j] = 2.0

    lowered = lower_mappings(transpile(body)).entry_function
    fors = collect(lowered.body, S.For)
    kinds = [f.kind for f in fors]
    assert kinds[0] is S.ForKind.PARALLEL and fors[0].stop == E.const(3)          # workers over cores
    assert kinds[1:3] == [S.ForKind.UNROLL, S.ForKind.UNROLL]                   # 8 tasks per worker
    assert kinds[3] is S.ForKind.SERIAL and fors[3].stop == E.const(UNROLL_LIMIT + 1)  # too many to unroll
    assert kinds[-1] is S.ForKind.VECTORIZE and fors[-1].stop == E.const(16)     # lanes innermost
    assert not collect(lowered.body, S.MappingFor)


# ----------------------------------------------------------------------------- flattening


def flat_offsets(layout, shape, env=None):
    """Flatten a store into a tensor of ``layout`` and evaluate its offset at every index."""
    tensor = E.Var("t", TensorType(f32, tuple(E.as_expr(s) for s in shape), layout=layout))
    idx = [E.Var(f"i{d}", i32) for d in range(len(shape))]
    store = S.Store(tensor, tuple(idx), E.const(1.0))
    fn = Function("flat", FuncKind.CPU_KERNEL, (tensor,), store)
    (flat,) = collect(flatten_indexing(Module((fn,), "flat")).entry_function.body, S.Store)
    assert len(flat.indices) == 1
    dims = [int(substitute(E.as_expr(s), env or {}).value) if not isinstance(s, int) else s for s in shape]
    out = np.empty(dims, np.int64)
    for pos in np.ndindex(*dims):
        bind = {**(env or {}), **{v: E.const(p) for v, p in zip(idx, pos)}}
        value = simplify_expr(substitute(flat.indices[0], bind))
        assert isinstance(value, E.Const), value
        out[pos] = value.value
    return out


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 2)])
def test_flatten_row_major_and_column_major(shape):
    shp = tuple(E.const(s) for s in shape)
    n = int(np.prod(shape))
    assert (flat_offsets(row_major(shp), shape) == np.arange(n).reshape(shape, order="C")).all()
    assert (flat_offsets(column_major(shp), shape) == np.arange(n).reshape(shape, order="F")).all()


def test_flatten_with_symbolic_sizes():
    p, q = E.SizeVar("p"), E.SizeVar("q")
    env = {p: E.const(3), q: E.const(5)}
    shape = (p, 4, q)
    shp = tuple(E.as_expr(s) for s in shape)
    want = np.arange(60).reshape((3, 4, 5), order="C")
    assert (flat_offsets(row_major(shp), shape, env) == want).all()
    assert (flat_offsets(column_major(shp), shape, env) == np.arange(60).reshape((3, 4, 5), order="F")).all()


def test_lowered_module_has_flat_indices_only():
    lowered = guard_kernel(64).lower()
    stores = collect(lowered.entry_function.body, S.Store)
    assert stores and all(len(s.indices) == 1 for s in stores)
    assert all(len(ld.indices) == 1 for ld in collect(lowered.entry_function.body, E.Load))


# ----------------------------------------------------------------------------- dumping the IR


def pass_files():
    return ["00_input.txt"] + [f"{n:02d}_{name}.txt" for n, (name, _) in enumerate(PASSES, start=1)]


def test_lower_dump_dir_writes_one_file_per_pass(tmp_path):
    module = guard_kernel(100).module
    lowered = lower(module, dump_dir=tmp_path)
    out = tmp_path / module.entry
    assert sorted(p.name for p in out.iterdir()) == pass_files()
    texts = [(out / name).read_text() for name in pass_files()]
    assert ".on(threadIdx.x)" in texts[0]                                   # the input: a mapping loop
    assert ".on(" not in texts[1] and "threadIdx.x < 32:" in texts[1]      # after lower_mappings
    assert "if threadIdx.x < 32:" in texts[2]                               # after simplify
    assert "out[" in texts[-1] and texts[-1] == repr(lowered) + "\n"       # the last file: the result
    assert texts[0] == repr(module) + "\n"


def test_dump_ir_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKMAP_DUMP_IR", str(tmp_path))

    @taskmap.kernel
    def dumped(out: i32[8, 16]):
        attrs.block_dim = 40
        for i, j in GUARD_MAP.on(threadIdx.x):
            out[i, j] = threadIdx.x

    out = np.full((8, 16), -1, np.int32)
    dumped(out)
    assert sorted(p.name for p in (tmp_path / "dumped").iterdir()) == pass_files()
    assert (out >= 0).all() and out.max() == 31


# ----------------------------------------------------------------------------- simplified arithmetic


CONSTS = (-7, -4, -3, -1, 0, 1, 2, 3, 5, 8, 16)
DIVISORS = (-8, -5, -3, -2, 2, 3, 4, 7, 16)


@st.composite
def int_exprs(draw, i, j, depth=4):
    """(IR expression over i and j, the same function in Python) with Python's // and %."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        leaf = draw(st.sampled_from(["i", "j", "c"]))
        if leaf == "c":
            c = draw(st.sampled_from(CONSTS))
            return E.const(c), lambda x, y: c
        return (i, lambda x, y: x) if leaf == "i" else (j, lambda x, y: y)
    op = draw(st.sampled_from(["+", "-", "*", "//", "%", "min", "max", "select"]))
    a, fa = draw(int_exprs(i, j, depth - 1))
    if op in ("*", "//", "%"):  # by a constant: no int32 overflow, no division by zero
        d = draw(st.sampled_from(DIVISORS))
        if op == "*":
            return a * d, lambda x, y: fa(x, y) * d
        if op == "//":
            return a // d, lambda x, y: fa(x, y) // d
        return a % d, lambda x, y: fa(x, y) % d
    b, fb = draw(int_exprs(i, j, depth - 1))
    if op == "select":
        return (E.select(E.compare(E.CmpOp.LT, a, b), a * 2, b),
                lambda x, y: 2 * fa(x, y) if fa(x, y) < fb(x, y) else fb(x, y))
    build = {"+": lambda: (a + b, lambda x, y: fa(x, y) + fb(x, y)),
             "-": lambda: (a - b, lambda x, y: fa(x, y) - fb(x, y)),
             "min": lambda: (E.minimum(a, b), lambda x, y: min(fa(x, y), fb(x, y))),
             "max": lambda: (E.maximum(a, b), lambda x, y: max(fa(x, y), fb(x, y)))}
    return build[op]()


I_VAR, J_VAR = E.Var("i", i32), E.Var("j", i32)


@given(st.lists(int_exprs(I_VAR, J_VAR), min_size=6, max_size=6),
       st.sampled_from([(-20, 20), (0, 30), (5, 17), (-9, -1)]), st.sampled_from([(0, 6), (-3, 4), (1, 2)]))
@settings(max_examples=12, deadline=None)
def test_simplified_index_arithmetic_matches_python(exprs, irange, jrange):
    """Loop bounds let the simplifier rewrite // and %; the results must stay Python's."""
    (lo, hi), (jlo, jhi) = irange, jrange
    out = E.Var("out", TensorType(i32, (E.const(len(exprs)), E.const(hi - lo), E.const(jhi - jlo))))
    stores = [S.Store(out, (E.const(q), I_VAR - lo, J_VAR - jlo), E.cast(e, i32)) for q, (e, _) in enumerate(exprs)]
    loops = S.For(I_VAR, E.const(lo), E.const(hi), 1, S.For(J_VAR, E.const(jlo), E.const(jhi), 1, S.seq(*stores)))
    kern = taskmap.Kernel(Module((Function("arith", FuncKind.CPU_KERNEL, (out,), loops),), "arith"))
    got = np.zeros((len(exprs), hi - lo, jhi - jlo), np.int32)
    kern(got)
    for q, (e, fn) in enumerate(exprs):
        want = [[fn(x, y) for y in range(jlo, jhi)] for x in range(lo, hi)]
        assert got[q].tolist() == want, repr(e)
