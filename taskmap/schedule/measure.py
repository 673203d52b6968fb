"""Measuring a template's candidate schedules, surviving candidates that crash or hang.

1. Build: the candidates are instantiated and built in parallel worker processes (one per core),
   which fills the on-disk compile cache.
2. Measure: one candidate at a time, in an isolated worker process that only loads the cached
   binary, runs it once, warms up, and times ``repeat`` samples on random inputs (a sample is as
   many back-to-back runs as take ``min_sample_time``); the median is that pass's time.
   The candidates are measured in ``rounds`` passes, in alternating order, each taking its share
   of the samples; a candidate's time is its fastest pass: load from elsewhere on the machine
   (another process, a neighbour's burst) only adds time, and must now hit the same candidate in
   every pass to mislead the choice.
   A candidate that kills its worker (a segfault) or does not finish in ``timeout`` seconds
   (the worker is killed) is dropped with the reason, and a fresh worker takes the next one.

Workers are ``python -m taskmap.schedule.worker`` subprocesses talking over a socket pair (see
that module for why they are not ``multiprocessing`` children).  Templates and problems travel
to them pickled.

Example arguments: a template may provide ``example_inputs(problem, target) ->
ExampleArgs(inputs, outputs)``; by default they are made from the problem's ``input_specs()`` and
``output_specs()`` (each spec an object with ``.shape`` and ``.dtype``, or a ``(shape, dtype)``
pair): inputs uniformly random in ±[0.5, 1.5) (integers in [1, 8)), outputs zeros, on the
target's device (numpy arrays on the CPU, ``taskmap.Tensor`` on a GPU and for bfloat16).  The
kernel's launch arguments are then ``template.arguments(problem, inputs, outputs)``.
"""
from __future__ import annotations

import inspect
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..backends.base import Target, TargetKind
from ..errors import TaskmapError, UnsupportedError
from ..runtime.args import aligned
from ..runtime.tensor import dtype_name, tensor
from ..templates.base import ExampleArgs, Schedule

# ---------------------------------------------------------------------------------------------
# Example arguments


def spec_shape_dtype(spec: Any) -> tuple[tuple[int, ...], str]:
    """``(shape, dtype name)`` of a tensor spec: an object with ``.shape`` and ``.dtype``, or a pair."""
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):
        shape, dtype = spec.shape, spec.dtype
    else:
        try:
            shape, dtype = spec
        except (TypeError, ValueError):
            raise TaskmapError(f"a tensor spec is an object with .shape and .dtype or a (shape, dtype) pair, "
                               f"not {spec!r}") from None
    return tuple(int(s) for s in shape), dtype_name(dtype)


def random_host_array(shape: Sequence[int], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random non-zero values of ``dtype`` (bfloat16 as float32, converted on the way to a Tensor)."""
    shape = tuple(shape)
    if dtype == "bool":
        return np.ones(shape, np.bool_)
    if dtype.startswith(("int", "uint")):
        return rng.integers(1, 8, size=shape).astype(dtype)
    values = rng.uniform(0.5, 1.5, size=shape) * rng.choice(np.array([-1.0, 1.0]), size=shape)
    return values.astype(np.float32 if dtype == "bfloat16" else dtype)


def on_target(host: np.ndarray, dtype: str, target: Target) -> Any:
    """``host`` as an argument for a kernel built for ``target`` (on the CPU, cache-line aligned:
    as a compiled graph's buffers, so that operands read in place are timed as they run there)."""
    if target.kind is TargetKind.CPU and dtype != "bfloat16":
        return aligned(np.ascontiguousarray(host))
    return tensor(host, device=target.kind.value, dtype=dtype)


def _specs(problem: Any, name: str) -> list[Any] | None:
    specs = getattr(problem, name, None)
    if specs is None:
        return None
    return list(specs() if callable(specs) else specs)


def default_example_inputs(problem: Any, target: Target, seed: int = 0) -> ExampleArgs:
    """Inputs and outputs from the problem's ``input_specs()`` / ``output_specs()``."""
    ins, outs = _specs(problem, "input_specs"), _specs(problem, "output_specs")
    if ins is None or outs is None:
        raise TaskmapError(f"cannot make example inputs for {problem!r}: give the problem input_specs() and "
                           "output_specs(), or the template an example_inputs(problem, target) method")
    rng = np.random.default_rng(seed)
    inputs = [on_target(random_host_array(shape, dt, rng), dt, target) for shape, dt in map(spec_shape_dtype, ins)]
    outputs = []
    for shape, dt in map(spec_shape_dtype, outs):
        outputs.append(on_target(np.zeros(shape, np.float32 if dt == "bfloat16" else dt), dt, target))
    return ExampleArgs(inputs, outputs)


def example_inputs(template: Any, problem: Any, target: Target, seed: int = 0) -> ExampleArgs:
    """The template's own ``example_inputs`` if it has one, else :func:`default_example_inputs`."""
    own = getattr(template, "example_inputs", None)
    if own is not None:
        inputs, outputs = own(problem, target)
        return ExampleArgs(list(inputs), list(outputs))
    return default_example_inputs(problem, target, seed)


def example_arguments(template: Any, problem: Any, target: Target, seed: int = 0,
                      schedule: Schedule | None = None) -> list[Any]:
    """The launch arguments of ``template``'s kernels for ``problem``, on random inputs — of
    ``schedule``'s kernel when the template's arguments depend on the schedule (its
    ``arguments`` takes ``schedule``, and ``target`` if it takes one: e.g. weights packed for
    its tile)."""
    inputs, outputs = example_inputs(template, problem, target, seed)
    takes = inspect.signature(template.arguments).parameters
    extra = {} if schedule is None or "schedule" not in takes else \
        {"schedule": schedule, **({"target": target} if "target" in takes else {})}
    args = template.arguments(problem, inputs, outputs, **extra)
    # constants the template packed (weight panels) start on a cache line, as a compiled graph's do
    return [aligned(a) if isinstance(a, np.ndarray) else a for a in args]


# ---------------------------------------------------------------------------------------------
# Measuring


@dataclass(frozen=True)
class MeasureSettings:
    warmup: int = 2                 # runs before timing (the first one also loads the binary)
    repeat: int = 10                # timed samples, shared by the rounds; a round's median
    rounds: int = 2                 # passes over the candidates; the fastest one is the time
    timeout: float = 30.0           # seconds for loading and the first run of one candidate
    min_sample_time: float = 2e-3   # seconds: a sample batches runs up to this long
    max_batch: int = 1000
    seed: int = 0                   # of the random inputs
    build_workers: int = 0          # processes building in parallel (0: one per core)
    build_timeout: float = 600.0    # seconds to build one candidate
    startup_timeout: float = 120.0  # seconds for a worker process to start


@dataclass(frozen=True)
class Measurement:
    """One candidate's time in seconds (its fastest pass's median), or why it has none."""

    schedule: Schedule
    time: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.time is not None


class _Died(Exception):
    """The worker process went away (crashed, or was killed)."""


_FATAL = {"UnsupportedError": UnsupportedError}
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerProcess:
    """One ``taskmap.schedule.worker`` subprocess and its connection."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        env = dict(os.environ)   # the worker imports this taskmap, however this process found it
        env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        with theirs:
            fd = theirs.fileno()
            self.proc = subprocess.Popen([sys.executable, "-m", "taskmap.schedule.worker", str(fd)], pass_fds=(fd,),
                                         env=env, stdin=subprocess.DEVNULL)
        self.conn = Connection(mine.detach())
        self.ready = False

    def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        try:
            reply = self.recv(timeout)
        except _Died as died:
            raise TaskmapError(f"the tuner's worker process {died} while starting (its output is above)") from None
        if reply != ("ready",):
            self.kill()
            raise TaskmapError(f"the tuner's worker process did not start within {timeout:g} s")
        self.send(("init", list(sys.path)))
        self.ready = True

    def send(self, message: Any) -> None:
        data = _pickled(message)
        try:
            self.conn.send_bytes(data)
        except OSError as exc:
            raise _Died(self._death()) from exc

    def recv(self, timeout: float | None) -> Any:
        """The next reply, or None when none came within ``timeout`` seconds."""
        try:
            if not self.conn.poll(timeout):
                return None
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            raise _Died(self._death()) from exc

    def _death(self) -> str:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            return "stopped answering"
        if rc < 0:
            try:
                return f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exited with status {rc}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.conn.send_bytes(pickle.dumps(None))
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


def _pickled(message: Any) -> bytes:
    try:
        return pickle.dumps(message)
    except Exception as exc:
        raise TaskmapError(f"cannot send the template or problem to a worker process: {exc} (templates "
                           "and problems must pickle: make them instances of module-level classes)") from None


def _fatal(reply: tuple) -> TaskmapError:
    _, kind, text = reply
    return _FATAL.get(kind, TaskmapError)(text)


class CandidateRunner:
    """Worker processes for one tuning run of ``template`` on ``problem`` (a context manager)."""

    def __init__(self, template: Any, problem: Any, target: Target, settings: MeasureSettings) -> None:
        self.template, self.problem, self.target, self.settings = template, problem, target, settings
        self._spare: list[WorkerProcess] = []     # started, idle
        self._measurer: WorkerProcess | None = None

    def __enter__(self) -> "CandidateRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for w in [*self._spare, *([self._measurer] if self._measurer else [])]:
            w.close()
        self._spare, self._measurer = [], None

    def _start(self, n: int) -> list[WorkerProcess]:
        workers = [WorkerProcess() for _ in range(n)]
        try:
            for w in workers:
                w.wait_ready(self.settings.startup_timeout)
        except BaseException:
            for w in workers:
                w.kill()
            raise
        return workers

    def build_all(self, schedules: Sequence[Schedule],
                  on_built: Callable[[Schedule, str | None], None] | None = None) -> dict[Schedule, str]:
        """Build every candidate in parallel; returns the failures (schedule -> reason)."""
        s = self.settings
        n = min(len(schedules), s.build_workers or os.cpu_count() or 1)
        if n == 0:
            return {}
        idle = self._start(n)
        pending, busy, failures = list(schedules), {}, {}
        try:
            while pending or busy:
                while idle and pending:
                    w, sched = idle.pop(), pending.pop(0)
                    try:
                        w.send(("build", self.template, self.problem, self.target, sched))
                    except _Died:                   # it died idle: retry on a fresh one
                        pending.insert(0, sched)
                        idle.extend(self._start(1))
                        continue
                    busy[w.conn] = (w, sched, time.monotonic() + s.build_timeout)
                deadline = min(d for _, _, d in busy.values())
                for conn in wait(list(busy), timeout=max(deadline - time.monotonic(), 0.0)) or []:
                    w, sched, _ = busy.pop(conn)
                    try:
                        reply = w.recv(0)
                    except _Died as died:
                        failures[sched] = f"building crashed the worker process ({died})"
                        idle.extend(self._start(1))
                    else:
                        if reply[0] == "fatal":
                            raise _fatal(reply)
                        if reply[1] is not None:
                            failures[sched] = f"build failed: {reply[1]}"
                        idle.append(w)
                    if on_built:
                        on_built(sched, failures.get(sched))
                for conn, (w, sched, d) in list(busy.items()):
                    if time.monotonic() >= d:
                        del busy[conn]
                        w.kill()
                        failures[sched] = f"build timed out after {s.build_timeout:g} s"
                        idle.extend(self._start(1))
        finally:
            for w, _, _ in busy.values():
                w.kill()
            self._spare.extend(idle)
        return failures

    def _worker(self) -> WorkerProcess:
        if self._measurer is None:
            self._measurer = self._spare.pop() if self._spare else self._start(1)[0]
            for w in self._spare:          # measure alone: no other process of ours runs meanwhile
                w.close()
            self._spare = []
        return self._measurer

    def measure(self, schedule: Schedule) -> Measurement:
        """Time one candidate in the isolated worker (replaced if the candidate kills it)."""
        s, w = self.settings, self._worker()
        budget = s.timeout
        try:
            w.send(("measure", self.template, self.problem, self.target, schedule, s))
            reply = w.recv(budget)
            if reply is not None and reply[0] == "first":
                # Then warm-up and samples: allow three times what the first run suggests.
                first = reply[1]
                budget = s.timeout + 3 * (s.warmup * first + s.repeat * max(s.min_sample_time, first))
                reply = w.recv(budget)
        except _Died as died:
            self._measurer = None
            return Measurement(schedule, None, f"crashed the worker process ({died})")
        if reply is None:
            w.kill()
            self._measurer = None
            return Measurement(schedule, None, f"timed out after {budget:.3g} s (killed)")
        if reply[0] == "fatal":
            raise _fatal(reply)
        if reply[0] == "error":
            # A failed launch may leave the process unusable (a GPU context after a fault, a
            # corrupted heap): the next candidate gets a fresh worker.
            w.close()
            self._measurer = None
            return Measurement(schedule, None, reply[1])
        return Measurement(schedule, float(reply[1]))


def measure_candidates(template: Any, problem: Any, target: Target, schedules: Sequence[Schedule],
                       settings: MeasureSettings | None = None,
                       on_result: Callable[[Measurement], None] | None = None,
                       on_built: Callable[[Schedule, str | None], None] | None = None) -> list[Measurement]:
    """Build all ``schedules`` in parallel, then measure each in isolation, ``settings.rounds``
    passes in alternating order.  Candidates that fail to build, crash, hang or raise (in any
    pass) come back with ``time=None`` and the reason; only a problem that affects them all (no
    device, a template that does not pickle) raises.  ``on_result`` hears every measurement
    taken: the candidate's best so far, or its failure (once)."""
    settings = settings or MeasureSettings()
    _pickled((template, problem, target, list(schedules)))     # fail before starting any process
    rounds = max(settings.rounds, 1)
    per_round = replace(settings, repeat=max(math.ceil(settings.repeat / rounds), 1))
    with CandidateRunner(template, problem, target, per_round) as runner:
        failures = runner.build_all(schedules, on_built)
        best: dict[Schedule, Measurement] = {}
        for r in range(rounds):
            for sched in (schedules if r % 2 == 0 else schedules[::-1]):
                if sched in best and not best[sched].ok:
                    continue
                m = Measurement(sched, None, failures[sched]) if sched in failures else runner.measure(sched)
                if m.ok and sched in best:
                    m = min(m, best[sched], key=lambda x: x.time)
                best[sched] = m
                if on_result:
                    on_result(m)
    return [best[s] for s in schedules]
