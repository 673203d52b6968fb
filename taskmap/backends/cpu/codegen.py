"""Render a lowered IR module as C (gcc + OpenMP).

CPU kernels become plain C functions: parallel loops are ``omp parallel for``, vectorized loops
``omp simd``, unrolled loops ``GCC unroll``.  GPU kernels run with GPU semantics (see
``runtime_c``): a thread function per kernel, blocks spread over cores, and the threads of a
block executed either one after another (no barrier anywhere) or as fibers switching at each
``syncthreads()``.  Every module gets one exported entry ``tm_entry_<kernel>`` taking the
kernel's parameters followed by its symbolic sizes, and returning a status code.
"""
from __future__ import annotations

from ...errors import UnsupportedError
from ...ir import expr as E
from ...ir import stmt as S
from ...ir.dtypes import ScalarType, bf16, f16, f32, f64
from ...ir.func import FuncKind, Function, Module
from ...ir.functor import collect
from ...ir.types import MemScope, TensorType
from ..base import Target
from .cnames import CNames, ctype, entry_name, scalar_abi_type
from .runtime_c import RUNTIME_C

_FLOAT_FN = {  # intrinsic -> (f32 name, f64 name)
    E.Intrinsic.EXP: ("expf", "exp"), E.Intrinsic.EXP2: ("exp2f", "exp2"), E.Intrinsic.LOG: ("logf", "log"),
    E.Intrinsic.LOG2: ("log2f", "log2"), E.Intrinsic.SQRT: ("sqrtf", "sqrt"), E.Intrinsic.TANH: ("tanhf", "tanh"),
    E.Intrinsic.ERF: ("erff", "erf"), E.Intrinsic.ABS: ("fabsf", "fabs"), E.Intrinsic.SIN: ("sinf", "sin"),
    E.Intrinsic.COS: ("cosf", "cos"), E.Intrinsic.FLOOR: ("floorf", "floor"), E.Intrinsic.CEIL: ("ceilf", "ceil"),
    E.Intrinsic.ROUND: ("nearbyintf", "nearbyint"), E.Intrinsic.POW: ("powf", "pow"), E.Intrinsic.FMA: ("fmaf", "fma"),
}
_SPECIAL_FIELD = {E.SpecialReg.THREAD_IDX: "tid", E.SpecialReg.BLOCK_IDX: "bid",
                  E.SpecialReg.BLOCK_DIM: "bdim", E.SpecialReg.GRID_DIM: "gdim"}
#: Bytes of fiber stack reserved beyond a kernel's register tensors.
FIBER_STACK_BASE = 64 * 1024


def _c_float(v: float, t: ScalarType) -> str:
    if v != v:
        return "NAN" if t is f64 else "((float)NAN)"
    if v in (float("inf"), float("-inf")):
        s = "INFINITY" if v > 0 else "(-INFINITY)"
        return s
    text = repr(float(v))
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    if t is f64:
        return text
    if t is f16:
        return f"((_Float16){text}f)"
    return text + "f"


class _FuncGen:
    """Renders one function; ``nonneg`` tracks loop variables known to be ≥ 0."""

    def __init__(self, gen: "CGen", func: Function) -> None:
        self.gen = gen
        self.func = func
        self.names = CNames()
        self.nonneg: set[int] = set()
        self.lines: list[str] = []
        self.gpu_body = func.kind is FuncKind.GPU_KERNEL
        for sv in func.size_vars:
            self.names.size(sv.name)

    # --------------------------------------------------------------------------- expressions
    def is_nonneg(self, e: E.Expr) -> bool:
        if isinstance(e, E.Const):
            return e.value >= 0
        if isinstance(e, (E.Special, E.SizeVar)):
            return True
        if isinstance(e, E.Var):
            return id(e) in self.nonneg or e.dtype.kind.value == "uint"
        if isinstance(e, E.Binary) and e.op in (E.BinOp.ADD, E.BinOp.MUL, E.BinOp.FLOORDIV, E.BinOp.MOD,
                                                 E.BinOp.MIN, E.BinOp.MAX, E.BinOp.SHR, E.BinOp.BITAND):
            return self.is_nonneg(e.a) and self.is_nonneg(e.b)
        if isinstance(e, E.Cast):  # only casts that keep every non-negative value of the source
            src, dst = e.a.dtype, e.type
            if not (dst.is_integer and src.is_integer and self.is_nonneg(e.a)):
                return False
            return dst.kind.value == "uint" or dst.nbytes > src.nbytes or (dst.nbytes == src.nbytes and src.is_signed)
        return False

    def special(self, e: E.Special) -> str:
        f = _SPECIAL_FIELD[e.reg]
        if self.gpu_body and e.reg in (E.SpecialReg.THREAD_IDX, E.SpecialReg.BLOCK_IDX):
            return f"tm_{f}{'xyz'[e.dim]}"
        return f"tm_tls.{f}[{e.dim}]"

    def expr(self, e: E.Expr) -> str:  # noqa: C901 - one dispatch over node kinds
        if isinstance(e, E.Const):
            if e.dtype.is_bool:
                return "true" if e.value else "false"
            if e.dtype.is_float:
                return _c_float(e.value, e.dtype if e.dtype is not bf16 else f32)
            suffix = {8: "LL", 4: ""}.get(e.dtype.nbytes, "")
            if e.dtype.kind.value == "uint":
                suffix = "u" + suffix
            return f"{e.value}{suffix}" if e.value >= 0 else f"({e.value}{suffix})"
        if isinstance(e, E.Var):
            return self.names(e)
        if isinstance(e, E.SizeVar):
            return self.names.size(e.name)
        if isinstance(e, E.Special):
            return self.special(e)
        if isinstance(e, E.Binary):
            return _wrap_narrow(self.binary(e), e.dtype)
        if isinstance(e, E.Compare):
            return f"({self.expr(e.a)} {e.op.value} {self.expr(e.b)})"
        if isinstance(e, E.Unary):
            op = {E.UnOp.NEG: "-", E.UnOp.NOT: "!", E.UnOp.BITNOT: "~"}[e.op]
            return _wrap_narrow(f"({op}{self.expr(e.a)})", e.dtype)
        if isinstance(e, E.Cast):
            return self.cast(self.expr(e.a), e.a.dtype, e.type)
        if isinstance(e, E.Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, E.Load):
            ref = f"{self.names(e.tensor)}[{self.expr(e.indices[0])}]"
            return f"tm_bf16_to_f32({ref})" if e.dtype is bf16 else ref
        if isinstance(e, E.Call):
            return self.call(e)
        if isinstance(e, E.CallFunc):
            callee = self.gen.module.lookup(e.name)
            args = [self.expr(a) for a in e.args]
            args += [self.expr(sv) for sv in callee.size_vars[len(e.args) - len(callee.params):]]
            return f"{self.gen.func_name(e.name)}({', '.join(args)})"
        raise UnsupportedError(f"C backend cannot render {type(e).__name__}")

    def cast(self, text: str, src: ScalarType, dst: ScalarType) -> str:
        if dst.is_bool:
            return f"({text} != 0)"
        if dst is bf16:
            return f"tm_round_bf16((float)({text}))"
        return f"(({ctype(dst)})({text}))"

    def binary(self, e: E.Binary) -> str:
        a, b, t = self.expr(e.a), self.expr(e.b), e.dtype
        op = e.op
        if op in (E.BinOp.FLOORDIV, E.BinOp.MOD):
            if t.is_float:
                if op is E.BinOp.MOD:
                    return f"tm_fmod_{'f64' if t is f64 else 'f32'}({a}, {b})"
                return f"{'floor' if t is f64 else 'floorf'}({a} / {b})"
            if t.kind.value == "uint" or (self.is_nonneg(e.a) and self.is_nonneg(e.b)):
                return f"({a} {'/' if op is E.BinOp.FLOORDIV else '%'} {b})"
            fn = "fdiv" if op is E.BinOp.FLOORDIV else "fmod"
            return f"tm_{fn}_{'i64' if t.nbytes == 8 else 'i32'}({a}, {b})"
        if op is E.BinOp.DIV and not (e.a.dtype.is_float and e.b.dtype.is_float):
            return f"(({ctype(t)}){a} / ({ctype(t)}){b})"
        if op in (E.BinOp.MIN, E.BinOp.MAX):
            if t.is_float:
                name = ("fmin" if op is E.BinOp.MIN else "fmax") + ("" if t is f64 else "f")
                return f"(({ctype(t)}){name}({a}, {b}))"
            cmp = "<" if op is E.BinOp.MIN else ">"
            return f"(({a}) {cmp} ({b}) ? ({a}) : ({b}))"
        c_op = {E.BinOp.AND: "&&", E.BinOp.OR: "||"}.get(op, op.value)
        return f"({a} {c_op} {b})"

    def call(self, e: E.Call) -> str:
        t = e.dtype
        args = [self.expr(a) for a in e.args]
        if t.is_integer and e.fn is E.Intrinsic.ABS:
            return f"(({args[0]}) < 0 ? -({args[0]}) : ({args[0]}))"
        wide = t is f64
        cargs = ", ".join(a if wide else f"(float)({a})" for a in args)
        if e.fn is E.Intrinsic.RSQRT:
            text = f"(1.0 / sqrt({cargs}))" if wide else f"(1.0f / sqrtf({cargs}))"
        else:
            text = f"{_FLOAT_FN[e.fn][1 if wide else 0]}({cargs})"
        return text if t in (f32, f64, bf16) else f"(({ctype(t)}){text})"

    # ---------------------------------------------------------------------------- statements
    def emit(self, line: str, depth: int) -> None:
        self.lines.append("  " * depth + line)

    def store_value(self, tensor: E.Var, value: E.Expr) -> str:
        text = self.expr(value)
        if tensor.dtype is bf16:
            return f"tm_f32_to_bf16({text})"
        if value.dtype is not tensor.dtype:
            return self.cast(text, value.dtype, tensor.dtype)
        return text

    def stmt(self, s: S.Stmt, d: int) -> None:  # noqa: C901 - one dispatch over node kinds
        if isinstance(s, S.Seq):
            for c in s.stmts:
                self.stmt(c, d)
        elif isinstance(s, S.Evaluate):
            self.emit(self.expr(s.expr) + ";", d)
        elif isinstance(s, S.DeclScalar):
            init = "" if s.init is None else " = " + self.cast(self.expr(s.init), s.init.dtype, s.var.type)
            self.emit(f"{ctype(s.var.type)} {self.names(s.var)}{init};", d)
        elif isinstance(s, S.DeclTensor):
            self.decl_tensor(s, d)
        elif isinstance(s, S.Assign):
            self.emit(f"{self.names(s.var)} = {self.cast(self.expr(s.value), s.value.dtype, s.var.type)};", d)
        elif isinstance(s, S.Store):
            self.emit(f"{self.names(s.tensor)}[{self.expr(s.indices[0])}] = {self.store_value(s.tensor, s.value)};", d)
        elif isinstance(s, S.For):
            self.for_(s, d)
        elif isinstance(s, S.If):
            self.emit(f"if ({self.expr(s.cond)}) {{", d)
            self.stmt(s.then, d + 1)
            if s.else_ is not None:
                self.emit("} else {", d)
                self.stmt(s.else_, d + 1)
            self.emit("}", d)
        elif isinstance(s, S.While):
            self.emit(f"while ({self.expr(s.cond)}) {{", d)
            self.stmt(s.body, d + 1)
            self.emit("}", d)
        elif isinstance(s, S.Break):
            self.emit("break;", d)
        elif isinstance(s, S.Continue):
            self.emit("continue;", d)
        elif isinstance(s, S.Return):
            value = "" if s.value is None else " " + self.cast(self.expr(s.value), s.value.dtype, self.func.ret)
            self.emit(f"return{value};", d)
        elif isinstance(s, S.Barrier):
            self.emit("tm_barrier();", d)
        else:
            raise UnsupportedError(f"C backend cannot render {type(s).__name__} (was the module lowered?)")

    def check_independent(self, s: S.For, what: str) -> None:
        why = _omp_conflict(s)
        if why is not None:
            raise UnsupportedError(f"{self.func.name}: the {what} loop over '{s.var.name}' {why}")

    def decl_tensor(self, s: S.DeclTensor, d: int) -> None:
        t: TensorType = s.var.type
        name = self.names(s.var)
        storage = "uint16_t" if t.dtype is bf16 else ctype(t.dtype)
        if t.scope is MemScope.SHARED:
            if self.func.kind is not FuncKind.GPU_KERNEL:
                raise UnsupportedError(f"shared tensor {s.var.name} outside a GPU kernel ({self.func.name})")
            offset = self.gen.smem_offsets[id(s.var)]
            self.emit(f"{storage} *{name} = ({storage} *)(tm_tls.smem + {offset});", d)
        else:
            self.emit(f"{storage} {name}[{_numel(t)}];", d)

    def for_(self, s: S.For, d: int) -> None:
        v = self.names(s.var)
        if self.is_nonneg(s.start) and s.step > 0:
            self.nonneg.add(id(s.var))
        if s.kind is S.ForKind.PARALLEL and not self.gpu_body and self.func.kind is FuncKind.CPU_KERNEL:
            self.check_independent(s, "parallel")
            self.emit("#pragma omp parallel for schedule(static)", d)
        elif s.kind is S.ForKind.VECTORIZE:
            self.check_independent(s, "vectorized")
            self.emit("#pragma omp simd", d)
        elif s.kind is S.ForKind.UNROLL:
            extent = _const_extent(s)
            self.emit(f"#pragma GCC unroll {min(extent, 128) if extent else 8}", d)
        cmp = "<" if s.step > 0 else ">"
        step = "++" if s.step == 1 else f" += {s.step}"
        self.emit(f"for ({ctype(s.var.type)} {v} = {self.expr(s.start)}; {v} {cmp} {self.expr(s.stop)}; {v}{step}) {{", d)
        self.stmt(s.body, d + 1)
        self.emit("}", d)


def _wrap_narrow(text: str, t: ScalarType) -> str:
    """C computes 8- and 16-bit integer arithmetic in ``int``: wrap the result to its IR type."""
    return f"(({ctype(t)}){text})" if t.is_integer and t.nbytes < 4 else text


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


def _numel(t: TensorType) -> int:
    n = 1
    for s in t.shape:
        if not isinstance(s, E.Const):
            raise UnsupportedError(f"shared/register tensors need constant shapes, got {t!r}")
        n *= s.value
    return n


def _const_extent(s: S.For) -> int | None:
    if isinstance(s.start, E.Const) and isinstance(s.stop, E.Const):
        return max(0, -(-(s.stop.value - s.start.value) // s.step))
    return None


def _param_decl(names: CNames, p: E.Var, written: set[int]) -> str:
    if isinstance(p.type, TensorType):
        storage = "uint16_t" if p.type.dtype is bf16 else ctype(p.type.dtype)
        const = "" if id(p) in written else "const "
        return f"{const}{storage} *{names(p)}"
    return f"{ctype(p.type)} {names(p)}"


class CGen:
    """Renders a whole module; GPU kernels get a thread function and a block-launching entry."""

    def __init__(self, module: Module, target: Target) -> None:
        self.module = module
        self.target = target
        self.smem_offsets: dict[int, int] = {}
        self.written = {id(s.tensor) for f in module.functions for s in collect(f.body, S.Store)}

    def func_name(self, name: str) -> str:
        return f"tm_fn_{name}"

    def render(self) -> str:
        out = [RUNTIME_C]
        helpers = [f for f in self.module.functions if f.name != self.module.entry]
        for f in helpers:
            out.append(self.signature(f, _FuncGen(self, f)) + ";")
        for f in helpers:
            out.append(self.function(f))
        entry = self.module.entry_function
        if entry.kind is FuncKind.GPU_KERNEL:
            out.append(self.gpu_kernel(entry))
        elif entry.kind is FuncKind.CPU_KERNEL:
            out.append(self.cpu_kernel(entry))
        else:
            raise UnsupportedError(f"cannot launch a {entry.kind.value} function ({entry.name})")
        return "\n\n".join(out) + "\n"

    def signature(self, f: Function, g: _FuncGen) -> str:
        params = [_param_decl(g.names, p, self.written) for p in f.params]
        params += [f"int32_t {g.names.size(sv.name)}" for sv in f.size_vars]  # the caller's sizes, by name
        params = ", ".join(params) or "void"
        ret = ctype(f.ret) if f.ret is not None else "void"
        return f"static inline {ret} {self.func_name(f.name)}({params})"

    def function(self, f: Function) -> str:
        g = _FuncGen(self, f)
        head = self.signature(f, g) + " {"
        g.stmt(f.body, 1)
        return "\n".join([head, *g.lines, "}"])

    def entry_params(self, f: Function, g: _FuncGen) -> list[str]:
        params = []
        for p in f.params:
            if isinstance(p.type, TensorType):
                params.append(_param_decl(g.names, p, self.written))
            else:
                params.append(f"{scalar_abi_type(p.type)} {g.names(p)}")
        params += [f"int32_t {g.names.size(sv.name)}" for sv in f.size_vars]
        return params

    def cpu_kernel(self, f: Function) -> str:
        g = _FuncGen(self, f)
        g.stmt(f.body, 1)
        params = ", ".join(self.entry_params(f, g)) or "void"
        return "\n".join([f"int {entry_name(f.name)}({params}) {{", *g.lines, "  return TM_OK;", "}"])

    def gpu_kernel(self, f: Function) -> str:
        """Thread function + entry running the grid; threads are fibers if there are barriers."""
        g = _FuncGen(self, f)
        smem = 0
        reg_bytes = 0
        for decl in collect(f.body, S.DeclTensor):
            t = decl.var.type
            nbytes = _numel(t) * (2 if t.dtype is bf16 else t.dtype.nbytes)
            if t.scope is MemScope.SHARED:
                smem = (smem + 15) // 16 * 16
                self.smem_offsets[id(decl.var)] = smem
                smem += nbytes
            else:
                reg_bytes += nbytes
        for h in self.module.functions:  # helpers' register tensors live on the fiber stacks too
            if h is not f:
                reg_bytes += sum(_numel(x.var.type) * (2 if x.var.type.dtype is bf16 else x.var.type.dtype.nbytes)
                                 for x in collect(h.body, S.DeclTensor) if x.var.type.scope is MemScope.REGISTER)
        g.stmt(f.body, 1)
        has_barrier = bool(collect(f.body, S.Barrier)) or any(
            collect(h.body, S.Barrier) for h in self.module.functions if h is not f)
        arg_names = [g.names(p) for p in f.params] + [g.names.size(sv.name) for sv in f.size_vars]
        fields = [_param_decl(g.names, p, self.written) + ";" for p in f.params]
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
            f"    if (tm_ok && {int(has_barrier)}) tm_ok = tm_sched_init(&tm_sched_, tm_nthreads, {stack}) == TM_OK;",
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
            *run,
            "    }",
            f"    if (tm_ok && {int(has_barrier)}) tm_sched_free(&tm_sched_);",
            "    free(tm_smem);",
            "  }",
            "  return tm_status;",
            "}",
        ]
        return "\n".join(entry)


def render_c(module: Module, target: Target) -> str:
    return CGen(module, target).render()


__all__ = ["render_c", "CGen", "FIBER_STACK_BASE"]
