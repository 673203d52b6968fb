"""``taskmap.compile(model)``: a callable that runs ``model``'s computation as compiled graphs.

Graphs are compiled per call signature (input shapes, dtypes, devices and the non-tensor
arguments) and cached: a new input shape compiles a new graph — or raises ``LaunchError``
with ``static_shapes=True``.  ``save(path)`` writes every compiled graph (constants included);
``taskmap.load(path, model=None)`` brings them back (kernels come from the disk cache); a
loaded module recompiles for new shapes only when given the model.
"""
from __future__ import annotations

import operator
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch.utils import _pytree as pytree

from ...errors import LaunchError
from ...graph import OpCategory, OpKind, serialize
from ...graph.flops import op_flops
from ...runtime.graph import CompiledGraph, gc_paused
from . import autocast, precision
from .capture import CAPTURES, Capture, capture, try_symbolic_trace
from .signature import bind, constant_arguments, forward_signature
from .importer import Imported


def signature_key(arguments: dict[str, Any]) -> tuple[Any, ...]:
    """What a compiled graph is specialised on: tensor shapes / dtypes / devices, other values."""
    flat, spec = pytree.tree_flatten(arguments)
    items = []
    for v in flat:
        if isinstance(v, torch.Tensor):
            items.append(("tensor", tuple(v.shape), str(v.dtype), str(v.device)))
        else:
            items.append(("value", type(v).__name__, repr(v)))
    return (str(spec), tuple(items), autocast.state())      # torch.autocast changes what the graph computes


_VERSION = operator.attrgetter("_version")


def _quick_key(args: Sequence[Any]) -> tuple[Any, ...] | None:
    """For calls with tensors as the only (positional) arguments: their shapes, dtypes and
    devices, which pick the entry as :func:`signature_key` would (the rest of the signature is
    the model's defaults).  Hashed directly, it saves the pytree walk and the strings on every
    call of a compiled model."""
    key: list[Any] = [autocast.state()]
    for a in args:
        if type(a) is not torch.Tensor:
            return None
        key.append((a.shape, a.dtype, a.device))
    return tuple(key)


def _describe(key: tuple[Any, ...]) -> str:
    return ", ".join(f"{dt.replace('torch.', '')}{list(shape)}" for kind, shape, dt, *_ in key[1] if kind == "tensor")


@dataclass
class Entry:
    """One compiled graph and how calls reach it."""

    imported: Imported
    capture: Capture
    compiled: CompiledGraph | None = None
    compile_seconds: float = 0.0
    calls: int = 0
    stamp: int | None = None     # the model's parameters and buffers when captured (CompiledModule._stamp)

    def ready(self, progress: bool | None) -> CompiledGraph:
        if self.compiled is None:
            t = time.perf_counter()
            g = self.imported.graph
            device = next((x.device for x in g.inputs), "cpu")
            self.compiled = CompiledGraph(g, device, "torch", progress)
            self.compile_seconds = time.perf_counter() - t
        return self.compiled

    def run(self, arguments: dict[str, Any], progress: bool | None) -> Any:
        cg = self.ready(progress)
        flat = self.capture.flat_inputs(arguments)
        tensors = self.imported.graph_inputs(flat)
        self.calls += 1
        values = cg(*tensors)
        if self.imported.mutated:
            self.imported.write_back(values, flat)
        return self.capture.finish(self.imported.outputs(values))

    def __getstate__(self) -> dict[str, Any]:
        return {"imported": self.imported, "capture": self.capture, "compiled": None, "compile_seconds": 0.0,
                "calls": 0}


@dataclass
class CompiledModule:
    """What ``taskmap.compile`` returns: call it like the model."""

    model: torch.nn.Module | None
    static_shapes: bool = False
    fallback: bool = False
    progress: bool | None = None
    capture: str = "auto"
    fp32_precision: str | None = None       # see :mod:`.precision` (None: PyTorch's settings at capture)
    entries: dict[tuple[Any, ...], Entry] = field(default_factory=dict)
    cache_hits: int = 0
    _traces: dict[str, Any] = field(default_factory=dict, repr=False)   # fx traces (None: not traceable)
    _quick: dict[tuple[Any, ...], Entry] = field(default_factory=dict, repr=False)   # see _quick_key
    _state: list[torch.Tensor] | None = field(default=None, repr=False)           # see _stamp
    _lock: Any = field(default_factory=threading.RLock, repr=False)        # compiling a graph

    @property
    def name(self) -> str:
        return type(self.model).__name__ if self.model is not None else "graph"

    def _entry(self, arguments: dict[str, Any]) -> Entry:
        key = signature_key(arguments)
        hit = self.entries.get(key)
        if hit is not None:
            self.cache_hits += 1
            return hit
        if self.static_shapes and self.entries:
            have = "; ".join(_describe(k) for k in self.entries)
            raise LaunchError(f"{self.name} was compiled with static_shapes=True for inputs ({have}); got "
                              f"({_describe(key)}). Compile again, or drop static_shapes to recompile per shape.")
        if self.model is None:
            raise LaunchError(f"this loaded module has graphs for ({'; '.join(_describe(k) for k in self.entries)}) "
                              f"only; got ({_describe(key)}). Pass model= to taskmap.load to compile new shapes.")
        constants = constant_arguments(arguments)
        which = repr(sorted(constants.items()))
        with gc_paused():
            if which not in self._traces and self.capture == "auto":
                self._traces[which] = try_symbolic_trace(self.model, constants)
            stamp = self._stamp()
            with precision.chosen(self.fp32_precision):
                imported, cap = capture(self.model, self._traces.get(which), arguments, fallback=self.fallback,
                                        name=self.name, how=self.capture)
            entry = self.entries[key] = Entry(imported, cap, stamp=stamp)
            entry.ready(self.progress)
        return entry

    def _stamp(self) -> int | None:
        """The sum of the version counters of the model's parameters and buffers: an in-place
        change of any of them (an optimizer step, ``load_state_dict``) moves it, and the graphs,
        which hold their values as constants, are compiled again (~25 us a call for ResNet-50's
        320 tensors)."""
        if self.model is None:
            return None
        if self._state is None:
            self._state = list({id(t): t for t in [*self.model.parameters(), *self.model.buffers()]}.values())
        return sum(map(_VERSION, self._state))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        arguments = self._bind(args, kwargs)
        quick = None if kwargs else _quick_key(args)
        entry = self._quick.get(quick) if quick is not None else None
        if entry is None:
            with self._lock:                   # threads calling at once compile a graph once
                entry = self._entry(arguments)
        else:
            self.cache_hits += 1
        if entry.stamp is not None and entry.stamp != self._stamp():      # weights changed: every graph is stale
            with self._lock:
                self.entries.clear()
                self._quick.clear()
                entry = self._entry(arguments)
        if quick is not None:
            self._quick[quick] = entry
        return entry.run(arguments, self.progress)

    def _bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.model is not None:
            return bind(self.model, args, kwargs)
        merged = {**self._defaults, **dict(zip(self._names, args)), **kwargs}
        return {n: merged[n] for n in self._names if n in merged}

    forward = __call__

    def __repr__(self) -> str:
        return f"CompiledModule({self.name}: {len(self.entries)} graph(s), cache hits {self.cache_hits})"

    def compile_for(self, *args: Any, **kwargs: Any) -> "CompiledModule":
        """Compile the graph for this call's signature now (without running it)."""
        self._entry(self._bind(args, kwargs))
        return self

    # ------------------------------------------------------------------ reports, save / load

    def profile(self, *args: Any, rounds: int = 10, top: int | None = 20, **kwargs: Any) -> str:
        """Per-kernel times of one call's compiled graph (compiled first if needed), slowest
        first: a table of median milliseconds over ``rounds`` runs, share of the total, the
        step's kind, its kernel (the template's or rule-based kernel's name; ``runner`` for an
        operator run another way), the GFLOP/s of its convolutions, matmuls and attention, and
        its ops (``top`` rows; None: all)."""
        arguments = self._bind(args, kwargs)
        entry = self._entry(arguments)
        cg = entry.ready(self.progress)
        flat = entry.capture.flat_inputs(arguments)
        tensors = entry.imported.graph_inputs(flat)
        rows = cg.profile(*tensors, rounds=rounds)
        total = sum(r[2] for r in rows) or 1.0
        kernels = {s.name: "+".join(k.__name__ for k in s.kernels) or "runner" for s in cg.steps}
        ops = {op.name: op for op in cg.graph.ops}
        flops = {s.name: sum(op_flops(ops[n]) for n in s.name.split("+") if n in ops) for s in cg.steps}
        work = sum(flops[name] for name, _, _ in rows)
        lines = [f"{self.name}: {len(rows)} steps, {total * 1e3:.3f} ms in all (median of {rounds} runs per step), "
                 f"{work / 1e9:.2f} GFLOP of convolutions, matmuls and attention: {work / total / 1e9:.1f} GFLOP/s",
                 f"{'ms':>9} {'share':>6} {'GFLOP/s':>8}  {'kind':<14} {'kernel':<18} step"]
        for name, kind, sec in rows[:top]:
            rate = f"{flops[name] / sec / 1e9:8.1f}" if flops[name] and sec > 0 else f"{'':8}"
            lines.append(f"{sec * 1e3:9.3f} {sec / total:6.1%} {rate}  {kind:<14} {kernels[name]:<18} {name}")
        return "\n".join(lines)

    def summary(self) -> str:
        lines = [f"taskmap compiled module {self.name}: {len(self.entries)} graph(s), cache hits {self.cache_hits}"]
        for key, e in self.entries.items():
            g = e.imported.graph
            cats: dict[str, int] = {}
            for op in g.ops:
                c = op.definition.category
                label = "fallback" if op.kind is OpKind.TORCH else \
                    "injective" if c <= OpCategory.INJECTIVE else "anchor"
                cats[label] = cats.get(label, 0) + 1
            cg = e.compiled
            kernels = len({id(k) for k in cg.kernels}) if cg else 0
            const_mb = sum(t.nbytes for t in g.constants()) / 2**20
            kinds = ", ".join(f"{v} {k}" for k, v in cats.items())
            after = len(cg.graph.ops) if cg is not None else len(g.ops)
            steps = len(cg.steps) if cg is not None else 0
            calls = sum(1 for st in cg.steps if st.kernel is None) if cg is not None else 0
            by = f", captured by {e.capture.tracer}" if getattr(e.capture, "tracer", "") else ""
            lines.append(f"  inputs ({_describe(key)}){by}: {len(g.ops)} ops ({kinds}), {after} after graph passes, "
                         f"{steps} fusion groups (launch steps), {kernels} compiled kernels + {calls} "
                         f"taskmap.ops / PyTorch calls, planned memory "
                         f"{cg.planned_bytes / 2**20 if cg else 0:.1f} MiB in {len(cg.buffer_sizes) if cg else 0} "
                         f"buffers, constants {const_mb:.1f} MiB, compiled in {e.compile_seconds:.1f} s, "
                         f"{e.calls} call(s)")
            tf32 = sorted({op.kind.name.lower() for op in g.ops if getattr(op.attrs, "tf32", False)})
            if tf32:
                why = "fp32_precision='tf32'" if self.fp32_precision == "tf32" else "PyTorch's settings at compile time"
                lines.append(f"    TF32 allowed ({why}) for: {', '.join(tf32)}")
            x3 = sorted({op.kind.name.lower() for op in g.ops if getattr(op.attrs, "tf32x3", False)})
            if x3:
                lines.append(f"    3xTF32 (fp32_precision='3xtf32') for: {', '.join(x3)}")
            if e.imported.unsupported:
                lines.append("    run by PyTorch: " + ", ".join(sorted({u[0] for u in e.imported.unsupported})))
        return "\n".join(lines)

    @property
    def graphs(self) -> list[Any]:
        return [e.imported.graph for e in self.entries.values()]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the compiled graphs (constants included) to ``path``."""
        names, defaults = _signature(self.model) if self.model is not None else (self._names, self._defaults)
        serialize.save({"entries": self.entries, "names": names, "defaults": defaults,
                        "static_shapes": self.static_shapes, "fallback": self.fallback, "capture": self.capture,
                        "fp32_precision": self.fp32_precision}, path)

    _names: tuple[str, ...] = ()
    _defaults: dict[str, Any] = field(default_factory=dict)


def _signature(model: torch.nn.Module) -> tuple[tuple[str, ...], dict[str, Any]]:
    fs = forward_signature(model)
    return fs.named, fs.defaults


def compile(model: torch.nn.Module, example_inputs: Any = None, *, static_shapes: bool = False,  # noqa: A001
            fallback: bool = False, progress: bool | None = None, capture: str = "auto",
            fp32_precision: str | None = None) -> CompiledModule:
    """Compile ``model`` (an ``nn.Module`` in eval mode) into a callable with the same outputs.

    ``example_inputs`` (a tensor, a tuple of positional arguments or a dict of keyword
    arguments) compiles a graph now; otherwise the first call does.  ``static_shapes=True``:
    other input shapes raise ``LaunchError`` instead of compiling a new graph.  ``fallback=True``:
    operators the frontend does not support run in PyTorch instead of raising
    ``UnsupportedOpsError``.  ``progress``: show a progress bar (default: on a terminal).

    ``capture``: how the forward becomes a graph.  ``"auto"``: ``torch.fx.symbolic_trace``
    (any input shape), else ``torch.export.export(strict=False)`` for the call's shapes (when it
    writes nothing in place and its every op converts), else ``torch._dynamo.export``;
    ``"export"`` or ``"dynamo"``: that one only.

    ``fp32_precision``: how f32 matmuls and convolutions multiply on an NVIDIA GPU.  None (the
    default): as PyTorch would (TF32 where its settings allow it, IEEE f32 elsewhere);
    ``"3xtf32"``: where PyTorch would use IEEE f32, 3xTF32 on tensor cores (about f32's accuracy:
    see :mod:`taskmap.frontend.torch.precision`); ``"ieee"`` / ``"tf32"``: that everywhere."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"taskmap.compile expects a torch.nn.Module, got {type(model).__name__}")
    if capture not in CAPTURES:
        raise ValueError(f"taskmap.compile: capture={capture!r}; expected one of {', '.join(map(repr, CAPTURES))}")
    cm = CompiledModule(model, static_shapes, fallback, progress, capture, precision.check(fp32_precision))
    if example_inputs is not None:
        if isinstance(example_inputs, dict):
            cm.compile_for(**example_inputs)
        elif isinstance(example_inputs, (tuple, list)):
            cm.compile_for(*example_inputs)
        else:
            cm.compile_for(example_inputs)
    return cm


def load(path: str | os.PathLike[str], model: torch.nn.Module | None = None) -> CompiledModule:
    """A module saved by ``CompiledModule.save``; with ``model``, new shapes compile new graphs."""
    state = serialize.load(path)
    cm = CompiledModule(model, state["static_shapes"], state["fallback"], capture=state.get("capture", "auto"),
                        fp32_precision=state.get("fp32_precision"))
    cm.entries = state["entries"]
    cm._names, cm._defaults = state["names"], state["defaults"]
    return cm


__all__ = ["CompiledModule", "compile", "load", "signature_key"]
