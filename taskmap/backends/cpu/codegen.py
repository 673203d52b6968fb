"""Render a lowered IR module as C (gcc + OpenMP).

CPU kernels become plain C functions: parallel loops are ``omp parallel for``, vectorized loops
``omp simd``, unrolled loops ``GCC unroll``.  GPU kernels run with GPU semantics (see
``runtime_c``): a thread function per kernel, blocks spread over cores, and the threads of a
block executed either one after another (no barrier anywhere) or as fibers switching at each
``syncthreads()``.  Every module gets one exported entry ``tm_entry_<kernel>`` taking the
kernel's parameters followed by its symbolic sizes, and returning a status code; and a *packed*
entry ``tm_packed_<kernel>(const uint64_t *words)`` taking the same arguments as one array of
64-bit words (a tensor's address, or a scalar's bytes at the start of its word), which the
chain runner of a compiled graph calls (:mod:`taskmap.backends.cpu.chain`).
"""
from __future__ import annotations

from ...errors import UnsupportedError
from ...ir import expr as E
from ...ir import stmt as S
from ...ir.dtypes import ScalarType, f16, f32, i32
from ...ir.func import FuncKind, Function, Module
from ...ir.functor import collect, substitute
from ...ir.primitives import MBAR_OPS, WGMMA_OPS, Prim, PrimCall, is_warp_synchronous
from ...ir.types import MemScope, TensorType
from ..base import Target
from ..clike import CLikeFuncGen, const_extent, element_bytes, func_name, numel, smem_layout, written_tensors
from .cnames import ctype, entry_name, packed_name, scalar_abi_type
from .runtime_c import RUNTIME_C
from .warp_c import render_prim_c

_SPECIAL_FIELD = {E.SpecialReg.THREAD_IDX: "tid", E.SpecialReg.BLOCK_IDX: "bid",
                  E.SpecialReg.BLOCK_DIM: "bdim", E.SpecialReg.GRID_DIM: "gdim"}
#: Bytes of fiber stack reserved beyond a kernel's register tensors.
FIBER_STACK_BASE = 64 * 1024


class CpuFuncGen(CLikeFuncGen):
    """The C dialect: GPU thread indices are thread-function arguments (or thread-local state in
    helpers), shared memory is the block's buffer, a barrier switches fibers."""

    FLOAT_BITS = {t: (f"tm_bits_{s}", f"tm_{s}_of_bits") for t, s in
                  (("float32", "f32"), ("float64", "f64"), ("float16", "f16"))}
    #: f32 erf, tanh, exp, log, log1p and expm1 are inline approximations (runtime_c.py): no libm
    #: call, so gcc vectorizes the loops that use them (GELU, sigmoid, SiLU, softplus, Mish, ELU
    #: epilogues) and keeps their registers
    MATH = {**CLikeFuncGen.MATH, E.Intrinsic.ERF: ("tm_erff", "erf"), E.Intrinsic.TANH: ("tm_tanhf", "tanh"),
            E.Intrinsic.EXP: ("tm_expf", "exp"), E.Intrinsic.LOG: ("tm_logf", "log"),
            E.Intrinsic.LOG1P: ("tm_log1pf", "log1p"), E.Intrinsic.EXPM1: ("tm_expm1f", "expm1"),
            E.Intrinsic.SIGMOID: ("tm_sigmoidf", ""), E.Intrinsic.SILU: ("tm_siluf", "")}
    #: float min / max as a compare and a blend (runtime_c.py), which gcc vectorizes: libm's
    #: fminf / fmaxf it calls once per lane
    MIN_MAX = ("tm_fmin", "tm_fmax")

    def __init__(self, gen: "CGen", func: Function) -> None:
        super().__init__(gen, func)
        self.gpu_body = func.kind is FuncKind.GPU_KERNEL

    def float_const(self, text: str, t: ScalarType) -> str:
        return f"((_Float16){text}f)" if t is f16 else super().float_const(text, t)

    def special(self, e: E.Special) -> str:
        f = _SPECIAL_FIELD[e.reg]
        if self.gpu_body and e.reg in (E.SpecialReg.THREAD_IDX, E.SpecialReg.BLOCK_IDX):
            return f"tm_{f}{'xyz'[e.dim]}"
        return f"tm_tls.{f}[{e.dim}]"

    def barrier(self) -> str:
        return "tm_barrier();"

    def prim(self, e: PrimCall) -> str:
        return render_prim_c(self, e)

    def loop_pragmas(self, s: S.For) -> list[str]:
        if s.kind is S.ForKind.PARALLEL and not self.gpu_body and self.func.kind is FuncKind.CPU_KERNEL:
            self.check_independent(s, "parallel")
            return ["#pragma omp parallel for schedule(static)"]
        if s.kind is S.ForKind.VECTORIZE and not collect(s.body, PrimCall):  # else: a plain loop
            self.check_independent(s, "vectorized")
            return ["#pragma omp simd"]
        if s.kind is S.ForKind.UNROLL:
            extent = const_extent(s)
            return [f"#pragma GCC unroll {min(extent, 128) if extent else 8}"]
        return []

    def loop_tail(self, s: S.For) -> list[str]:
        # A core that streamed stores fences them before the others may read them.
        return ["tm_stream_fence();"] if s.kind is S.ForKind.PARALLEL and self.gen.streams else []

    def for_(self, s: S.For, d: int) -> None:
        store = self.streamed(s)
        if store is None:
            super().for_(s, d)
            return
        # Whole vectors of lanes: their values into an aligned buffer (a loop gcc vectorizes), then
        # stored past the caches (tm_stream_f32, which checks the alignment); a last partial
        # vector, plainly.  Constant bounds give each vector a constant base (a register tile
        # indexed by the lanes stays in registers).
        self.check_independent(s, "vectorized")
        lanes, lane = self.gen.target.vector_bytes // 4, E.Var("tm_lane", i32)
        v, ln, dst = self.names(s.var), self.names(lane), self.names(store.tensor)
        self.nonneg.add(id(s.var))
        value = self.store_value(store.tensor, store.value)

        def vector(base: E.Expr, depth: int) -> None:
            self.emit("{", depth)
            self.emit(f"float tm_st[{lanes}] __attribute__((aligned(64)));", depth + 1)
            self.emit("#pragma omp simd", depth + 1)
            self.emit(f"for (int32_t {ln} = 0; {ln} < {lanes}; {ln}++) {{", depth + 1)
            self.emit(f"const int32_t {v} = {self.expr(E.as_expr(base))} + {ln};", depth + 2)
            self.emit(f"tm_st[{ln}] = {value};", depth + 2)
            self.emit("}", depth + 1)
            self.emit(f"tm_stream_f32(&{dst}[{self.expr(substitute(store.indices[0], {s.var: base}))}], tm_st, "
                      f"{lanes});", depth + 1)
            self.emit("}", depth)

        n = const_extent(s)
        if n is not None:                 # constant bounds: the vectors unrolled
            lo = s.start.value
            for q in range(n // lanes):
                vector(E.const(lo + q * lanes), d)
            tail = (E.const(lo + n // lanes * lanes), s.stop)
        else:
            at = E.Var("tm_at", i32)
            a = self.names(at)
            self.emit("{", d)
            d += 1
            self.emit(f"int32_t {a} = {self.expr(s.start)};", d)
            self.emit(f"for (; {a} + {lanes} <= {self.expr(s.stop)}; {a} += {lanes}) {{", d)
            vector(at, d + 1)
            self.emit("}", d)
            tail = (at, s.stop)
        if n is None or n % lanes:
            self.emit(f"for (int32_t {v} = {self.expr(tail[0])}; {v} < {self.expr(tail[1])}; {v}++) {{", d)
            self.emit(f"{dst}[{self.expr(store.indices[0])}] = {value};", d + 1)
            self.emit("}", d)
        if n is None:
            self.emit("}", d - 1)

    def streamed(self, s: S.For) -> S.Store | None:
        """The store of a vectorized loop that streams it (:attr:`Store.stream`): one f32 store
        whose lanes are consecutive elements (else: stored plainly)."""
        st = s.body
        if not (self.gen.streams and s.kind is S.ForKind.VECTORIZE and isinstance(st, S.Store) and st.stream
                and s.step == 1 and st.tensor.dtype is f32 and len(st.indices) == 1
                and self.gen.target.vector_bytes >= 32):
            return None
        if collect(st.value, PrimCall) or _stride(st.indices[0], s.var) != 1:
            return None
        return st

    def check_independent(self, s: S.For, what: str) -> None:
        why = _omp_conflict(s)
        if why is not None:
            raise UnsupportedError(f"{self.func.name}: the {what} loop over '{s.var.name}' {why}")

    def decl_tensor(self, s: S.DeclTensor, d: int) -> None:
        t: TensorType = s.var.type
        name = self.names(s.var)
        storage = self.storage_ctype(t.dtype)
        if t.scope is MemScope.SHARED:
            if self.func.kind is not FuncKind.GPU_KERNEL:
                raise UnsupportedError(f"shared tensor {s.var.name} outside a GPU kernel ({self.func.name})")
            offset = self.gen.smem_offsets[id(s.var)]
            self.emit(f"{storage} *{name} = ({storage} *)(tm_tls.smem + {offset});", d)
        else:  # 16-byte aligned, as on the GPU backends: vector copies and fragments rely on it
            self.emit(f"{storage} {name}[{numel(t)}] __attribute__((aligned(16)));", d)


def _stride(e: E.Expr, var: E.Var) -> int | None:
    """The coefficient of ``var`` in ``e`` when ``e`` is affine in it (None otherwise)."""
    if e is var:
        return 1
    if isinstance(e, E.Binary) and e.op in (E.BinOp.ADD, E.BinOp.SUB, E.BinOp.MUL):
        a, b = _stride(e.a, var), _stride(e.b, var)
        if a is None or b is None:
            return None
        if e.op is E.BinOp.ADD:
            return a + b
        if e.op is E.BinOp.SUB:
            return a - b
        if a == 0 and b == 0:
            return 0
        k = e.a if a == 0 else e.b if b == 0 else None
        return (a or b) * k.value if isinstance(k, E.Const) else None
    return 0 if not any(x is var for x in collect(e, E.Var)) else None


def _omp_conflict(loop: S.For) -> str | None:
    """Why the iterations of ``loop`` cannot run concurrently (an OpenMP loop), or None."""
    inner = {id(x.var) for x in collect(loop.body, S.DeclScalar)}
    for a in collect(loop.body, S.Assign):
        if id(a.var) not in inner:
            return (f"assigns '{a.var.name}', a variable declared outside the loop, so its iterations would race; "
                    "declare it inside the loop, or use a serial loop")
    if collect(loop.body, S.Return):
        return "returns from inside the loop"
    todo = [loop.body]
    while todo:  # a break that leaves this loop (not one of an inner loop)
        st = todo.pop()
        if isinstance(st, S.Break):
            return "breaks out of the loop; use a serial loop"
        if isinstance(st, S.Seq):
            todo.extend(st.stmts)
        elif isinstance(st, S.If):
            todo.extend(x for x in (st.then, st.else_) if x is not None)
    return None


class CGen:
    """Renders a whole module; GPU kernels get a thread function and a block-launching entry."""

    def __init__(self, module: Module, target: Target) -> None:
        self.module = module
        self.target = target
        self.smem_offsets: dict[int, int] = {}
        self.written = written_tensors(module)
        #: a CPU kernel with streaming stores (its parallel iterations and its end fence them)
        self.streams = module.entry_function.kind is FuncKind.CPU_KERNEL and any(
            st.stream for f in module.functions for st in collect(f.body, S.Store))

    def render(self) -> str:
        out = [RUNTIME_C]
        helpers = [f for f in self.module.functions if f.name != self.module.entry]
        for f in helpers:
            out.append(self.signature(f, CpuFuncGen(self, f)) + ";")
        for f in helpers:
            out.append(self.function(f))
        entry = self.module.entry_function
        if entry.kind is FuncKind.GPU_KERNEL:
            out.append(self.gpu_kernel(entry))
        elif entry.kind is FuncKind.CPU_KERNEL:
            out.append(self.cpu_kernel(entry))
        else:
            raise UnsupportedError(f"cannot launch a {entry.kind.value} function ({entry.name})")
        out.append(self.packed_entry(entry))
        return "\n\n".join(out) + "\n"

    def packed_entry(self, f: Function) -> str:
        """``tm_packed_<kernel>(words)``: the entry, its arguments read from an array of words."""
        args = [f"(void *)(uintptr_t)tm_w[{i}]" if isinstance(p.type, TensorType) else
                f"TM_WORD({scalar_abi_type(p.type)}, tm_w[{i}])" for i, p in enumerate(f.params)]
        args += [f"TM_WORD(int32_t, tm_w[{len(f.params) + i}])" for i in range(len(f.size_vars))]
        return (f"int {packed_name(f.name)}(const uint64_t *tm_w) {{\n"
                f"  return {entry_name(f.name)}({', '.join(args)});\n}}")

    def signature(self, f: Function, g: CpuFuncGen) -> str:
        params = [g.param_decl(p, self.written) for p in f.params]
        params += [f"int32_t {g.names.size(sv.name)}" for sv in f.size_vars]  # the caller's sizes, by name
        params = ", ".join(params) or "void"
        ret = ctype(f.ret) if f.ret is not None else "void"
        return f"static inline {ret} {func_name(f.name)}({params})"

    def function(self, f: Function) -> str:
        g = CpuFuncGen(self, f)
        head = self.signature(f, g) + " {"
        g.stmt(f.body, 1)
        return "\n".join([head, *g.lines, "}"])

    def entry_params(self, f: Function, g: CpuFuncGen) -> list[str]:
        params = []
        for p in f.params:
            if isinstance(p.type, TensorType):
                params.append(g.param_decl(p, self.written))
            else:
                params.append(f"{scalar_abi_type(p.type)} {g.names(p)}")
        params += [f"int32_t {g.names.size(sv.name)}" for sv in f.size_vars]
        return params

    def cpu_kernel(self, f: Function) -> str:
        g = CpuFuncGen(self, f)
        g.stmt(f.body, 1)
        params = ", ".join(self.entry_params(f, g)) or "void"
        fence = ["  tm_stream_fence();"] if self.streams else []
        return "\n".join([f"int {entry_name(f.name)}({params}) {{", *g.lines, *fence, "  return TM_OK;", "}"])

    def gpu_kernel(self, f: Function) -> str:
        """Thread function + entry running the grid; threads are fibers if there are barriers."""
        g = CpuFuncGen(self, f)
        self.smem_offsets, smem = smem_layout(f)
        reg_bytes = sum(numel(x.var.type) * element_bytes(x.var.type)  # helpers' too: all on the fiber stack
                        for h in self.module.functions for x in collect(h.body, S.DeclTensor)
                        if x.var.type.scope is MemScope.REGISTER)
        g.stmt(f.body, 1)
        prims = [p.op for h in self.module.functions for p in collect(h.body, PrimCall)]
        needs = (1 if any(map(is_warp_synchronous, prims)) else 0) | (2 if Prim.CP_ASYNC in prims else 0) | \
            (4 if any(op in WGMMA_OPS for op in prims) else 0) | \
            (8 if any(op in MBAR_OPS or op in (Prim.TMA_LOAD, Prim.BAR_SYNC) for op in prims) else 0)
        # Threads are fibers when they must stop midway: barriers, warp rendezvous, cp.async queues, mbarriers.
        has_barrier = needs != 0 or any(collect(h.body, S.Barrier) for h in self.module.functions)
        arg_names = [g.names(p) for p in f.params] + [g.names.size(sv.name) for sv in f.size_vars]
        fields = [g.param_decl(p, self.written) + ";" for p in f.params]
        fields += [f"int32_t {g.names.size(sv.name)};" for sv in f.size_vars]
        struct = f"tm_args_{f.name}"
        unpack = [f"  {fld[:-1]} = tm_p->{name};" for fld, name in zip(fields, arg_names)]
        uses_tls = any(collect(h.body, E.Special) for h in self.module.functions if h is not f)
        thread = [f"static inline __attribute__((always_inline)) void tm_thread_{f.name}("
                  "const void *tm_arg, int tm_tidx, int tm_tidy, int tm_tidz, int tm_bidx, int tm_bidy, int tm_bidz) {",
                  f"  const {struct} *tm_p = (const {struct} *)tm_arg;", *unpack, *g.lines, "}",
                  f"static void tm_fiber_{f.name}(const void *tm_arg) {{",
                  f"  tm_thread_{f.name}(tm_arg, tm_tls.tid[0], tm_tls.tid[1], tm_tls.tid[2], "
                  "tm_tls.bid[0], tm_tls.bid[1], tm_tls.bid[2]);", "}"]
        launch = f.launch
        dims = [g.expr(x) for x in (*launch.grid_dim, *launch.block_dim)]
        if has_barrier:
            run = [f"      tm_run_block(&tm_sched_, tm_fiber_{f.name}, &tm_A);"]
        else:
            set_tid = "tm_tls.tid[0] = tm_x; tm_tls.tid[1] = tm_y; tm_tls.tid[2] = tm_z; " if uses_tls else ""
            run = ["      const int tm_bx = tm_tls.bid[0], tm_by = tm_tls.bid[1], tm_bz = tm_tls.bid[2];",
                   "      for (int tm_z = 0; tm_z < tm_dims[5]; ++tm_z)",
                   "      for (int tm_y = 0; tm_y < tm_dims[4]; ++tm_y)",
                   "      for (int tm_x = 0; tm_x < tm_dims[3]; ++tm_x) {",
                   f"        {set_tid}tm_thread_{f.name}(&tm_A, tm_x, tm_y, tm_z, tm_bx, tm_by, tm_bz);", "      }"]
        stack = FIBER_STACK_BASE + 2 * reg_bytes
        entry = [
            f"typedef struct {{ {' '.join(fields) or 'int tm_unused;'} }} {struct};",
            "\n".join(thread),
            f"int {entry_name(f.name)}({', '.join(self.entry_params(f, g)) or 'void'}) {{",
            f"  {struct} tm_A = {{ {', '.join(arg_names) or '0'} }};",
            "  const long tm_dims[6] = { " + ", ".join(f"(long)({d})" for d in dims) + " };",
            "  for (int tm_i = 0; tm_i < 6; ++tm_i) if (tm_dims[tm_i] <= 0) return TM_ERR_LAUNCH;",
            "  const long tm_nblocks = tm_dims[0] * tm_dims[1] * tm_dims[2];",
            "  const int tm_nthreads = (int)(tm_dims[3] * tm_dims[4] * tm_dims[5]);",
            "  int tm_status = TM_OK;",
            "  #pragma omp parallel",
            "  {",
            f"    char *tm_smem = {'(char *)aligned_alloc(64, ' + str((smem + 63) // 64 * 64) + ')' if smem else 'NULL'};",
            "    tm_sched tm_sched_;",
            f"    int tm_ok = {'tm_smem != NULL' if smem else '1'};",
            f"    if (tm_ok && {int(has_barrier)}) tm_ok = tm_sched_init(&tm_sched_, tm_nthreads, {stack}, "
            f"{self.target.warp_size}, {needs}) == TM_OK;",
            "    if (!tm_ok) {",
            "      #pragma omp atomic write",
            "      tm_status = TM_ERR_ALLOC;",
            "    }",
            "    #pragma omp for schedule(dynamic, 1)",
            "    for (long tm_b = 0; tm_b < tm_nblocks; ++tm_b) {",
            "      if (!tm_ok) continue;",
            "      for (int tm_i = 0; tm_i < 3; ++tm_i) { tm_tls.gdim[tm_i] = (int)tm_dims[tm_i]; tm_tls.bdim[tm_i] = (int)tm_dims[3 + tm_i]; }",
            "      tm_tls.bid[0] = (int)(tm_b % tm_dims[0]); tm_tls.bid[1] = (int)((tm_b / tm_dims[0]) % tm_dims[1]);",
            "      tm_tls.bid[2] = (int)(tm_b / (tm_dims[0] * tm_dims[1]));",
            "      tm_tls.smem = tm_smem;",
            "      tm_tls.status = &tm_status;",
            *run,
            "    }",
            f"    if (tm_ok && {int(has_barrier)}) tm_sched_free(&tm_sched_);",
            "    tm_tls.status = NULL;",
            "    free(tm_smem);",
            "  }",
            "  return tm_status;",
            "}",
        ]
        return "\n".join(entry)


def render_c(module: Module, target: Target) -> str:
    return CGen(module, target).render()


__all__ = ["render_c", "CGen", "FIBER_STACK_BASE"]
