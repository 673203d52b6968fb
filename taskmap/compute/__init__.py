"""Compute definitions: what an operator computes, as a DAG of ``tensor_input`` / ``compute`` /
``reduce`` nodes, and the facts about it that scheduling and fusion use (injective, bijective,
index maps).  See :mod:`.nodes` and :mod:`.analysis`."""
from .analysis import (Inlined, bounded_view, has_reduction, index_map, inline, inverse_index_map, is_bijective,
                       is_injective)
from .indexmap import IndexMap
from .nodes import (ComputeNode, ReduceNode, ReduceOp, TensorInput, TensorNode, accumulator_type, compute,
                    dag_str, graph_inputs, reduce, tensor_input, walk)

__all__ = ["ComputeNode", "IndexMap", "Inlined", "ReduceNode", "ReduceOp", "TensorInput", "TensorNode",
           "accumulator_type", "bounded_view", "compute", "dag_str", "graph_inputs", "has_reduction", "index_map", "inline",
           "inverse_index_map", "is_bijective", "is_injective", "reduce", "tensor_input", "walk"]
