"""The C-like renderer shared by the backends (C for the CPU, CUDA, HIP).

:class:`CLikeFuncGen` renders one lowered function's statements and expressions; a backend
subclasses it for its dialect (value types, thread indices, shared memory, barriers, loop
pragmas) and assembles the module around the rendered functions.
"""
from __future__ import annotations

import re
from typing import Any

from ..errors import UnsupportedError
from ..ir import expr as E
from ..ir.expr import Var
from ..ir import stmt as S
from ..ir.dtypes import ScalarType, bf16, f32, f64
from ..ir.func import FuncKind, Function, Module
from ..ir.functor import collect, written_tensors as _written_under
from ..ir.primitives import WGMMA_OPS, Prim, PrimCall
from ..ir.types import MemScope, TensorType

_CTYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "float16": "_Float16", "bfloat16": "float", "float32": "float", "float64": "double",
}
_FLOAT_FN = {  # intrinsic -> (f32 name, f64 name)
    E.Intrinsic.EXP: ("expf", "exp"), E.Intrinsic.EXP2: ("exp2f", "exp2"), E.Intrinsic.LOG: ("logf", "log"),
    E.Intrinsic.LOG2: ("log2f", "log2"), E.Intrinsic.SQRT: ("sqrtf", "sqrt"), E.Intrinsic.TANH: ("tanhf", "tanh"),
    E.Intrinsic.ERF: ("erff", "erf"), E.Intrinsic.ABS: ("fabsf", "fabs"), E.Intrinsic.SIN: ("sinf", "sin"),
    E.Intrinsic.COS: ("cosf", "cos"), E.Intrinsic.FLOOR: ("floorf", "floor"), E.Intrinsic.CEIL: ("ceilf", "ceil"),
    E.Intrinsic.ROUND: ("nearbyintf", "nearbyint"), E.Intrinsic.POW: ("powf", "pow"), E.Intrinsic.FMA: ("fmaf", "fma"),
    E.Intrinsic.TRUNC: ("truncf", "trunc"), E.Intrinsic.FMOD: ("fmodf", "fmod"),
    E.Intrinsic.EXPM1: ("expm1f", "expm1"), E.Intrinsic.LOG1P: ("log1pf", "log1p"),
    E.Intrinsic.ATAN2: ("atan2f", "atan2"), E.Intrinsic.LGAMMA: ("lgammaf", "lgamma"),
    E.Intrinsic.TAN: ("tanf", "tan"),
    E.Intrinsic.ASIN: ("asinf", "asin"),
    E.Intrinsic.ACOS: ("acosf", "acos"),
    E.Intrinsic.ATAN: ("atanf", "atan"),
    E.Intrinsic.SINH: ("sinhf", "sinh"),
    E.Intrinsic.COSH: ("coshf", "cosh"),
    E.Intrinsic.ASINH: ("asinhf", "asinh"),
    E.Intrinsic.ACOSH: ("acoshf", "acosh"),
    E.Intrinsic.ATANH: ("atanhf", "atanh"),
}
_C_KEYWORDS = frozenset("""auto break case char const continue default do double else enum extern float for
goto if inline int long register restrict return short signed sizeof static struct switch typedef union
unsigned void volatile while bool true false main NAN INFINITY
""".split())
#: Identifiers the generated code calls or names inside functions that also hold user names: a
#: parameter called ``exp`` or ``free`` must not shadow them.
C_RESERVED = _C_KEYWORDS | frozenset("""exp expf exp2 exp2f log logf log2 log2f sqrt sqrtf tanh tanhf erf erff
fabs fabsf sin sinf cos cosf floor floorf ceil ceilf nearbyint nearbyintf pow powf fma fmaf fmin fminf fmax fmaxf
fmod fmodf trunc truncf expm1 expm1f log1p log1pf free malloc calloc aligned_alloc memset memcpy mmap munmap
atan2 atan2f lgamma lgammaf tan tanf asin asinf acos acosf atan atanf sinh sinhf cosh coshf asinh asinhf
acosh acoshf atanh atanhf
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t uintptr_t size_t
""".split())




def func_name(name: str) -> str:
    """The C name of a helper function of the module."""
    return f"tm_fn_{name}"


class CNames:
    """Unique, valid C identifiers for IR variables and symbolic sizes."""

    def __init__(self, reserved: frozenset[str] = frozenset()) -> None:
        self._reserved = reserved
        self._by_id: dict[int, str] = {}
        self._sizes: dict[str, str] = {}
        self._used: set[str] = set()
        self._keep: list[Var] = []

    def _fresh(self, base: str) -> str:
        base = re.sub(r"\W", "_", base) or "v"
        reserved_prefix = base.lower().startswith("tm_") or (base[0] == "_" and base[1:2].isupper()) \
            or base.startswith("__")
        if base[0].isdigit() or base in self._reserved or reserved_prefix:
            base = "v_" + base
        name, k = base, 0
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name

    def __call__(self, v: Var) -> str:
        name = self._by_id.get(id(v))
        if name is None:
            name = self._by_id[id(v)] = self._fresh(v.name)
            self._keep.append(v)
        return name

    def size(self, name: str) -> str:
        c = self._sizes.get(name)
        if c is None:
            c = self._sizes[name] = self._fresh(name)
        return c


class CLikeFuncGen:
    """Renders one function as C-like code; subclasses supply the dialect (types, specials,
    shared memory, barriers, loop pragmas).  ``nonneg`` tracks loop variables known to be ≥ 0."""

    #: Value type of each scalar type (bf16 values are computed in float, stored as uint16).
    TYPES: dict[str, str] = _CTYPES
    #: Names of float math functions: intrinsic -> (f32 name, f64 name).
    MATH: dict[E.Intrinsic, tuple[str, str]] = _FLOAT_FN
    #: Names of float min and max (C's ``fmin`` / ``fmax``; an ``f`` suffix for f32).
    MIN_MAX = ("fmin", "fmax")

    def __init__(self, gen: Any, func: Function) -> None:
        self.gen = gen
        self.func = func
        self.names = CNames(self.RESERVED)
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

    # ------------------------------------------------------------------- dialect hooks
    RESERVED: frozenset[str] = C_RESERVED

    def ctype(self, t: ScalarType) -> str:
        return self.TYPES[t.name]

    def storage_ctype(self, t: ScalarType) -> str:
        """Element type of tensors in memory."""
        return "uint16_t" if t is bf16 else self.ctype(t)

    def float_const(self, text: str, t: ScalarType) -> str:
        return text if t is f64 else text + "f"

    def special(self, e: E.Special) -> str:
        raise NotImplementedError

    def prim(self, e: PrimCall) -> str:
        """A GPU primitive (shuffles, atomics, copies, mma), in the backend's dialect."""
        raise UnsupportedError(f"{self.func.name}: {e.op.spec.name}() is not supported by this backend")

    def ref(self, load: E.Load) -> str:
        """The address of an element reference (a primitive's memory operand)."""
        return f"(&{self.names(load.tensor)}[{self.expr(load.indices[0])}])"

    def linear_tid(self) -> E.Expr:
        """The thread's linear index in its block (x fastest), as an IR expression."""
        tid = [E.Special(E.SpecialReg.THREAD_IDX, d) for d in range(3)]
        launch = self.func.launch if self.func.kind is FuncKind.GPU_KERNEL else None
        dims = list(launch.block_dim) if launch is not None else \
            [E.Special(E.SpecialReg.BLOCK_DIM, d) for d in range(3)]
        one = lambda d: isinstance(d, E.Const) and d.value == 1  # noqa: E731
        if one(dims[1]) and one(dims[2]):
            return tid[0]
        return tid[0] + tid[1] * dims[0] + tid[2] * (dims[0] * dims[1])

    def warp_special(self, e: E.Special) -> str:
        """``lane_id()``, ``warp_id()``, ``warp_size()`` with the target's warp size (32 or 64, which
        the simplifier assumes)."""
        w = self.gen.target.warp_size
        if w not in (32, 64):
            raise UnsupportedError(f"warp size {w} of {self.gen.target.name}: warp primitives need 32 or 64")
        if e.reg is E.SpecialReg.WARP_SIZE:
            return str(w)
        linear = self.linear_tid()
        if e.reg is E.SpecialReg.LANE_ID:
            return self.expr(E.Binary(E.BinOp.BITAND, linear, E.const(w - 1)))
        return self.expr(E.Binary(E.BinOp.SHR, linear, E.const(w.bit_length() - 1)))

    def barrier(self) -> str:
        raise NotImplementedError

    def decl_tensor(self, s: S.DeclTensor, d: int) -> None:
        raise NotImplementedError

    def loop_pragmas(self, s: S.For) -> list[str]:
        return []

    def param_decl(self, p: Var, written: set[int]) -> str:
        """A parameter: tensors are pointers (``const`` unless the module stores to them)."""
        if isinstance(p.type, TensorType):
            const = "" if id(p) in written else "const "
            return f"{const}{self.storage_ctype(p.type.dtype)} *{self.names(p)}"
        return f"{self.ctype(p.type)} {self.names(p)}"

    def const_float(self, v: float, t: ScalarType) -> str:
        if v != v:
            return "NAN" if t is f64 else "((float)NAN)"
        if v in (float("inf"), float("-inf")):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(float(v))
        if "e" not in text and "." not in text:
            text += ".0"
        return self.float_const(text, t)

    def wrap_narrow(self, text: str, t: ScalarType) -> str:
        """C computes 8- and 16-bit integer arithmetic in ``int``: wrap the result to its IR type."""
        return f"(({self.ctype(t)}){text})" if t.is_integer and t.nbytes < 4 else text

    def expr(self, e: E.Expr) -> str:  # noqa: C901 - one dispatch over node kinds
        if isinstance(e, E.Const):
            if e.dtype.is_bool:
                return "true" if e.value else "false"
            if e.dtype.is_float:
                return self.const_float(e.value, e.dtype if e.dtype is not bf16 else f32)
            suffix = {8: "LL", 4: ""}.get(e.dtype.nbytes, "")
            if e.dtype.kind.value == "uint":
                suffix = "u" + suffix
            return f"{e.value}{suffix}" if e.value >= 0 else f"({e.value}{suffix})"
        if isinstance(e, E.Var):
            return self.names(e)
        if isinstance(e, E.SizeVar):
            return self.names.size(e.name)
        if isinstance(e, E.Special):
            return self.warp_special(e) if e.reg.is_warp else self.special(e)
        if isinstance(e, PrimCall):
            return self.prim(e)
        if isinstance(e, E.Binary):
            return self.wrap_narrow(self.binary(e), e.dtype)
        if isinstance(e, E.Compare):
            return f"({self.expr(e.a)} {e.op.value} {self.expr(e.b)})"
        if isinstance(e, E.Unary):
            op = {E.UnOp.NEG: "-", E.UnOp.NOT: "!", E.UnOp.BITNOT: "~"}[e.op]
            return self.wrap_narrow(f"({op}{self.expr(e.a)})", e.dtype)
        if isinstance(e, E.Cast):
            return self.cast(self.expr(e.a), e.a.dtype, e.type)
        if isinstance(e, E.BitCast):
            return self.bitcast(self.expr(e.a), e.a.dtype, e.type)
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
            return f"{func_name(e.name)}({', '.join(args)})"
        raise UnsupportedError(f"C backend cannot render {type(e).__name__}")

    def cast(self, text: str, src: ScalarType, dst: ScalarType) -> str:
        if dst.is_bool:
            return f"({text} != 0)"
        if dst is bf16:
            return f"tm_round_bf16((float)({text}))"
        return f"(({self.ctype(dst)})({text}))"

    #: Float type name -> (function giving its bits as the unsigned integer of its size, function
    #: giving the float of such bits), in the dialect: the bit-cast of each float type.
    FLOAT_BITS: dict[str, tuple[str, str]] = {}

    def bitcast(self, text: str, src: ScalarType, dst: ScalarType) -> str:
        """``text``'s bits read as ``dst``: through the unsigned integer of the size (bf16 values are
        floats holding a bf16, so their bits are the top half of the f32's)."""
        if src is dst:
            return text
        if src.is_integer:
            bits = f"(({self.TYPES['uint' + str(8 * src.nbytes)]})({text}))" if src.kind.value == "int" else text
        elif src is bf16:
            bits = f"tm_f32_to_bf16({text})"
        else:
            bits = f"{self._float_bits(src)[0]}({text})"
        if dst.is_integer:
            return f"(({self.ctype(dst)}){bits})" if dst.kind.value == "int" else bits
        if dst is bf16:
            return f"tm_bf16_to_f32({bits})"
        return f"{self._float_bits(dst)[1]}({bits})"

    def _float_bits(self, t: ScalarType) -> tuple[str, str]:
        fns = self.FLOAT_BITS.get(t.name)
        if fns is None:
            raise UnsupportedError(f"{self.func.name}: this backend cannot bit-cast {t!r}")
        return fns

    def binary(self, e: E.Binary) -> str:
        a, b, t = self.expr(e.a), self.expr(e.b), e.dtype
        op = e.op
        if op in (E.BinOp.FLOORDIV, E.BinOp.MOD):
            if t.is_float:
                if op is E.BinOp.MOD:
                    return f"tm_fmod_{'f64' if t is f64 else 'f32'}({a}, {b})"
                return f"{'floor' if t is f64 else 'floorf'}({a} / {b})"
            nonzero = isinstance(e.b, E.Const) and e.b.value != 0
            if nonzero and (t.kind.value == "uint" or (self.is_nonneg(e.a) and self.is_nonneg(e.b))):
                return f"({a} {'/' if op is E.BinOp.FLOORDIV else '%'} {b})"
            if t.kind.value == "uint":  # a zero divisor must not trap on the CPU
                return f"({b} == 0 ? ({self.ctype(t)})0 : ({a} {'/' if op is E.BinOp.FLOORDIV else '%'} {b}))"
            fn = "fdiv" if op is E.BinOp.FLOORDIV else "fmod"
            return f"tm_{fn}_{'i64' if t.nbytes == 8 else 'i32'}({a}, {b})"
        if op is E.BinOp.DIV and not (e.a.dtype.is_float and e.b.dtype.is_float):
            return f"(({self.ctype(t)}){a} / ({self.ctype(t)}){b})"
        if op in (E.BinOp.MIN, E.BinOp.MAX):
            if t.is_float:
                name = self.MIN_MAX[op is E.BinOp.MAX] + ("" if t is f64 else "f")
                return f"(({self.ctype(t)}){name}({a}, {b}))"
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
        elif e.fn in (E.Intrinsic.SIGMOID, E.Intrinsic.SILU) and (wide or e.fn not in self.MATH):
            exp = self.MATH[E.Intrinsic.EXP][1 if wide else 0]
            top = f"({cargs})" if e.fn is E.Intrinsic.SILU else "1.0" if wide else "1.0f"
            text = f"({top} / (1.0 + {exp}(-({cargs}))))" if wide else f"({top} / (1.0f + {exp}(-({cargs}))))"
        else:
            text = f"{self.MATH[e.fn][1 if wide else 0]}({cargs})"
        return text if t in (f32, f64, bf16) else f"(({self.ctype(t)}){text})"

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
            self.emit(f"{self.ctype(s.var.type)} {self.names(s.var)}{init};", d)
        elif isinstance(s, S.DeclTensor):
            self.decl_tensor(s, d)
        elif isinstance(s, S.Assign):
            self.emit(f"{self.names(s.var)} = {self.cast(self.expr(s.value), s.value.dtype, s.var.type)};", d)
        elif isinstance(s, S.Store):
            self.store(s, d)
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
            self.emit(self.barrier(), d)
        else:
            raise UnsupportedError(f"C backend cannot render {type(s).__name__} (was the module lowered?)")

    def for_(self, s: S.For, d: int) -> None:
        v = self.names(s.var)
        if self.is_nonneg(s.start) and s.step > 0:
            self.nonneg.add(id(s.var))
        for line in self.loop_pragmas(s):
            self.emit(line, d)
        cmp = "<" if s.step > 0 else ">"
        step = "++" if s.step == 1 else f" += {s.step}"
        self.emit(f"for ({self.ctype(s.var.type)} {v} = {self.expr(s.start)}; {v} {cmp} {self.expr(s.stop)}; {v}{step}) {{", d)
        self.stmt(s.body, d + 1)
        for line in self.loop_tail(s):
            self.emit(line, d + 1)
        self.emit("}", d)

    def store(self, s: S.Store, d: int) -> None:
        self.emit(f"{self.names(s.tensor)}[{self.expr(s.indices[0])}] = {self.store_value(s.tensor, s.value)};", d)

    def loop_tail(self, s: S.For) -> list[str]:
        """Lines a backend ends every iteration of ``s`` with (none)."""
        return []


def numel(t: TensorType) -> int:
    n = 1
    for s in t.shape:
        if not isinstance(s, E.Const):
            raise UnsupportedError(f"shared/register tensors need constant shapes, got {t!r}")
        n *= s.value
    return n


def const_extent(s: S.For) -> int | None:
    if isinstance(s.start, E.Const) and isinstance(s.stop, E.Const):
        return max(0, -(-(s.stop.value - s.start.value) // s.step))
    return None


def element_bytes(t: TensorType) -> int:
    return 2 if t.dtype is bf16 else t.dtype.nbytes


#: Alignment of the shared buffer and of the tiles wgmma reads through its 128-byte swizzle.
SWIZZLE_ALIGN = 1024


def smem_layout(func: Function) -> tuple[dict[int, int], int]:
    """Byte offsets (by variable id) of a kernel's shared tensors in its one shared buffer, 16-byte
    aligned (1024 for the tiles ``wgmma`` reads and ``tma_load`` writes: their swizzle works on address bits), and the
    buffer's size.  The CPU and GPU backends and the launcher all use this."""
    offsets: dict[int, int] = {}
    total = 0
    calls = collect(func.body, PrimCall)
    swizzled = {id(c.args[i].tensor) for c in calls if c.op in WGMMA_OPS for i in (1, 2)}
    swizzled |= {id(c.args[0].tensor) for c in calls if c.op is Prim.TMA_LOAD}     # TMA: 128 (1024 swizzled)
    for decl in collect(func.body, S.DeclTensor):
        t = decl.var.type
        if t.scope is MemScope.SHARED:
            align = SWIZZLE_ALIGN if id(decl.var) in swizzled else 16
            total = (total + align - 1) // align * align
            offsets[id(decl.var)] = total
            total += numel(t) * element_bytes(t)
    return offsets, total


def written_tensors(module: Module) -> set[int]:
    """Ids of the tensor variables some function of ``module`` writes: stores, primitives' write
    operands, and tensors passed to a helper function that writes the parameter."""
    written = {id(t) for f in module.functions for t in _written_under(f.body)}
    calls = [c for f in module.functions for c in collect(f.body, E.CallFunc)]
    changed = True
    while changed:
        changed = False
        for c in calls:
            for p, a in zip(module.lookup(c.name).params, c.args):
                if id(p) in written and isinstance(a, Var) and a.is_tensor and id(a) not in written:
                    written.add(id(a))
                    changed = True
    return written
