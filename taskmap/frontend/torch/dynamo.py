"""The ``torch.compile`` backend: ``torch.compile(model, backend="taskmap")``.

Registered through the ``torch_dynamo_backends`` entry point (``pyproject.toml``), so it works
without importing taskmap first.  Dynamo hands over an ``fx.GraphModule`` of torch-level calls
(parameters arrive as inputs); unsupported operators run in PyTorch (``fallback=True``, the
default here).  Graphs are compiled per input signature: when dynamo marks sizes dynamic, each
concrete shape gets its own graph.

Options: ``torch.compile(m, backend="taskmap", options={"fallback": False})``.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ...runtime.graph import CompiledGraph
from .importer import Imported, import_fx


class DynamoGraph:
    """The callable handed back to dynamo: compiled graphs keyed by the concrete inputs."""

    def __init__(self, gm: torch.fx.GraphModule, fallback: bool, progress: bool | None) -> None:
        self.gm = gm
        self.fallback = fallback
        self.progress = progress
        self.graphs: dict[tuple[Any, ...], tuple[Imported, CompiledGraph]] = {}

    def _key(self, args: Sequence[Any]) -> tuple[Any, ...]:
        return tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else ("value", a)
                     for a in args)

    def compile_for(self, args: Sequence[Any]) -> tuple[Imported, CompiledGraph]:
        key = self._key(args)
        hit = self.graphs.get(key)
        if hit is None:
            imported = import_fx(self.gm, args, fallback=self.fallback, name="dynamo_graph")
            g = imported.graph
            device = next((x.device for x in g.inputs), "cpu")
            hit = self.graphs[key] = (imported, CompiledGraph(g, device, "torch", self.progress))
        return hit

    def __call__(self, *args: Any) -> Any:
        imported, cg = self.compile_for(args)
        tensors = [a for a, k in zip(args, imported.input_kinds) if k == "tensor"]
        with torch.no_grad():
            return imported.outputs(cg(*tensors))


def taskmap_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                    options: dict[str, Any] | None = None, mode: str | None = None) -> Callable[..., Any]:
    """Dynamo backend entry point (see the module docstring).  ``options``: ``fallback`` (default
    True) and ``progress`` (a progress bar; default: on a terminal)."""
    opts = dict(options or {})
    fallback = bool(opts.pop("fallback", True))
    progress = opts.pop("progress", None)
    if opts:
        raise TypeError(f"unknown taskmap backend options: {sorted(opts)}; known: fallback, progress")
    runner = DynamoGraph(gm, fallback, progress)
    if all(isinstance(a, torch.Tensor) for a in example_inputs) and \
            not any(isinstance(s, torch.SymInt) for a in example_inputs for s in a.shape):
        runner.compile_for(list(example_inputs))
    return runner


__all__ = ["DynamoGraph", "taskmap_backend"]
