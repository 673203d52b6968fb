"""The fusion pass: a scheduled anchor kernel + prologue / epilogue definitions -> a new kernel.

Steps (see the package docstring for the contract):

1. **check and bind sizes** — every fused parameter's shape is unified with its definition's:
   symbolic sizes the definitions give as ints are substituted everywhere in the module
   (:func:`specialize`), tensor variables retyped;
2. **plan** — per fused parameter a :class:`Fused` record: the definition inlined
   (:func:`taskmap.compute.analysis.inline`), the nodes that replace the parameter, and for an
   epilogue the inverse index map and the value with a hole where the anchor's value goes;
3. **splice**, function by function from the entry: :class:`Splicer` rewrites loads of prologue
   parameters, stores to epilogue parameters, vector copies touching them, and calls of helper
   functions that receive them (the helper is then spliced too, with the same plan, and its
   parameters replaced the same way at every call site — a helper that receives a fused tensor
   at one call site and another tensor at another is refused);
4. **hoist** loop-invariant dividing index arithmetic out of vector loops
   (:mod:`.hoist`), so that gcc vectorizes spliced loads as vector loads, not gathers.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, replace
from collections.abc import Mapping
from typing import Any

from ..compute.analysis import inline, inverse_index_map, is_injective
from ..compute.indexmap import IndexMap
from ..compute.nodes import TensorInput, TensorNode, dag_str, graph_inputs, walk
from ..errors import FusionError, IRError
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.func import Function, LaunchConfig, Module
from ..ir.functor import IRRewriter, collect, substitute
from ..ir.primitives import Prim, PrimCall
from ..ir.dtypes import i32
from ..ir.types import MemScope, TensorType, row_major
from ..ir.verify import verify
from ..runtime.kernel import Kernel
from .hoist import hoist_invariants

# ----------------------------------------------------------------------------- public entry points


def fusion_key(prologues: Mapping[str, TensorNode] | None, epilogues: Mapping[str, TensorNode] | None,
               sizes: Mapping[str, int] | None = None, placements: Mapping[str, "Placement"] | None = None) -> str:
    """A text that identifies the definitions structurally (names, dtypes, shapes, expressions)."""
    parts = []
    for tag, defs in (("prologue", prologues or {}), ("epilogue", epilogues or {})):
        for name in sorted(defs):
            parts.append(f"{tag} {name}:\n{dag_str(defs[name])}\n-> {defs[name].dtype!r}{defs[name]._shape_str()}")
    for name, pl in sorted((placements or {}).items()):
        parts.append(f"placement {name} {list(pl.shape)} at {list(pl.offset)} in {pl.into.name} "
                     f"{pl.into.dtype!r}{pl.into._shape_str()}")
    parts.append("sizes " + repr(sorted((sizes or {}).items())))
    return "\n".join(parts)


_MEMO: "weakref.WeakKeyDictionary[Kernel, dict[str, Kernel]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def fuse(anchor: Any, prologues: Mapping[str, TensorNode] | None = None,
         epilogues: Mapping[str, TensorNode] | None = None, sizes: Mapping[str, int] | None = None,
         placements: Mapping[str, "Placement"] | None = None) -> Kernel:
    """The anchor kernel with ``prologues`` spliced into the loads of the named input parameters,
    ``epilogues`` into the stores of the named output parameters and ``placements`` made (see
    :mod:`taskmap.fusion` and :func:`taskmap.fusion.place`).  Raises :class:`FusionError` when it
    cannot."""
    kernel = _single_kernel(anchor)
    prologues, epilogues, placements = dict(prologues or {}), dict(epilogues or {}), dict(placements or {})
    key = fusion_key(prologues, epilogues, sizes, placements)
    with _LOCK:
        hit = _MEMO.get(kernel, {}).get(key)
    if hit is not None:
        return hit
    module = splice(kernel.module, prologues, epilogues, dict(sizes or {}), placements)
    try:
        verify(module)
    except IRError as e:        # a case the checks above do not foresee: refuse rather than miscompile
        raise FusionError(f"the fused {kernel.__name__} does not verify: {e}") from None
    fused = Kernel(module)
    fused.__doc__ = f"{kernel.__name__} fused with:\n{key}"
    with _LOCK:
        return _MEMO.setdefault(kernel, {}).setdefault(key, fused)


def can_fuse(anchor: Any, prologues: Mapping[str, TensorNode] | None = None,
             epilogues: Mapping[str, TensorNode] | None = None,
             sizes: Mapping[str, int] | None = None) -> tuple[bool, str]:
    """``(True, "")`` when :func:`fuse` would succeed, else ``(False, reason)``; never raises
    :class:`FusionError`."""
    try:
        fuse(anchor, prologues, epilogues, sizes)
    except FusionError as e:
        return False, str(e)
    return True, ""


def _single_kernel(anchor: Any) -> Kernel:
    if isinstance(anchor, Kernel):
        return anchor
    kernels = getattr(anchor, "kernels", None)
    if kernels is not None:
        if len(kernels) == 1 and isinstance(kernels[0], Kernel):
            return kernels[0]
        raise FusionError(f"cannot fuse into the kernel chain {getattr(anchor, '__name__', anchor)!r} "
                          f"({len(kernels)} kernels, e.g. split-K): fuse into a single-kernel schedule")
    raise FusionError(f"the anchor must be a taskmap.Kernel, got {type(anchor).__name__}")


# ----------------------------------------------------------------------------- planning


@dataclass(eq=False)
class Fused:
    """What replaces one tensor parameter of the anchor."""

    param: str
    node: TensorNode
    epilogue: bool
    new_nodes: tuple[TensorNode, ...]     # the parameters taking its place
    axes: tuple[E.Var, ...]              # of the inlined value
    value: E.Expr                        # the definition inlined (epilogue: with ``hole``)
    hole: E.Var | None = None            # epilogue: stands for the value the anchor stores
    inv: IndexMap | None = None          # epilogue: anchor output index -> definition index


def _elements(shape: tuple[E.Expr, ...]) -> int | None:
    """The element count of a tensor type's shape; None when a dimension is symbolic."""
    n = 1
    for d in shape:
        if not isinstance(d, E.Const):
            return None
        n *= int(d.value)
    return n


def _dims_text(shape: Any) -> str:
    return "[" + ", ".join(repr(d) if not isinstance(d, int) else str(d) for d in shape) + "]"


def _bind_shape(what: str, ptype: TensorType, shape: tuple[Any, ...], env: dict[str, int]) -> None:
    if len(ptype.shape) != len(shape):
        raise FusionError(f"{what}: the parameter is {ptype!r} ({len(ptype.shape)}-D), the definition has shape "
                          f"{_dims_text(shape)}")
    for d, (pd, nd) in enumerate(zip(ptype.shape, shape)):
        if isinstance(nd, int):
            if isinstance(pd, E.Const):
                if int(pd.value) != nd:
                    raise FusionError(f"{what}: dimension {d} is {pd.value} in the kernel, {nd} in the definition")
            elif isinstance(pd, E.SizeVar):
                if env.setdefault(pd.name, nd) != nd:
                    raise FusionError(f"{what}: size '{pd.name}' would be both {env[pd.name]} and {nd}")
        elif not (isinstance(pd, E.SizeVar) and pd.name == nd.name) and not (
                isinstance(pd, E.SizeVar) and pd.name in env):
            raise FusionError(f"{what}: symbolic dimension {d} ({nd.name}) does not match the kernel's {pd!r}")


def _plan(entry: Function, prologues: dict[str, TensorNode], epilogues: dict[str, TensorNode],
          env: dict[str, int], placements: Mapping[str, "Placement"] | None = None) -> list[Fused]:
    params = {p.name: p for p in entry.params}
    plans = [_placement_plan(params[name], name, pl, env) for name, pl in (placements or {}).items()]
    for name, node in prologues.items():
        p = params[name]
        if node.dtype is not p.type.dtype:
            raise FusionError(f"prologue of '{name}': the definition gives {node.dtype!r}, the parameter is "
                              f"{p.type.dtype!r} (add a cast to the definition)")
        if not is_injective(node):
            raise FusionError(f"prologue of '{name}' ({node.name}) has a reduction: only injective definitions "
                              "can be inlined into an anchor's loads")
        inl = inline(node)
        plans.append(Fused(name, node, False, tuple(graph_inputs(node)), inl.axes, inl.value))
    for name, node in epilogues.items():
        p = params[name]
        srcs = [n for n in walk(node) if isinstance(n, TensorInput) and n.name == name]
        if not srcs:
            raise FusionError(f"epilogue of '{name}' ({node.name}) does not read a tensor_input named '{name}' "
                              "standing for the anchor's output")
        if len(srcs) > 1:
            raise FusionError(f"epilogue of '{name}' has several tensor_inputs named '{name}'")
        src = srcs[0]
        if node is src:
            raise FusionError(f"epilogue of '{name}' is the anchor's output itself: nothing to fuse")
        if src.dtype is not p.type.dtype:
            raise FusionError(f"epilogue of '{name}': tensor_input '{name}' is {src.dtype!r}, the anchor's output "
                              f"is {p.type.dtype!r}")
        _bind_shape(f"epilogue of '{name}' (its input '{name}')", p.type, src.shape, env)
        if not is_injective(node):
            raise FusionError(f"epilogue of '{name}' ({node.name}) has a reduction: not bijective")
        try:
            inv = inverse_index_map(node, src)
        except ValueError as e:
            raise FusionError(f"epilogue of '{name}': {e}") from None
        if inv is None:
            raise FusionError(f"epilogue of '{name}' ({node.name}) is not a bijective function of '{name}' (each "
                              f"element of the output must read exactly one element of '{name}', each once)")
        inl = inline(node)
        hole = E.Var(f"{name}_value", src.dtype)
        loads = {ld: hole for ld in collect(inl.value, E.Load) if ld.tensor is src.var}
        value = substitute(inl.value, loads)
        others = tuple(n for n in graph_inputs(node) if n is not src)
        plans.append(Fused(name, node, True, others + (node,), inl.axes, value, hole, inv))
    return plans


@dataclass(frozen=True)
class Placement:
    """An output parameter of ``shape`` written inside the larger tensor ``into`` instead: its element
    ``i`` at ``into[i + offset]`` (:func:`taskmap.fusion.place`)."""

    into: TensorNode
    offset: tuple[int, ...]
    shape: tuple[int, ...]


def _placement_plan(p: E.Var, name: str, pl: Placement, env: dict[str, int]) -> Fused:
    if pl.into.dtype is not p.type.dtype:
        raise FusionError(f"placement of '{name}': '{pl.into.name}' is {pl.into.dtype!r}, the parameter is "
                          f"{p.type.dtype!r}")
    if not (len(pl.offset) == len(pl.shape) == len(pl.into.shape)) or any(
            o < 0 or o + d > int(t) for o, d, t in zip(pl.offset, pl.shape, pl.into.shape)):
        raise FusionError(f"placement of '{name}': {list(pl.shape)} at {list(pl.offset)} is not inside "
                          f"'{pl.into.name}' {_dims_text(pl.into.shape)}")
    _bind_shape(f"placement of '{name}'", p.type, pl.shape, env)
    axes = tuple(E.var(f"{name}_i{d}") for d in range(len(pl.shape)))
    inv = IndexMap(axes, tuple(a + o if o else a for a, o in zip(axes, pl.offset)))
    hole = E.Var(f"{name}_value", pl.into.dtype)
    return Fused(name, pl.into, True, (pl.into,), (), hole, hole, inv)


def node_key(n: TensorNode) -> Any:
    """What makes two definition nodes one parameter: an input is its name, dtype and shape (a
    lowering names each graph tensor once per kernel; a view memoised by its text, ``view_as``,
    holds input nodes equal to, not the same objects as, those of the prologue beside it), any
    other node is itself."""
    return (n.name, n.dtype, tuple(n.shape)) if isinstance(n, TensorInput) else id(n)


def _check_names(entry: Function, plans: list[Fused]) -> None:
    fused = {f.param for f in plans}
    taken = {p.name: None for p in entry.params if p.name not in fused}
    seen: dict[str, TensorNode] = {}
    for f in plans:
        for n in f.new_nodes:
            other = seen.setdefault(n.name, n)
            if node_key(other) != node_key(n):
                raise FusionError(f"two different definition nodes are named '{n.name}': give the inputs and outputs "
                                  "of the fused definitions distinct names")
            if n.name in taken:
                raise FusionError(f"'{n.name}' of the {'epilogue' if f.epilogue else 'prologue'} of '{f.param}' "
                                  f"clashes with the anchor's parameter '{n.name}': rename the definition's node")


# ----------------------------------------------------------------------------- sizes


class _Specializer(IRRewriter):
    """Substitutes bound symbolic sizes by constants, retyping the tensor variables they shape."""

    def __init__(self, env: dict[str, int]) -> None:
        super().__init__()
        self.env = env
        self.vars: dict[int, E.Var] = {}

    def visit_SizeVar(self, sv: E.SizeVar) -> E.Expr:
        v = self.env.get(sv.name)
        return sv if v is None else E.const(v)

    def visit_Var(self, v: E.Var) -> E.Var:
        if not v.is_tensor:
            return v
        hit = self.vars.get(id(v))
        if hit is None:
            t: TensorType = v.type
            shape = tuple(self.visit(d) for d in t.shape)
            if all(a is b for a, b in zip(shape, t.shape)):
                hit = v
            else:
                layout = None if t.layout is None else replace(t.layout, strides=tuple(self.visit(s) for s in
                                                                                     t.layout.strides))
                hit = E.Var(v.name, TensorType(t.dtype, shape, t.scope, layout))
            self.vars[id(v)] = hit
        return hit

    def function(self, f: Function) -> Function:
        params = tuple(self.visit(p) for p in f.params)
        body = self.visit(f.body)
        launch = f.launch
        if launch is not None:
            launch = LaunchConfig(tuple(self.visit(d) for d in launch.grid_dim),
                                  tuple(self.visit(d) for d in launch.block_dim), self.visit(launch.dynamic_smem),
                                  launch.min_blocks)
        return _with_sizes(replace(f, params=params, body=body, launch=launch))


def _with_sizes(f: Function) -> Function:
    """``f`` with its symbolic sizes recomputed: parameter types, then launch, then body."""
    seen: dict[str, E.SizeVar] = {}
    roots: list[Any] = [d for p in f.params if p.is_tensor for d in p.type.shape]
    if f.launch is not None:
        roots += [*f.launch.grid_dim, *f.launch.block_dim]
    roots.append(f.body)
    for r in roots:
        for sv in collect(r, E.SizeVar):
            seen.setdefault(sv.name, sv)
    return replace(f, size_vars=tuple(seen.values()))


def specialize(module: Module, env: Mapping[str, int]) -> Module:
    """``module`` with the symbolic sizes in ``env`` replaced by their values."""
    if not env:
        return module
    sp = _Specializer(dict(env))
    return Module(tuple(sp.function(f) for f in module.functions), module.entry)


# ----------------------------------------------------------------------------- splicing


class Splicer(IRRewriter):
    """Rewrites one function: loads of prologue parameters, stores to epilogue parameters, vector
    copies and helper calls that touch them."""

    def __init__(self, fused: dict[int, Fused], module: Module, sites: dict[str, list[tuple]]) -> None:
        super().__init__()
        self.fused = fused                    # id(parameter Var of this function) -> plan
        self.module = module
        self.sites = sites                    # callee -> fused positions at each call site
        self.node_vars: dict[Any, E.Var] = {}     # by node_key

    def var_of(self, node: TensorNode) -> E.Var:
        v = self.node_vars.get(node_key(node))
        if v is None:
            t = node.var.type
            v = self.node_vars[node_key(node)] = E.Var(node.name, TensorType(t.dtype, t.shape, MemScope.GLOBAL))
        return v

    def _inputs_env(self, f: Fused) -> dict[Any, Any]:
        return {n.var: self.var_of(n) for n in walk(f.node) if isinstance(n, TensorInput) and n in f.new_nodes}

    def _epilogue_env(self, f: Fused, indices: tuple[E.Expr, ...]) -> tuple[tuple[E.Expr, ...], dict[Any, Any]]:
        """For the anchor's element ``indices`` of an epilogue's parameter: the output's index
        (through the inverse map) and the substitution of the definition's axes and inputs there
        (the hole, the anchor's value, is the caller's)."""
        assert f.inv is not None and f.hole is not None
        out_idx = tuple(f.inv(*(self.visit(i) for i in indices)))
        env: dict[Any, Any] = dict(zip(f.axes, out_idx))
        env.update(self._inputs_env(f))
        return out_idx, env

    # -- expressions
    def visit_Var(self, v: E.Var) -> E.Var:
        f = self.fused.get(id(v))
        if f is not None:
            raise FusionError(f"the anchor uses '{v.name}' other than through element loads, stores and helper "
                              f"calls: cannot splice its {'epilogue' if f.epilogue else 'prologue'}")
        return v

    def visit_Load(self, ld: E.Load) -> E.Expr:
        f = self.fused.get(id(ld.tensor))
        if f is None:
            return self.generic_visit(ld)
        if f.epilogue:
            raise FusionError(f"the anchor reads its output '{f.param}': an epilogue needs each element written "
                              "once and never read back (keep partial results in another buffer)")
        idx = tuple(self.visit(i) for i in ld.indices)
        env: dict[Any, Any] = dict(zip(f.axes, idx))
        env.update(self._inputs_env(f))
        return E.cast(substitute(f.value, env), ld.dtype)

    def visit_PrimCall(self, call: PrimCall) -> E.Expr:
        refs = call.op.spec.refs
        args = []
        for i, a in enumerate(call.args):
            if i in refs:
                f = self.fused.get(id(a.tensor))
                if f is not None:
                    raise FusionError(f"{call.op.spec.name}() accesses the fused tensor '{f.param}' as memory: "
                                      "only element loads / stores, copy16(), cp_async() and transpose_block() "
                                      "of row-major tensors can be rewritten")
                args.append(E.Load(a.tensor, tuple(self.visit(i_) for i_ in a.indices)))
            else:
                args.append(self.visit(a))
        if all(x == y for x, y in zip(args, call.args)):
            return call
        return PrimCall(call.op, tuple(args), call.type)

    def visit_CallFunc(self, call: E.CallFunc) -> E.Expr:
        callee = self.module.lookup(call.name)
        positions = tuple((i, id(self.fused[id(a)])) for i, a in enumerate(call.args)
                          if isinstance(a, E.Var) and id(a) in self.fused)
        self.sites.setdefault(call.name, []).append(positions)
        if not positions:
            return self.generic_visit(call)
        if len(call.args) != len(callee.params):
            raise FusionError(f"call of {call.name} passes symbolic sizes explicitly: cannot splice into it")
        args: list[E.Expr] = []
        added: set[Any] = set()
        for a in call.args:
            f = self.fused.get(id(a)) if isinstance(a, E.Var) else None
            if f is None:
                args.append(self.visit(a))
                continue
            for n in f.new_nodes:
                if node_key(n) not in added:
                    added.add(node_key(n))
                    args.append(self.var_of(n))
        return E.CallFunc(call.name, tuple(args), call.ret)

    # -- statements
    def visit_Store(self, st: S.Store) -> S.Stmt:
        f = self.fused.get(id(st.tensor))
        if f is None:
            return self.generic_visit(st)
        if not f.epilogue:
            raise FusionError(f"the anchor writes its input '{f.param}': cannot splice a prologue into it")
        out_idx, env = self._epilogue_env(f, st.indices)
        env[f.hole] = self.visit(st.value)
        value = E.cast(substitute(f.value, env), f.node.dtype)
        return S.Store(self.var_of(f.node), tuple(out_idx), value, st.stream)

    def visit_Evaluate(self, ev: S.Evaluate) -> S.Stmt:
        call = ev.expr
        if isinstance(call, PrimCall) and call.op is Prim.PREFETCH and id(call.args[0].tensor) in self.fused:
            return self._prefetch(call)
        if isinstance(call, PrimCall) and call.op in (Prim.COPY16, Prim.CP_ASYNC):
            dst, src = call.args[0], call.args[1]
            if call.op is Prim.CP_ASYNC and id(src.tensor) in self.fused and id(dst.tensor) not in self.fused:
                return self._gather_async(call)
            if id(dst.tensor) in self.fused or id(src.tensor) in self.fused:
                return self.visit(self._expand_copy(call))
        if isinstance(call, PrimCall) and call.op is Prim.TRANSPOSE:
            dst, src = call.args[0], call.args[1]
            if (id(dst.tensor) in self.fused or id(src.tensor) in self.fused) and \
                    all(_row_major(r.tensor.type) for r in (dst, src)):
                return self.visit(self._expand_transpose(call))
        return self.generic_visit(ev)

    def _prefetch(self, call: PrimCall) -> S.Stmt:
        """A prefetch of an epilogue's parameter becomes prefetches of what its store touches there:
        the output element (through the inverse index map; not for a ``beside`` prefetch, whose
        kernel's stores bypass the caches) and the elements of the definition's inputs as large as
        the output (a residual; smaller ones — a bias, a scale — are re-read across a tile and stay
        in cache).  A prefetch of a prologue's parameter is dropped (its reads may be gathers whose
        index arithmetic would cost more than the hint saves)."""
        f = self.fused[id(call.args[0].tensor)]
        if not f.epilogue:
            return S.seq()
        out_idx, env = self._epilogue_env(f, call.args[0].indices)
        out = self.var_of(f.node)
        size = _elements(out.type.shape)
        refs = [E.Load(out, tuple(out_idx))]
        for ld in collect(substitute(f.value, env), E.Load):
            n = _elements(ld.tensor.type.shape)
            if ld not in refs and (n >= size if n and size else ld.tensor.type.shape == out.type.shape):
                refs.append(ld)
        # the output keeps the hint's write intent; the inputs beside it are read
        writes = [call.args[2]] + [E.const(0)] * (len(refs) - 1)
        fetch = list(zip(refs, writes))[1 if int(call.args[3].value) else 0:]
        return S.seq(*(S.Evaluate(PrimCall(Prim.PREFETCH, (r, call.args[1], w, E.const(0)), call.type))
                       for r, w in fetch))

    @staticmethod
    def _expand_transpose(call: PrimCall) -> S.Stmt:
        """A block transpose as a loop nest of element copies (``dst[b*ld_dst + a] =
        src[a*ld_src + b]``, offsets flat from the references, row-major)."""
        dst, src, n, ld_dst, ld_src = call.args
        a, b = E.var("ta"), E.var("tb")
        store = S.Store(dst.tensor, _offset(dst, b * ld_dst + a), E.Load(src.tensor, _offset(src, a * ld_src + b)))
        return S.For(a, E.const(0, i32), n, 1, S.For(b, E.const(0, i32), n, 1, store))

    def _gather_async(self, call: PrimCall) -> S.Stmt:
        """``cp_async`` from a prologue, element by element: an element whose prologue only reads
        one element of a 4-byte tensor where a guard holds and is zero elsewhere (img2col, a
        transpose, a slice) stays an asynchronous copy — of 4 bytes, zero-filled past the guard —
        so the anchor's copy pipeline keeps running; any other element is computed and stored
        (synchronously, as :meth:`_expand_copy`)."""
        dst, src, _, src_bytes = call.args
        t = dst.dtype
        nbytes = int(call.args[2].value)
        have = self.visit(src_bytes)
        stmts: list[S.Stmt] = []
        for e in range(nbytes // t.nbytes):
            d_idx = tuple(self.visit(i) for i in dst.indices[:-1] + (dst.indices[-1] + e,))
            s_idx = src.indices[:-1] + (src.indices[-1] + e,)
            value = self.visit(E.Load(src.tensor, s_idx))
            in_copy = E.compare(E.CmpOp.GT, have, e * t.nbytes)
            gather = _guarded_load(value, t)
            if gather is None:
                stmts.append(S.Store(dst.tensor, d_idx, E.select(in_copy, value, E.const(0, t))))
                continue
            guard, load = gather
            ok = in_copy if guard is None else E.logical_and(in_copy, guard)
            safe = tuple(E.select(ok, i, E.const(0, i.dtype)) for i in load.indices)
            stmts.append(S.Evaluate(PrimCall(Prim.CP_ASYNC, (E.Load(dst.tensor, d_idx), E.Load(load.tensor, safe),
                                                             E.const(t.nbytes, i32),
                                                             E.select(ok, E.const(t.nbytes, i32), E.const(0, i32))),
                                             call.type)))
        return S.seq(*stmts)

    @staticmethod
    def _expand_copy(call: PrimCall) -> S.Stmt:
        """A vector copy as element copies (``cp_async``: synchronous, zero-filling past
        ``src_bytes``), along the last dimension of both references."""
        dst, src = call.args[0], call.args[1]
        t = dst.dtype
        nbytes = 16 if call.op is Prim.COPY16 else int(call.args[2].value)
        stores = []
        for e in range(nbytes // t.nbytes):
            d_idx = dst.indices[:-1] + (dst.indices[-1] + e,)
            s_idx = src.indices[:-1] + (src.indices[-1] + e,)
            value: E.Expr = E.Load(src.tensor, s_idx)
            if call.op is Prim.CP_ASYNC:
                value = E.select(E.compare(E.CmpOp.GT, call.args[3], e * t.nbytes), value, E.const(0, t))
            stores.append(S.Store(dst.tensor, d_idx, value))
        return S.seq(*stores)


def _guarded_load(value: E.Expr, t: Any) -> tuple[E.Expr | None, E.Load] | None:
    """``(guard, load)`` when ``value`` is ``load`` where ``guard`` holds and zero elsewhere (guard
    None: always), ``load`` reading a global tensor of ``t`` (4 bytes: what ``cp_async`` copies);
    else None."""
    guard = None
    if isinstance(value, E.Select) and isinstance(value.b, E.Const) and value.b.value == 0:
        guard, value = value.cond, value.a
    if (isinstance(value, E.Load) and value.tensor.dtype is t and t.nbytes == 4
            and value.tensor.type.scope is MemScope.GLOBAL):
        return guard, value
    return None


def _row_major(t: TensorType) -> bool:
    return t.layout == row_major(t.shape)


def _offset(ref: E.Load, off: E.Expr) -> tuple[E.Expr, ...]:
    """The indices of the element ``off`` elements (row-major) after ``ref``'s."""
    shape = ref.tensor.type.shape
    flat: E.Expr = ref.indices[0]
    for i, d in zip(ref.indices[1:], shape[1:]):
        flat = flat * d + i
    flat = flat + off
    idx = []
    for d in reversed(shape[1:]):
        idx.append(flat % d)
        flat = flat // d
    return (flat, *reversed(idx))


def _rewrite_function(func: Function, fused_pos: dict[int, Fused], module: Module,
                      sites: dict[str, list[tuple]]) -> tuple[Function, Splicer]:
    by_var = {id(func.params[i]): f for i, f in fused_pos.items()}
    sp = Splicer(by_var, module, sites)
    params: list[E.Var] = []
    added: set[Any] = set()
    for i, p in enumerate(func.params):
        f = fused_pos.get(i)
        if f is None:
            params.append(p)
            continue
        for n in f.new_nodes:
            if node_key(n) not in added:
                added.add(node_key(n))
                params.append(sp.var_of(n))
    body = sp.visit(func.body)
    return _with_sizes(replace(func, params=tuple(params), body=body)), sp


def splice(module: Module, prologues: dict[str, TensorNode], epilogues: dict[str, TensorNode],
           sizes: dict[str, int], placements: Mapping[str, Placement] | None = None) -> Module:
    """The module with the definitions spliced in (see :func:`fuse`) and the ``placements`` made
    (see :func:`taskmap.fusion.place`)."""
    entry = module.entry_function
    tensor_params = {p.name: p for p in entry.params if p.is_tensor}
    placements = dict(placements or {})
    for name in (*prologues, *epilogues, *placements):
        if name not in tensor_params:
            known = ", ".join(tensor_params)
            raise FusionError(f"{entry.name} has no tensor parameter '{name}' (its tensor parameters: {known})")
    both = (set(prologues) & set(epilogues)) | ((set(prologues) | set(epilogues)) & set(placements))
    if both:
        raise FusionError(f"{sorted(both)} cannot have more than one of a prologue, an epilogue and a placement")
    for name, node in {**prologues, **epilogues}.items():
        if not isinstance(node, TensorNode):
            raise FusionError(f"the definition for '{name}' must be a compute node, got {type(node).__name__}")
    env: dict[str, int] = {}
    for name, node in prologues.items():
        _bind_shape(f"prologue of '{name}'", tensor_params[name].type, node.shape, env)
    for name, v in sizes.items():
        if env.setdefault(name, int(v)) != int(v):
            raise FusionError(f"size '{name}' is {env[name]} by the definitions, {v} by sizes=")
    plans_probe = _plan(entry, prologues, epilogues, env, placements)   # checks (and binds sizes) first
    _check_names(entry, plans_probe)
    module = specialize(module, env)
    entry = module.entry_function
    plans = {f.param: f for f in plans_probe}
    work: list[tuple[str, dict[int, Fused]]] = [(entry.name, {i: plans[p.name] for i, p in enumerate(entry.params)
                                                               if p.name in plans})]
    done: dict[str, Function] = {}
    sites: dict[str, list[tuple]] = {}
    wanted: dict[str, tuple] = {}
    while work:
        name, fused_pos = work.pop()
        if name in done:
            continue
        new, _ = _rewrite_function(module.lookup(name), fused_pos, module, sites)
        done[name] = new
        for callee, site_list in sites.items():
            for pos in site_list:
                if pos and callee not in done and callee not in wanted:
                    wanted[callee] = pos
                    work.append((callee, {i: _plan_by_id(plans, fid) for i, fid in pos}))
    for f in module.functions:          # call sites in functions with nothing fused
        if f.name not in done:
            for call in collect(f.body, E.CallFunc):
                sites.setdefault(call.name, []).append(())
    for callee, site_list in sites.items():
        if len(set(site_list)) > 1:
            raise FusionError(f"helper function {callee} receives a fused tensor at some call sites and other "
                              "tensors at others: cannot splice into it")
    return Module(tuple(hoist_invariants(done[f.name]) if f.name in done else f for f in module.functions),
                  module.entry)


def _plan_by_id(plans: dict[str, Fused], fid: int) -> Fused:
    for f in plans.values():
        if id(f) == fid:
            return f
    raise AssertionError("unknown fusion plan")


__all__ = ["Fused", "Placement", "Splicer", "can_fuse", "fuse", "fusion_key", "specialize", "splice"]
