"""The DSL front end builds the expected IR: structure, kinds, launch, size vars, printed form."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import taskmap
from taskmap.ir import expr as E
from taskmap.ir import stmt as S
from taskmap.ir.expr import BinOp, CmpOp, SizeVar, SpecialReg
from taskmap.ir.func import FuncKind, LaunchConfig, Module
from taskmap.ir.functor import collect
from taskmap.ir.mapping import MappingLoopKind
from taskmap.ir.stmt import ForKind
from taskmap.ir.verify import verify
from taskmap.ir.types import MemScope
from taskmap.lang import (attrs, auto_map, blockIdx, f16, f32, func, i32, parallel, register_tensor, repeat,
                          shared_tensor, spatial, symbol, syncthreads, threadIdx, transpile, unroll, vectorize)


def stmts(node: S.Stmt) -> list[S.Stmt]:
    return list(node.stmts) if isinstance(node, S.Seq) else [node]


def entry(fn, kind=None):
    mod = transpile(fn, kind)
    verify(mod)  # what the front end builds satisfies the IR's invariants
    return mod.entry_function


def dims(d) -> tuple:
    return tuple(x.value if isinstance(x, E.Const) else x for x in d)


# ----------------------------------------------------------------------------- DESIGN §1: vec_add


def vec_add(a: f32[1024], b: f32[1024], c: f32[1024]):
    attrs.grid_dim = 4
    attrs.block_dim = 256
    for i in spatial(1024).on(blockIdx.x * 256 + threadIdx.x):
        c[i] = a[i] + b[i]


def test_vec_add():
    mod = transpile(vec_add)
    assert isinstance(mod, Module) and mod.entry == "vec_add" and len(mod.functions) == 1
    f = mod.entry_function
    assert f.name == "vec_add" and f.kind is FuncKind.GPU_KERNEL and f.ret is None
    assert [p.name for p in f.params] == ["a", "b", "c"]
    assert all(p.type.scope is MemScope.GLOBAL and dims(p.type.shape) == (1024,) for p in f.params)
    assert f.launch == LaunchConfig(grid_dim=(E.const(4), E.const(1), E.const(1)),
                                    block_dim=(E.const(256), E.const(1), E.const(1)))
    assert f.size_vars == ()
    (loop,) = stmts(f.body)
    assert isinstance(loop, S.MappingFor) and loop.kind is MappingLoopKind.SEQUENTIAL
    assert loop.mapping == spatial(1024) and [v.name for v in loop.vars] == ["i"]
    assert loop.vars[0].dtype is i32
    assert loop.worker == blockIdx.x * 256 + threadIdx.x
    (store,) = stmts(loop.body)
    assert isinstance(store, S.Store) and store.tensor is f.params[2] and store.indices == (loop.vars[0],)
    assert store.value == E.Load(f.params[0], (loop.vars[0],)) + E.Load(f.params[1], (loop.vars[0],))
    text = repr(mod)
    assert "def vec_add(a: f32[1024], b: f32[1024], c: f32[1024]):  # gpu_kernel" in text
    assert "# grid_dim=(4, 1, 1) block_dim=(256, 1, 1)" in text
    assert "on(blockIdx.x * 256 + threadIdx.x):" in text
    assert "        c[i] = a[i] + b[i]" in text


def test_kernel_decorator_wraps_the_module():
    k = taskmap.kernel(vec_add)
    assert isinstance(k, taskmap.Kernel)


# ----------------------------------------------------------------------------- Hidet paper: cooperative load


def coop_load(g: f32[64, 8], out: f32[64, 8]):
    attrs.block_dim = 128
    smem = shared_tensor(f32, [64, 8])
    for i, j in (repeat(4, 1) * spatial(16, 8)).on(threadIdx.x):
        smem[i, j] = g[i, j]
    syncthreads()
    for i, j in (repeat(4, 1) * spatial(16, 8)).on(threadIdx.x):
        out[i, j] = smem[i, j] * 2.0


def test_cooperative_load():
    f = entry(coop_load)
    assert f.kind is FuncKind.GPU_KERNEL
    assert dims(f.launch.block_dim) == (128, 1, 1) and dims(f.launch.grid_dim) == (1, 1, 1)
    decl, load, barrier, back = stmts(f.body)
    assert isinstance(decl, S.DeclTensor) and decl.scope is MemScope.SHARED
    assert decl.var.name == "smem" and dims(decl.type.shape) == (64, 8) and decl.type.dtype is f32
    assert isinstance(load, S.MappingFor)
    assert load.mapping == repeat(4, 1) * spatial(16, 8) and load.mapping.num_workers == 128
    assert [v.name for v in load.vars] == ["i", "j"] and load.worker == threadIdx.x
    (st,) = stmts(load.body)
    assert st.tensor is decl.var and st.indices == load.vars
    assert isinstance(barrier, S.Barrier)
    assert back.vars[0] is not load.vars[0]  # fresh loop variables per loop
    assert "smem: shared f32[64, 8]" in repr(f) and "syncthreads()" in repr(f)


# ----------------------------------------------------------------------------- block tree reduction


def block_sum(x: f32[256], out: f32[1]):
    attrs.block_dim = 256
    buf = shared_tensor(f32, [256])
    tid = threadIdx.x
    buf[tid] = x[tid]
    syncthreads()
    stride = 128
    while stride > 0:
        if tid < stride:
            buf[tid] += buf[tid + stride]
        syncthreads()
        stride //= 2
    if tid == 0:
        out[0] = buf[0]


def test_block_tree_reduction():
    f = entry(block_sum)
    decl, tid, store, sync, stride, loop, last = stmts(f.body)
    assert isinstance(tid, S.DeclScalar) and tid.init == threadIdx.x
    assert isinstance(stride, S.DeclScalar) and stride.init == E.const(128) and stride.var.dtype is i32
    assert isinstance(loop, S.While) and loop.cond == E.compare(CmpOp.GT, stride.var, 0)
    cond, inner_sync, update = stmts(loop.body)
    assert isinstance(cond, S.If) and isinstance(inner_sync, S.Barrier)
    (acc,) = stmts(cond.then)
    assert isinstance(acc, S.Store) and acc.value == E.Load(decl.var, (tid.var,)) + \
        E.Load(decl.var, (tid.var + stride.var,))
    assert isinstance(update, S.Assign) and update.var is stride.var
    assert update.value == E.binary(BinOp.FLOORDIV, stride.var, 2)
    assert isinstance(last, S.If) and last.else_ is None


# ----------------------------------------------------------------------------- CPU kernels


def cpu_rows(a: f32[64, 16], out: f32[64]):
    for i in spatial(64).parallel():
        acc = 0.0
        for j in range(16):
            acc += a[i, j]
        out[i] = acc


def cpu_vec(a: f32[8, 8], b: f32[8, 8]):
    for i, j in (spatial(2, 1) * repeat(4, 1) * spatial(1, 8)).vectorize():
        b[i, j] = a[i, j] + 1
    for t in spatial(8):
        b[t, 0] = 0.0
    for t in spatial(8).sequential():
        b[t, 1] = 0.0


def test_cpu_parallel_and_accumulator():
    f = entry(cpu_rows)
    assert f.kind is FuncKind.CPU_KERNEL and f.launch is None
    (loop,) = stmts(f.body)
    assert isinstance(loop, S.MappingFor) and loop.worker is None and loop.kind is MappingLoopKind.PARALLEL
    decl, inner, store = stmts(loop.body)
    assert isinstance(decl, S.DeclScalar) and decl.var.name == "acc" and decl.var.dtype is f32
    assert decl.init == E.const(0.0)
    assert isinstance(inner, S.For) and inner.kind is ForKind.SERIAL and inner.step == 1
    assert dims((inner.start, inner.stop)) == (0, 16)
    (upd,) = stmts(inner.body)
    assert isinstance(upd, S.Assign) and upd.var is decl.var
    assert upd.value == decl.var + E.Load(f.params[0], (loop.vars[0], inner.var))
    assert store.value is decl.var
    assert "for i in spatial(64):  # parallel" in repr(f)


def test_cpu_vectorize_and_whole_mapping_loops():
    f = entry(cpu_vec)
    vec, plain, seq = stmts(f.body)
    assert vec.kind is MappingLoopKind.VECTORIZE and vec.worker is None and len(vec.vars) == 2
    assert vec.mapping.task_shape == (8, 8)
    assert plain.kind is MappingLoopKind.SEQUENTIAL and plain.worker is None
    assert seq.kind is MappingLoopKind.SEQUENTIAL
    (st,) = stmts(vec.body)
    assert st.value == E.Load(f.params[0], vec.vars) + E.const(1.0)


def loops(a: f32[64], n: i32):
    for i in unroll(4):
        a[i] = 0.0
    for i in parallel(n):
        a[i] = 1.0
    for i in vectorize(0, 64, 8):
        a[i] = 2.0
    for i in range(60, 0, -2):
        a[i] = 3.0
    for i in unroll(2, 6):
        a[i] = 4.0


def test_loop_builders():
    f = entry(loops)
    got = [(s.kind, dims((s.start, s.stop)), s.step) for s in stmts(f.body)]
    n = f.params[1]
    assert got == [(ForKind.UNROLL, (0, 4), 1), (ForKind.PARALLEL, (0, n), 1), (ForKind.VECTORIZE, (0, 64), 8),
                   (ForKind.SERIAL, (60, 0), -2), (ForKind.UNROLL, (2, 6), 1)]
    assert f.kind is FuncKind.CPU_KERNEL


def test_register_tensor_in_cpu_kernel():
    def k(a: f32[4, 4]):
        r = register_tensor(f32, (4, 4))
        for i, j in repeat(4, 4).on(0):
            r[i, j] = a[i, j]
            a[i, j] = r[i, j] * r[i, j]

    f = entry(k)
    decl, loop = stmts(f.body)
    assert decl.scope is MemScope.REGISTER and f.kind is FuncKind.CPU_KERNEL
    assert loop.worker == E.const(0)


# ----------------------------------------------------------------------------- device functions


@func
def square(x: f32) -> f32:
    return x * x


@func
def sum_sq(a: f32, b: f32) -> f32:
    return square(a) + square(b)


@func
def store_pair(t: f32[64], i: i32, v: f32):
    t[i] = v
    t[i + 1] = v


def uses_helpers(a: f32[64], out: f32[64]):
    for i in range(32):
        out[i] = sum_sq(a[i], i)
        store_pair(out, 2 * i, square(1.5))


def test_device_functions():
    mod = transpile(uses_helpers)
    verify(mod)
    assert [f.name for f in mod.functions] == ["uses_helpers", "sum_sq", "square", "store_pair"]
    assert mod.entry == "uses_helpers" and mod.entry_function.kind is FuncKind.CPU_KERNEL
    helper = mod.lookup("sum_sq")
    assert helper.kind is FuncKind.DEVICE and helper.ret is f32 and helper.launch is None
    assert [p.dtype for p in helper.params] == [f32, f32]
    (ret,) = stmts(helper.body)
    assert isinstance(ret, S.Return) and isinstance(ret.value, E.Binary)
    assert ret.value.a == E.CallFunc("square", (helper.params[0],), f32)
    assert mod.lookup("store_pair").ret is None
    loop = stmts(mod.entry_function.body)[0]
    store, call = stmts(loop.body)
    c = store.value
    assert isinstance(c, E.CallFunc) and c.name == "sum_sq" and c.ret is f32
    assert c.args[1] == E.Cast(loop.var, f32)  # scalar arguments are cast to the parameter type
    assert isinstance(call, S.Evaluate) and call.expr.name == "store_pair" and call.expr.ret is None
    assert call.expr.args[0] is mod.entry_function.params[1]
    assert "sum_sq(a[i], f32(i))" in repr(mod)
    assert "def square(x: f32) -> f32:  # device" in repr(mod)


def test_transpile_device_function_directly_and_cache():
    mod = transpile(sum_sq)
    assert mod.entry == "sum_sq" and [f.name for f in mod.functions] == ["sum_sq", "square"]
    assert transpile(sum_sq).entry_function is mod.entry_function  # transpiled once


@func
def block_barrier(buf: f32[32], v: f32):
    buf[threadIdx.x] = v
    syncthreads()


def test_device_function_with_gpu_features_makes_a_gpu_kernel():
    def k(a: f32[32]):
        attrs.block_dim = 32
        buf = shared_tensor(f32, [32])
        block_barrier(buf, a[threadIdx.x])
        a[threadIdx.x] = buf[31 - threadIdx.x]

    mod = transpile(k)
    assert mod.entry_function.kind is FuncKind.GPU_KERNEL
    helper = mod.lookup("block_barrier")
    assert helper.kind is FuncKind.DEVICE and any(isinstance(s, S.Barrier) for s in stmts(helper.body))


# ----------------------------------------------------------------------------- closures, configs, symbols


def make_matmul_tile(cfg):
    BM, BN = cfg.tile
    load_map = auto_map((BM, 8), cfg.threads)

    def tile_kernel(a: f32[BM, 8], c: f32[BM, BN]):
        attrs.block_dim = cfg.threads
        smem = shared_tensor(f32, [BM, min(BN, 8)])
        for i, j in load_map.on(threadIdx.x):
            smem[i, j] = a[i, j]
        syncthreads()
        for i, j in (spatial(cfg.threads // BN, BN) * repeat(BM // (cfg.threads // BN), 1)).on(threadIdx.x):
            c[i, j] = smem[i, j % len(cfg.tile) * 4]

    return tile_kernel


def test_closure_tile_sizes_and_mappings():
    cfg = SimpleNamespace(tile=(64, 16), threads=128)
    f = entry(make_matmul_tile(cfg))
    assert dims(f.params[1].type.shape) == (64, 16) and dims(f.launch.block_dim) == (128, 1, 1)
    decl, load, _, comp = stmts(f.body)
    assert dims(decl.type.shape) == (64, 8)
    assert load.mapping == auto_map((64, 8), 128)
    assert comp.mapping == spatial(8, 16) * repeat(8, 1)
    (st,) = stmts(comp.body)
    i, j = comp.vars
    assert st.value == E.Load(decl.var, (i, E.binary(BinOp.MOD, j, 2) * 4))


N = symbol("N")


def symbolic(a: f32[N, "K"], b: f32["K"], n_blocks: i32):
    attrs.grid_dim = ((N + 63) // 64, 2)
    attrs.block_dim = 64
    M = symbol("M")
    for i in range(a.shape[1]):
        b[i] = a[blockIdx.x, i] + M


def test_symbolic_sizes():
    f = entry(symbolic)
    assert f.size_vars == (SizeVar("N"), SizeVar("K"), SizeVar("M"))
    assert f.params[0].type.shape == (SizeVar("N"), SizeVar("K"))
    assert f.launch.grid_dim == ((SizeVar("N") + 63) // 64, E.const(2), E.const(1))
    (loop,) = stmts(f.body)
    assert loop.stop == SizeVar("K")
    assert "# grid_dim=((N + 63) // 64, 2, 1) block_dim=(64, 1, 1)" in repr(f)


def test_future_annotations_module():
    import lang_future_kernels as m

    mod = transpile(m.scale)
    f = mod.entry_function
    assert [f.name for f in mod.functions] == ["scale", "twice"]
    assert f.params[0].type.shape == (SizeVar("N"), E.const(32)) and f.params[2].type is i32
    assert f.size_vars == (SizeVar("N"),) and f.launch.grid_dim[0] == SizeVar("N")
    q = entry(m.quoted)
    assert dims(q.params[0].type.shape) == (8,) and q.params[1].type is f32


# ----------------------------------------------------------------------------- kinds


def test_kind_override_and_gpu_dims():
    def k(a: f32[16]):
        attrs.grid_dim = (2, 3, 4)
        attrs.block_dim = (8, 2)
        a[threadIdx.y] = 1.0

    f = entry(k)
    assert dims(f.launch.grid_dim) == (2, 3, 4) and dims(f.launch.block_dim) == (8, 2, 1)
    assert f.body.tensor is f.params[0] and f.body.indices == (E.Special(SpecialReg.THREAD_IDX, 1),)

    def plain(a: f32[16]):
        for i in range(16):
            a[i] = 0.0

    assert entry(plain).kind is FuncKind.CPU_KERNEL
    assert entry(plain, FuncKind.DEVICE).kind is FuncKind.DEVICE


def test_cast_of_f16_tensor_store():
    def k(a: f16[8], b: f32[8]):
        for i in range(8):
            a[i] = b[i] * 2

    f = entry(k)
    (loop,) = stmts(f.body)
    assert loop.body.value == E.Cast(E.Load(f.params[1], (loop.var,)) * 2, f16)
    assert collect(loop.body, E.Cast)[0].type is f16


def test_builtins_refuse_plain_python():
    with pytest.raises(TypeError, match=r"syncthreads\(\) can only be called inside a @taskmap.kernel function"):
        syncthreads()
    with pytest.raises(TypeError, match="shared_tensor"):
        shared_tensor(f32, [4])
    with pytest.raises(TypeError, match="unroll"):
        unroll(4)
    with pytest.raises(TypeError, match="attrs.block_dim"):
        attrs.block_dim = 4
    with pytest.raises(TypeError, match="device function 'square' can only be called inside"):
        square(2.0)
    # dtypes and mappings stay ordinary values
    assert spatial(2, 2).num_workers == 4 and f32.nbytes == 4 and symbol("n") == SizeVar("n")
