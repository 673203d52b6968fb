"""The graph IR: tensors, ops with typed attributes, graphs, op definitions (category, shape and
dtype inference, compute definition or ``taskmap.ops`` runner), a builder and a printer.

See :mod:`.ir` for the data structures, :mod:`.kinds` for what an op definition says, and
:mod:`.attrs` for the attribute types.
"""
from . import defs_anchor, defs_injective  # noqa: F401 - register the op definitions
from .attrs import (AdaptivePoolAttrs, AttentionAttrs, AxisAttrs, BinaryAttrs, BinaryFn, CastAttrs, Conv2dAttrs,
                    InputRef, MatmulAttrs, NormAttrs, PadAttrs, PadMode, PermuteAttrs, Pool2dAttrs, ReduceAttrs,
                    ReduceFn, ScatterAttrs, ShapeAttrs, SliceAttrs, TopkAttrs, TorchAttrs, UnaryAttrs, UnaryFn,
                    WhereAttrs)
from .builder import GraphBuilder, infer
from .ir import Graph, Op, Tensor
from .kinds import OpCategory, OpDef, OpKind, op_def
from .printer import graph_str

__all__ = ["AdaptivePoolAttrs", "AttentionAttrs", "AxisAttrs", "BinaryAttrs", "BinaryFn", "CastAttrs", "Conv2dAttrs",
           "Graph", "GraphBuilder", "InputRef", "MatmulAttrs", "NormAttrs", "Op", "OpCategory", "OpDef", "OpKind",
           "PadAttrs", "PadMode", "PermuteAttrs", "Pool2dAttrs", "ReduceAttrs", "ReduceFn", "ScatterAttrs",
           "ShapeAttrs", "SliceAttrs", "Tensor", "TopkAttrs", "TorchAttrs", "UnaryAttrs", "UnaryFn", "WhereAttrs",
           "graph_str", "infer", "op_def"]
