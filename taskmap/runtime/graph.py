"""A compiled graph: a list of steps (kernel launches over buffer slots) and a static memory plan.

``CompiledGraph(graph, device)`` runs the graph passes (:mod:`taskmap.graph.passes`), then
turns every **fusion group** (:func:`taskmap.graph.lower.lower_group`) into a :class:`Step`:

* a fused kernel (a matmul / linear / conv2d anchor with its prologues and epilogue, or a
  chain of injective ops composed and scheduled by the rule-based scheduler): the step
  launches it into a buffer of the **memory plan**.  On the CPU the launch is bound at the
  first run (``CompiledKernel.bind_host``: arguments checked once) and every later run passes
  only the arrays' data pointers — a compiled graph's shapes are static and its inputs are
  checked by the graph; on a GPU it is a prepared launch (``CompiledKernel.prepare``),
  prepared again when an array outside the memory plan has moved;
* other anchors (reductions, norms, pooling, attention, unsupported shapes) and the PyTorch
  fallback: the step calls the op's ``taskmap.ops`` runner, which allocates its own result.

``fuse=False`` (or ``TASKMAP_FUSION=0``) skips the passes and makes one step per op.

Memory plan: every intermediate written by a kernel step (not a graph output) gets a region of
one of a few byte buffers, chosen by lifetime (a buffer is free again after the last step that
reads its tensor; best fit, growing the largest free one).  The buffers are allocated (and the
tensors' views of them made) once, on the first run, and reused by every later run — so a
compiled graph runs one call at a time.  A batch-1 concat's inputs are written in place, in
their ranges of its buffer, and its copy step is dropped (:mod:`.concat_inplace`); a slice of a
contiguous range is a view carved out of its source's buffer, with no step (:mod:`.views`).  A
buffer lives until the last step that reads it or any view of it.
Values of other steps are dropped after their last use.  Graph outputs are always fresh arrays.

On the CPU, from the second call on, each run of consecutive kernel steps is one call into C
(:class:`taskmap.backends.cpu.chain.HostChain`: the bound launches' arguments packed once, only
the addresses of the graph's inputs and outputs and of the runners' results written again per
call); ``TASKMAP_HOST_CHAIN=0`` launches step by step, as the first call and ``profile`` do.

On a GPU (torch CUDA tensors) the second call captures the whole run as one CUDA graph and later
calls replay it (:meth:`CompiledGraph._replay`; ``cuda_graph=False`` or ``TASKMAP_CUDA_GRAPHS=0``:
launch step by step).

The seam for fusion: :func:`build_steps` is the only place that maps groups (or ops) to steps;
a fused group becomes one :class:`Step` launching one kernel over the same slots.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

from ..backends import TargetKind
from ..backends.cpu.chain import HostChain
from ..compute.nodes import graph_inputs, tensor_input
from ..errors import LaunchError
from ..graph.derived import derived, shared_by
from ..graph.ir import Graph, Op, Tensor
from ..graph.kinds import OpKind
from ..graph.concat_place import concat_inputs, concat_parts, place_group
from ..graph.lower import KernelGroup, Scalar, Workspace, Zeros, graph_groups, lowered, workspace_sizes
from ..graph.passes import debug_enabled, optimize
from ..graph.printer import graph_str
from ..ir.types import TensorType
from ..ops._dispatch import kernel_shape, target_for
from ..ops.arrays import ArrayKind, empty_like_kind
from ..schedule.rule_based import schedule
from .args import aligned, in_place, reinterpret, torch_view
from .args import data_ptr as _ptr
from .args import view
from .concat_inplace import elide_concats
from .views import elide_views
from .kernel import CompiledKernel, HostLaunch, Kernel, status_error

#: One kernel argument of a step: (a slot of the graph's values or -1, the fixed array or scalar
#: of a -1, the shape the kernel sees the slot's array with or None).
_Arg = tuple[int, Any, "tuple[int, ...] | None"]

_KERNELS: dict[tuple[Any, ...], tuple[Kernel, tuple[int, ...]]] = {}
#: Cycles per second a GPU spin kernel (``torch.cuda._sleep``) is sized with in ``profile``: at
#: least the clock of today's data-center GPUs (H100 / H200: 1.98 GHz), so the spin lasts at
#: least as long as asked.
SPIN_CYCLES_PER_SECOND = 2.0e9


@dataclass(frozen=True)
class HostWork:
    """What a CPU kernel step does, for a chain (:class:`HostChain`): make its output array
    (``out``, of ``shape`` / ``dtype``) when the memory plan has none, then run its ``sites``."""

    out: int
    shape: tuple[int, ...]
    dtype: str
    sites: tuple["_HostSite", ...]


@dataclass
class Step:
    """One launch: ``run(values)`` reads ``values[k]`` for ``k`` in ``inputs`` and sets
    ``values[k]`` for ``k`` in ``outputs`` (slots of the graph's tensors)."""

    name: str
    kind: OpKind
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    run: Callable[[list[Any]], None] = field(repr=False)
    kernel: Any = field(default=None, repr=False)
    planned: bool = False  # writes into the memory plan
    more: tuple[Any, ...] = field(default=(), repr=False)     # kernels launched after ``kernel`` (split-K)
    host: HostWork | None = field(default=None, repr=False)    # a CPU kernel step: what a chain runs
    view: tuple[int, int] | None = None    # a view of the array of this slot at this byte offset (.views)

    @property
    def kernels(self) -> tuple[Any, ...]:
        """Every kernel the step launches, in order (none for a runner)."""
        return () if self.kernel is None else (self.kernel, *self.more)


def compute_kernel(op: Op, target: Any) -> tuple[Kernel, tuple[int, ...]]:
    """The rule-based kernel of an injective op (cached per op kind, attributes, shapes, dtypes,
    target) and which of its inputs it reads."""
    shapes = tuple(kernel_shape(t.shape) for t in op.inputs)
    dtypes = tuple(t.dtype.name for t in op.inputs)
    out = op.output
    key = (op.kind, op.attrs, shapes, dtypes, kernel_shape(out.shape), target)
    hit = _KERNELS.get(key)
    if hit is None:
        nodes = [tensor_input(f"x{k}", d, s) for k, (d, s) in enumerate(zip(dtypes, shapes))]
        node = op.definition.compute(nodes, op.attrs, kernel_shape(out.shape))
        if tuple(node.shape) != kernel_shape(out.shape) or node.dtype is not out.dtype:
            raise AssertionError(f"{op.name}: compute gives {node.dtype!r}{list(node.shape)}, inference "
                                 f"{out.dtype!r}{list(out.shape)}")
        read = {id(n) for n in graph_inputs(node)}
        used = tuple(k for k, x in enumerate(nodes) if id(x) in read)
        kernel = schedule(node, target, inputs=[nodes[k] for k in used], name=op.kind.name.lower())
        hit = _KERNELS[key] = (kernel, used)
    return hit


def _carve(buf: Any, shape: Sequence[int], dtype: str) -> Any:
    """A contiguous array of ``shape``/``dtype`` at the start of the byte buffer ``buf``."""
    n = math.prod(shape)
    if isinstance(buf, np.ndarray):
        return buf[: n * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
    torch = sys.modules["torch"]
    t = getattr(torch, dtype)
    size = n * torch.empty((), dtype=t).element_size()
    return buf[:size].view(t).view(tuple(shape))


@contextlib.contextmanager
def gc_paused():
    """Compiling creates many small objects that live on (IR trees, cached kernels unpickled):
    the cyclic collector's passes then walk the whole heap, a PyTorch model's included, again and
    again (a cached ResNet-50 compile: ~0.15 s of ~0.95), and free next to nothing.  The
    frontends pause it for capture and import too (one full pass over GPT-2 under dynamo: ~0.4 s)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class CompiledGraph:
    """``graph`` ready to run on ``device`` with arrays of ``library`` ("torch" or "numpy")."""

    def __init__(self, graph: Graph, device: str = "cpu", library: str = "torch", progress: bool | None = None,
                 fuse: bool | None = None, cuda_graph: bool | None = None):
        fuse = fuse if fuse is not None else os.environ.get("TASKMAP_FUSION", "1") != "0"
        self.source_graph = graph
        with gc_paused(), shared_by(self):       # constants derived as other graphs did: shared
            graph = self.graph = optimize(graph) if fuse else graph      # graph passes (taskmap.graph.passes)
            self.kind = ArrayKind(library, device)
            self.target = target_for(self.kind)
            if debug_enabled("graph"):
                print(graph_str(graph), file=sys.stderr)
            self.slots: dict[Tensor, int] = {t: k for k, t in enumerate(graph.tensors())}
            # converted when a step reads them: a weight the lowering replaced by its packed or
            # K-major copy is never copied to the device
            lazy = _Constants({self.slots[t]: t.data for t in graph.constants()},
                              lambda data: shared_constant(data, self.kind))
            steps = build_steps(graph, self.slots, self.target, self.kind, progress, fuse, lazy)
            # kept: those the kernels were given, those runners read, those the graph returns
            read = lazy.given | {k for st in steps if st.kernel is None for k in st.inputs} | \
                {self.slots[t] for t in graph.outputs}
            self.constants: dict[int, Any] = {k: lazy.get(k) for k in lazy.raw if k in read}
            self.steps, self.aliases = elide_concats(graph, self.slots, steps, set(lazy.raw)) if fuse \
                else (steps, {})
            keep = {self.slots[t] for t in (*graph.inputs, *graph.outputs)} | set(lazy.raw)
            self.steps, self.aliases = elide_views(self.steps, self.aliases, keep)
            self._plan()
        self._by_slot = {k: t for t, k in self.slots.items()}
        self._template: list[Any] | None = None    # per slot: its constant or its view of a planned buffer
        self._segments: list[Any] | None = None    # the steps as run after the first call (CPU)
        self.host_chain = os.environ.get("TASKMAP_HOST_CHAIN", "1") != "0"
        self.runs = 0
        # CUDA graph capture (torch CUDA tensors): the second call captures, later calls replay
        if cuda_graph is None:
            cuda_graph = os.environ.get("TASKMAP_CUDA_GRAPHS", "1") != "0"
        self.cuda_graph = cuda_graph and self.kind.library == "torch" and self.kind.device.startswith("cuda")
        self._captured: tuple[Any, list[Any], list[Any]] | None = None
        # one run at a time: the runs share the memory plan's buffers (and bind launches lazily)
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ compile time

    def _plan(self) -> None:
        """Assign buffers to the planned outputs by lifetime."""
        last: dict[int, int] = {}
        for i, step in enumerate(self.steps):
            for k in step.inputs:
                last[k] = i
        for k, (owner, _) in self.aliases.items():     # a buffer lives as long as its views are read
            if k in last:
                last[owner] = max(last[k], last.get(owner, -1))
        keep = {self.slots[t] for t in self.graph.outputs}
        self.free_after: list[list[int]] = [[] for _ in self.steps]
        for k, i in last.items():
            if k not in keep and k not in self.constants and i < len(self.steps):
                self.free_after[i].append(k)
        sizes: list[int] = []
        free: list[int] = []
        self.assign: dict[int, int] = {}
        nbytes = {self.slots[t]: t.nbytes for t in self.slots}
        for i, step in enumerate(self.steps):
            if step.planned:
                for k in step.outputs:
                    if k in self.aliases:      # written inside a concat's output: its buffer, from here on
                        k = self.aliases[k][0]
                    elif k in keep or k not in last:
                        continue
                    if k in self.assign:       # a concat's output that an earlier part's kernel wrote
                        continue
                    need = max(nbytes[k], 1)
                    fits = [b for b in free if sizes[b] >= need]
                    if fits:
                        b = min(fits, key=lambda b: sizes[b])
                    elif free:
                        b = max(free, key=lambda b: sizes[b])
                        sizes[b] = need
                    else:
                        b = len(sizes)
                        sizes.append(need)
                    if b in free:
                        free.remove(b)
                    self.assign[k] = b
            for k in self.free_after[i]:
                if k in self.assign:
                    free.append(self.assign[k])
        self.buffer_sizes = sizes

    @property
    def planned_bytes(self) -> int:
        return sum(self.buffer_sizes)

    @property
    def kernels(self) -> list[Any]:
        """Every kernel launched, in order."""
        return [k for s in self.steps for k in s.kernels]

    # ------------------------------------------------------------------ run time

    def _check(self, inputs: Sequence[Any]) -> None:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise LaunchError(f"compiled graph {g.name} takes {len(g.inputs)} inputs, got {len(inputs)}")
        for k, (a, t) in enumerate(zip(inputs, g.inputs)):
            shape = tuple(a.shape)
            dtype = _dtype_name(a)
            dev = str(getattr(a, "device", "cpu"))
            if shape != t.shape or dtype != t.dtype.name or (dev != self.kind.device and
                                                              not (dev == "cuda" and self.kind.device == "cuda:0")):
                raise LaunchError(f"input {k} ({t.name}) of {g.name}: expected {t.dtype.name}{list(t.shape)} on "
                                  f"{self.kind.device}, got {dtype}{list(shape)} on {dev}")

    def _prefilled(self) -> list[Any]:
        """Allocate the memory plan's buffers; per slot, the constant or the view of a buffer that
        every run starts with (None for the others)."""
        buffers = [empty_like_kind(self.kind, (n,), "uint8") for n in self.buffer_sizes]
        values: list[Any] = [None] * len(self.slots)
        for k, c in self.constants.items():
            values[k] = c
        for step in self.steps:
            for k in step.outputs:
                out, offset = self.aliases.get(k, (k, 0))
                b = self.assign.get(out)
                if b is None:
                    continue
                if out != k and values[out] is None:          # the concat's output, before its first part
                    t = self._by_slot[out]
                    values[out] = _carve(buffers[b], t.shape, t.dtype.name)
                t = self._by_slot[k]
                values[k] = _carve(buffers[b][offset:], t.shape, t.dtype.name)
        for k, (out, offset) in self.aliases.items():       # the views of the slices no step makes
            b = self.assign.get(out)
            if values[k] is None and b is not None:
                t = self._by_slot[k]
                values[k] = _carve(buffers[b][offset:], t.shape, t.dtype.name)
        return values

    def _chained(self) -> list[Any]:
        """The steps as later calls run them: each run of consecutive CPU kernel steps (all bound,
        with packed entries) as ``(chain, outputs to make, slots to drop)``, any other step as its
        index."""
        planned = {k for k, v in enumerate(self._template or ()) if v is not None}
        segments: list[Any] = []
        run: list[int] = []
        launches: list[Any] = []

        def close() -> None:
            if run:
                works = [self.steps[i].host for i in run]
                chain = HostChain(self.target, launches, self._template, planned, _ptr)
                segments.append((chain, [(w.out, w.shape, w.dtype) for w in works if w.out not in planned],
                                 [k for i in run for k in self.free_after[i]]))
                run.clear()
                launches.clear()
        for i, step in enumerate(self.steps):
            chained = [site.chained() for site in step.host.sites] if step.host is not None else [None]
            if all(c is not None for c in chained):
                run.append(i)
                launches.extend(chained)
            else:
                close()
                segments.append(i)
        close()
        return segments

    def __call__(self, *inputs: Any) -> list[Any]:
        if self.cuda_graph and self.runs > 0:
            with self._lock:
                return self._replay(inputs)
        return self._run(inputs, None)

    def _replay(self, inputs: Sequence[Any]) -> list[Any]:
        """Run as one CUDA graph (``torch.cuda.CUDAGraph``): the first call here copies the inputs
        into static buffers and captures every step on PyTorch's capture stream (the kernels
        launch on the current stream; the runners' tensors come from the graph's private memory
        pool); later calls copy the inputs in and replay.  A graph that cannot be captured (a
        step synchronises with the host) warns and runs step by step from then on."""
        torch = sys.modules["torch"]
        self._check(inputs)
        if self._captured is None:
            static = [a.detach().clone(memory_format=torch.contiguous_format) for a in inputs]
            graph = torch.cuda.CUDAGraph()
            try:
                torch.cuda.synchronize()
                with torch.cuda.graph(graph):
                    outs = self._run(static, None)
            except Exception as exc:          # noqa: BLE001 - any failure to capture: run uncaptured
                self.cuda_graph = False
                warnings.warn(f"taskmap: {self.graph.name} runs without CUDA graph capture: {exc}", stacklevel=3)
                return self._run(inputs, None)
            self._captured = (graph, static, outs)
        graph, static, outs = self._captured
        for buf, a in zip(static, inputs):
            buf.copy_(a)
        graph.replay()
        self.runs += 1
        return [o.clone() for o in outs]      # graph outputs are fresh arrays, as without capture

    def profile(self, *inputs: Any, rounds: int = 10) -> list[tuple[str, str, float]]:
        """Run ``rounds`` times (after one warm-up run) and return, per step, its name, its
        kind and its median seconds — slowest first.  CPU steps are timed by the wall clock
        around each launch; GPU steps by CUDA events on the stream around each step's launches:
        device time.  So that the events time the kernels and not the host launching them, each
        round is queued behind a spin kernel (``torch.cuda._sleep``) that lasts about twice as
        long as the host takes to queue a round."""
        torch = sys.modules["torch"] if self.kind.device.startswith("cuda") else None
        gpu = torch is not None
        self._run(inputs, None)
        t0 = time.perf_counter()
        if gpu:
            self._run(inputs, None)
        queue_s = time.perf_counter() - t0          # the host's time to queue a round (GPU)
        times: list[list[float]] = [[] for _ in self.steps]
        events: list[tuple[int, Any, Any]] = []

        def timed(i: int, step: Step, values: list[Any]) -> None:
            if gpu:
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                step.run(values)
                end.record()
                events.append((i, start, end))
                return
            t0 = time.perf_counter()
            step.run(values)
            times[i].append(time.perf_counter() - t0)

        for _ in range(max(1, rounds)):
            if gpu:
                torch.cuda.synchronize()
                if hasattr(torch.cuda, "_sleep"):
                    torch.cuda._sleep(int(min(queue_s, 0.25) * 2 * SPIN_CYCLES_PER_SECOND))
            self._run(inputs, timed)
            if gpu:
                torch.cuda.synchronize()
                for i, start, end in events:
                    times[i].append(start.elapsed_time(end) / 1e3)
                events.clear()
        rows = [(s.name, s.kind.name.lower(), float(np.median(t))) for s, t in zip(self.steps, times)]
        return sorted(rows, key=lambda r: -r[2])

    def _run(self, inputs: Sequence[Any], timed: Callable[[int, Step, list[Any]], None] | None) -> list[Any]:
        with self._lock:
            return self._run_locked(inputs, timed)

    def _run_locked(self, inputs: Sequence[Any], timed: Callable[[int, Step, list[Any]], None] | None) -> list[Any]:
        self._check(inputs)
        if self._template is None:
            self._template = self._prefilled()
        values = list(self._template)
        gpu = self.target.kind is not TargetKind.CPU
        for t, a in zip(self.graph.inputs, inputs):
            # GPU kernels read 16-byte chunks (cp_async, ldmatrix): a view off that alignment is copied
            values[self.slots[t]] = a if _contiguous(a) and not (gpu and _ptr(a) % 16) else _copy(a)
        if timed is None and self._segments is not None:
            self._run_segments(values)
        else:
            for i, (step, free) in enumerate(zip(self.steps, self.free_after)):
                if timed is None:
                    step.run(values)
                else:
                    timed(i, step, values)
                for k in free:
                    values[k] = None
            if self._segments is None and self.host_chain and not gpu:
                self._segments = self._chained()
        self.runs += 1
        outs = []
        for t in self.graph.outputs:
            v = values[self.slots[t]]
            outs.append(v.clone() if t.is_constant and hasattr(v, "clone") else v)
        return outs

    def _run_segments(self, values: list[Any]) -> None:
        for seg in self._segments or ():
            if isinstance(seg, int):
                self.steps[seg].run(values)
                for k in self.free_after[seg]:
                    values[k] = None
                continue
            chain, make, drop = seg
            for k, shape, dtype in make:
                if values[k] is None:
                    values[k] = empty_like_kind(self.kind, shape, dtype)
            failed = chain(values)
            if failed is not None:
                raise status_error(*failed)
            for k in drop:
                values[k] = None


def _contiguous(a: Any) -> bool:
    return a.flags.c_contiguous if isinstance(a, np.ndarray) else a.is_contiguous()


def _copy(a: Any) -> Any:
    """A contiguous copy in a fresh (aligned) allocation."""
    if isinstance(a, np.ndarray):
        return np.array(a, order="C")
    return a.clone(memory_format=sys.modules["torch"].contiguous_format)


def _dtype_name(a: Any) -> str:
    return str(a.dtype).replace("torch.", "")


def build_steps(graph: Graph, slots: dict[Tensor, int], target: Any, kind: ArrayKind,
                progress: bool | None = None, fuse: bool = True, constants: _Constants | dict[int, Any] | None = None
                ) -> list[Step]:
    """One step per fusion group (:func:`taskmap.graph.lower.lower_group`); with ``fuse=False``
    one step per op (injective ops as rule-based kernels, the others through their runners).
    ``constants``: the arrays of constant slots, given to the kernels once (not read each run)."""
    constants = constants or {}
    if fuse:
        return _group_steps(graph, slots, target, kind, progress, constants)
    steps = []
    ops = graph.ops
    bar = tqdm(ops, desc=f"taskmap: compiling {graph.name}", unit="op", leave=False,
               disable=not progress if progress is not None else None)
    for op in bar:
        ins = tuple(slots[t] for t in op.inputs)
        outs = tuple(slots[t] for t in op.outputs)
        if op.definition.category.is_injective:
            steps.append(_kernel_step(op, ins, outs, target, kind, constants))
        else:
            steps.append(_runner_step(op, ins, outs))
    return steps


def _group_steps(graph: Graph, slots: dict[Tensor, int], target: Any, kind: ArrayKind,
                 progress: bool | None, constants: _Constants | dict[int, Any]) -> list[Step]:
    """Steps of the fused kernel groups (kernels launch through :func:`_launch`: on a GPU
    prepared again only when an array that is not in the memory plan — a graph input or output,
    a runner's result — has moved)."""
    groups = _lower_and_build(graph, target, kind, progress)
    if debug_enabled("source"):
        for kg in groups:
            where = kg.kernel.build(kind.target).source_path if kg.kernel is not None else "taskmap.ops runner"
            print(f"// {kg.name}: {where}", file=sys.stderr)
    ws = {k: empty_like_kind(kind, (n,), "float32") for k, n in workspace_sizes(groups).items()}
    zeros: dict[str, Any] = {}                  # per dtype: the Zeros operands (one element)
    for kg in groups:
        for a in (a for _, args, _ in kg.launches for a in args):
            if isinstance(a, Zeros) and a.dtype not in zeros:
                zeros[a.dtype] = empty_like_kind(kind, (1,), a.dtype)
                zeros[a.dtype][...] = 0
    outputs = set(graph.outputs)
    stable = {slots[t] for t in graph.constants()}
    for kg in groups:
        if kg.kernel is not None or (kg.view is not None and slots[kg.view[0]] in stable):
            stable.update(slots[t] for t in kg.outputs if t not in outputs)
    steps = []
    for kg in groups:
        ins = tuple(slots[t] for t in kg.inputs)
        outs = tuple(slots[t] for t in kg.outputs)
        if kg.kernel is not None:
            steps.append(_group_step(kg, slots, kind, ws, zeros, stable, constants))
        elif kg.view is not None:
            steps.append(_view_step(kg, slots))
        elif len(kg.ops) == 1 and not kg.ops[0].definition.category.is_injective:
            # the op's own inputs: a group lists a tensor read twice (f(w, w)) once
            steps.append(_runner_step(kg.ops[0], tuple(slots[t] for t in kg.ops[0].inputs), outs))
        else:
            steps.append(_kernel_step(kg.ops[-1], ins, outs, target, kind, constants))   # an empty result
    return steps


def _lower_and_build(graph: Graph, target: Any, kind: ArrayKind, progress: bool | None) -> list[KernelGroup]:
    """Every fusion group lowered (:func:`taskmap.graph.lower.lower_group`) and its kernel built.

    The builds overlap the lowering: each new kernel goes to a few threads as soon as its group
    is lowered (the compilers run as processes, in parallel with each other and with the
    lowering of the next groups; binaries already in the disk cache are only loaded).  The
    progress bar counts the fusion groups whose kernels are built."""
    groups = graph_groups(graph, target)
    waiting = concat_inputs(graph, groups)       # batch > 1: maybe written in place (.concat_place)
    bar = tqdm(total=len(groups), desc=f"taskmap: compiling {graph.name}", unit="group", leave=False,
               disable=not progress if progress is not None else None)
    out: list[KernelGroup] = []
    held: dict[Tensor, int] = {}                 # a concat's input -> its producer's index in out
    futures: dict[Kernel, Future[Any]] = {}
    with bar, ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, 16)) as pool:
        def submit(kgs: list[KernelGroup]) -> None:
            new = list(dict.fromkeys(k for kg in kgs for k, _, _ in kg.launches if k not in futures))
            for k in new:
                futures[k] = pool.submit(k.build, kind.target)
            if new:
                futures[new[-1]].add_done_callback(lambda _: bar.update(1))
            else:
                bar.update(1)

        for kgs in lowered(graph, groups, target):
            ready = []
            for kg in kgs:
                reads = [t for t in kg.inputs if t in held]
                if reads:                                # the concat (or its consumer): place, or build as is
                    parts = concat_parts(kg.group, graph)
                    placed = [place_group(out[held[p.tensor]], p, target) if p.tensor in held else None
                              for p in parts or ()]
                    if parts and all(placed):
                        for p, pk in zip(parts, placed):
                            out[held.pop(p.tensor)] = pk
                            submit([pk])
                        bar.update(1)                    # the copy is gone
                        continue
                    for t in reads:
                        submit([out[held.pop(t)]])
                if kg.kernel is not None and len(kg.outputs) == 1 and kg.outputs[0] in waiting:
                    held[kg.outputs[0]] = len(out)       # built once its concat is decided
                else:
                    ready.append(kg)
                out.append(kg)
            if ready or not kgs:
                submit(ready)
        for t in list(held):
            submit([out[held.pop(t)]])
        for f in futures.values():
            f.result()          # a build's error surfaces here
    return out


class _Constants:
    """Slot -> the graph's constant as the kernels take it, converted on the first ``get``."""

    def __init__(self, raw: dict[int, np.ndarray], convert: Callable[[np.ndarray], Any]) -> None:
        self.raw, self._convert, self._done = raw, convert, {}

    def get(self, k: int) -> Any:
        if k not in self.raw:
            return None
        if k not in self._done:
            self._done[k] = self._convert(self.raw[k])
        return self._done[k]

    @property
    def given(self) -> set[int]:
        """The slots converted so far."""
        return set(self._done)


def device_constant(data: np.ndarray, kind: ArrayKind) -> Any:
    """A constant for the kernels of ``kind``: on the CPU starting on a cache line (packed weight
    panels are read as aligned vectors; numpy's arrays start 16 bytes off a line as often as not),
    on a GPU copied to its memory."""
    if kind.device == "cpu":
        data = aligned(data)
    if kind.library == "numpy":
        return data
    return torch_view(data).to(kind.device)     # constants are read-only; kernels never write them


def shared_constant(data: np.ndarray, kind: ArrayKind) -> Any:
    """A graph's constant for the kernels (:func:`device_constant`), shared with the other compiled
    graphs of the same values (:mod:`taskmap.graph.derived`)."""
    if kind.device == "cpu" and in_place(data):
        return device_constant(data, kind)          # used in place: nothing to share
    return derived((data,), ("constant", kind.library, kind.device), lambda: device_constant(data, kind))


def _lowering_constant(data: np.ndarray, kind: ArrayKind) -> Any:
    """A constant the lowering made (the CPU's packed panels, a GPU's K-major weights) as the
    kernels take it: the array itself on the CPU, once on the device (shared like the graph's
    constants) on a GPU."""
    return data if kind.device == "cpu" else shared_constant(data, kind)


def _group_step(kg: KernelGroup, slots: dict[Tensor, int], kind: ArrayKind, ws: dict[str, Any], zeros: dict[str, Any],
                stable: set[int], constants: _Constants | dict[int, Any]) -> Step:
    out = kg.outputs[0]
    o = slots[out]
    launches = []
    for kernel, args, shapes in kg.launches:
        plan: list[_Arg] = []
        for a, s in zip(args, shapes):
            if isinstance(a, Workspace):
                buf = ws[a.slot] if a.dtype == "float32" else reinterpret(ws[a.slot], a.dtype)
                plan.append((-1, buf if s is None else view(buf[:math.prod(s)], s), None))
            elif isinstance(a, Zeros):
                plan.append((-1, zeros[a.dtype], None))
            elif isinstance(a, Scalar):
                plan.append((-1, a.value, None))
            elif a not in slots and a.data is not None:     # a constant of the lowering's (packed weights)
                plan.append((-1, _lowering_constant(a.data if s is None else a.data.reshape(s), kind), None))
            else:
                plan.append(_slot_arg(slots[a], s, constants))
        volatile = tuple(dict.fromkeys([o, *(k for k, _, _ in plan if k >= 0 and k not in stable)]))
        launches.append(_launch(kernel.build(kind.target), plan, volatile))

    def run(values: list[Any]) -> None:
        if values[o] is None:
            values[o] = empty_like_kind(kind, out.shape, out.dtype.name)
        for launch in launches:
            launch(values)
    ins = tuple(slots[t] for t in kg.inputs)
    return Step(kg.name, kg.ops[-1].kind, ins, tuple(slots[t] for t in kg.outputs), run, kg.kernel, True,
                tuple(k for k, _, _ in kg.launches[1:]), _host_work(o, out, launches))


def _view_step(kg: KernelGroup, slots: dict[Tensor, int]) -> Step:
    """A group that is a view of a contiguous range of its source (:mod:`taskmap.graph.views`):
    made per run where the memory plan does not carve it (:mod:`.views`)."""
    assert kg.view is not None
    src, offset = kg.view
    s, out = slots[src], kg.outputs[0]
    o = slots[out]

    def run(values: list[Any]) -> None:
        a = values[s]
        flat = a.reshape(-1).view(np.uint8 if isinstance(a, np.ndarray) else sys.modules["torch"].uint8)
        values[o] = _carve(flat[offset:], out.shape, out.dtype.name)
    return Step(kg.name, kg.ops[-1].kind, (s,), (o,), run, view=(s, offset))


def _kernel_step(op: Op, ins: tuple[int, ...], outs: tuple[int, ...], target: Any, kind: ArrayKind,
                 constants: _Constants | dict[int, Any]) -> Step:
    out = op.output
    o = outs[0]
    if out.numel == 0:
        def run_empty(values: list[Any]) -> None:
            if values[o] is None:
                values[o] = empty_like_kind(kind, out.shape, out.dtype.name)
        return Step(op.name, op.kind, ins, outs, run_empty, None, True, host=_host_work(o, out, []))
    kernel, used = compute_kernel(op, target)
    plan = [_slot_arg(ins[k], kernel_shape(op.inputs[k].shape), constants) for k in used]
    plan.append((o, None, kernel_shape(out.shape)))
    launch = _launch(kernel.build(kind.target), plan, tuple(dict.fromkeys(k for k, _, _ in plan if k >= 0)))

    def run(values: list[Any]) -> None:
        if values[o] is None:
            values[o] = empty_like_kind(kind, out.shape, out.dtype.name)
        launch(values)
    return Step(op.name, op.kind, ins, outs, run, kernel, True, host=_host_work(o, out, [launch]))


def _host_work(o: int, out: Tensor, launches: list[Any]) -> HostWork | None:
    """A kernel step's work for a chain: None unless every launch is a CPU one."""
    if not all(isinstance(launch, _HostSite) for launch in launches):
        return None
    return HostWork(o, out.shape, out.dtype.name, tuple(launches))


def _slot_arg(k: int, shape: tuple[int, ...] | None, constants: _Constants | dict[int, Any]) -> _Arg:
    """The argument reading slot ``k`` (seen with ``shape``): fixed when it is a constant."""
    c = constants.get(k)
    if c is None:
        return k, None, shape
    return -1, c if shape is None else view(c, shape), None


def _launch(compiled: CompiledKernel, plan: list[_Arg], volatile: tuple[int, ...]) -> Callable[[list[Any]], None]:
    """``launch(values)``: ``compiled`` on the arguments of ``plan``.

    CPU builds are bound at the first launch (``CompiledKernel.bind_host``: the arguments are
    checked once) and then launched by the data pointers of the slots' arrays: a graph's shapes
    are static, its inputs are checked by :meth:`CompiledGraph.__call__`, its runners' results
    by their steps, and its kernels' outputs are made here.  GPU builds launch prepared
    (``CompiledKernel.prepare``), prepared again whenever the array of a ``volatile`` slot moved."""
    if compiled.target.kind is TargetKind.CPU:
        return _HostSite(compiled, plan)
    state: list[Any] = [None, None]          # the prepared launch, the volatile pointers it was made for

    def prepared(values: list[Any]) -> None:
        key = tuple(_ptr(values[k]) for k in volatile)
        if state[0] is None or key != state[1]:
            state[0], state[1] = compiled.prepare(*_arrays(plan, values)), key
        state[0]()
    return prepared


class _HostSite:
    """A CPU launch of a step: bound at its first call (the arguments checked once), then
    launched by the addresses of the slots' arrays."""

    __slots__ = ("_compiled", "_plan", "_tensors", "bound", "ptrs")

    def __init__(self, compiled: CompiledKernel, plan: list[_Arg]) -> None:
        self._compiled, self._plan = compiled, plan
        self._tensors = [a for a, p in zip(plan, compiled.func.params) if isinstance(p.type, TensorType)]
        self.bound: HostLaunch | None = None
        self.ptrs: list[tuple[int, int]] = []     # per tensor parameter: (slot, 0) or (-1, the fixed address)

    def __call__(self, values: list[Any]) -> None:
        if self.bound is None:
            self.ptrs = [(k, 0) if k >= 0 else (-1, _ptr(fixed)) for k, fixed, _ in self._tensors]
            self.bound = self._compiled.bind_host(*_arrays(self._plan, values))
        self.bound(*[p if k < 0 else _ptr(values[k]) for k, p in self.ptrs])

    def chained(self) -> tuple[int, str, list[int], list[tuple[int, int]]] | None:
        """This launch in a :class:`HostChain` (its packed entry, name, words, and the words of
        its slots), or None before its first call or without a packed entry."""
        b = self.bound
        if b is None or b.packed is None:
            return None
        words, positions = b.words()
        slots = []
        for pos, (k, p) in zip(positions, self.ptrs):
            if k < 0:
                words[pos] = p
            else:
                slots.append((pos, k))
        return b.packed, b.name, words, slots


def _arrays(plan: list[_Arg], values: list[Any]) -> list[Any]:
    return [fixed if k < 0 else view(values[k], s) if s is not None else values[k] for k, fixed, s in plan]


def _runner_step(op: Op, ins: tuple[int, ...], outs: tuple[int, ...]) -> Step:
    d = op.definition
    attrs = op.attrs
    shapes = [(t.shape, t.dtype.name) for t in op.outputs]
    fallback = op.kind is OpKind.TORCH

    def run(values: list[Any]) -> None:
        res = d.run([values[k] for k in ins], attrs)
        res = tuple(res) if isinstance(res, (tuple, list)) else (res,)
        for k, r, (s, dtype) in zip(outs, res, shapes):
            if not _contiguous(r):
                r = r.contiguous() if hasattr(r, "contiguous") else np.ascontiguousarray(r)
            elif fallback and getattr(r, "_base", None) is not None:
                r = r.clone()  # a view of an input (maybe a planned buffer): own the result
            if tuple(r.shape) != s or _dtype_name(r) != dtype:     # kernels read it by its address
                raise LaunchError(f"{op.name} ({d.run_name}) returned {_dtype_name(r)}{list(r.shape)}, expected "
                                  f"{dtype}{list(s)}")
            values[k] = r
    return Step(op.name, op.kind, ins, outs, run, None, False)


__all__ = ["CompiledGraph", "Step", "build_steps", "compute_kernel"]
