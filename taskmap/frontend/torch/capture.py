"""Capturing a model as an fx graph for ``taskmap.compile``.

``torch.fx.symbolic_trace`` first (shape-independent, parameters as ``get_attr``; augmented
assignments recorded as the in-place operators they are); a model it cannot trace (Python
control flow on tensors, as in transformers' models), or whose fx graph lacks what the import
needs (PyTorch's strides for ``as_strided``, a write through a view made functional), is
captured by ``torch.export`` or else ``torch._dynamo.export`` for the concrete example inputs,
which also handle nested inputs and outputs (``ModelOutput`` dataclasses) through their pytree
specs.

Capturing stays cheap: each fx node records only the model's source line that created it (for
messages; fx's own ``record_stack_traces`` symbolizes whole stacks and imports
``torch._dynamo``, seconds per model), and the model is not run: the importer infers shapes
itself.  ``TASKMAP_DEBUG=shapes`` also propagates the example inputs through the fx graph
(``ShapeProp``) so that the importer checks every shape it infers against PyTorch's.

Arguments that hold no tensor are traced as their values (:mod:`.signature`), PyTorch's fused
transformer fast path is off while capturing, and a forward that changes the model's parameters
or buffers in place is refused (they become constants; changed inputs are written back).

A :class:`Capture` maps a call's bound arguments to the graph's flat inputs and the graph's
outputs back to the model's output structure; it is picklable (``save``/``load``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import io
import linecache
import logging
import operator
import os
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp
from torch.nn.modules import transformer

from ...errors import CaptureError, UnsupportedError, UnsupportedOpsError
from ...graph.passes import debug_enabled
from . import aten
from .aliasing import AliasedWrite
from .importer import Imported, NotRecorded, import_fx
from .registry import lookup
from .signature import bind, call_arguments, forward_signature

_TORCH_DIR = os.path.dirname(torch.__file__)
_TORCH_FX_DIR = os.path.join(_TORCH_DIR, "fx")
_TASKMAP_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Capture:
    """How graph inputs come from a call, and how outputs go back (see module docstring)."""

    method: str                  # "fx" | "export"
    names: tuple[str, ...]       # fx: the forward parameter of each placeholder; export: orig_args
    codegen: Any = None          # export: the _PyTreeCodeGen (in/out pytree specs)
    spread: str | None = None    # export: the ``*args`` parameter (dynamo names its items args_0, ...)
    tracer: str = ""             # what captured the graph: torch.fx, torch.export or torch._dynamo.export

    def flat_inputs(self, arguments: dict[str, Any]) -> list[Any]:
        if self.method == "fx":
            return [arguments.get(n) for n in self.names]
        if self.spread is not None:
            arguments = {**arguments, **{f"{self.spread}_{i}": v for i, v in enumerate(arguments[self.spread])}}
        return list(self.codegen.process_inputs(*[arguments.get(n) for n in self.names]))

    def finish(self, result: Any) -> Any:
        if self.method == "fx":
            return result
        return self.codegen.process_outputs(result)


#: Python's augmented assignments: fx's proxies have none, so ``v *= m`` would trace as
#: ``v = v * m`` and a tensor that ``v`` is a view of (or another name for) would miss the update.
_AUGMENTED = {"__iadd__": operator.iadd, "__isub__": operator.isub, "__imul__": operator.imul,
              "__itruediv__": operator.itruediv, "__ifloordiv__": operator.ifloordiv, "__imod__": operator.imod,
              "__ipow__": operator.ipow, "__imatmul__": operator.imatmul, "__iand__": operator.iand,
              "__ior__": operator.ior, "__ixor__": operator.ixor, "__ilshift__": operator.ilshift,
              "__irshift__": operator.irshift}


class _Proxy(torch.fx.Proxy):
    """An fx proxy that records augmented assignments as the in-place operators they are."""


def _augmented(op: Any) -> Any:
    def method(self: _Proxy, other: Any) -> Any:
        return self.tracer.create_proxy("call_function", op, (self, other), {})
    return method


for _name, _op in _AUGMENTED.items():
    setattr(_Proxy, _name, _augmented(_op))


class _Tracer(torch.fx.Tracer):
    """``torch.fx.Tracer`` recording, per node, the innermost frame outside torch and taskmap
    (the model's line) as its ``stack_trace``, in the traceback format — or, for a model that is
    itself a torch module (``taskmap.compile(nn.LSTM(...))``), the line of torch's ``forward``.

    PyTorch's layers are single nodes (fx's leaves) only when the frontend converts them; the
    others (``nn.TransformerDecoderLayer``, ...) are traced through, into the layers and
    functions they call."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return super().is_leaf_module(m, module_qualified_name) and lookup("call_module", m) is not None

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _Proxy(node, self)

    #: the type of the dict the forward returns when it is a subclass (a ``ModelOutput``), which
    #: fx records as a plain dict: set by :meth:`create_arg`, kept by :meth:`create_node`
    output_type: type | None = None
    _dict_type: type | None = None

    def create_arg(self, a: Any) -> Any:
        if isinstance(a, dict) and type(a) is not dict:
            self._dict_type = type(a)
        return super().create_arg(a)

    def create_node(self, *args: Any, **kwargs: Any) -> torch.fx.Node:
        kind = args[0] if args else kwargs.get("kind")
        if kind == "output":     # its argument was the last one made: the forward's result
            result = (args[2] if len(args) > 2 else kwargs.get("args", (None,)))[0]
            self.output_type = self._dict_type if isinstance(result, dict) else None
        self._dict_type = None
        node = super().create_node(*args, **kwargs)
        frame, torch_line = sys._getframe(1), None
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(_TASKMAP_DIR):        # back in taskmap: no user frame in between
                frame = None
                break
            if not name.startswith(_TORCH_DIR):
                break
            if torch_line is None and not name.startswith(_TORCH_FX_DIR):
                torch_line = frame
            frame = frame.f_back
        frame = frame or torch_line
        if frame is not None:
            code = frame.f_code
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            node.stack_trace = f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n    {line}\n'
        return node


def _transformers_caches(model: torch.nn.Module) -> None:
    """Hugging Face models return their key / value caches (``DynamicCache``,
    ``EncoderDecoderCache``, ...) by default; ``transformers`` can register its cache classes as
    pytree nodes so that an export may return them.  Done (idempotently) when ``transformers`` is
    loaded: the compiled model then returns the same kind of cache, rebuilt from the graph's
    tensors."""
    if "transformers" not in sys.modules:
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except Exception:  # noqa: BLE001 - older transformers: DynamicCache only, if even that
        try:
            from transformers.integrations.executorch import register_dynamic_cache_export_support
        except Exception:  # noqa: BLE001
            return
        register_dynamic_cache_export_support()
        return
    register_cache_pytrees_for_model(model)


def _no_recompile_limit() -> Any:
    """Each export of a model adds an entry to the cache of its ``forward``'s code object, and
    past dynamo's recompile limit (8) an export fails outright: compiling a ninth instance of a
    class (or any ninth model sharing its forward) would raise.  Exports lift the limit."""
    names = ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit")
    cfg = torch._dynamo.config
    return cfg.patch(**{n: 1 << 30 for n in names if hasattr(cfg, n)})


def try_symbolic_trace(model: torch.nn.Module, constants: dict[str, Any] | None = None
                       ) -> torch.fx.GraphModule | None:
    """``torch.fx.symbolic_trace`` recording each node's source line (for messages), or None
    when the model cannot be traced symbolically.

    ``constants``: forward arguments that hold no tensor (None, numbers, flags), traced as these
    values (fx's ``concrete_args``) — as proxies, ``if y is None`` would silently take the branch
    of a tensor.  The graph serves only calls with these values (they are in the compiled
    module's signature key), so fx's guards on them and their placeholders are dropped."""
    before = _versions(model)
    try:
        tracer = _Tracer()
        with _no_fastpaths():
            graph = tracer.trace(model, concrete_args=constants or None)
    except Exception:  # noqa: BLE001 - any tracing failure means: capture with dynamo instead
        return None
    changed = [n for n, v in _versions(model).items() if before.get(n) != v]
    if changed:        # buffers are real tensors while fx traces: an in-place op ran on them, unrecorded
        raise _state_error(type(model).__name__, changed)
    if constants:
        _drop_guards(graph, set(forward_signature(model).names) - set(constants))
    gm = torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    gm.meta[OUTPUT_TYPE] = tracer.output_type
    return gm


#: Where :func:`try_symbolic_trace` keeps the type of the dict the forward returns (``GraphModule.meta``).
OUTPUT_TYPE = "taskmap_output_type"


_GUARDS = (torch._assert, torch.fx._symbolic_trace._assert_is_none)


def _drop_guards(graph: torch.fx.Graph, keep: set[str]) -> None:
    """Remove fx's checks of specialised arguments, then their placeholders (those not in ``keep``)."""
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _GUARDS:
            checked = node.args[0]
            graph.erase_node(node)
            if isinstance(checked, torch.fx.Node) and checked.op == "call_function" and not checked.users:
                graph.erase_node(checked)        # the comparison the guard asserted
    for node in list(graph.nodes):
        if node.op == "placeholder" and not node.users and node.target not in keep:
            graph.erase_node(node)


@contextlib.contextmanager
def _no_fastpaths() -> Any:
    """PyTorch's transformer layers in eval mode call fused kernels of their own
    (``torch._transformer_encoder_layer_fwd``, ``torch._native_multi_head_attention``) unless its
    fast path is off: captured with it off, they are the linears, attention and norms taskmap
    compiles and fuses.  And they compare a mask given without an ``is_causal`` hint against a
    causal one (``nn.Transformer``'s ``tgt_mask``) to choose a kernel: a branch on data, which no
    capture can trace; captured without that test, the mask is applied as given — the same
    numbers."""
    mha = torch.backends.mha
    was = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    detect = transformer._detect_is_causal_mask
    transformer._detect_is_causal_mask = _hinted_causal
    try:
        yield
    finally:
        mha.set_fastpath_enabled(was)
        transformer._detect_is_causal_mask = detect


def _hinted_causal(mask: Any, is_causal: bool | None = None, size: int | None = None) -> bool:
    """``_detect_is_causal_mask`` without looking at the mask: causal when the caller says so."""
    return is_causal is True


def _dynamo_reason(exc: Exception) -> str:
    """Dynamo's reason in short: its first line (or the error a traced op raised) and the user's
    frames ("from user code")."""
    text = str(exc)
    head = next((ln for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    raised = re.search(r"^\s*Explanation: .*?: got (.+)$", text, re.M)
    if raised:
        head = raised.group(1)
    where = text.split("from user code:", 1)[1].strip("\n").split("\n\n", 1)[0] if "from user code:" in text else ""
    return head + ("\n" + where if where else "")


CAPTURES = ("auto", "export", "dynamo")
#: Loggers of torch's tracing machinery silenced while a forward is captured.
_TRACING_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes")


def _holds_tensors(value: Any) -> bool:
    """Whether ``value`` is a container (tuple, list, dict, ...) with a tensor inside."""
    return not isinstance(value, torch.Tensor) and any(isinstance(v, torch.Tensor)
                                                       for v in torch.utils._pytree.tree_leaves(value))


def capture(model: torch.nn.Module, traced: torch.fx.GraphModule | None, arguments: dict[str, Any], *,
            fallback: bool, name: str, how: str = "auto") -> tuple[Imported, Capture]:
    """Import ``model`` for the call ``arguments`` (``traced``: its symbolic trace, if any).

    ``how``: ``"auto"`` takes the fx trace, else ``torch.export``'s graph, else dynamo's;
    ``"export"`` / ``"dynamo"`` take that one (an error when it fails)."""
    if traced is not None and how == "auto":
        names = tuple(str(n.target) for n in traced.graph.nodes if n.op == "placeholder")
        cap = Capture("fx", names, tracer="torch.fx")
        examples = cap.flat_inputs(arguments)
        # the fx importer keeps a placeholder that is no tensor as a Python value: tensors in a
        # tuple, list or dict argument would be baked in (torch.export flattens them)
        if not any(_holds_tensors(e) for e in examples):
            if debug_enabled("shapes"):
                with torch.no_grad():
                    ShapeProp(traced).propagate(*examples)
            try:
                imported = import_fx(traced, examples, fallback=fallback, name=name)
            except (NotRecorded, AliasedWrite) as exc:   # torch.export's graph has the strides; its
                # functionalization makes writes through views functional
                if debug_enabled("capture"):
                    print(f"// {name}: torch.fx's graph not used ({exc})", file=sys.stderr)
            else:
                imported.output_type = traced.meta.get(OUTPUT_TYPE)
                return _stateless(imported, name), cap
    fs = forward_signature(model)
    args, kwargs = call_arguments(fs, arguments)
    _transformers_caches(model)
    refused: _Refused | None = None
    if how != "dynamo":
        got, reason, refused = _aten_capture(model, fs, args, kwargs, arguments, name)
        if got is not None:
            return got
        if refused is not None and (how == "export" or not refused.retry):
            return refused.resolve(fallback, name)
        if how == "export":
            raise CaptureError(name, reason, "torch.export.export")
        if debug_enabled("capture"):
            print(f"// {name}: torch.export's graph not used ({reason}); capturing with torch._dynamo.export",
                  file=sys.stderr)
    # dynamo leaves RNN modules out of its graphs unless told (their weights may be re-flattened
    # between calls in training); taskmap's frontend unrolls them (ops_rnn)
    with _quiet(), _no_recompile_limit(), _no_fastpaths(), _state_kept(model), \
            torch._dynamo.config.patch(allow_rnn=True):
        try:
            # static sizes: the graph is compiled for these shapes (a new shape captures again);
            # symbolic ones cost minutes of sympy on some models (timm's MobileViT-v2)
            exported = torch._dynamo.export(model, assume_static_by_default=True)(*args, **kwargs)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as exc:   # not the model's own errors
            if refused is not None:      # torch.export's graph, with the ops it refused run in PyTorch (or named)
                return refused.resolve(fallback, name)
            raise CaptureError(name, _dynamo_reason(exc)) from exc
        except torch._dynamo.exc.TorchRuntimeError as exc:    # the forward's own code raised on fake tensors
            eager = _eager_error(model, args, kwargs)
            if eager is not None:
                raise eager        # the model's own error, as PyTorch raises it
            raise CaptureError(name, "the forward runs eagerly but raises when traced (does it branch on "
                               "torch.compiler.is_compiling() or on tracing?): " + _dynamo_reason(exc)) from exc
    gm = exported.graph_module
    codegen = gm.graph._codegen
    orig = tuple(getattr(codegen, "pytree_info").orig_args) if hasattr(codegen, "pytree_info") else fs.named
    cap = Capture("export", orig, codegen, fs.var_positional, "torch._dynamo.export")
    examples = cap.flat_inputs(arguments)
    return _stateless(import_fx(gm, examples, fallback=fallback, name=name), name), cap


def _eager_error(model: torch.nn.Module, args: list[Any], kwargs: dict[str, Any]) -> Exception | None:
    """What the forward raises when run eagerly on the call's arguments (None: nothing), its
    buffers put back as they were."""
    saved = {n: b.detach().clone() for n, b in model.named_buffers()}
    with _state_kept(model), torch.no_grad():
        try:
            model(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any error of the model's is what the user sees
            return exc
        finally:
            for n, b in model.named_buffers():
                if n in saved and b.shape == saved[n].shape:
                    b.copy_(saved[n])
    return None


@contextlib.contextmanager
def _quiet() -> Any:
    """Tracing prints and warns about the model's Python (``TracerWarning``s, dynamo's logs, and
    the loggers of torch's tracing machinery, whose handlers write to the process's stderr: a
    forward that raises on fake tensors logs the whole traceback before the error is raised)."""
    loggers = [logging.getLogger(name) for name in _TRACING_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


@dataclasses.dataclass(frozen=True)
class _Refused:
    """``torch.export``'s graph whose import refused some ops: what serves the forward when
    dynamo's capture fails too (or is not to be tried: ``retry`` False, ops no torch-level graph
    would convert either) — imported with those ops run in PyTorch under ``fallback``, else the
    error naming them."""

    gm: torch.fx.GraphModule
    cap: Capture
    examples: list[Any]
    error: UnsupportedOpsError
    retry: bool

    def resolve(self, fallback: bool, name: str) -> tuple[Imported, Capture]:
        if not fallback:
            raise self.error
        return _stateless(import_fx(self.gm, self.examples, fallback=True, name=name), name), self.cap


#: ATen ops whose refusal (a recurrent layer over packed sequences, too many steps, dropout in
#: training) no other capture lifts (dynamo cannot trace the modules that call them either): a
#: graph refusing only these is resolved from torch.export's capture, without trying dynamo's.
_NO_RETRY = ("aten.lstm", "aten.gru", "aten.rnn_tanh", "aten.rnn_relu")


def _aten_capture(model: torch.nn.Module, fs: Any, args: list[Any], kwargs: dict[str, Any],
                  arguments: dict[str, Any], name: str
                  ) -> tuple[tuple[Imported, Capture] | None, str, _Refused | None]:
    """``torch.export.export(strict=False)``'s graph of ATen calls, imported (:mod:`.aten`), or
    None, the reason it is not used and — when that reason is ops the import refused — the graph
    to fall back to (:class:`_Refused`).  Several times faster than ``torch._dynamo.export`` on
    transformers' models (BERT-base: ~1.2 s vs 5-6 s), it serves forwards that change nothing in
    place and whose every op converts; dynamo's torch-level graph serves the others (its
    unsupported-op errors name torch's functions, and it tracks writes into inputs)."""
    if fs.var_positional is not None:
        return None, "a forward of *args", None
    with _quiet(), _no_fastpaths(), _state_kept(model):
        try:
            ep = torch.export.export(model, tuple(args), kwargs, strict=False)
        except Exception as exc:  # noqa: BLE001 - any failure: dynamo's capture decides
            return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}", None
        sig = ep.graph_signature
        if sig.buffers_to_mutate or sig.user_inputs_to_mutate:
            return None, "the forward changes inputs or buffers in place", None
        gm = _unguarded(ep.module())
    graph = gm.graph
    try:
        unsafe = aten.functional_writes(graph)
    except aten.AliasingError as exc:
        raise UnsupportedError(f"{name}: {exc}: taskmap's graphs are functional and do not track which tensors "
                               "share memory; write out of place (h = h + 1) or clone the view") from None
    if unsafe:
        return None, unsafe, None
    cap = Capture("export", tuple(graph._codegen.pytree_info.orig_args), graph._codegen, tracer="torch.export")
    examples = cap.flat_inputs(arguments)
    try:
        imported = import_fx(gm, examples, fallback=False, name=name)
    except UnsupportedOpsError as exc:
        retry = not all(op.startswith(_NO_RETRY) for op, _, _ in exc.ops)
        return None, "; ".join(f"{op}" + (f" ({why})" if why else "") for op, _, why in exc.ops), \
            _Refused(gm, cap, examples, exc, retry)
    except UnsupportedError as exc:
        return None, str(exc).splitlines()[0], None
    return (imported, cap), "", None


def _unguarded(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``torch.export``'s module without its checks of the call's shapes (the callers key
    their graphs by shape)."""
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            gm.graph.erase_node(node)
    return gm


def reexport(gm: torch.fx.GraphModule, args: list[Any], name: str, fallback: bool) -> Imported:
    """A dynamo graph that the torch-level import refused (a write through a view: BEiT's
    relative position index), traced again by ``torch.export`` — ATen calls, whose in-place
    writes :func:`.aten.functional_writes` makes functional — and imported."""
    with _quiet():
        ep = torch.export.export(gm, tuple(args), strict=False)
    if ep.graph_signature.buffers_to_mutate or ep.graph_signature.user_inputs_to_mutate:
        raise UnsupportedError(f"{name}: changes its inputs in place")
    egm = _unguarded(ep.module())
    unsafe = aten.functional_writes(egm.graph)
    if unsafe:
        raise UnsupportedError(f"{name}: {unsafe}")
    return import_fx(egm, args, fallback=fallback, name=name)


def _stateless(imported: Imported, name: str) -> Imported:
    """``imported``, unless its forward changes the model's parameters or buffers in place: they
    are constants of the compiled graph (its inputs changed in place are written back)."""
    state = sorted({str(key) for kind, key, _ in imported.mutated if kind == "attr"})
    if state:
        raise _state_error(name, state)
    return imported


def _state_error(name: str, state: Sequence[str]) -> UnsupportedError:
    return UnsupportedError(f"{name}: the forward changes {', '.join(state)} in place; taskmap.compile compiles "
                            "parameters and buffers in as constants (a stateful forward, e.g. a cache kept in a "
                            "buffer, needs its state passed in and returned as tensors)")


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(itertools.chain(model.named_parameters(), model.named_buffers()))


def _versions(model: torch.nn.Module) -> dict[str, int]:
    return {n: t._version for n, t in _state(model).items()}


@contextlib.contextmanager
def _state_kept(model: torch.nn.Module) -> Any:
    """Put back any parameter or buffer object an export replaced (dynamo leaves a buffer the
    forward changes in place as a fake tensor on the module)."""
    kept = _state(model)
    try:
        yield
    finally:
        for name, t in kept.items():
            owner, _, attr = name.rpartition(".")
            module = model.get_submodule(owner) if owner else model
            if getattr(module, attr, None) is not t:
                if attr in module._buffers:
                    module._buffers[attr] = t
                elif attr in module._parameters:
                    module._parameters[attr] = t


__all__ = ["CAPTURES", "Capture", "bind", "capture", "try_symbolic_trace"]
