"""The tuner's worker process: ``python -m taskmap.schedule.worker FD``.

It builds candidates (filling the on-disk compile cache) and measures them, one request at a
time, answering over the socket ``FD`` (a ``multiprocessing.connection.Connection``).  It is a
fresh interpreter started with ``subprocess``, not a ``multiprocessing`` child: it never imports
the user's ``__main__`` (an unguarded script that tunes would otherwise run again in every
worker), and a candidate that crashes or hangs takes only this process down.

Requests (tuples) and replies:

``("init", sys_path)``                              -> nothing (extends ``sys.path``)
``("build", template, problem, target, schedule)``  -> ``("built", None | error text)``
``("measure", template, problem, target, schedule, settings)``
    -> ``("first", seconds)`` after loading and one run, then ``("ok", median seconds)``;
       ``("error", text)`` when the candidate fails; ``("fatal", text)`` when nothing can be
       measured here (no device) or the request cannot be unpickled (template not importable);
       a fatal reply is ``("fatal", exception type name, text)``.
``None``                                            -> the worker exits.
"""
from __future__ import annotations

import math
import pickle
import resource
import statistics
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

from ..backends.base import Target, TargetKind
from ..backends.cuda import driver as cuda_driver
from ..backends.hip import runtime as hip_runtime
from ..runtime.kernel import CompiledKernel, Kernel
from ..templates.base import Schedule
from .measure import MeasureSettings, example_arguments


def build_kernel(kernel: Kernel, target: Target) -> CompiledKernel:
    """``kernel`` built for ``target`` (through the on-disk compile cache)."""
    if target.kind is TargetKind.CPU:
        return kernel.build("cpu")
    return kernel.build(target.kind.value, target.arch)


def _synchronizer(target: Target) -> Callable[[], None]:
    """Waits for the device to finish what was launched (a no-op on the CPU)."""
    if target.kind is TargetKind.CUDA:
        return lambda: cuda_driver.synchronize(0)
    if target.kind is TargetKind.HIP:
        return lambda: hip_runtime.synchronize(0)
    return lambda: None


class NoDevice(Exception):
    """Nothing can be measured in this process (the target's device is absent)."""


def build_candidate(template: Any, problem: Any, target: Target, schedule: Schedule) -> CompiledKernel:
    return build_kernel(template.instantiate(problem, target, schedule), target)


def measure_candidate(template: Any, problem: Any, target: Target, schedule: Schedule,
                      settings: MeasureSettings, first: Callable[[float], None]) -> float:
    """Median seconds per run of ``schedule`` after warm-up; calls ``first`` after the first run.
    On an NVIDIA GPU a sample is the device time of a CUDA graph of back-to-back launches (a
    compiled graph's replay: no host launch overhead, which is what a host-timed loop of small
    kernels measures); elsewhere the wall clock around a loop of launches."""
    compiled = build_candidate(template, problem, target, schedule)
    if compiled.launcher is None:
        raise NoDevice(f"cannot measure on {target.name}: no such device is present")
    args = example_arguments(template, problem, target, settings.seed, schedule)
    sync = _synchronizer(target)
    launch = compiled.prepare(*args)        # checked once: the samples time the kernel, not the checks

    def timed(number: int) -> float:
        start = time.perf_counter()
        for _ in range(number):
            launch()
        sync()
        return (time.perf_counter() - start) / number

    first(timed(1))
    for _ in range(max(settings.warmup - 1, 0)):
        compiled(*args)
    if target.kind is TargetKind.CUDA:      # device time, launches replayed as a CUDA graph
        def batch(number: int, repeat: int) -> list[float]:
            return cuda_driver.graph_seconds(launch, number, repeat)
    else:
        def batch(number: int, repeat: int) -> list[float]:
            return [timed(number) for _ in range(repeat)]
    one = min(batch(1, 3))
    number = max(1, min(settings.max_batch, math.ceil(settings.min_sample_time / max(one, 1e-9))))
    return statistics.median(batch(number, max(settings.repeat, 1)))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 4000 else text[:4000] + " ..."


def serve(conn: Connection) -> None:
    """Answer requests until told to stop (or the parent goes away)."""
    conn.send(("ready",))
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            request = pickle.loads(raw)
        except Exception as exc:  # the template's class cannot be imported here
            conn.send(("fatal", "TaskmapError", "cannot load the request in the worker process (templates and "
                       f"problems must be instances of importable, module-level classes): {_describe(exc)}"))
            continue
        if request is None:
            return
        op, *rest = request
        if op == "init":
            sys.path[:] = list(dict.fromkeys([*rest[0], *sys.path]))
            continue
        try:
            if op == "build":
                build_candidate(*rest)
                conn.send(("built", None))
            elif op == "measure":
                conn.send(("ok", measure_candidate(*rest, first=lambda t: conn.send(("first", t)))))
            else:
                conn.send(("fatal", "TaskmapError", f"unknown request {op!r}"))
        except NoDevice as exc:
            conn.send(("fatal", "UnsupportedError", str(exc)))
        except Exception as exc:
            if op == "build":
                conn.send(("built", _describe(exc)))
            else:
                conn.send(("error", _describe(exc)))
            if sys.flags.dev_mode:
                traceback.print_exc()


def main(argv: list[str]) -> int:
    # A candidate that crashes must not leave a core dump behind.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    conn = Connection(int(argv[1]))
    try:
        serve(conn)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
