"""A toy template family for the tuner's tests: row sums on the CPU, with points that are slow,
crash (write 8 GB past the output), hang (a loop that never ends), fail at launch or do not build.

Module-level classes, so worker processes can unpickle them (this directory is on ``sys.path``
while the tests run, and workers inherit it).
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

import taskmap
from taskmap import spatial
from taskmap.lang import attrs, blockIdx, f32, threadIdx
from taskmap.runtime.cache import clear_cache
from taskmap.schedule import tune
from taskmap.schedule.cost_model import Workload, estimate_time
from taskmap.templates.base import Schedule

# Fixtures for the tuner's tests (imported by them; not a conftest.py, so that other tests in
# this directory are unaffected): one compile cache for the session, so the toy kernels are
# built once; an empty tuning cache and model memo for every test.


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("taskmap-cache")


@pytest.fixture
def cache_root(session_cache, monkeypatch):
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(session_cache))
    monkeypatch.delenv("TASKMAP_TUNE", raising=False)
    clear_cache("tuning")
    tune.clear_memo()
    yield session_cache
    tune.clear_memo()


@dataclass(frozen=True)
class RowSumProblem:
    rows: int
    cols: int

    def input_specs(self):
        return [((self.rows, self.cols), "float32")]

    def output_specs(self):
        return [((self.rows,), "float32")]


FAST = Schedule.of(tasks=2, reps=1, variant="normal")
ONE_TASK = Schedule.of(tasks=1, reps=1, variant="normal")
MEDIUM = Schedule.of(tasks=2, reps=4, variant="normal")     # 4x the work of FAST
SLOW = Schedule.of(tasks=2, reps=10, variant="normal")      # 10x
CRASH = Schedule.of(tasks=2, reps=1, variant="crash")
HANG = Schedule.of(tasks=2, reps=1, variant="hang")
WRONG_SHAPE = Schedule.of(tasks=2, reps=1, variant="wrong_shape")   # builds, fails at launch
UNBUILDABLE = Schedule.of(tasks=2, reps=1, variant="unbuildable")   # instantiate raises


def row_sum_kernel(R: int, C: int, tasks: int, reps: int, variant: str):
    rows_per = (R + tasks - 1) // tasks

    @taskmap.kernel
    def row_sum(x: f32[R, C], y: f32[R]):
        for t in spatial(tasks).parallel():
            for r in range(rows_per):
                row = t * rows_per + r
                if row < R:
                    acc = 0.0
                    for rep in range(reps):
                        for c in range(C):
                            acc += x[row, c]
                    if variant == "crash":
                        y[row * 7 + 2000000000] = acc
                    elif variant == "hang":
                        while acc > -1.0:
                            acc = acc * 0.5 + 1.0
                        y[row] = acc
                    else:
                        y[row] = acc / reps

    return row_sum


class RowSumTemplate:
    """``points``: the space.  The cost is the analytic model's, except that the crashing and
    hanging points are bait: the model rates them best (half the cost of the same normal point)."""

    def __init__(self, points=(FAST, ONE_TASK, SLOW), name="toy_row_sum", version=None):
        self.points = tuple(points)
        self.name = name
        if version is not None:
            self.version = version

    def applies(self, problem, target):
        return True

    def space(self, problem, target):
        return self.points

    def cost(self, problem, target, s):
        R, C = problem.rows, problem.cols
        # a scalar chain of dependent adds per row: far below the vector peak, so that the work
        # (``reps``) ranks the points on any host (at 1/16 a Zen 5's peak made FAST and MEDIUM tie
        # on the memory term)
        w = Workload(flops=R * C * s["reps"], global_bytes=4 * R * (C + 1), register_bytes=4 * R * C * s["reps"],
                     work_items=s["tasks"], compute_efficiency=1 / 64)
        return estimate_time(target, w) * (0.5 if s["variant"] != "normal" else 1.0)

    def instantiate(self, problem, target, s):
        if s["variant"] == "unbuildable":
            raise ValueError("this point cannot be instantiated")
        rows = problem.rows + (s["variant"] == "wrong_shape")
        return row_sum_kernel(rows, problem.cols, s["tasks"], s["reps"], s["variant"])

    def arguments(self, problem, inputs, outputs):
        return [*inputs, *outputs]


@dataclass(frozen=True)
class ScaleProblem:
    n: int

    def input_specs(self):
        return [((self.n,), "float32")]

    def output_specs(self):
        return [((self.n,), "float32")]


def scale_kernel(n: int, block: int):
    grid = (n + block - 1) // block

    @taskmap.kernel
    def scale(a: f32[n], b: f32[n]):
        attrs.grid_dim = grid
        attrs.block_dim = block
        i = blockIdx.x * block + threadIdx.x
        if i < n:
            b[i] = a[i] * 2.0

    return scale


class ScaleTemplate:
    """A GPU-style kernel family (block size), for measuring on GPU targets (or failing to)."""

    name = "toy_scale"

    def __init__(self, blocks=(128, 256)):
        self.blocks = tuple(blocks)

    def applies(self, problem, target):
        return True

    def space(self, problem, target):
        return [Schedule.of(block=b) for b in self.blocks]

    def cost(self, problem, target, s):
        w = Workload(flops=problem.n, global_bytes=8 * problem.n, work_items=-(-problem.n // s["block"]),
                     threads_per_item=s["block"], registers_per_thread=16)
        return estimate_time(target, w)

    def instantiate(self, problem, target, s):
        return scale_kernel(problem.n, s["block"])

    def arguments(self, problem, inputs, outputs):
        return [*inputs, *outputs]
