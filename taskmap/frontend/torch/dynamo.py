"""The ``torch.compile`` backend: ``torch.compile(model, backend="taskmap")``.

Registered through the ``torch_dynamo_backends`` entry point (``pyproject.toml``), so it works
without importing taskmap first.  Dynamo hands over an ``fx.GraphModule`` of torch-level calls
(parameters and buffers arrive as inputs); unsupported operators run in PyTorch (``fallback=True``, the
default here).  Graphs are compiled per input signature.  When dynamo marks sizes dynamic, the
graph is split (:mod:`.dynamic`: what depends on a symbolic size runs in PyTorch, each static
region compiles once) when its static regions hold most of the work, as in a decode step;
otherwise each concrete shape gets its own graph, and the :data:`MAX_GRAPHS` used most recently
are kept (a loop over many shapes would otherwise keep a graph and its memory per shape).

The model's parameters and buffers (which dynamo also passes as inputs) are compiled in as
constants — batch norms fold into the convolutions, weights are packed for the templates — and
an in-place change of any of them compiles again (``options={"freeze": False}`` keeps them
inputs).

Options: ``torch.compile(m, backend="taskmap", options={"fallback": False, "freeze": True,
"fp32_precision": "3xtf32", "max_graphs": 16, "dynamic_sizes": "auto"})`` (``fp32_precision`` as
``taskmap.compile``'s: :mod:`.precision`; ``dynamic_sizes``: ``"auto"``, ``"split"`` or
``"specialize"``, :mod:`.dynamic`).
"""
from __future__ import annotations

import collections
import sys
import threading
import warnings
from typing import Any, Callable, Sequence

import torch

from ...errors import EagerFallbackWarning
from ...graph.passes import debug_enabled
from ...runtime.graph import CompiledGraph, gc_paused
from . import precision
from .aliasing import AliasedWrite
from .capture import reexport
from .dynamic import MODES, SPLIT_SHARE, SplitGraph, attr, describe, is_dynamic, regions, static_share, writes
from .importer import Imported, import_fx


_FROZEN = "_taskmap_frozen_"     # get_attr names of the frozen inputs: this prefix and the input's index
#: Compiled graphs kept per dynamo graph (the most recently used; ``options={"max_graphs": n}``).
MAX_GRAPHS = 16
#: With symbolic sizes, specialized per shape: a shape compiles at its second call, the first runs
#: in PyTorch (``options={"compile_at": n}``) — a prompt length met once is not worth a compile.
COMPILE_AT = 2


def module_state(gm: torch.fx.GraphModule, args: Sequence[Any]) -> tuple[int, ...]:
    """Which of dynamo's inputs are the model's parameters and buffers (dynamo lifts them to
    graph inputs): their placeholders' sources name a module's ``_parameters`` / ``_buffers``."""
    nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for i, (node, a) in enumerate(zip(nodes, args)):
        source = str(getattr(node.meta.get("grapharg"), "source", ""))
        if isinstance(a, torch.nn.Parameter) or (isinstance(a, torch.Tensor) and
                                                 ("_parameters" in source or "_buffers" in source)):
            out.append(i)
    return tuple(out)


def freeze(gm: torch.fx.GraphModule, args: Sequence[Any], frozen: tuple[int, ...]) -> torch.fx.GraphModule:
    """``gm`` with the ``frozen`` inputs as constants (``get_attr`` of their current values): the
    graph passes then fold batch norms into weights and the lowering packs them."""
    graph = torch.fx.Graph()
    attrs: dict[str, Any] = {}
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    index = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if index in frozen:
                name = f"{_FROZEN}{index}"
                attrs[name] = args[index].detach()
                env[node] = graph.get_attr(name)
                env[node].meta = dict(node.meta)        # its example_value: the split's work estimates
            else:
                env[node] = graph.node_copy(node, lambda n: env[n])
            index += 1
            continue
        if node.op in ("get_attr", "call_module"):
            attrs[str(node.target)] = gm.get_submodule(str(node.target)) if node.op == "call_module" else \
                attr(gm, str(node.target))
        env[node] = graph.node_copy(node, lambda n: env[n])
    return torch.fx.GraphModule(attrs, graph)


def unlift_scalars(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, tuple[int, ...]]:
    """Dynamo passes Python floats it did not specialize (a norm's ``eps``, a scale) as 0-d
    tensors that the graph reads back with ``.item()``.  Those placeholders become plain values
    (the caller passes ``.item()`` of the tensor: :func:`scalars`), compiled in like other values
    and part of the compiled graphs' key.  Returns the new graph and the placeholders' indices."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for i, node in enumerate(places):
        value = node.meta.get("example_value")
        users = list(node.users)
        if isinstance(value, torch.Tensor) and value.dim() == 0 and users and \
                all(u.op == "call_method" and u.target == "item" and not u.args[1:] for u in users):
            out.append(i)
    if not out:
        return gm, ()
    lifted = {places[i] for i in out}
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.args[0] in lifted:      # .item()
            env[node] = env[node.args[0]]
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node in lifted:
            env[node].meta.pop("example_value", None)
    return torch.fx.GraphModule(gm, graph), tuple(out)


def scalars(args: Sequence[Any], indices: tuple[int, ...]) -> list[Any]:
    """``args`` with the unlifted 0-d tensors (:func:`unlift_scalars`) as Python numbers."""
    args = list(args)
    for i in indices:
        args[i] = args[i].item()
    return args


def needs_grad(args: Sequence[Any]) -> bool:
    """Whether a call may be differentiated: grad mode on and a tensor argument (dynamo passes
    the parameters as arguments) requires grad."""
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


class DynamoGraph:
    """The callable handed back to dynamo: compiled graphs keyed by the concrete inputs.

    With ``freeze`` (the default) the model's parameters and buffers are compiled in as
    constants, keyed by their storage and version counter: an in-place update (an optimizer
    step, ``load_state_dict``) compiles again with the new values."""

    def __init__(self, gm: torch.fx.GraphModule, fallback: bool, progress: bool | None,
                 frozen: tuple[int, ...] = (), fp32_precision: str | None = None,
                 max_graphs: int = MAX_GRAPHS, attrs: dict[str, torch.Tensor] | None = None,
                 scalars: tuple[int, ...] = (), compile_at: int = 1) -> None:
        self.gm = gm
        self.compile_at = compile_at    # a shape's calls before it compiles (the earlier ones: PyTorch)
        self.seen: collections.OrderedDict[tuple[Any, ...], int] = collections.OrderedDict()
        self.eager_calls = 0
        self.scalars = scalars      # inputs passed as Python numbers (:func:`unlift_scalars`)
        self.attrs = attrs          # frozen get_attr name -> the tensor it was (a split graph's regions)
        self.fallback = fallback
        self.fp32_precision = fp32_precision
        self.progress = progress
        self.frozen = frozen
        self.max_graphs = max_graphs
        # least recently used first; None: the graph could not be compiled and runs in PyTorch
        self.graphs: collections.OrderedDict[tuple[Any, ...], tuple[Imported, CompiledGraph] | None] = \
            collections.OrderedDict()
        self.compiles = 0
        self._last: tuple[Any, ...] | None = None
        self._frozen: tuple[tuple[Any, ...], torch.fx.GraphModule] | None = None   # (state, frozen gm)
        self.warned = False
        self.lock = threading.Lock()

    def _key(self, args: Sequence[Any]) -> tuple[Any, ...]:
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else ("value", a)
                    for a in args)
        return key + self._state(args)

    def _state(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """The frozen inputs' storages and versions (an in-place update changes them)."""
        return tuple((args[i].data_ptr(), args[i]._version) for i in self.frozen)

    def _live(self, args: Sequence[Any]) -> Sequence[Any]:
        """The arguments that are not frozen in."""
        return [a for i, a in enumerate(args) if i not in self.frozen] if self.frozen else args

    def compile_for(self, args: Sequence[Any]) -> tuple[Imported, CompiledGraph] | None:
        key = self._key(args)
        if key == self._last and key in self.graphs:
            return self.graphs[key]            # the last one used (a loop of one shape): no lock
        with self.lock:                        # threads calling at once compile a graph once
            return self._compile(key, args)

    def _compile(self, key: tuple[Any, ...], args: Sequence[Any]) -> tuple[Imported, CompiledGraph] | None:
        if key in self.graphs:
            hit = self.graphs[key]
            self.graphs.move_to_end(key)
        else:
            gm, live = self.gm, list(args)
            if self.frozen:
                state = key[len(args):]        # the frozen inputs' storages and versions
                if self._frozen is None or self._frozen[0] != state:     # one freeze for every shape
                    self._frozen = (state, freeze(self.gm, args, self.frozen))
                gm = self._frozen[1]
                live = list(self._live(args))
                shapes = key[:len(args)]       # values changed in place: the old graph is stale
                for old in [k for k in self.graphs if k[:len(args)] == shapes]:
                    del self.graphs[old]
            with precision.chosen(self.fp32_precision), gc_paused():
                hit = self._build(gm, live)
            self.graphs[key] = hit
            self.compiles += hit is not None
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        self._last = key
        return hit

    def _build(self, gm: torch.fx.GraphModule, live: list[Any]) -> tuple[Imported, CompiledGraph] | None:
        """``gm`` imported and compiled.  A graph the torch-level import refuses (writes through
        views) is traced again by ``torch.export``; with ``fallback``, one that cannot be
        compiled at all gives None (PyTorch runs it) and an :class:`EagerFallbackWarning`."""
        try:
            try:
                imported = import_fx(gm, live, fallback=self.fallback, name="dynamo_graph")
            except AliasedWrite as first:         # torch.export's ATen graph makes such writes functional
                try:
                    imported = reexport(gm, live, "dynamo_graph", self.fallback)
                except Exception:  # noqa: BLE001 - the first error says more
                    raise first from None
            device = next((x.device for x in imported.graph.inputs), "cpu")
            return imported, CompiledGraph(imported.graph, device, "torch", self.progress)
        except Exception as exc:  # noqa: BLE001 - with fallback, any failure: run in PyTorch
            if not self.fallback:
                raise
            warnings.warn(f"taskmap: a graph of {len(gm.graph.nodes)} nodes runs in PyTorch, taskmap could not "
                          f"compile it: {type(exc).__name__}: {str(exc)[:1000]}", EagerFallbackWarning, stacklevel=4)
            return None

    def __call__(self, *args: Any) -> Any:
        if self.scalars:
            args = tuple(scalars(args, self.scalars))
        if needs_grad(args):
            if not self.warned:
                self.warned = True
                warnings.warn("taskmap: gradients may be needed here (grad mode is on and inputs or parameters "
                              "require grad), so this graph runs in PyTorch, where backward works; taskmap compiles "
                              "inference: call the model under torch.no_grad() or torch.inference_mode() to run "
                              "taskmap's kernels", stacklevel=2)
            return self.gm(*args)
        with torch.no_grad():
            return self._run(args)

    def _due(self, args: Sequence[Any]) -> bool:
        """Whether this call's shape has a graph or has now been met ``compile_at`` times; if
        not, the call is counted (and runs in PyTorch)."""
        key = self._key(args)
        if key in self.graphs:
            return True
        with self.lock:
            calls = self.seen.pop(key, 0) + 1
            if calls >= self.compile_at:
                return True
            self.seen[key] = calls
            while len(self.seen) > 4 * self.max_graphs:
                self.seen.popitem(last=False)
            self.eager_calls += 1
        return False

    def _run(self, args: Sequence[Any]) -> Any:
        hit = self.compile_for(args) if self.compile_at == 1 or self._due(args) else None
        if hit is None:                # not compiled (yet), or could not be: PyTorch runs it
            return self.gm(*args)
        imported, cg = hit
        live = self._live(args)
        tensors = imported.graph_inputs(live)
        values = cg(*tensors)
        if imported.mutated:       # in place on an input, or on a frozen buffer (the module's own)
            imported.write_back(values, live, self.attrs.get if self.attrs is not None else
                                lambda name: args[int(name.rsplit("_", 1)[1])] if name.startswith(_FROZEN) else None)
        return imported.outputs(values)


class SplitDynamoGraph(DynamoGraph):
    """A graph with symbolic sizes run by :class:`.dynamic.SplitGraph`: what depends on them in
    PyTorch, each static region compiled once (by a :class:`DynamoGraph` of its own).  Frozen
    parameters are compiled in as with :class:`DynamoGraph`; an in-place update of one splits
    and compiles again (kernels come from the cache)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.split: tuple[tuple[Any, ...], SplitGraph] | None = None      # (frozen state, split graph)

    def _run(self, args: Sequence[Any]) -> Any:
        state = self._state(args)
        split = self.split
        if split is None or split[0] != state:
            with self.lock:
                if self.split is None or self.split[0] != state:
                    gm = freeze(self.gm, args, self.frozen) if self.frozen else self.gm
                    attrs = {f"{_FROZEN}{i}": args[i] for i in self.frozen}
                    self.split = (state, SplitGraph(gm, lambda sub: DynamoGraph(
                        sub, self.fallback, self.progress, (), self.fp32_precision, self.max_graphs, attrs)))
                    self.compiles += 1
                split = self.split
        return split[1](*self._live(args))


def _positive(opts: dict[str, Any], name: str, default: int) -> int:
    value = opts.pop(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"taskmap backend option {name}: a positive int, not {value!r}")
    return value


def taskmap_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                    options: dict[str, Any] | None = None, mode: str | None = None) -> Callable[..., Any]:
    """Dynamo backend entry point (see the module docstring).  ``options``: ``fallback`` (default
    True), ``progress`` (a progress bar; default: on a terminal), ``freeze`` (parameters and
    buffers as constants; default True), ``fp32_precision`` (as ``taskmap.compile``'s),
    ``max_graphs`` (graphs kept per dynamo graph when specializing), ``dynamic_sizes`` and
    ``compile_at`` (:data:`COMPILE_AT`)."""
    opts = dict(options or {})
    fallback = bool(opts.pop("fallback", True))
    progress = opts.pop("progress", None)
    frozen = module_state(gm, example_inputs) if opts.pop("freeze", True) else ()
    fp32 = precision.check(opts.pop("fp32_precision", None))
    max_graphs, compile_at = _positive(opts, "max_graphs", MAX_GRAPHS), _positive(opts, "compile_at", COMPILE_AT)
    sizes = opts.pop("dynamic_sizes", "auto")
    if sizes not in MODES:
        raise ValueError(f"taskmap backend option dynamic_sizes: one of {', '.join(MODES)}, not {sizes!r}")
    if opts:
        raise TypeError(f"unknown taskmap backend options: {sorted(opts)}; known: fallback, progress, freeze, "
                        "fp32_precision, max_graphs, dynamic_sizes, compile_at")
    gm, lifted = unlift_scalars(gm)
    dynamic = is_dynamic(gm)
    in_place = dynamic and writes(gm)
    parts = regions(gm) if dynamic and sizes != "specialize" else []
    split = dynamic and not in_place and (sizes == "split" or sizes == "auto" and static_share(parts) >= SPLIT_SHARE)
    if dynamic and debug_enabled("dynamic"):
        mode = "split" if split else f"specialized per shape (dynamic_sizes={sizes!r}" + \
            (", it writes in place)" if in_place else ")")
        print(describe(parts, mode) if parts else f"taskmap: a graph with symbolic sizes: {mode}", file=sys.stderr)
    runner = (SplitDynamoGraph if split else DynamoGraph)(
        gm, fallback, progress, frozen, fp32, max_graphs, scalars=lifted,
        compile_at=compile_at if dynamic and not split else 1)
    if not split and not lifted and all(isinstance(a, torch.Tensor) for a in example_inputs) and \
            not needs_grad(example_inputs) and \
            not any(isinstance(s, torch.SymInt) for a in example_inputs for s in a.shape):
        runner.compile_for(list(example_inputs))
    return runner


__all__ = ["DynamoGraph", "SplitDynamoGraph", "taskmap_backend"]
