"""Text form of a graph, one op a line::

    graph resnet(x: f32[1, 3, 224, 224]) {
      conv2d1: f32[1, 64, 112, 112] = CONV2D(x, c1:f32[64, 3, 7, 7]; stride=(2, 2), padding=(3, 3), ...)
      ...
      return linear173
    }

Constants show their shape; op attributes show their fields.  This module only reads the
objects' attributes (it imports nothing of the graph IR, which imports it).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any


def _type(t: Any) -> str:
    return f"{t.dtype.short}{list(t.shape)}"


def _ref(t: Any) -> str:
    return f"{t.name}:{_type(t)}" if t.is_constant else t.name


def _value(v: Any) -> str:
    if isinstance(v, enum.Enum):
        return v.name.lower()
    if hasattr(v, "short"):
        return v.short
    if callable(v):
        return getattr(v, "__qualname__", None) or getattr(v, "__name__", None) or repr(v)
    return repr(v)


def attrs_str(attrs: Any) -> str:
    """``name=value`` of each attribute that differs from its field's default."""
    if attrs is None:
        return ""
    if dataclasses.is_dataclass(attrs):
        return ", ".join(f"{f.name}={_value(getattr(attrs, f.name))}" for f in dataclasses.fields(attrs)
                         if f.default is dataclasses.MISSING or getattr(attrs, f.name) != f.default)
    return repr(attrs)


def op_str(op: Any) -> str:
    outs = ", ".join(f"{t.name}: {_type(t)}" for t in op.outputs)
    args = ", ".join(_ref(t) for t in op.inputs)
    a = attrs_str(op.attrs)
    return f"{outs} = {op.kind.name}({args}{'; ' + a if a else ''})"


def graph_str(graph: Any) -> str:
    params = ", ".join(f"{t.name}: {_type(t)}" for t in graph.inputs)
    lines = [f"graph {graph.name}({params}) {{"]
    lines += ["  " + op_str(op) for op in graph.ops]
    lines.append("  return " + ", ".join(_ref(t) for t in graph.outputs))
    lines.append("}")
    return "\n".join(lines)


__all__ = ["attrs_str", "graph_str", "op_str"]
