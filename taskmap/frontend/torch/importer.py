"""torch.fx GraphModule -> graph IR.

The importer walks the fx graph once with concrete example inputs in mind:

* placeholders become graph inputs (tensors) or stay Python values (baked in);
* ``get_attr`` tensors (weights, buffers) become constants (shared by identity);
* a call whose tensor arguments are all constants — ``torch.arange``, ``zeros``, masks built
  from buffers, ``x.size(0) * 2`` — is **folded**: run by PyTorch now, its result a constant
  (not a random draw, :data:`RANDOM_OPS`: unsupported, or run by PyTorch on every call);
* any other call goes to its registered handler (:mod:`.registry`); a call without one, or
  whose handler raises :class:`NotConvertible`, is *unsupported*: all of them are collected,
  then reported together (:class:`~taskmap.errors.UnsupportedOpsError`) — or, with
  ``fallback=True``, each becomes an opaque ``TORCH`` op that PyTorch runs.

Where fx recorded shapes (dynamo's ``example_value``, ShapeProp's ``tensor_meta``) every
converted value is checked against them: a mismatch is a frontend bug, reported at once.
"""
from __future__ import annotations

import operator
import os
import re
from dataclasses import dataclass, field, is_dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.fx
from torch.utils import _pytree as pytree

from ...errors import IRError, UnsupportedError, UnsupportedOpsError
from ...graph import Graph, GraphBuilder, InputRef, OpKind, Tensor, TorchAttrs
from ...graph.defs_anchor import torch_meta
from . import (ops_bag, ops_composite, ops_einsum, ops_elementwise, ops_layers, ops_math,  # noqa: F401
               ops_moe, ops_nn, ops_rnn, ops_sample, ops_scatter, ops_search, ops_tensor, ops_upsample)
from . import aten, autocast, precision
from . import complex as cx
from . import regions
from .aliasing import Aliases
from .complex import Complex
from .registry import (Converter, NotConvertible, Unavailable, as_index, from_torch_dtype, lookup, to_torch,
                       torch_dtype)


@dataclass
class Imported:
    """The graph, and how to rebuild the fx output structure from the graph's outputs:
    ``leaves[k]`` is ``("out", i)`` (graph output ``i``) or ``("value", v)``."""

    graph: Graph
    input_kinds: list[str]  # per placeholder: "tensor", "complex" (a graph input of its real view) or "value"
    out_spec: Any
    leaves: list[tuple[str, Any]]
    unsupported: list[tuple[str, str, str]] = field(default_factory=list)
    #: tensors the forward changes in place, and the graph output holding their new value:
    #: ``("input", placeholder index, output)`` or ``("attr", get_attr target, output)``
    mutated: tuple[tuple[str, Any, int], ...] = ()
    #: the forward's result type where fx traced it as a plain dict (a ``ModelOutput``: rebuilt)
    output_type: type | None = None

    def graph_inputs(self, flat: Sequence[Any]) -> list[Any]:
        """The graph's inputs of the forward's flat inputs (one per placeholder)."""
        return [v if k == "tensor" else torch.view_as_real(v.resolve_conj())
                for v, k in zip(flat, self.input_kinds) if k != "value"]

    def outputs(self, values: Sequence[Any]) -> Any:
        flat = [values[v] if k == "out" else torch.view_as_complex(values[v]) if k == "complex" else v
                for k, v in self.leaves]
        out = pytree.tree_unflatten(flat, self.out_spec)
        if self.output_type is not None and type(out) is dict:
            return self.output_type(**out) if is_dataclass(self.output_type) else self.output_type(out)
        return out

    def write_back(self, values: Sequence[Any], inputs: Sequence[Any],
                   attr: Callable[[str], Any] | None = None) -> None:
        """Copy the new values of what the forward changed in place into it, as eager PyTorch
        would have left it: the inputs (``inputs``: the call's flat inputs, one per placeholder)
        and, with ``attr`` (a get_attr target -> its tensor, or None), attributes."""
        for kind, key, out in self.mutated:
            target = inputs[key] if kind == "input" else attr(key) if attr is not None else None
            if target is not None:
                target.copy_(torch.view_as_complex(values[out]) if target.is_complex() else values[out])


class NotRecorded(UnsupportedError):
    """An op that needs what a torch.fx trace does not record: PyTorch's strides (``as_strided``)
    or Python values read off a tensor (``x.stride(0)``; ``tolist``, which no graph has).
    torch.export's and dynamo's graphs record the strides and resolve such values at capture."""


def target_name(node: torch.fx.Node) -> str:
    t = node.target
    if node.op == "call_method":
        return f"Tensor.{t}"
    if node.op == "call_module":
        return f"{type(node.graph.owning_module.get_submodule(t)).__name__} ({t})" \
            if node.graph.owning_module is not None else str(t)
    if aten.is_aten(t):
        return str(t)               # aten.linear.default
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__name__", None) or str(t)
    mod = {"torch._C._nn": "torch.nn.functional", "_operator": "operator", "torch._C._VariableFunctions": "torch"}.get(
        mod, mod)
    sub = mod.removeprefix("torch._C._")
    if sub in ("special", "linalg", "fft") and mod != sub:     # torch._C._special.special_erfcx: torch.special.erfcx
        mod, name = f"torch.{sub}", name.removeprefix(f"{sub}_")
    return f"{mod}.{name}" if mod else name


_TORCH_DIR = os.path.dirname(torch.__file__)


def where(node: torch.fx.Node) -> str:
    """``node NAME (File "model.py", line 12, in forward: the source line)``: the innermost frame
    of the node's recorded stack outside torch itself (inside torch when it has no other: a
    model that is a torch module)."""
    lines = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames: list[tuple[bool, str]] = []
    for k, ln in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line \d+', ln)
        if m:
            code = lines[k + 1].strip() if k + 1 < len(lines) and not lines[k + 1].strip().startswith("File ") else ""
            frames.append((m.group(1).startswith(_TORCH_DIR), ln.strip() + (f": {code}" if code else "")))
    outside = [f for in_torch, f in frames if not in_torch]
    best = outside[-1] if outside else frames[-1][1] if frames else ""
    return f"node {node.name}" + (f" ({best})" if best else "")


def _is_dynamic(v: Any) -> bool:
    return isinstance(v, (Tensor, Complex)) and not v.is_constant


def _has_dynamic(args: Any) -> bool:
    return any(_is_dynamic(v) for v in pytree.tree_leaves(args))


#: Ops that draw random numbers: never folded (a compiled graph would repeat one draw on every
#: call); without a handler they are unsupported, and with ``fallback`` PyTorch draws anew.
RANDOM_OPS = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "bernoulli_",
    "multinomial", "normal", "normal_", "uniform_", "random_", "exponential_", "geometric_", "cauchy_", "log_normal_",
    "poisson", "native_dropout"})


COMPLEX_REASON = ("it computes with complex tensors, which taskmap builds from real ops for elementwise "
                  "arithmetic, views and conversions only; fallback=True runs it in PyTorch")


def _touches_complex(node: torch.fx.Node, args: Any) -> bool:
    """Whether the op reads a complex value, makes one (``view_as_complex``, ``torch.complex``)
    or (per PyTorch's metadata) returns one."""
    return any(cx.is_complex(v) for v in pytree.tree_leaves(args)) or \
        cx.name_of(node.op, node.target) in ("view_as_complex", "complex", "polar") or \
        any(cx.is_complex(getattr(m, "dtype", None)) for m in _meta_leaves(
            _meta(node) if _meta(node) is not None else node.meta.get("val")))


def _random(target: Any) -> bool:
    name = target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else \
        target if isinstance(target, str) else getattr(target, "__name__", "")
    return name in RANDOM_OPS


def _materialize(args: Any, device: str) -> Any:
    """Constants as torch tensors on the graph's device: a folded op sees its arguments where the
    model had them (``aten._assert_tensor_metadata(c, device=cuda:0)`` checks the device, and an
    op mixing a constant with a tensor made on ``device=`` needs both on one device)."""
    return pytree.tree_map(lambda v: to_torch(v).to(device) if isinstance(v, Tensor) else v, args)


class Importer:
    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], fallback: bool, name: str = "graph"):
        self.gm = gm
        self.examples = list(example_inputs)
        self.fallback = fallback
        dev = next((str(x.device) for x in self.examples if isinstance(x, torch.Tensor)), "cpu")
        self.builder = GraphBuilder(dev if dev != "cuda" else "cuda:0", name)
        self.tf32 = precision.current(dev)           # PyTorch's TF32 settings now
        self.autocast = autocast.Regions(dev)         # torch.autocast: now, then the graph's own regions
        self.env: dict[torch.fx.Node, Any] = {}
        self.consts: dict[int, tuple[Any, Tensor]] = {}
        self.unsupported: list[tuple[str, str, str]] = []
        self.aliases: Aliases | None = None          # built at the first in-place op

    def run(self) -> Imported:
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.examples):
            raise IRError(f"the fx graph has {len(placeholders)} inputs, {len(self.examples)} example inputs given")
        kinds = []
        out_node = None
        first: dict[torch.fx.Node, Tensor] = {}      # the inputs' and attributes' values before any in-place op
        done: set[torch.fx.Node] = set()             # nodes of regions run in PyTorch as one op
        for node in self.gm.graph.nodes:
            if node in done:
                continue
            if self.fallback and node.op == "call_function" and regions.is_functorch(node.target):
                if getattr(node.target, "__name__", "") in regions.NO_OPS:
                    continue
                if regions.opens(node):
                    done.update(self._region(node))
                    continue
            if node.op == "placeholder":
                ex = self.examples[placeholders.index(node)]
                if isinstance(ex, torch.Tensor) and ex.is_complex():
                    self.env[node] = first[node] = Complex(self.builder.input(
                        (*ex.shape, 2), from_torch_dtype(cx.PARTS[ex.dtype]), node.name), ex.dtype)
                    kinds.append("complex")
                elif isinstance(ex, torch.Tensor):
                    self.env[node] = first[node] = self.builder.input(tuple(ex.shape), from_torch_dtype(ex.dtype),
                                                                      node.name)
                    kinds.append("tensor")
                else:
                    self.env[node] = ex
                    kinds.append("value")
            elif node.op == "get_attr":
                self.env[node] = self._attr(node)
                if isinstance(self.env[node], Tensor):
                    first[node] = self.env[node]
            elif node.op == "output":
                out_node = node
            else:
                self.env[node] = self._call(node)
                if isinstance(self.env[node], Unavailable) and node.users:
                    raise UnsupportedOpsError([(target_name(node), where(node), self.env[node].reason)])
                self._check_meta(node)
        if self.unsupported and not self.fallback:
            raise UnsupportedOpsError(self.unsupported)
        assert out_node is not None
        result = _plain(torch.fx.node.map_arg(out_node.args[0], lambda n: self.env[n]))
        flat, spec = pytree.tree_flatten(result)
        outs: list[Tensor] = []
        leaves: list[tuple[str, Any]] = []
        for v in flat:
            if isinstance(v, (Tensor, Complex)):
                leaves.append(("out" if isinstance(v, Tensor) else "complex", len(outs)))
                outs.append(v if isinstance(v, Tensor) else v.data)
            elif isinstance(v, torch.Tensor) and v.is_complex():          # a constant
                leaves.append(("complex", len(outs)))
                outs.append(self._const(torch.view_as_real(v.resolve_conj())))
            else:
                leaves.append(("value", v))
        mutated = []
        for node, value in first.items():           # changed in place (the functional graph rebound them)
            new = self.env[node]
            if new is not value and isinstance(new, (Tensor, Complex)):
                key = placeholders.index(node) if node.op == "placeholder" else str(node.target)
                mutated.append(("input" if node.op == "placeholder" else "attr", key, len(outs)))
                outs.append(new.data if isinstance(new, Complex) else new)
        return Imported(self.builder.build(outs), kinds, spec, leaves, self.unsupported, tuple(mutated))

    # ------------------------------------------------------------------ nodes

    def _const(self, t: torch.Tensor, name: str = "") -> Tensor:
        try:
            return Converter(self.builder, cache=self.consts).const(t, name=name)
        except NotConvertible as e:
            raise UnsupportedError(f"{self.builder.name}: constant {name or list(t.shape)}: {e} (graph constants are "
                                   "numpy arrays; convert the model, e.g. model.float() or model.half())") from None

    def _attr(self, node: torch.fx.Node) -> Any:
        obj: Any = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        if cx.is_complex(obj):
            return obj                  # a constant as it is: folded ops read it, others their parts
        return self._const(obj, str(node.target)) if isinstance(obj, torch.Tensor) else obj

    def _call(self, node: torch.fx.Node) -> Any:
        args = torch.fx.node.map_arg(node.args, lambda n: self.env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.env[n])
        target = self.gm.get_submodule(node.target) if node.op == "call_module" else node.target
        if target is autocast.ENTER:
            return self.autocast.enter(*args, **kwargs)
        if target is autocast.EXIT:
            return self.autocast.exit()
        if str(getattr(target, "__module__", "")).startswith(("torch._C._functorch", "torch._functorch")):
            # before folding: running functorch's level changes here would break dynamo's guards
            raise UnsupportedError(f"{where(node)}: {target_name(node)}: dynamo traced a torch.vmap (or another "
                                   "torch.func transform) into this graph; taskmap's graph ops cannot hold "
                                   "functorch's batching levels")
        dynamic = _has_dynamic((args, kwargs))
        if dynamic and not _indexes(target):
            args, kwargs = _sizes_as_ints(args), {k: _sizes_as_ints(v) for k, v in kwargs.items()}
        if dynamic and _touches_complex(node, (args, kwargs)):
            result = cx.lower(self._converter(node), cx.name_of(node.op, target), args, kwargs)
            if result is None:
                self.unsupported.append((target_name(node), where(node), COMPLEX_REASON))
                result = self._torch_op(node, _FUNCTIONAL.get(target, target), args, kwargs)
            return self._rebind_inplace(node, target, result)
        if not dynamic and not _random(target):
            result = self._fold(node, target, args, kwargs)
            return self._rebind_inplace(node, target, result)
        if isinstance(target, type) and issubclass(target, tuple) and hasattr(target, "_fields"):
            return target(*args, **kwargs)      # a namedtuple (of graph tensors): structure, not an op
        if target in _AS_STRIDED and isinstance(node.args[0], torch.fx.Node):
            if not isinstance(_layout(node.args[0]), torch.Tensor):
                raise NotRecorded(f"{where(node)}: as_strided of a tensor whose strides in PyTorch were not recorded")
            return self._as_strided(node, *args, **kwargs)
        handler = lookup(node.op, target)
        if handler is None and aten.is_aten(target):
            handler = aten.handler(target)
        if handler is None and _in_place_name(node, target):     # ``x.sigmoid_()``: ``sigmoid``'s value
            handler = aten.generic(_in_place_name(node, target)[:-1])
        reason = ""
        if handler is not None:
            cv = self._converter(node)
            if self.autocast.dtype is not None and autocast.lowers(node.op, target):    # as the dispatcher would
                cv = replace(cv, cast_to=self.autocast.dtype)
                args, kwargs = pytree.tree_map(
                    lambda v: cv.cast(v, cv.cast_to) if isinstance(v, Tensor) and v.dtype.is_float else v,
                    (args, kwargs))
            try:
                if node.op == "call_module":
                    result = handler(cv, target, *args, **kwargs)
                else:
                    result = handler(cv, *args, **kwargs)
                return self._rebind_inplace(node, target, result)
            except NotConvertible as e:
                reason = str(e)
        elif _random(target):
            reason = "it draws random numbers, anew on every call: a compiled graph would repeat one draw"
        self.unsupported.append((target_name(node), where(node), reason))
        result = self._torch_op(node, _FUNCTIONAL.get(target, target), args, kwargs)
        return self._rebind_inplace(node, target, result)

    def _region(self, start: torch.fx.Node) -> tuple[torch.fx.Node, ...]:
        """The functorch region ``start`` opens (a ``torch.vmap`` dynamo traced), run by PyTorch
        as one op: the values read after it bound to its outputs.  Its nodes."""
        region = regions.functorch_region(start)
        if region is None:
            raise UnsupportedError(f"{where(start)}: {target_name(start)} opens a functorch level the graph never "
                                   "closes")
        args = [self.env[x] for x in region.inputs]
        if any(isinstance(a, Complex) for a in args):
            raise UnsupportedError(f"{where(start)}: a torch.vmap region reading complex values")
        inputs = [a for a in args if isinstance(a, Tensor)]
        refs, k = [], 0
        for a in args:
            refs.append(InputRef(k) if isinstance(a, Tensor) else a)
            k += isinstance(a, Tensor)
        attrs = TorchAttrs(region.module, tuple(refs), (), False, "torch.vmap (its region)")
        metas = [_meta(o) for o in region.outputs]
        leaves = [m for v in metas for m in _meta_leaves(v)]
        if len(leaves) != len(region.outputs):    # sizes symbolic (or no record): PyTorch's on meta tensors
            leaves = _meta_leaves(list(torch_meta(inputs, attrs)))
        if len(leaves) != len(region.outputs):
            raise UnsupportedError(f"{where(start)}: a torch.vmap region whose results are not all tensors")
        self.unsupported.append(("torch.vmap", where(start), "functorch's batching levels: the region runs in "
                                 "PyTorch as one op"))
        outs = self.builder.op_multi(OpKind.TORCH, inputs, attrs, source=where(start), specs=list(map(_spec, leaves)))
        for o, value in zip(region.outputs, outs):
            self.env[o] = value
        return region.nodes

    def _as_strided(self, node: torch.fx.Node, x: Tensor, size: Sequence[int], stride: Sequence[int],
                    storage_offset: int | None = None) -> Tensor:
        """``x.as_strided(size, stride, offset)`` indexes ``x``'s storage, laid out as PyTorch had
        it (a transpose's, a view's of a permuted tensor: Longformer's overlapping chunks), where a
        graph tensor is contiguous: a gather from ``x`` at the logical positions of those storage
        elements (a constant index)."""
        xm = _layout(node.args[0])
        spots = _storage_positions(tuple(x.shape), tuple(xm.stride()), int(xm.storage_offset())).reshape(-1)
        want = _storage_positions(tuple(int(v) for v in size), tuple(int(v) for v in stride),
                                  int(xm.storage_offset()) if storage_offset is None else int(storage_offset))
        order = np.argsort(spots, kind="stable")             # x's logical indices by storage position
        ordered = spots[order]
        if np.any(ordered[1:] == ordered[:-1]):
            raise UnsupportedError(f"{where(node)}: as_strided of a tensor whose elements overlap in memory")
        at = np.minimum(np.searchsorted(ordered, want), max(ordered.size - 1, 0))
        if want.size and (not ordered.size or np.any(ordered[at] != want)):
            raise UnsupportedError(f"{where(node)}: as_strided reads memory outside its input's elements")
        cv = self._converter(node)
        flat = lookup("call_method", "reshape")(cv, x, -1)
        index = order[at] if ordered.size else at
        return lookup("call_function", operator.getitem)(cv, flat, cv.const(torch.from_numpy(index)))

    def _converter(self, node: torch.fx.Node) -> Converter:
        return Converter(self.builder, f"{where(node)}: {target_name(node)}",
                         str(node.target) if node.op == "call_module" else "", self.consts, self.tf32)

    def _rebind_inplace(self, node: torch.fx.Node, target: Any, result: Any) -> Any:
        """After an in-place op (``x.add_(y)``, ``x += y``, ``relu(x, inplace=True)``) later uses
        of ``x`` read the result, in ``x``'s dtype (returned): graph ops are functional, the
        mutation becomes a rebinding."""
        if not isinstance(result, (Tensor, Complex)) or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return result
        written = self.env.get(node.args[0])
        if writes_in_place(node, target) and (isinstance(written, (Tensor, Complex)) or cx.is_complex(written)):
            if self.aliases is None:
                self.aliases = Aliases(self.gm.graph)
            self.aliases.check_write(node, where(node))
            if isinstance(written, Tensor) and isinstance(result, Tensor) and result.dtype != written.dtype:
                result = self._converter(node).cast(result, written.dtype)    # the tensor keeps its dtype
            self.env[node.args[0]] = result
        return result

    def _fold(self, node: torch.fx.Node, target: Any, args: Any, kwargs: Any) -> Any:
        dtype = self.autocast.dtype                # the graph's autocast regions hold for folded ops too
        with torch.autocast("cuda" if self.builder.device.startswith("cuda") else "cpu",
                            dtype=None if dtype is None else torch_dtype(dtype), enabled=dtype is not None):
            return self._folded(node, target, args, kwargs)

    def _folded(self, node: torch.fx.Node, target: Any, args: Any, kwargs: Any) -> Any:
        a, kw = _materialize(args, self.builder.device), _materialize(kwargs, self.builder.device)
        if writes_in_place(node, target) and a and isinstance(a[0], torch.Tensor):
            a = (a[0].clone(), *a[1:])       # constants share memory with the model's tensors
        if node.op == "call_method":
            out = getattr(a[0], target)(*a[1:], **kw)
        else:
            out = _FUNCTIONAL.get(target, target)(*a, **kw)
        return pytree.tree_map(lambda v: self._const(v) if isinstance(v, torch.Tensor) and not v.is_complex() else v,
                               out)

    def _torch_op(self, node: torch.fx.Node, target: Any, args: Any, kwargs: Any) -> Any:
        """An opaque op run by PyTorch, with the node's recorded output shapes."""
        inputs: list[Tensor] = []

        def ref(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.is_complex():     # a complex constant: its real view
                v = Complex(self._const(torch.view_as_real(v.resolve_conj())), v.dtype)
            if isinstance(v, (Tensor, Complex)):
                inputs.append(v if isinstance(v, Tensor) else v.data)
                return InputRef(len(inputs) - 1, isinstance(v, Complex))
            return v
        targs = pytree.tree_map(ref, tuple(args))
        # run functionally: in-place variants mutate a copy (their input may be a weight or a reused buffer)
        tkw = tuple((k, False if k == "inplace" else pytree.tree_map(ref, v)) for k, v in kwargs.items())
        attrs = TorchAttrs(target, _freeze(targs), tkw, node.op == "call_method", target_name(node))
        meta = _meta(node)
        try:
            if meta is None:     # no recorded shapes: PyTorch's result on meta tensors
                meta = torch_meta(inputs, attrs)
            # the result's tensors (on meta tensors where the recorded sizes are symbolic)
            leaves = _meta_leaves(meta) or _meta_leaves(torch_meta(inputs, attrs))
            if not leaves:
                raise NotRecorded(
                    f"{self.builder.name}: {target_name(node)} at {where(node)} returns no tensor but Python values "
                    "that PyTorch reads off a tensor's data or memory layout as it runs, which a compiled graph "
                    "does not have (torch.compile(model, backend=\"taskmap\") runs such code in PyTorch)")
            outs = self.builder.op_multi(OpKind.TORCH, inputs, attrs, source=where(node), specs=list(map(_spec, leaves)))
            # complex results: their real views, read as complex
            outs = [Complex(o, m.dtype) if m.dtype in cx.PARTS else o for o, m in zip(outs, leaves)]
        except (NotImplementedError, RuntimeError) as e:   # no meta kernel, or `.item()`: sizes from values
            if not isinstance(e, NotImplementedError) and "meta tensors" not in str(e) and \
                    "data-dependent" not in str(e):
                raise                                       # a real error (bad sizes), as PyTorch reports it
            raise UnsupportedError(f"{self.builder.name}: {target_name(node)} at {where(node)}: its output's shape "
                                   f"cannot be known before it runs ({type(e).__name__}: {str(e).splitlines()[0]}); a "
                                   "compiled graph has static shapes (torch.compile(model, backend=\"taskmap\") "
                                   "runs such graphs in PyTorch)") from e
        if _nests(meta):
            return _nested(meta, iter(outs))   # nn.LSTM's (output, (h, c)): the outputs in that structure
        if len(outs) > 1 or (leaves and not hasattr(meta, "shape")):
            return tuple(outs)
        return outs[0]

    def _check_meta(self, node: torch.fx.Node) -> None:
        meta, got = _meta(node), self.env[node]
        if meta is None:
            return
        got_leaves = [got] if isinstance(got, (Tensor, Complex)) else [g for g in pytree.tree_leaves(got)]
        for m, g in zip(_meta_leaves(meta, symbolic=True), got_leaves):
            if isinstance(g, (Tensor, Complex)) and all(isinstance(d, int) for d in m.shape) and tuple(m.shape) != g.shape:
                raise IRError(f"frontend bug: {target_name(node)} at {where(node)} gives shape {g.shape}, PyTorch "
                              f"{tuple(m.shape)}")


_AS_STRIDED = {torch.as_strided, "as_strided", torch.ops.aten.as_strided.default}


def _indexes(target: Any) -> bool:
    """Whether the op indexes (``x[i]``, ATen's ``index``): its index lists are no sizes (a list
    ``[t, 0]`` indexes two dimensions, ``[1, 0]`` picks two rows)."""
    name = target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else ""
    return target in (operator.getitem, operator.setitem, "__getitem__", "__setitem__") or \
        name in ("index", "index_put", "index_put_", "_unsafe_index", "_unsafe_index_put")


def _sizes_as_ints(v: Any) -> Any:
    """Integer 0-d constants in the argument's size-like tuples and lists (those holding some
    Python value: sizes, pads, indices; not lists of tensors) as Python ints, as PyTorch reads
    them (``__index__``): Longformer's ``torch.div(n, w, rounding_mode="trunc")`` in an
    ``as_strided`` size, Encodec's padding from buffers."""
    if not isinstance(v, (tuple, list)) or isinstance(v, torch.Size):
        return v
    items = [_sizes_as_ints(x) for x in v]
    if not all(isinstance(x, (Tensor, Complex)) for x in items):
        items = [as_index(x) for x in items]
    return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)


def _spec(m: torch.Tensor) -> tuple[tuple[int, ...], Any]:
    """A graph tensor's shape and dtype for a PyTorch result's (a complex one's real view)."""
    if m.dtype in cx.PARTS:
        return (*m.shape, 2), from_torch_dtype(cx.PARTS[m.dtype])
    return tuple(m.shape), from_torch_dtype(m.dtype)


def _storage_positions(shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> np.ndarray:
    """The storage position of every element of a strided view, in logical order."""
    pos = np.full(shape, offset, dtype=np.int64)
    for axis, (n, st) in enumerate(zip(shape, strides)):
        pos += (np.arange(n, dtype=np.int64) * st).reshape([n if a == axis else 1 for a in range(len(shape))])
    return pos


def _meta(node: torch.fx.Node) -> Any:
    v = node.meta.get("example_value")
    if v is None:
        v = node.meta.get("tensor_meta")
    return v


def _layout(node: torch.fx.Node) -> Any:
    """The node's recorded (fake) tensor, which has PyTorch's strides: dynamo's ``example_value``,
    torch.export's ``val``."""
    v = node.meta.get("example_value")
    return v if v is not None else node.meta.get("val")


def setitem_copy(x: torch.Tensor, idx: Any, value: Any) -> torch.Tensor:
    """``x[idx] = value`` on a copy, returned: item assignment as a function (it returns None, and
    graph ops are functional; the importer rebinds ``x`` to the result)."""
    y = x.clone()
    y[idx] = value
    return y


#: In-place Python operators run by PyTorch as functions returning the new value.
def writes_in_place(node: torch.fx.Node, target: Any) -> bool:
    """Whether the node is an in-place op on its first argument."""
    if node.op == "call_method":
        return str(target).endswith("_") and not str(target).startswith("_")
    if node.op == "call_module":
        return getattr(target, "inplace", False) is True
    if aten.is_aten(target):
        return aten.mutates(target)
    return target in _INPLACE_OPERATORS or node.kwargs.get("inplace") is True or bool(_in_place_name(node, target))


def _in_place_name(node: torch.fx.Node, target: Any) -> str:
    """``sigmoid_`` for ``x.sigmoid_()``, ``torch.sigmoid_`` and ``F.elu_``: an in-place variant
    whose name without the ``_`` is the same op out of place; ``""`` for others (``x.bernoulli_(p)``
    draws with probability ``p``, ``x.bernoulli()`` with ``x``'s)."""
    if node.op == "call_method":
        name = str(target)
    elif node.op == "call_function" and getattr(target, "__module__", None) in ("torch", "torch._C._nn"):
        name = getattr(target, "__name__", "")
    else:
        return ""
    return name if name.endswith("_") and not name.startswith("_") and name != "bernoulli_" else ""


_FUNCTIONAL = {operator.setitem: setitem_copy}
_INPLACE_OPERATORS = (operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
                      operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift,
                      operator.irshift, torch.relu_, operator.setitem)


def _plain(v: Any) -> Any:
    """fx's immutable containers as Python's own (the model returned dicts and lists)."""
    if isinstance(v, dict) and type(v) is not dict and type(v).__module__.startswith("torch.fx"):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list) and type(v) is not list:
        return [_plain(x) for x in v]
    if type(v) is tuple:
        return tuple(_plain(x) for x in v)
    if type(v) is dict:
        return {k: _plain(x) for k, x in v.items()}
    if type(v) is list:
        return [_plain(x) for x in v]
    return v


def _nests(meta: Any) -> bool:
    """Whether a node's metadata is a tuple / list holding tuples / lists."""
    return isinstance(meta, (tuple, list)) and any(isinstance(m, (tuple, list)) for m in meta)


def _nested(meta: Any, outs: Any) -> Any:
    """The tensors ``outs`` in the (tuple / list) structure of ``meta``, the node's metadata."""
    if hasattr(meta, "shape") and hasattr(meta, "dtype"):
        return next(outs)
    if isinstance(meta, (tuple, list)):
        return tuple(_nested(m, outs) for m in meta)
    return meta


def _meta_leaves(m: Any, symbolic: bool = False) -> list[Any]:
    """The tensor metadata of a node's value (one per output tensor) — of those with symbolic
    sizes too with ``symbolic`` (in their place among the outputs), else not (unknown here)."""
    if m is None:
        return []
    if hasattr(m, "shape") and hasattr(m, "dtype"):
        return [m] if symbolic or all(isinstance(d, int) for d in m.shape) else []
    if isinstance(m, (tuple, list)):
        return [x for v in m for x in _meta_leaves(v, symbolic)]
    return []


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, tuple):
        return tuple(_freeze(x) for x in v)
    return v


def import_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, fallback: bool = False,
              name: str = "graph") -> Imported:
    """Convert ``gm`` (torch-level calls, as from ``symbolic_trace`` or dynamo) to a graph."""
    return Importer(gm, example_inputs, fallback, name).run()


__all__ = ["Imported", "import_fx", "target_name", "writes_in_place"]
