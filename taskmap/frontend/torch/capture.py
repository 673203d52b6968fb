"""Capturing a model as an fx graph for ``taskmap.compile``.

``torch.fx.symbolic_trace`` first (shape-independent, parameters as ``get_attr``); a model it
cannot trace (Python control flow on tensors, as in transformers' models) is captured by
``torch._dynamo.export`` for the concrete example inputs, which also handles nested inputs and
outputs (``ModelOutput`` dataclasses) through its pytree specs.

A :class:`Capture` maps a call's bound arguments to the graph's flat inputs and the graph's
outputs back to the model's output structure; it is picklable (``save``/``load``).
"""
from __future__ import annotations

import contextlib
import inspect
import io
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp

from .importer import Imported, import_fx


@dataclass
class Capture:
    """How graph inputs come from a call, and how outputs go back (see module docstring)."""

    method: str                  # "fx" | "export"
    names: tuple[str, ...]       # fx: the forward parameter of each placeholder; export: orig_args
    codegen: Any = None          # export: the _PyTreeCodeGen (in/out pytree specs)

    def flat_inputs(self, arguments: dict[str, Any]) -> list[Any]:
        if self.method == "fx":
            return [arguments.get(n) for n in self.names]
        return list(self.codegen.process_inputs(*[arguments.get(n) for n in self.names]))

    def finish(self, result: Any) -> Any:
        if self.method == "fx":
            return result
        return self.codegen.process_outputs(result)


def bind(model: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by forward-parameter name (defaults applied)."""
    sig = inspect.signature(model.forward)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    out = dict(bound.arguments)
    for name, p in sig.parameters.items():
        if p.kind is p.VAR_KEYWORD and name in out:
            out.update(out.pop(name))
    return out


def try_symbolic_trace(model: torch.nn.Module) -> torch.fx.GraphModule | None:
    """``torch.fx.symbolic_trace`` recording each node's source line (for messages), or None
    when the model cannot be traced symbolically."""
    try:
        tracer = torch.fx.Tracer()
        tracer.record_stack_traces = True
        graph = tracer.trace(model)
        return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    except Exception:  # noqa: BLE001 - any tracing failure means: capture with dynamo instead
        return None


def capture(model: torch.nn.Module, traced: torch.fx.GraphModule | None, arguments: dict[str, Any], *,
            fallback: bool, name: str) -> tuple[Imported, Capture]:
    """Import ``model`` for the call ``arguments`` (``traced``: its symbolic trace, if any)."""
    if traced is not None:
        names = tuple(str(n.target) for n in traced.graph.nodes if n.op == "placeholder")
        cap = Capture("fx", names)
        examples = cap.flat_inputs(arguments)
        with torch.no_grad():
            ShapeProp(traced).propagate(*examples)
        return import_fx(traced, examples, fallback=fallback, name=name), cap
    sig_names = [n for n, p in inspect.signature(model.forward).parameters.items()
                 if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    kwargs = {n: v for n, v in arguments.items()}
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        exported = torch._dynamo.export(model)(**kwargs)
    gm = exported.graph_module
    codegen = gm.graph._codegen
    orig = tuple(getattr(codegen, "pytree_info").orig_args) if hasattr(codegen, "pytree_info") else tuple(sig_names)
    cap = Capture("export", orig, codegen)
    examples = cap.flat_inputs(arguments)
    return import_fx(gm, examples, fallback=fallback, name=name), cap


__all__ = ["Capture", "bind", "capture", "try_symbolic_trace"]
