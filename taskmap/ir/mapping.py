"""Task mappings: which worker does which task, in which order (Hidet paper, §5.1).

A task mapping ``f`` with ``n`` workers and task shape ``d = (d_0, ..., d_{m-1})`` maps each worker
``w`` in ``0..n-1`` to the list of tasks (index tuples into ``d``) that ``w`` runs, in order.

* ``spatial(*d)``: ``prod(d)`` workers, one task each: worker ``w`` gets the multi-index of ``w``.
* ``repeat(*d)``: one worker runs all ``prod(d)`` tasks, as nested sequential loops.
* ``ranks`` (both) orders the dimensions: the dimension of rank 0 varies slowest. The default is
  row-major (last dimension fastest); ``ranks=[1, 0]`` in 2-D is column-major.
* ``f1 * f2`` is the paper's composition ``f1 ∘ f2``: ``n1*n2`` workers, task shape ``d1 ⊙ d2``,
  ``f3(w) = [t1 ⊙ d2 + t2 for t1 in f1(w // n2) for t2 in f2(w % n2)]``. It is associative, and
  flattened into one ``ComposedMapping`` of factors, so ``(a*b)*c == a*(b*c)``.

Every worker gets the same number of tasks. Two methods are the single source of truth for a
mapping's meaning; the compiler lowers mappings with them and ``worker2task`` is built on them:

* ``loop_extents()``: extents of the sequential loops (outermost first) that enumerate one
  worker's tasks in execution order;
* ``task_index(worker, loop_vars)``: the task of ``worker`` at one value per loop, built with
  ``+ * // %`` only, so that it works on ints and on symbolic expressions alike. ``worker`` is
  assumed to lie in ``0..num_workers-1``: guarding that is the caller's job.
"""

from __future__ import annotations

import enum
import itertools
import math
import numbers
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

Index = Any
"""An int, or a symbolic expression that overloads ``+``, ``*``, ``//`` and ``%``."""
TaskFn = Callable[[Index, Index], "Sequence[Index] | Index"]
"""``fn(worker, k)`` -> the k-th task of ``worker`` (a tuple, or one index for 1-D tasks)."""


# Arithmetic that skips no-ops, on ints and symbolic expressions alike.
def _is_zero(x: Index) -> bool:
    return isinstance(x, int) and x == 0


def _add(x: Index, y: Index) -> Index:
    return y if _is_zero(x) else x if _is_zero(y) else x + y


def _mul(x: Index, c: int) -> Index:
    return x if c == 1 or _is_zero(x) else x * c


def _split_worker(worker: Index, counts: Sequence[int]) -> list[Index]:
    """Part i is ``(worker // prod(counts[i+1:])) % counts[i]`` (``counts[0]`` slowest), less the
    no-ops for a worker in range: no ``// 1``, no ``%`` while all slower groups have one worker,
    and the literal 0 for a group of one."""
    parts: list[Index] = []
    for i, n in enumerate(counts):
        divisor = math.prod(counts[i + 1 :])
        part = worker if divisor == 1 else worker // divisor
        parts.append(0 if n == 1 else part if math.prod(counts[:i]) == 1 else part % n)
    return parts


def _positive_int(what: str, value: object) -> int:
    try:
        v = None if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        v = None
    if v is None or v <= 0:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return v


def _check_shape(what: str, shape: Sequence[object]) -> tuple[int, ...]:
    if len(shape) == 0:
        raise ValueError(f"{what}: a task shape needs at least one dimension")
    return tuple(_positive_int(f"{what}: task shape {tuple(shape)!r}: entry", d) for d in shape)


def _check_ranks(what: str, ndim: int, ranks: Sequence[int] | None) -> tuple[int, ...]:
    if ranks is None:
        return tuple(range(ndim))
    rk = tuple(ranks)
    ints = all(isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in rk)
    if not ints or sorted(rk) != list(range(ndim)):
        perm = list(range(ndim))
        raise ValueError(f"{what}: ranks must be a permutation of {perm} (0: slowest), got {ranks}")
    return tuple(int(r) for r in rk)


# ---------------------------------------------------------------- mappings
class TaskMapping(ABC):
    """Subclasses provide the 3 attributes below, ``loop_extents()`` and ``task_index()``."""

    num_workers: int
    task_shape: tuple[int, ...]
    tasks_per_worker: int

    @property
    def ndim(self) -> int:
        return len(self.task_shape)

    @abstractmethod
    def loop_extents(self) -> tuple[int, ...]:
        """Extents of the sequential loops (outermost first) enumerating one worker's tasks."""

    @abstractmethod
    def task_index(self, worker: Index, loop_vars: Sequence[Index] = ()) -> tuple[Index, ...]:
        """The task of ``worker`` at loop values ``loop_vars`` (one per ``loop_extents()``)."""

    def _expect_loop_vars(self, loop_vars: Sequence[Index]) -> None:
        want = len(self.loop_extents())
        if len(loop_vars) != want:
            raise ValueError(f"{self!r}: expected {want} loop variable(s), got {len(loop_vars)}")

    def worker2task(self, worker: int) -> list[tuple[int, ...]]:
        """The tasks of ``worker``, in execution order."""
        if not isinstance(worker, numbers.Integral):  # a symbolic one is the compiler's business
            raise TypeError(f"worker2task needs an int worker, got {type(worker).__name__}")
        if not 0 <= worker < self.num_workers:
            n = self.num_workers
            raise ValueError(f"worker {worker} out of range for {self!r}: need 0 <= worker < {n}")
        loops = itertools.product(*(range(e) for e in self.loop_extents()))
        tasks = [tuple(self.task_index(worker, vs)) for vs in loops]
        for t in tasks:
            if not all(0 <= i < d for i, d in zip(t, self.task_shape)):
                raise ValueError(f"{self!r}: worker {worker}'s task {t} not in {self.task_shape}")
        return tasks

    def on(self, worker: Index) -> MappingOn:
        """The tasks of one worker, e.g. ``for i, j in spatial(4, 8).on(threadIdx.x)``."""
        return MappingOn(self, worker)

    def sequential(self) -> MappingLoop:
        """All tasks, worker after worker, in one thread."""
        return MappingLoop(self, MappingLoopKind.SEQUENTIAL)

    def parallel(self) -> MappingLoop:
        """All tasks, with the workers spread over CPU cores."""
        return MappingLoop(self, MappingLoopKind.PARALLEL)

    def vectorize(self, stream: bool = False) -> MappingLoop:
        """All tasks, with the workers as SIMD lanes; ``stream=True`` makes the loop's stores
        streaming (:attr:`taskmap.ir.stmt.Store.stream`: written past the caches on the CPU, for
        outputs too big to stay in them)."""
        return MappingLoop(self, MappingLoopKind.VECTORIZE, stream)

    def __iter__(self) -> Iterator[Any]:
        """All tasks, worker by worker (ints for 1-D mappings, tuples otherwise)."""
        for w in range(self.num_workers):
            yield from self.on(w)

    def __mul__(self, other: object) -> ComposedMapping:
        return ComposedMapping((self, other))  # type: ignore[arg-type]  # checks the operands

    def __rmul__(self, other: object) -> ComposedMapping:
        return ComposedMapping((other, self))  # type: ignore[arg-type]  # raises TypeError


@dataclass(frozen=True)
class _GridMapping(TaskMapping):
    """Shared by ``spatial`` and ``repeat``: a task grid ``shape`` with dimension ``ranks``."""

    shape: tuple[int, ...]
    ranks: tuple[int, ...]
    _name: ClassVar[str] = "grid"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _check_shape(self._name, self.shape))
        object.__setattr__(self, "ranks", _check_ranks(self._name, len(self.shape), self.ranks))

    @property
    def task_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.shape

    def _dims_by_rank(self) -> list[int]:
        """Dimensions from the slowest-varying (rank 0) to the fastest."""
        return sorted(range(len(self.shape)), key=lambda i: self.ranks[i])

    def __repr__(self) -> str:
        args = ", ".join(map(str, self.shape))
        if self.ranks != tuple(range(len(self.shape))):
            args += f", ranks={list(self.ranks)}"
        return f"{self._name}({args})"


class SpatialMapping(_GridMapping):
    """``spatial(*shape, ranks)``: ``prod(shape)`` workers, one task each."""

    _name = "spatial"

    @property
    def num_workers(self) -> int:  # type: ignore[override]
        return math.prod(self.shape)

    @property
    def tasks_per_worker(self) -> int:  # type: ignore[override]
        return 1

    def loop_extents(self) -> tuple[int, ...]:
        return ()

    def task_index(self, worker: Index, loop_vars: Sequence[Index] = ()) -> tuple[Index, ...]:
        self._expect_loop_vars(loop_vars)
        dims = self._dims_by_rank()
        out: list[Index] = [0] * len(self.shape)
        for dim, part in zip(dims, _split_worker(worker, [self.shape[i] for i in dims])):
            out[dim] = part
        return tuple(out)


class RepeatMapping(_GridMapping):
    """``repeat(*shape, ranks)``: one worker runs all ``prod(shape)`` tasks in nested loops."""

    _name = "repeat"

    @property
    def num_workers(self) -> int:  # type: ignore[override]
        return 1

    @property
    def tasks_per_worker(self) -> int:  # type: ignore[override]
        return math.prod(self.shape)

    def loop_extents(self) -> tuple[int, ...]:
        return tuple(self.shape[i] for i in self._dims_by_rank())

    def task_index(self, worker: Index, loop_vars: Sequence[Index] = ()) -> tuple[Index, ...]:
        self._expect_loop_vars(loop_vars)
        out: list[Index] = [0] * len(self.shape)
        for dim, var in zip(self._dims_by_rank(), loop_vars):
            out[dim] = 0 if self.shape[dim] == 1 else var
        return tuple(out)


@dataclass(frozen=True)
class ComposedMapping(TaskMapping):
    """``factors[0] * factors[1] * ...``, flattened; the first factor is the outermost."""

    factors: tuple[TaskMapping, ...]

    def __post_init__(self) -> None:
        flat: list[TaskMapping] = []
        for f in self.factors:
            if not isinstance(f, TaskMapping):
                raise TypeError(f"cannot compose {f!r}: both operands of * must be task mappings")
            flat.extend(f.factors if isinstance(f, ComposedMapping) else (f,))
        if len(flat) < 2:
            raise ValueError(f"a ComposedMapping needs two factors or more, got {flat!r}")
        for a, b in itertools.pairwise(flat):
            if a.ndim != b.ndim:
                raise ValueError(
                    f"cannot compose task mappings of different dimensions: {a!r} has task shape "
                    f"{a.task_shape} but {b!r} has task shape {b.task_shape}"
                )
        object.__setattr__(self, "factors", tuple(flat))

    @property
    def num_workers(self) -> int:  # type: ignore[override]
        return math.prod(f.num_workers for f in self.factors)

    @property
    def tasks_per_worker(self) -> int:  # type: ignore[override]
        return math.prod(f.tasks_per_worker for f in self.factors)

    @property
    def task_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return tuple(math.prod(dims) for dims in zip(*(f.task_shape for f in self.factors)))

    def loop_extents(self) -> tuple[int, ...]:
        return tuple(e for f in self.factors for e in f.loop_extents())

    def task_index(self, worker: Index, loop_vars: Sequence[Index] = ()) -> tuple[Index, ...]:
        self._expect_loop_vars(loop_vars)
        workers = _split_worker(worker, [f.num_workers for f in self.factors])
        out: list[Index] = [0] * self.ndim
        pos = 0
        for i, (f, w) in enumerate(zip(self.factors, workers)):
            nloops = len(f.loop_extents())
            task = f.task_index(w, tuple(loop_vars[pos : pos + nloops]))
            pos += nloops
            for dim in range(self.ndim):
                scale = math.prod(g.task_shape[dim] for g in self.factors[i + 1 :])
                out[dim] = _add(out[dim], _mul(task[dim], scale))
        return tuple(out)

    def __repr__(self) -> str:
        return "*".join(repr(f) for f in self.factors)


@dataclass(frozen=True)
class CustomMapping(TaskMapping):
    """Worker ``w``'s k-th task is ``fn(w, k)``, written with ``+ * // %`` only."""

    task_shape: tuple[int, ...]
    num_workers: int
    tasks_per_worker: int
    fn: TaskFn

    def __post_init__(self) -> None:
        what = "custom_mapping"
        object.__setattr__(self, "task_shape", _check_shape(what, tuple(self.task_shape)))
        for name in ("num_workers", "tasks_per_worker"):
            object.__setattr__(self, name, _positive_int(f"{what}: {name}", getattr(self, name)))
        if not callable(self.fn):
            raise TypeError(f"{what}: fn must be callable, got {self.fn!r}")

    def loop_extents(self) -> tuple[int, ...]:
        return (self.tasks_per_worker,)

    def task_index(self, worker: Index, loop_vars: Sequence[Index] = ()) -> tuple[Index, ...]:
        self._expect_loop_vars(loop_vars)
        task = self.fn(worker, loop_vars[0])
        task = tuple(task) if isinstance(task, (tuple, list)) else (task,)
        if len(task) != self.ndim:
            raise ValueError(f"{self!r}: fn returned {len(task)} indices for {self.ndim}-D tasks")
        return task

    def __repr__(self) -> str:
        fn = getattr(self.fn, "__qualname__", repr(self.fn))
        args = f"{self.task_shape}, {self.num_workers}, {self.tasks_per_worker}"
        return f"custom_mapping({args}, {fn})"


# ---------------------------------------------------------------- loop markers
class MappingLoopKind(enum.Enum):
    """How the workers of a mapping iterated as a whole are realised."""

    SEQUENTIAL = enum.auto()  # one after another, in one thread
    PARALLEL = enum.auto()  # spread over CPU cores
    VECTORIZE = enum.auto()  # SIMD lanes


@dataclass(frozen=True)
class MappingOn:
    """The tasks of one (possibly symbolic) worker of ``mapping``."""

    mapping: TaskMapping
    worker: Index

    def __iter__(self) -> Iterator[Any]:
        tasks = self.mapping.worker2task(self.worker)
        return (t[0] for t in tasks) if self.mapping.ndim == 1 else iter(tasks)


@dataclass(frozen=True)
class MappingLoop:
    """All tasks of ``mapping``, with its workers realised as ``kind`` says."""

    mapping: TaskMapping
    kind: MappingLoopKind
    stream: bool = False     # the loop's stores are streaming (``vectorize(stream=True)``)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.mapping)


# ---------------------------------------------------------------- constructors
def spatial(*shape: int, ranks: Sequence[int] | None = None) -> SpatialMapping:
    """``prod(shape)`` workers, one task each: worker ``w`` gets the multi-index of ``w``."""
    return SpatialMapping(shape, ranks)  # type: ignore[arg-type]


def repeat(*shape: int, ranks: Sequence[int] | None = None) -> RepeatMapping:
    """One worker runs every task of ``shape``, in loop order (rank 0 outermost)."""
    return RepeatMapping(shape, ranks)  # type: ignore[arg-type]


def custom_mapping(
    task_shape: Sequence[int], num_workers: int, tasks_per_worker: int, fn: TaskFn
) -> CustomMapping:
    """A mapping whose k-th task of worker w is ``fn(w, k)``, written with ``+ * // %`` only."""
    return CustomMapping(tuple(task_shape), num_workers, tasks_per_worker, fn)


def auto_map(
    task_shape: Sequence[int] | int, num_workers: int, ranks: Sequence[int] | None = None
) -> TaskMapping:
    """``repeat(d / s) * spatial(s)``: covers ``task_shape`` with at most ``num_workers`` workers.

    Dimensions are visited fastest first (the last first by default, the highest rank first with
    ``ranks``, which both factors also get); dimension i gets ``gcd(workers_left, d_i)`` workers.
    A factor of all ones is dropped, unless it is the only one.
    """
    dims = (task_shape,) if isinstance(task_shape, int) else tuple(task_shape)
    shape = _check_shape("auto_map", dims)
    left = _positive_int("auto_map: num_workers", num_workers)
    rk = _check_ranks("auto_map", len(shape), ranks)
    spatial_shape = [1] * len(shape)
    for dim in sorted(range(len(shape)), key=lambda i: rk[i], reverse=True):
        spatial_shape[dim] = math.gcd(left, shape[dim])
        left //= spatial_shape[dim]
    repeat_shape = tuple(d // s for d, s in zip(shape, spatial_shape))
    factors: list[TaskMapping] = []
    if math.prod(repeat_shape) > 1:
        factors.append(RepeatMapping(repeat_shape, rk))
    if math.prod(spatial_shape) > 1 or not factors:
        factors.append(SpatialMapping(tuple(spatial_shape), rk))
    return factors[0] if len(factors) == 1 else ComposedMapping(tuple(factors))
