"""Complex tensors in a graph of real tensors.

Graphs have no complex dtype: a complex value is held as its real view (``torch.view_as_real``:
the same shape plus a last axis of 2, the real and the imaginary parts), wrapped in
:class:`Complex` so that no real handler ever reads it as a real tensor.

The importer gives every op that touches a complex value to :func:`lower` first, which builds
the elementwise arithmetic (``*``, ``+``, ``-``, ``/``, ``abs``, ``conj``, ``exp``, ``where``...),
products (``@``, ``einsum``: four real ones), views, indexing and item assignment, reductions, and
the conversions (``view_as_complex``, ``view_as_real``, ``.real``, ``torch.complex``,
``torch.polar``) from real graph ops: Meta-LLaMA's rotary embedding
(``view_as_real(view_as_complex(x) * freqs_cis)``) becomes a few fused elementwise ops.  What
it does not build (an FFT) is an unsupported op; with ``fallback=True`` PyTorch runs it, its
complex inputs and results crossing the graph as real views (:class:`~taskmap.graph.InputRef`).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ...graph import BinaryFn, Tensor, UnaryFn
from .ops_tensor import _sizes
from .registry import Converter, NotConvertible, lookup, norm_axis

#: complex dtype -> the real dtype of its parts
PARTS = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}
OF_PARTS = {v: k for k, v in PARTS.items()}


@dataclass(frozen=True)
class Complex:
    """A complex value of the graph: ``data`` is its real view (shape ``shape + (2,)``)."""

    data: Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape[:-1]

    @property
    def ndim(self) -> int:
        return self.data.ndim - 1

    @property
    def is_constant(self) -> bool:
        return self.data.is_constant


def is_complex(v: Any) -> bool:
    """A complex graph value, a complex torch tensor (a constant), a Python complex number, or a
    complex dtype."""
    return isinstance(v, (Complex, complex)) or isinstance(v, torch.Tensor) and v.is_complex() or \
        isinstance(v, torch.dtype) and v in PARTS


Lowering = Callable[..., Any]
_LOWER: dict[str, Lowering] = {}
_ALIASES = {"iadd": "add", "isub": "sub", "imul": "mul", "itruediv": "truediv", "multiply": "mul",
            "subtract": "sub", "true_divide": "truediv", "divide": "div", "negative": "neg", "_unsafe_view": "view",
            "absolute": "abs", "conj_physical": "conj", "_conj": "conj", "_conj_physical": "conj",
            "_to_copy": "clone", "alias": "clone", "resolve_conj": "clone", "resolve_neg": "clone",
            "contiguous": "clone", "lift_fresh_copy": "clone", "concat": "cat", "concatenate": "cat"}


def name_of(op: str, target: Any) -> str:
    """An fx call's op name, the same for its function, method and ATen forms (``mul``)."""
    if op == "call_method":
        name = target
    elif isinstance(target, torch._ops.OpOverload):
        name = target.overloadpacket.__name__
    else:
        name = getattr(target, "__name__", "")
    if name.endswith("_") and not name.startswith("_"):     # x.mul_(y): the importer rebinds x
        name = name[:-1]
    return _ALIASES.get(name, name)


def lower(cv: Converter, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The op built from real graph ops, or None where it is not (PyTorch must run it)."""
    fn = _LOWER.get(name)
    if fn is None:
        return None
    try:
        return fn(cv, *args, **kwargs)
    except (NotConvertible, TypeError, ValueError, AttributeError, IndexError):       # arguments this lowering does not take
        return None


def _lowers(*names: str) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        for n in names:
            _LOWER[n] = fn
        return fn
    return deco


# ----------------------------------------------------------------------------- parts

Part = Tensor | float | None       # a real or imaginary part: shape + (1,), a number, or zero


def _parts(cv: Converter, v: Any) -> tuple[Part, Part]:
    if isinstance(v, Complex):
        return cv.slice(v.data, -1, 0, 1), cv.slice(v.data, -1, 1, 2)
    if isinstance(v, torch.Tensor) and v.is_complex():                # a constant (a buffer, a folded op)
        v = v.resolve_conj()
        return cv.const(v.real.unsqueeze(-1).contiguous()), cv.const(v.imag.unsqueeze(-1).contiguous())
    if isinstance(v, Tensor) and v.dtype.is_float:
        return _unsqueeze(cv, v), None
    if isinstance(v, complex):
        return v.real, v.imag
    if isinstance(v, (bool, int, float)):
        return float(v), None
    raise NotConvertible(f"a {type(v).__name__} operand")


def _unsqueeze(cv: Converter, x: Tensor) -> Tensor:
    return cv.reshape(x, (*x.shape, 1))


def _dtype(values: Sequence[Any]) -> torch.dtype:
    """The result's complex dtype, where the operands agree on their parts' dtype and it is
    complex64 or complex128 (promotion across dtypes, and complex32, are left to PyTorch)."""
    dtypes = {v.dtype for v in values if isinstance(v, Complex) or isinstance(v, torch.Tensor)}
    dtypes |= {OF_PARTS.get(getattr(torch, v.dtype.name)) for v in values if isinstance(v, Tensor)}
    if len(dtypes) != 1 or next(iter(dtypes)) not in (torch.complex64, torch.complex128):
        raise NotConvertible("operands of several dtypes")
    return next(iter(dtypes))


def _mul(cv: Converter, a: Part, b: Part, fn: BinaryFn = BinaryFn.MUL) -> Part:
    if a is None or b is None or (fn is BinaryFn.MUL and (a == 0 if not isinstance(a, Tensor) else False)):
        return None
    if not isinstance(b, Tensor) and b == 1:
        return a
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a * b if fn is BinaryFn.MUL else a / b
    if not isinstance(b, Tensor) and b == 0 and fn is BinaryFn.MUL:
        return None
    return cv.binary(fn, a, b)


def _add(cv: Converter, a: Part, b: Part, fn: BinaryFn = BinaryFn.ADD) -> Part:
    if b is None:
        return a
    if a is None:
        return b if fn is BinaryFn.ADD else _neg(cv, b)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a + b if fn is BinaryFn.ADD else a - b
    return cv.binary(fn, a, b)


def _neg(cv: Converter, a: Part) -> Part:
    if a is None or not isinstance(a, Tensor):
        return None if a is None else -a
    return cv.unary(UnaryFn.NEG, a)


def _make(cv: Converter, re: Part, im: Part, dtype: torch.dtype) -> Complex:
    """The complex value of two parts (at least one a tensor), broadcast to one shape."""
    tensors = [p for p in (re, im) if isinstance(p, Tensor)]
    if not tensors:
        raise NotConvertible("a complex number without tensor operands")
    shape = tuple(np.broadcast_shapes(*(t.shape for t in tensors)))
    dtype_parts = getattr(torch, tensors[0].dtype.name)

    def full(p: Part) -> Tensor:
        if not isinstance(p, Tensor):            # a number (0 for None): a one-element constant, broadcast
            p = cv.const(torch.full((1,) * len(shape), float(p or 0.0), dtype=dtype_parts))
        return cv.expand(p, shape)
    return Complex(lookup("call_function", torch.cat)(cv, [full(re), full(im)], -1), dtype)


def _real(cv: Converter, p: Tensor) -> Tensor:
    return cv.reshape(p, p.shape[:-1])


def _complex_operands(*values: Any) -> None:
    """A complex graph value among the operands, or a complex number with a real tensor
    (``1j * theta``)."""
    if not any(isinstance(v, Complex) for v in values) and not (
            any(isinstance(v, complex) for v in values) and any(isinstance(v, Tensor) for v in values)):
        raise NotConvertible("no complex graph operand")


# ----------------------------------------------------------------------------- arithmetic


def _scaled(cv: Converter, fn: BinaryFn, z: Any, r: Any) -> Complex | None:
    """``z * r`` or ``z / r`` of a complex value by a real tensor or number: one op on the real
    view (both parts scaled alike); None for other operands."""
    if not isinstance(z, Complex) or isinstance(r, (Complex, complex, torch.Tensor)) or \
            isinstance(r, Tensor) and not r.dtype.is_float:
        return None
    dtype = _dtype([z, r])
    return Complex(cv.binary(fn, z.data, _unsqueeze(cv, r) if isinstance(r, Tensor) else r), dtype)


@_lowers("mul")
def _mul_op(cv: Converter, a: Any, b: Any) -> Complex:
    _complex_operands(a, b)
    scaled = _scaled(cv, BinaryFn.MUL, a, b) or _scaled(cv, BinaryFn.MUL, b, a)
    if scaled is not None:
        return scaled
    dtype = _dtype([a, b])
    (ar, ai), (br, bi) = _parts(cv, a), _parts(cv, b)
    return _make(cv, _add(cv, _mul(cv, ar, br), _mul(cv, ai, bi), BinaryFn.SUB),
                 _add(cv, _mul(cv, ar, bi), _mul(cv, ai, br)), dtype)


@_lowers("add", "sub")
def _add_op(cv: Converter, a: Any, b: Any, alpha: Any = 1, *, _fn: BinaryFn = BinaryFn.ADD) -> Complex:
    _complex_operands(a, b)
    if alpha != 1:
        raise NotConvertible("alpha")
    dtype = _dtype([a, b])
    (ar, ai), (br, bi) = _parts(cv, a), _parts(cv, b)
    return _make(cv, _add(cv, ar, br, _fn), _add(cv, ai, bi, _fn), dtype)


_LOWER["sub"] = lambda cv, a, b, alpha=1: _add_op(cv, a, b, alpha, _fn=BinaryFn.SUB)


@_lowers("truediv", "div")
def _div_op(cv: Converter, a: Any, b: Any, rounding_mode: Any = None) -> Complex:
    _complex_operands(a, b)
    if rounding_mode is not None:
        raise NotConvertible("rounding division of complex numbers")
    scaled = _scaled(cv, BinaryFn.DIV, a, b)
    if scaled is not None:
        return scaled
    dtype = _dtype([a, b])
    (ar, ai), (br, bi) = _parts(cv, a), _parts(cv, b)
    if bi is None:                                                # by a real divisor
        return _make(cv, _mul(cv, ar, br, BinaryFn.DIV), _mul(cv, ai, br, BinaryFn.DIV), dtype)
    den = _add(cv, _mul(cv, br, br), _mul(cv, bi, bi))
    re = _add(cv, _mul(cv, ar, br), _mul(cv, ai, bi))
    im = _add(cv, _mul(cv, ai, br), _mul(cv, ar, bi), BinaryFn.SUB)
    return _make(cv, _mul(cv, re, den, BinaryFn.DIV), _mul(cv, im, den, BinaryFn.DIV), dtype)


@_lowers("neg")
def _neg_op(cv: Converter, z: Complex) -> Complex:
    _complex_operands(z)
    return Complex(cv.unary(UnaryFn.NEG, z.data), z.dtype)


@_lowers("conj")
def _conj(cv: Converter, z: Complex) -> Complex:
    _complex_operands(z)
    signs = cv.const(torch.tensor([1.0, -1.0], dtype=PARTS[z.dtype]))
    return Complex(cv.binary(BinaryFn.MUL, z.data, signs), z.dtype)


@_lowers("abs")
def _abs(cv: Converter, z: Complex) -> Tensor:
    _complex_operands(z)
    re, im = _parts(cv, z)
    return _real(cv, cv.unary(UnaryFn.SQRT, _add(cv, _mul(cv, re, re), _mul(cv, im, im))))


@_lowers("angle")
def _angle(cv: Converter, z: Complex) -> Tensor:
    _complex_operands(z)
    re, im = _parts(cv, z)
    return _real(cv, cv.binary(BinaryFn.ATAN2, im, re))


@_lowers("exp")
def _exp(cv: Converter, z: Complex) -> Complex:
    _complex_operands(z)
    re, im = _parts(cv, z)
    r = cv.unary(UnaryFn.EXP, re)
    return _make(cv, _mul(cv, r, cv.unary(UnaryFn.COS, im)), _mul(cv, r, cv.unary(UnaryFn.SIN, im)), z.dtype)


def _bilinear(cv: Converter, f: Callable[[Tensor, Tensor], Tensor], a: Any, b: Any) -> Complex:
    """``f(a, b)`` of a bilinear ``f`` (a product): (ar + i ai)(br + i bi) term by term."""
    _complex_operands(a, b)
    if not all(isinstance(v, Complex) or isinstance(v, torch.Tensor) and v.is_complex() for v in (a, b)):
        raise NotConvertible("a product of a complex and a real operand (PyTorch refuses it)")
    dtype = _dtype([a, b])
    (ar, ai), (br, bi) = ([_real(cv, p) for p in _parts(cv, v)] for v in (a, b))
    re = cv.binary(BinaryFn.SUB, f(ar, br), f(ai, bi))
    im = cv.binary(BinaryFn.ADD, f(ar, bi), f(ai, br))
    return _make(cv, _unsqueeze(cv, re), _unsqueeze(cv, im), dtype)


@_lowers("matmul", "mm", "bmm", "__matmul__")
def _matmul(cv: Converter, a: Any, b: Any) -> Complex:
    return _bilinear(cv, lambda x, y: lookup("call_function", torch.matmul)(cv, x, y), a, b)


@_lowers("einsum")
def _einsum(cv: Converter, equation: str, *operands: Any) -> Complex:
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if len(operands) != 2:
        raise NotConvertible("an einsum of other than two operands")
    return _bilinear(cv, lambda x, y: lookup("call_function", torch.einsum)(cv, equation, x, y), *operands)


@_lowers("where")
def _where(cv: Converter, cond: Any, a: Any, b: Any) -> Complex:
    _complex_operands(a, b)
    if not isinstance(cond, Tensor):
        raise NotConvertible("a condition that is not a tensor")
    dtype = _dtype([a, b])
    c = _unsqueeze(cv, cond)
    where = lookup("call_function", torch.where)
    (ar, ai), (br, bi) = _parts(cv, a), _parts(cv, b)
    return _make(cv, where(cv, c, 0.0 if ar is None else ar, 0.0 if br is None else br),
                 where(cv, c, 0.0 if ai is None else ai, 0.0 if bi is None else bi), dtype)


_LOWER["masked_fill"] = lambda cv, z, mask, value: _where(cv, mask, value, z)


# ----------------------------------------------------------------------------- conversions


@_lowers("view_as_complex")
def _view_as_complex(cv: Converter, x: Tensor) -> Complex:
    if not isinstance(x, Tensor) or x.ndim == 0 or x.shape[-1] != 2 or getattr(torch, x.dtype.name) not in OF_PARTS:
        raise NotConvertible("not a real view")
    return Complex(x, OF_PARTS[getattr(torch, x.dtype.name)])


@_lowers("view_as_real")
def _view_as_real(cv: Converter, z: Complex) -> Tensor:
    _complex_operands(z)
    return z.data


@_lowers("real", "imag")
def _part(cv: Converter, z: Complex, *, _k: int = 0) -> Tensor:
    _complex_operands(z)
    return _real(cv, _parts(cv, z)[_k])


_LOWER["imag"] = lambda cv, z: _part(cv, z, _k=1)


@_lowers("complex")
def _complex(cv: Converter, re: Any, im: Any) -> Complex:
    if not isinstance(re, Tensor) or not isinstance(im, Tensor) or re.dtype is not im.dtype:
        raise NotConvertible("parts of two dtypes")
    return _make(cv, _unsqueeze(cv, re), _unsqueeze(cv, im), OF_PARTS[getattr(torch, re.dtype.name)])


@_lowers("polar")
def _polar(cv: Converter, r: Any, theta: Any) -> Complex:
    z = _complex(cv, theta, theta)                       # (checks the dtypes)
    t = _unsqueeze(cv, theta)
    rr = _unsqueeze(cv, r)
    return _make(cv, _mul(cv, rr, cv.unary(UnaryFn.COS, t)), _mul(cv, rr, cv.unary(UnaryFn.SIN, t)), z.dtype)


@_lowers("clone", "to")
def _same(cv: Converter, z: Complex, *args: Any, **kwargs: Any) -> Complex:
    _complex_operands(z)
    keep = {"memory_format", "non_blocking", "copy", "layout", "device", "pin_memory"}
    if any(not (a is None or a == z.dtype or isinstance(a, (str, torch.device)) or a is torch.contiguous_format)
           for a in args) or any(k not in keep and not (k == "dtype" and v in (None, z.dtype))
                                 for k, v in kwargs.items()):
        raise NotConvertible("a conversion")
    return z


# ----------------------------------------------------------------------------- shapes


def _on_data(name: str, make_args: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
    """``name`` on a complex value: the real op on its real view, with arguments made for it."""
    def fn(cv: Converter, z: Any, *args: Any, **kwargs: Any) -> Complex:
        _complex_operands(z)
        a, kw = make_args(z, *args, **kwargs)
        handler = lookup("call_method", name)
        return Complex(handler(cv, z.data, *a, **kw), z.dtype)
    _LOWER[name] = fn


def _dims(z: Complex, *dims: Any) -> tuple[int, ...]:
    return tuple(norm_axis(d, z.ndim) for d in _sizes(dims))


_on_data("reshape", lambda z, *shape: ((*_sizes(shape), 2), {}))
_on_data("view", lambda z, *shape: ((*_sizes(shape), 2), {}))
_on_data("expand", lambda z, *shape: ((*_sizes(shape), 2), {}))
_on_data("permute", lambda z, *dims: ((*_dims(z, *dims), z.ndim), {}))
_on_data("transpose", lambda z, a, b: (_dims(z, a, b), {}))
_on_data("unsqueeze", lambda z, d: ((d % (z.ndim + 1),), {}))
_on_data("flatten", lambda z, start=0, end=-1: (_dims(z, start, end), {}))
_on_data("select", lambda z, d, i: ((norm_axis(d, z.ndim), i), {}))
_on_data("narrow", lambda z, d, start, length: ((norm_axis(d, z.ndim), start, length), {}))


@_lowers("slice")
def _slice(cv: Converter, z: Complex, dim: int = 0, start: Any = None, end: Any = None, step: Any = 1) -> Complex:
    _complex_operands(z)
    return Complex(cv.slice(z.data, norm_axis(dim, z.ndim), start, end, step), z.dtype)


@_lowers("squeeze")
def _squeeze(cv: Converter, z: Complex, dim: Any = None) -> Complex:
    _complex_operands(z)
    drop = [d for d, n in enumerate(z.shape) if n == 1] if dim is None else \
        [d for d in _dims(z, *(dim if isinstance(dim, (tuple, list)) else (dim,))) if z.shape[d] == 1]
    return Complex(cv.reshape(z.data, [n for d, n in enumerate(z.data.shape) if d not in drop]), z.dtype)


@_lowers("getitem")
def _getitem(cv: Converter, z: Any, index: Any) -> Any:
    if not isinstance(z, Complex):
        if isinstance(z, (tuple, list)):
            return z[index]                                      # a (complex) value of a tuple
        raise NotConvertible("not a complex value")
    return Complex(lookup("call_function", operator.getitem)(cv, z.data, _on_view(index)), z.dtype)


@_lowers("setitem")
def _setitem(cv: Converter, z: Any, index: Any, value: Any) -> Complex:
    """``z[index] = value`` into a complex value or constant: the assignment on the real views."""
    z = _as_complex(cv, z)
    value = _as_complex(cv, value, z.data)
    if value.dtype != z.dtype:
        raise NotConvertible("assigning a value of another dtype")
    return Complex(lookup("call_function", operator.setitem)(cv, z.data, _on_view(index), value.data), z.dtype)


def _as_complex(cv: Converter, v: Any, like: Tensor | None = None) -> Complex:
    """``v`` (a complex value or constant; with ``like``, a real tensor or a number too) as a
    complex value."""
    if isinstance(v, Complex):
        return v
    if isinstance(v, torch.Tensor) and v.is_complex():
        return Complex(cv.const(torch.view_as_real(v.resolve_conj()).contiguous()), v.dtype)
    if like is None or not isinstance(v, (Tensor, bool, int, float, complex)) or isinstance(v, Tensor) and \
            v.dtype is not like.dtype:
        raise NotConvertible(f"a {type(v).__name__} as a complex value")
    dtype = OF_PARTS[getattr(torch, like.dtype.name)]
    if isinstance(v, Tensor):
        return _make(cv, _unsqueeze(cv, v), None, dtype)
    c = complex(v)
    return Complex(cv.const(torch.tensor([c.real, c.imag], dtype=PARTS[dtype])), dtype)


def _on_view(index: Any) -> tuple[Any, ...]:
    """A complex value's index as its real view's: the parts' axis kept whole."""
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (Complex, torch.Tensor, Tensor, list)) for i in items):
        raise NotConvertible("indexing by tensors")
    return items + ((slice(None),) if Ellipsis in items else (Ellipsis, slice(None)))


@_lowers("cat", "stack")
def _join(cv: Converter, values: Sequence[Any], dim: int = 0, *, _stack: bool = False) -> Complex:
    if not values or not all(isinstance(v, Complex) for v in values) or len({v.dtype for v in values}) != 1:
        raise NotConvertible("joining complex and real values")
    d = norm_axis(dim, values[0].ndim + (1 if _stack else 0))
    join = lookup("call_function", torch.stack if _stack else torch.cat)
    return Complex(join(cv, [v.data for v in values], d), values[0].dtype)


_LOWER["stack"] = lambda cv, values, dim=0: _join(cv, values, dim, _stack=True)


@_lowers("sum", "mean")
def _reduce(cv: Converter, z: Complex, dim: Any = None, keepdim: bool = False, *, dtype: Any = None,
            _fn: str = "sum") -> Complex:
    _complex_operands(z)
    if dtype not in (None, z.dtype):
        raise NotConvertible("a reduction to another dtype")
    dims = tuple(range(z.ndim)) if dim is None or dim == () or dim == [] else \
        _dims(z, *(dim if isinstance(dim, (tuple, list)) else (dim,)))
    return Complex(lookup("call_method", _fn)(cv, z.data, dims, keepdim), z.dtype)


_LOWER["mean"] = lambda cv, z, dim=None, keepdim=False, dtype=None: _reduce(cv, z, dim, keepdim, dtype=dtype,
                                                                             _fn="mean")


# ----------------------------------------------------------------------------- what a value is


@_lowers("getattr")
def _attribute(cv: Converter, z: Any, name: str) -> Any:
    if not isinstance(z, Complex):
        raise NotConvertible("not a complex value")
    if name in ("real", "imag", "T", "mT"):
        return _LOWER[name](cv, z)
    values = {"shape": lambda: torch.Size(z.shape), "dtype": lambda: z.dtype, "ndim": lambda: z.ndim,
              "device": lambda: torch.device(z.data.device)}
    if name not in values:
        raise NotConvertible(f"the attribute {name!r} of a complex value")
    return values[name]()


_LOWER["mT"] = lambda cv, z: _LOWER["transpose"](cv, z, -2, -1)
_LOWER["T"] = lambda cv, z: _LOWER["permute"](cv, z, *reversed(range(z.ndim)))
_LOWER["size"] = lambda cv, z, dim=None: torch.Size(z.shape) if dim is None else z.shape[norm_axis(dim, z.ndim)]
_LOWER["sym_size"] = lambda cv, z, dim=0: z.shape[norm_axis(dim, z.ndim)]
_LOWER["dim"] = lambda cv, z: z.ndim
_LOWER["numel"] = lambda cv, z: int(np.prod(z.shape, dtype=np.int64))
_LOWER["is_complex"] = lambda cv, z: True
_LOWER["is_floating_point"] = lambda cv, z: False

__all__ = ["Complex", "PARTS", "is_complex", "lower", "name_of"]
