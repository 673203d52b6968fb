"""Which in-place ops of a torch-level fx graph the importer may turn into rebindings.

Graph ops are functional: after ``h.add_(1)`` the importer lets later uses of ``h`` read the
result.  A view of ``h`` taken before (``v = h[:, :2]``) and read after would then give its old
values: the program reads memory two names share, which a functional graph cannot express
without tracking aliasing.  :func:`check_write` finds such views (conservatively: any op that
may return a view counts) and raises :class:`~taskmap.errors.UnsupportedError` with the model's
line instead of compiling a wrong answer.  (ATen graphs from ``torch.export`` are checked with
their schemas' alias annotations: :func:`.aten.functional_writes`.)
"""
from __future__ import annotations

import operator
import torch

from ...errors import UnsupportedError

#: Tensor methods and torch functions whose result may share memory with their first argument.
VIEW_METHODS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "unsqueeze", "squeeze", "expand",
    "expand_as", "narrow", "select", "flatten", "unflatten", "split", "chunk", "unbind", "diagonal", "movedim",
    "moveaxis", "swapaxes", "swapdims", "as_strided", "detach", "contiguous", "__getitem__", "real", "imag",
    "tensor_split", "split_with_sizes", "unfold", "type_as", "to", "float", "half", "double", "int", "long", "type",
    "T", "mT", "H", "mH", "conj", "resolve_conj", "resolve_neg"})
VIEW_FUNCTIONS = frozenset({
    operator.getitem, getattr, torch.reshape, torch.transpose, torch.permute, torch.t, torch.unsqueeze, torch.squeeze,
    torch.narrow, torch.select, torch.flatten, torch.unflatten, torch.split, torch.chunk, torch.unbind,
    torch.diagonal, torch.movedim, torch.moveaxis, torch.swapaxes, torch.swapdims, torch.detach, torch.tensor_split,
    torch.as_strided, torch.view_as_complex, torch.view_as_real, torch.real, torch.imag, torch.conj,
    torch.resolve_conj, torch.resolve_neg})


#: Ops that return a tuple of tensors of their own (``values, indices = x.topk(k)``): an item of
#: their result aliases nothing (their ``dim``-less forms, ``max(x)``, return one tensor).
TUPLE_METHODS = frozenset({"topk", "sort", "kthvalue", "mode", "median", "max", "min", "aminmax", "cummax", "cummin"})
TUPLE_FUNCTIONS = frozenset({torch.topk, torch.sort, torch.kthvalue, torch.mode, torch.median, torch.max, torch.min,
                             torch.aminmax, torch.cummax, torch.cummin, torch.var_mean, torch.std_mean})


def _fresh_tuple(node: torch.fx.Node) -> bool:
    """Whether ``node`` returns a tuple of fresh tensors (an ATen overload: by its schema)."""
    if isinstance(node.target, torch._ops.OpOverload):
        returns = node.target._schema.returns
        return len(returns) > 1 and all(r.alias_info is None for r in returns)
    if node.op == "call_method":
        known = node.target in TUPLE_METHODS
    else:
        known = node.op == "call_function" and node.target in TUPLE_FUNCTIONS
    if known and node.target in ("max", "min", "median", torch.max, torch.min, torch.median):
        return len(node.args) > 1 and isinstance(node.args[1], int) or "dim" in node.kwargs
    return known


def _may_alias(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in VIEW_METHODS
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) and _fresh_tuple(node.args[0]):
        return False
    return node.op == "call_function" and node.target in VIEW_FUNCTIONS


class AliasedWrite(UnsupportedError):
    """An in-place op whose effect reaches another name of its tensor (a view), read after."""


class Aliases:
    """The fx graph's nodes in order, and the node whose memory each one's value may be."""

    def __init__(self, graph: torch.fx.Graph):
        self.order = {n: i for i, n in enumerate(graph.nodes)}
        self.base: dict[torch.fx.Node, torch.fx.Node] = {}
        for node in graph.nodes:
            src = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
            self.base[node] = self.base[src] if src is not None and _may_alias(node) else node

    def check_write(self, node: torch.fx.Node, where: str) -> None:
        """Raise if the in-place op ``node`` changes a tensor that another name, taken before,
        reads after (a view of it, or the tensor a written view belongs to)."""
        target = node.args[0]
        root = self.base.get(target, target)
        at = self.order[node]
        for v, b in self.base.items():
            if b is root and v is not target and self.order[v] < at and v.op != "output" and \
                    any(self.order[u] > at for u in v.users):
                what = "the tensor it is a view of" if v is root else f"its view {v.name}, taken before,"
                raise AliasedWrite(
                    f"{where}: {node.name} writes in place into {target.name}, and {what} is read after: "
                    "taskmap's graphs are functional and do not track which tensors share memory; write out of "
                    "place (h = h + 1) or clone the view")


__all__ = ["AliasedWrite", "Aliases", "TUPLE_FUNCTIONS", "TUPLE_METHODS", "VIEW_FUNCTIONS", "VIEW_METHODS"]
