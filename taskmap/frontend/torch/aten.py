"""ATen overloads (``torch.ops.aten.linear.default``) through the registry's torch-level handlers.

``taskmap.compile`` captures a model that ``torch.fx.symbolic_trace`` cannot trace with
``torch.export.export(strict=False)`` (see :mod:`.capture`), whose graph calls ATen overloads.
Most of them take the arguments of the torch function of the same name (``aten.add.Tensor``
as ``torch.add``), of the tensor method (``aten.view.default`` as ``x.view(size)``) or of
``torch.nn.functional`` (``aten.gelu.default``): those handlers serve them as they are.  The
ones whose arguments differ (``aten.slice.Tensor``, ``aten.group_norm(..., cudnn_enabled)``,
``aten.upsample_bilinear2d.vec``, ...) are adapted here.

An overload that returns several tensors must get a handler that does (a handler returning one
tensor for ``aten.adaptive_max_pool2d`` would let ``[0]`` pick a row): otherwise, and for
overloads with no handler, the op is not convertible and the capture falls back to dynamo's
torch-level graph.  Memory-format, layout and pinning arguments are dropped: the graph holds
values, not strides.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ...graph import Tensor
from .ops_bag import MODES, embedding_bag_op
from .registry import Converter, Handler, NotConvertible, Unavailable, lookup

_ADAPTERS: dict[str, Handler] = {}      # by packet name, or "name.overload" for one overload
_IGNORED = ("layout", "pin_memory", "memory_format", "non_blocking")

#: Overloads that neither compute nor change values (checks, detaching): dropped.
_NO_OPS = frozenset({"_assert_tensor_metadata", "_assert_scalar", "_assert_async", "detach_", "sym_constrain_range",
                     "sym_constrain_range_for_size"})


def _adapt(*names: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for n in names:
            _ADAPTERS[n] = fn
        return fn
    return deco


def _call(cv: Converter, target: Any, *args: Any, **kwargs: Any) -> Any:
    """The torch-level handler of ``target`` (a function, or a method name given as a str)."""
    handler = lookup("call_method" if isinstance(target, str) else "call_function", target)
    assert handler is not None, target
    return handler(cv, *args, **kwargs)


def is_aten(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def mutates(op: torch._ops.OpOverload) -> bool:
    """Whether the overload writes into its first argument (``aten.add_.Tensor``)."""
    args = op._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write


def _aliases(op: Any) -> bool:
    """Whether the overload's result may share its first argument's memory (a view, an in-place op)."""
    returns = op._schema.returns
    return bool(returns) and returns[0].alias_info is not None


class AliasingError(NotConvertible):
    """An in-place write whose effect reaches a view read later (``v = h[:, :2]; h.add_(1); v``):
    no functional graph gives that view's value without tracking aliasing, dynamo's neither."""


def functional_writes(graph: torch.fx.Graph) -> str:
    """Rewrite the graph's in-place ops so that graph ops, which are functional, give their
    values; returns why that cannot be done (dynamo's graph may serve), or ``""``.  Raises
    :class:`AliasingError` where no graph of taskmap's would be right.

    An in-place op on a tensor that is no view (``h += x``, ``h.mul_(0.5)``, also through the
    result of an earlier in-place op) is a new value that every later reader of that tensor
    reads — unless a view of it taken before is read after.  A write through a view
    (``out[:, 1:] = h``: ``copy_`` into ``slice`` views) becomes ``operator.setitem`` on the
    base when the view is a chain of ``slice`` / ``select`` that nothing else reads; an update
    through such a view (``x[..., :n] *= mask``: ``mul_`` of a ``slice``) becomes the op out of
    place on the view, set into the base the same way, and later readers of the view read that
    result; where nothing reads the base or its other views after the update, whatever the views
    (reshapes too), the op out of place is all it takes.  ``contiguous`` of a tensor that is not
    (a permutation's) is a copy, not a view.  Writes into inputs or weights, and others through
    views, are refused (the caller's tensors would change, or aliasing would need tracking)."""
    base: dict[torch.fx.Node, torch.fx.Node] = {}     # the tensor whose memory a node's value is
    same: dict[torch.fx.Node, torch.fx.Node] = {}     # ... and the node that is that tensor, view or not
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        src = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        write = src is not None and is_aten(node.target) and mutates(node.target)
        # an output of a multi-output op is a tensor of its own unless the op returns views
        # (``split``, ``unbind``): ``topk``'s values and indices do not alias each other
        view = (node.target is operator.getitem and src is not None and is_aten(src.target) and _aliases(src.target)) \
            or (is_aten(node.target) and _aliases(node.target) and not _copies(node))
        alias = src is not None and view
        base[node] = base[src] if alias else node
        same[node] = same[src] if write else node
    for node in list(graph.nodes):
        if node.op != "call_function" or not is_aten(node.target) or not mutates(node.target) or \
                node.target.overloadpacket.__name__ in _NO_OPS:
            continue
        target = node.args[0]
        root = base[target]
        if root.op in ("placeholder", "get_attr"):
            return f"{node.target} writes into an input or a weight"
        written = lambda n: same.get(n) is root      # noqa: E731 - root, or a value written into it
        late = [v for v in base if base[v] is root and same[v] is v and v is not root and v is not target and
                order[v] < order[node] and _read_after(v, order, order[node]) and not _disjoint(v, target, written)]
        stale = [(v, _view_chain(v, written)) for v in late]     # taken again, for the later readers
        if any(chain is None for _, chain in stale):
            v = next(v for v, chain in stale if chain is None)
            raise AliasingError(f"{node.target} changes {root.name}, whose view {v.name} (taken before) is "
                                f"read after{_line(node)}")
        value = node
        pure = None if node.target.overloadpacket.__name__ in _OVERWRITES else _out_of_place(node.target)
        if same[target] is not root and pure is not None and _only_the_view_is_read(node, target, root, base, order):
            new = _updated_view(graph, node, target, pure, order)   # nothing reads the rest of root after
            base[new] = same[new] = new         # a tensor of its own (a later update may target it)
            graph.erase_node(node)
            continue
        if same[target] is not root:
            overwrite = node.target.overloadpacket.__name__ in _OVERWRITES
            chain = _index_chain(target, lambda n: same.get(n) is root, 1 if overwrite else len(target.users))
            if chain is None or (overwrite and node.users) or (not overwrite and pure is None):
                raise AliasingError(f"{node.target} writes through the view {target.name} of {root.name}{_line(node)}")
            index, views, current = chain
            new = node.args[1] if overwrite else _updated_view(graph, node, target, pure, order)
            if not overwrite:               # still a view of root (a second update must set it again)
                base[new], same[new] = root, new
            with graph.inserting_before(node):
                value = graph.call_function(operator.setitem, (current, index, new))
            value.meta = {**node.meta, **{k: root.meta[k] for k in ("val", "tensor_meta") if k in root.meta}}
            graph.erase_node(node)
            if overwrite:
                for v in views:
                    if not v.users:         # (a view read elsewhere stays: before the write, or taken again below)
                        graph.erase_node(v)
            order[value], same[value], base[value] = order.pop(node), root, root
        _take_again(graph, stale, value, root, base, same, order)
        for v in [v for v in same if same[v] is root and v is not value and v in order]:
            for user in list(v.users):          # later readers of the tensor read its new value
                if order.get(user, len(order)) > order[value]:
                    user.replace_input_with(v, value)
    return ""


def _view_chain(view: torch.fx.Node, is_root: Callable[[torch.fx.Node], bool]) -> list[torch.fx.Node] | None:
    """The ``slice`` / ``select`` views from the tensor (a value of it) to ``view``, first first; None
    for other views."""
    chain = []
    while not is_root(view):
        if view.target not in (torch.ops.aten.slice.Tensor, torch.ops.aten.select.int):
            return None
        chain.append(view)
        view = view.args[0]
    return chain[::-1]


def _take_again(graph: torch.fx.Graph, stale: list[tuple[torch.fx.Node, list[torch.fx.Node]]], value: torch.fx.Node,
                root: torch.fx.Node, base: dict[torch.fx.Node, torch.fx.Node], same: dict[torch.fx.Node, torch.fx.Node],
                order: dict[torch.fx.Node, int]) -> None:
    """Views of ``root`` taken before a write and read after (``f0 = freq[0]; f0[..., 1::3] = x;
    cat(f0, ...)``): their readers after the write read the same views of its result ``value``."""
    at = order[value]
    for view, chain in stale:
        last = current = value
        for v in chain:
            with graph.inserting_after(last):
                current = graph.call_function(v.target, (current, *v.args[1:]), dict(v.kwargs))
            current.meta = dict(v.meta)
            order[current], base[current], same[current] = at, root, current
            last = current
        for user in list(view.users):
            if order.get(user, len(order)) > at:
                user.replace_input_with(view, current)


def _line(node: torch.fx.Node) -> str:
    """`` (at <the model's line>)`` from the node's recorded stack, or ``""``."""
    lines = [ln.strip() for ln in (node.stack_trace or "").splitlines() if ln.strip()]
    return f" (at {lines[-2]}: {lines[-1]})" if len(lines) >= 2 else ""


_FULL = (0, None, 1)
_OVERWRITES = ("copy_", "fill_")


def _read_after(v: torch.fx.Node, order: dict[torch.fx.Node, int], at: int) -> bool:
    """Whether ``v``'s value is read after position ``at``: by a user there other than a write
    that replaces it whole (``copy_``, ``fill_``) or a view of it that is itself not read."""
    for u in v.users:
        overwrite = is_aten(u.target) and u.target.overloadpacket.__name__ in _OVERWRITES and u.args[0] is v
        view = is_aten(u.target) and _aliases(u.target) and not mutates(u.target) and u.args[0] is v
        if overwrite or (view and not _read_after(u, order, at)):
            continue
        if order.get(u, at + 1) > at:
            return True
    return False


def _updated_view(graph: torch.fx.Graph, node: torch.fx.Node, target: torch.fx.Node, pure: Any,
                  order: dict[torch.fx.Node, int]) -> torch.fx.Node:
    """The in-place update ``node`` of the view ``target``, out of place (``pure``): its result,
    in the view's dtype (``h.add_(x)`` of float16 ``h`` and float32 ``x`` stays float16), which
    the node's users and the view's later readers read instead."""
    val = node.meta.get("val")
    with graph.inserting_before(node):
        new = out = graph.call_function(pure, node.args, node.kwargs)
        if isinstance(val, torch.Tensor):
            new = graph.call_function(torch.ops.aten._to_copy.default, (out,), {"dtype": val.dtype})
    out.meta, new.meta = dict(node.meta), dict(node.meta)
    order[out] = order[new] = order[node]
    node.replace_all_uses_with(new)
    for user in [u for u in target.users if u not in (out, new) and order.get(u, len(order)) > order[node]]:
        user.replace_input_with(target, new)
    return new


def _only_the_view_is_read(node: torch.fx.Node, target: torch.fx.Node, root: torch.fx.Node,
                           base: dict[torch.fx.Node, torch.fx.Node], order: dict[torch.fx.Node, int]) -> bool:
    """Whether, after the in-place ``node`` on the view ``target`` of ``root``, nothing reads
    ``root``'s memory but ``target`` itself (and the views leading to it, each read only by the
    next): then only the view's value changes, whatever views lead to it (Funnel's
    ``_relative_shift_gather(...) *= mask`` goes through reshapes)."""
    chain = set()
    v = target
    while v is not root:
        chain.add(v)
        v = v.args[0]
    at = order[node]
    for v, b in base.items():
        if b is not root or v is target or v is node or v not in order or \
                (order[v] > at and _view_of(v, target, root)):
            continue
        if any(u is not node and u not in chain and order.get(u, at + 1) > at for u in v.users):
            return False
    return True


def _view_of(v: torch.fx.Node, target: torch.fx.Node, root: torch.fx.Node) -> bool:
    """Whether ``v`` is a view of ``target`` (through other views): taken after the update, it
    reads the updated view (DeBERTa's ``pos_query_layer /= scale`` then
    ``pos_query_layer.transpose(-1, -2)``)."""
    while v is not root and v.args and isinstance(v.args[0], torch.fx.Node):
        v = v.args[0]
        if v is target:
            return True
    return False


def _copies(node: torch.fx.Node) -> bool:
    """Whether an aliasing overload makes a copy here: ``contiguous`` of a tensor that is not."""
    if node.target is not torch.ops.aten.contiguous.default or not isinstance(node.args[0], torch.fx.Node):
        return False
    val = node.args[0].meta.get("val")
    return isinstance(val, torch.Tensor) and not val.is_contiguous()


def _out_of_place(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.mul.Tensor`` for ``aten.mul_.Tensor``; None where there is no such overload."""
    name = op.overloadpacket.__name__
    packet = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") else None
    return getattr(packet, op._overloadname, None) if packet is not None else None


def _region(view: torch.fx.Node, is_root: Callable[[torch.fx.Node], bool]) -> list[range] | None:
    """The elements of the tensor (a value of it: ``is_root``) a chain of ``slice`` / ``select``
    views shows: per dimension, the indices (None: another kind of view, or no recorded shape)."""
    chain = _view_chain(view, is_root)
    if chain is None:
        return None
    val = (chain[0].args[0] if chain else view).meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    region = [range(int(n)) for n in val.shape]
    dims = list(range(len(region)))            # the root's dimensions the current view still has
    for v in chain:
        d = dims[(v.args[1] if len(v.args) > 1 else 0) % len(dims)]
        if v.target is torch.ops.aten.select.int:
            i = region[d][v.args[2]]
            region[d] = range(i, i + 1)
            dims.remove(d)
        else:
            given = list(v.args[2:])
            start, end, step = given + [None, None, 1][len(given):]
            region[d] = region[d][slice(start, end, step)]
    return region


def _disjoint(a: torch.fx.Node, b: torch.fx.Node, is_root: Callable[[torch.fx.Node], bool]) -> bool:
    """Whether the ``slice`` / ``select`` views ``a`` and ``b`` of a tensor share no element
    (``freq[1]`` and ``freq[0][..., 1::3]``): a write through one leaves the other as it was."""
    ra, rb = _region(a, is_root), _region(b, is_root)
    return ra is not None and rb is not None and any(set(x).isdisjoint(y) for x, y in zip(ra, rb))


def _index_chain(view: torch.fx.Node, is_base: Callable[[torch.fx.Node], bool], users: int = 1
                 ) -> tuple[tuple[Any, ...], list[torch.fx.Node], torch.fx.Node] | None:
    """``base[index]`` for a chain of ``slice`` / ``select`` views, up to a node ``is_base``
    accepts; the views (last first) and that base.  The view itself may have ``users`` users
    (its write; with an update, its readers too); the chain's others any (readers before the
    write read the old values, readers after it views taken again: :func:`_take_again`).  None
    for other views."""
    views = []
    node = view
    while not is_base(node):
        if node.target not in (torch.ops.aten.slice.Tensor, torch.ops.aten.select.int) or \
                (node is view and len(node.users) > users):
            return None
        views.append(node)
        node = node.args[0]
    root = node
    shape = list(root.meta["val"].shape)
    index: list[Any] = [slice(None)] * len(shape)
    dims = list(range(len(shape)))             # the root's dimensions the current view still has
    for v in reversed(views):
        d = dims[v.args[1] % len(dims)] if len(v.args) > 1 else dims[0]
        if index[d] != slice(None):
            return None                        # two views of one dimension: not composed here
        if v.target is torch.ops.aten.select.int:
            index[d] = v.args[2]
            dims.remove(d)
            continue
        given = list(v.args[2:])
        start, end, step = given + [None, None, 1][len(given):]
        if (start or 0, end if end is None or end < shape[d] else None, step) != _FULL:
            index[d] = slice(start, end, step)
    while index and index[-1] == slice(None):
        index.pop()
    return tuple(index), views, root


def handler(op: torch._ops.OpOverload) -> Handler | None:
    """The handler of an ATen overload (None: not convertible)."""
    name = op.overloadpacket.__name__
    if name in _NO_OPS:
        return _no_op
    fn = _ADAPTERS.get(f"{name}.{op._overloadname}", _ADAPTERS.get(name))
    if fn is None:
        fn = generic(name)
    if fn is None:
        pure = _out_of_place(op) if mutates(op) else None
        # ``silu_``: its value out of place (:func:`functional_writes` made later readers read it)
        return handler(pure) if pure is not None else None
    returns = len(op._schema.returns)

    def convert(cv: Converter, *args: Any, **kwargs: Any) -> Any:
        kwargs = {k: v for k, v in kwargs.items() if k not in _IGNORED}
        try:
            out = fn(cv, *args, **kwargs)
        except TypeError as e:       # the torch-level handler takes other arguments
            raise NotConvertible(f"{op}: {e}") from None
        if returns > 1 and not isinstance(out, (tuple, list)):
            raise NotConvertible(f"{op} returns {returns} tensors, its handler one")
        return out
    return convert


def generic(name: str) -> Handler | None:
    """``torch.<name>``, the method ``<name>`` or ``F.<name>``, whichever has a handler."""
    for op, target in (("call_function", getattr(torch, name, None)), ("call_method", name),
                       ("call_function", getattr(F, name, None))):
        if target is not None and lookup(op, target) is not None:
            return lookup(op, target)
    return None


def _no_op(cv: Converter, x: Any = None, *args: Any, **kwargs: Any) -> Any:
    return x


@_adapt("embedding_bag", "_embedding_bag", "_embedding_bag_forward_only")
def _embedding_bag(cv: Converter, weight: Any, indices: Any, offsets: Any, scale_grad_by_freq: bool = False,
                   mode: int = 0, sparse: bool = False, per_sample_weights: Any = None,
                   include_last_offset: bool = False, padding_idx: Any = -1) -> tuple[Any, ...]:
    """The bags' values (``F.embedding_bag`` flattened a 2-d input and made its offsets before);
    ATen's other results — each index's bag, the bags' sizes, the positions of the maxima — are
    not computed."""
    out = embedding_bag_op(cv, indices, weight, offsets, None, MODES[mode], per_sample_weights, include_last_offset,
                           None if padding_idx is None or padding_idx < 0 else padding_idx)
    rest = Unavailable("embedding_bag's bag of each index, bag sizes and positions of the maxima (taskmap computes "
                       "the bags' values only)")
    return out, rest, rest, rest


@_adapt("lift_fresh_copy", "alias", "_to_copy", "_to_dim_order_copy")
def _copy(cv: Converter, x: Any, dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
    """A copy (a value, in the graph), cast when a dtype or device is given."""
    return _call(cv, "to", x, dtype=dtype, device=device) if dtype is not None or device is not None else x


@_adapt("group_norm")
def _group_norm(cv: Converter, x: Any, groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                cudnn_enabled: bool = True) -> Any:
    return _call(cv, F.group_norm, x, groups, weight, bias, eps)


@_adapt("instance_norm")
def _instance_norm(cv: Converter, x: Any, weight: Any, bias: Any, mean: Any, var: Any, use_input_stats: bool,
                   momentum: float, eps: float, cudnn_enabled: bool = True) -> Any:
    return _call(cv, F.instance_norm, x, mean, var, weight, bias, use_input_stats, momentum, eps)


@_adapt("_native_batch_norm_legit_no_training")
def _batch_norm_eval(cv: Converter, x: Any, weight: Any, bias: Any, mean: Any, var: Any, momentum: float,
                     eps: float) -> Any:
    return _call(cv, F.batch_norm, x, mean, var, weight, bias, False, momentum, eps), None, None   # no saved stats


@_adapt("elu")
def _elu(cv: Converter, x: Any, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Any:
    if scale != 1 or input_scale != 1:
        raise NotConvertible("elu with scale / input_scale")
    return _call(cv, F.elu, x, alpha)


@_adapt("log_sigmoid")
def _log_sigmoid(cv: Converter, x: Any) -> Any:
    return _call(cv, F.logsigmoid, x)


@_adapt("linalg_vector_norm")
def _vector_norm(cv: Converter, x: Any, *args: Any, **kwargs: Any) -> Any:
    return _call(cv, torch.linalg.vector_norm, x, *args, **kwargs)


@_adapt("slice")
def _slice(cv: Converter, x: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    return _call(cv, operator.getitem, x, (slice(None),) * (dim % x.ndim) + (slice(start, end, step),))


@_adapt("select")
def _select(cv: Converter, x: Tensor, dim: int, index: int) -> Any:
    return _call(cv, operator.getitem, x, (slice(None),) * (dim % x.ndim) + (index,))


@_adapt("index")
def _index(cv: Converter, x: Tensor, indices: Any) -> Any:
    return _call(cv, operator.getitem, x, tuple(slice(None) if i is None else i for i in indices))


@_adapt("expand")
def _expand(cv: Converter, x: Tensor, size: Any, implicit: bool = False) -> Any:
    return _call(cv, "expand", x, size)


@_adapt("_unsafe_view")
def _view(cv: Converter, x: Tensor, size: Any) -> Any:
    return _call(cv, "view", x, size)


@_adapt("split_with_sizes")
def _split_with_sizes(cv: Converter, x: Tensor, sizes: Any, dim: int = 0) -> Any:
    return _call(cv, torch.split, x, list(sizes), dim)


@_adapt("convolution")
def _convolution(cv: Converter, x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                 transposed: bool, output_padding: Any, groups: int) -> Any:
    if transposed:
        return _call(cv, F.conv_transpose2d, x, weight, bias, stride, padding, output_padding, groups, dilation)
    return _call(cv, F.conv2d if x.ndim == 4 else F.conv1d, x, weight, bias, stride, padding, dilation, groups)


@_adapt("constant_pad_nd")
def _constant_pad(cv: Converter, x: Any, pad: Any, value: float = 0.0) -> Any:
    return _call(cv, F.pad, x, list(pad), value=value)


def _pad_mode(mode: str) -> Handler:
    def pad(cv: Converter, x: Any, padding: Any) -> Any:
        return _call(cv, F.pad, x, list(padding), mode=mode)
    return pad


_adapt("reflection_pad1d", "reflection_pad2d")(_pad_mode("reflect"))
_adapt("replication_pad1d", "replication_pad2d")(_pad_mode("replicate"))
_adapt("_pad_circular")(_pad_mode("circular"))


def _upsample(mode: str, align: bool) -> Handler:
    def upsample(cv: Converter, x: Any, size: Any, *rest: Any) -> Any:
        align_corners = rest[0] if align else None
        scales = rest[1 if align else 0] if len(rest) > (1 if align else 0) else None
        return _call(cv, F.interpolate, x, size=None if scales else size, scale_factor=scales, mode=mode,
                     align_corners=align_corners)
    return upsample


_adapt("upsample_nearest1d.vec", "upsample_nearest2d.vec")(_upsample("nearest", False))
_adapt("_upsample_nearest_exact1d.vec", "_upsample_nearest_exact2d.vec")(_upsample("nearest-exact", False))
_adapt("upsample_linear1d.vec")(_upsample("linear", True))
_adapt("upsample_bilinear2d.vec")(_upsample("bilinear", True))
_adapt("upsample_bicubic2d.vec")(_upsample("bicubic", True))


@_adapt("im2col")
def _im2col(cv: Converter, x: Any, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> Any:
    return _call(cv, F.unfold, x, kernel_size, dilation, padding, stride)


__all__ = ["AliasingError", "functional_writes", "handler", "is_aten", "mutates"]
