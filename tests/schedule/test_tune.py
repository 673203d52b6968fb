"""``taskmap.schedule.tune``: model-only choice, measured choice (top k, exhaustive), surviving
candidates that crash or hang, the mode from ``$TASKMAP_TUNE``, and the model-vs-exhaustive report.

The toy template (``toy_templates.py``) sums the rows of a 128 x 512 matrix on the CPU; its
``SLOW`` point does 10x the work of ``FAST``, so the fastest point is clear even on a noisy
2-core machine.  Timeouts are short (3 s) to keep the file well under a minute.
"""
import dataclasses
import io
import sys
import types

import numpy as np
import pytest
from toy_templates import (CRASH, FAST, HANG, MEDIUM, ONE_TASK, SLOW, UNBUILDABLE, WRONG_SHAPE, RowSumProblem,
                           RowSumTemplate, ScaleProblem, ScaleTemplate)
from toy_templates import cache_root, session_cache  # noqa: F401 (fixtures)

from taskmap.backends import cuda_available, cuda_target, current_cuda_target, host_cpu_target
from taskmap.errors import TaskmapError, UnsupportedError
from taskmap.runtime.tensor import Tensor
from taskmap.schedule import tune
from taskmap.schedule.measure import (Measurement, MeasureSettings, default_example_inputs, example_arguments,
                                      measure_candidates)
from taskmap.schedule.worker import build_kernel

pytestmark = pytest.mark.usefixtures("cache_root")   # a session compile cache, an empty tuning cache
PROBLEM = RowSumProblem(128, 512)
QUICK = MeasureSettings(timeout=3.0, warmup=1, repeat=5, min_sample_time=1e-3)


@pytest.fixture(scope="module")
def cpu():
    return host_cpu_target()


@pytest.fixture
def one_thread(monkeypatch):
    """Worker processes run OpenMP regions on one thread: under pytest-xdist the other core is
    busy, and a region whose second thread waits for a scheduler time slice takes milliseconds
    whatever its work, hiding the 10x differences the tests rely on."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def fake_measure(times, calls):
    """A stand-in for ``measure_candidates``: ``times[schedule]`` seconds (None: it failed)."""

    def measure(template, problem, target, schedules, settings=None, on_result=None, on_built=None):
        calls.append(list(schedules))
        out = [Measurement(s, times.get(s), None if times.get(s) else "failed") for s in schedules]
        for m in out:
            if on_built:
                on_built(m.schedule, None)
        for m in out:
            if on_result:
                on_result(m)
        return out

    return measure


# ---------------------------------------------------------------------------------------------
# Model mode


def test_model_mode_picks_the_argmin_of_the_cost(cpu, monkeypatch):
    t = RowSumTemplate()
    costs = {s: t.cost(PROBLEM, cpu, s) for s in t.space(PROBLEM, cpu)}
    assert min(costs, key=costs.get) == FAST            # 2 tasks on 2 cores, 1x the work
    assert costs[FAST] < costs[ONE_TASK] < costs[SLOW]
    calls = []
    monkeypatch.setattr(tune, "measure_candidates", fake_measure({}, calls))
    assert tune.choose(t, PROBLEM, cpu) == FAST
    assert tune.choose(t, PROBLEM, cpu, mode="model") == FAST
    assert calls == []                                   # nothing measured
    # The bait points are rated best by the model: model mode takes them (it cannot know).
    bait = RowSumTemplate(points=(FAST, SLOW, CRASH), name="toy_bait")
    assert tune.choose(bait, PROBLEM, cpu, mode="model") == CRASH


def test_model_choice_is_memoized_per_template_problem_target(cpu):
    t = RowSumTemplate()
    assert tune.choose(t, PROBLEM, cpu) == FAST
    t.points = (SLOW,)          # the memo answers for the same (template, problem, target) ...
    assert tune.choose(t, PROBLEM, cpu) == FAST
    tune.clear_memo()           # ... until cleared
    assert tune.choose(t, PROBLEM, cpu) == SLOW
    assert tune.choose(t, RowSumProblem(64, 64), cpu) == SLOW


# ---------------------------------------------------------------------------------------------
# Measuring for real


def test_exhaustive_measures_every_point_and_picks_the_fastest(cpu, one_thread):
    # (Points differ in work, not in parallelism: with pytest-xdist the other core may be busy.)
    t = RowSumTemplate(points=(SLOW, MEDIUM, FAST))
    result = tune.tune(t, PROBLEM, cpu, "exhaustive", progress=False, settings=QUICK)
    assert result.schedule == FAST and result.mode == "exhaustive" and not result.from_cache
    assert set(result.record.times) == {SLOW, MEDIUM, FAST}
    assert result.record.times[FAST] * 2 < result.record.times[MEDIUM] < result.record.times[SLOW]
    # The report answers from the cache: the model also chose FAST.
    report = tune.compare_model_vs_exhaustive(t, PROBLEM, cpu, settings=QUICK)
    assert report.model_time == report.best_time == result.record.times[FAST] and report.ratio == 1.0


def test_rounds_alternate_the_order_and_keep_each_candidates_fastest_pass(cpu, monkeypatch):
    # A burst of load from elsewhere inflates FAST's first pass 10x: the second pass (in reverse
    # order) sees through it.  A candidate failing in any pass is dropped and not measured again.
    from taskmap.schedule import measure as measure_mod
    passes = {FAST: [5e-3, 1e-3], MEDIUM: [4e-3, 4.5e-3], SLOW: [10e-3, 9e-3], CRASH: [2e-3, None]}
    order = []

    class ScriptedRunner:
        def __init__(self, template, problem, target, settings):
            assert settings.repeat == 3          # QUICK's 5 samples shared by 2 rounds, rounded up

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def build_all(self, schedules, on_built):
            return {UNBUILDABLE: "does not build"}

        def measure(self, sched):
            order.append(sched)
            t = passes[sched].pop(0)
            return Measurement(sched, t, None if t else "crashed")

    monkeypatch.setattr(measure_mod, "CandidateRunner", ScriptedRunner)
    heard = []
    points = [FAST, MEDIUM, SLOW, CRASH, UNBUILDABLE]
    out = measure_mod.measure_candidates(RowSumTemplate(), PROBLEM, cpu, points, QUICK, on_result=heard.append)
    assert order == [FAST, MEDIUM, SLOW, CRASH, CRASH, SLOW, MEDIUM, FAST]
    assert [m.time for m in out] == [1e-3, 4e-3, 9e-3, None, None]
    assert out[3].error == "crashed" and out[4].error == "does not build"
    assert len(heard) == 9 and heard[-1] == out[0]      # every measurement, each failure once


def test_crashing_and_hanging_candidates_are_dropped_and_tuning_survives(cpu, caplog, one_thread):
    # The model rates the broken points best (bait), so they are measured first.
    t = RowSumTemplate(points=(SLOW, FAST, CRASH, HANG, WRONG_SHAPE, UNBUILDABLE), name="toy_bad_points")
    result = tune.tune(t, PROBLEM, cpu, "exhaustive", progress=False, settings=QUICK)
    assert result.schedule == FAST
    failures = result.record.failures
    assert set(failures) == {CRASH, HANG, WRONG_SHAPE, UNBUILDABLE}
    assert "SIGSEGV" in failures[CRASH] and "crashed the worker process" in failures[CRASH]
    assert "timed out after 3 s" in failures[HANG]
    assert failures[WRONG_SHAPE].startswith("LaunchError: ")
    assert failures[UNBUILDABLE] == "build failed: ValueError: this point cannot be instantiated"
    assert set(result.record.times) == {FAST, SLOW}
    assert "dropped" in caplog.text and "SIGSEGV" in caplog.text
    # The report (from the cache): the model's choice (CRASH) has no time at all.
    report = tune.compare_model_vs_exhaustive(t, PROBLEM, cpu, settings=QUICK)
    assert report.model_time == float("inf") and report.ratio == float("inf")
    assert report.best_time == result.record.times[FAST]


def test_example_inputs_are_random_non_zero_and_on_the_target(cpu):
    inputs, outputs = default_example_inputs(PROBLEM, cpu, seed=3)
    (x,), (y,) = inputs, outputs
    assert x.shape == (128, 512) and x.dtype == np.float32 and np.all(np.abs(x) >= 0.5)
    assert (x < 0).any() and (x > 0).any() and y.shape == (128,) and not y.any()
    # cache-line aligned, as a compiled graph's buffers: numpy's own arrays often start 16 bytes off
    assert x.ctypes.data % 64 == 0 and y.ctypes.data % 64 == 0 and x.flags.c_contiguous
    args = example_arguments(RowSumTemplate(), PROBLEM, cpu)
    assert all(a.ctypes.data % 64 == 0 for a in args)
    build_kernel(RowSumTemplate().instantiate(PROBLEM, cpu, FAST), cpu)(*args)
    np.testing.assert_allclose(args[1], args[0].sum(axis=1), rtol=1e-4)


def test_example_arguments_pass_the_schedule_and_target_only_where_taken(cpu):
    # The GPU matmul templates' ``arguments`` take a schedule (the split-K workspace) but no
    # target; the CPU ones take both.  Each gets what it takes (a GPU tuning run once failed here).
    seen = []

    class ScheduleOnly(RowSumTemplate):
        def arguments(self, problem, inputs, outputs, schedule=None):
            seen.append(schedule)
            return super().arguments(problem, inputs, outputs)

    class Both(RowSumTemplate):
        def arguments(self, problem, inputs, outputs, schedule=None, target=None):
            seen.append((schedule, target))
            return super().arguments(problem, inputs, outputs)

    example_arguments(ScheduleOnly(), PROBLEM, cpu, schedule=FAST)
    example_arguments(Both(), PROBLEM, cpu, schedule=FAST)
    example_arguments(Both(), PROBLEM, cpu)
    assert seen == [FAST, (FAST, cpu), (None, None)]


def test_example_inputs_from_spec_objects_ints_and_bf16(cpu):
    class Spec:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype

    class Problem:
        def input_specs(self):
            return [Spec([3, 4], np.int32), ((5,), "bfloat16")]

        output_specs = [((2,), "float64")]

    (ints, bf16), (out,) = default_example_inputs(Problem(), cpu)
    assert ints.dtype == np.int32 and ints.min() >= 1 and ints.max() < 8
    assert isinstance(bf16, Tensor) and bf16.dtype == "bfloat16" and np.all(np.abs(bf16.numpy()) >= 0.5)
    assert out.dtype == np.float64 and out.shape == (2,)


def test_example_input_errors(cpu):
    with pytest.raises(TaskmapError, match=r"cannot make example inputs for 'no specs': give the problem "
                                           r"input_specs\(\) and output_specs\(\), or the template an "
                                           r"example_inputs\(problem, target\) method"):
        default_example_inputs("no specs", cpu)

    class Odd:
        input_specs = [42]
        output_specs = []

    with pytest.raises(TaskmapError, match="a tensor spec is an object with .shape and .dtype or a "
                                           r"\(shape, dtype\) pair, not 42"):
        default_example_inputs(Odd(), cpu)


# ---------------------------------------------------------------------------------------------
# Modes, the environment, errors


def test_topk_measures_the_models_k_best(cpu, monkeypatch):
    calls = []
    monkeypatch.setattr(tune, "measure_candidates", fake_measure({FAST: 3e-3, ONE_TASK: 1e-3, SLOW: 9e-3}, calls))
    t = RowSumTemplate()
    assert tune.choose(t, PROBLEM, cpu, mode="topk", k=2) == ONE_TASK
    assert calls == [[FAST, ONE_TASK]]                  # in the model's order
    assert tune.choose(t, PROBLEM, cpu, mode="topk", k=1) == ONE_TASK   # k=2 entry answers k=1
    assert len(calls) == 1
    assert tune.choose(t, PROBLEM, cpu, mode="topk", k=8) == ONE_TASK  # needs a wider measurement
    assert calls[1] == [FAST, ONE_TASK, SLOW]                           # (all 3 points)
    assert tune.choose(t, PROBLEM, cpu, mode="topk", k=8) == ONE_TASK and len(calls) == 2


def test_env_var_sets_the_default_mode(cpu, monkeypatch):
    calls = []
    monkeypatch.setattr(tune, "measure_candidates", fake_measure({FAST: 3e-3, ONE_TASK: 1e-3, SLOW: 9e-3}, calls))
    t = RowSumTemplate()
    monkeypatch.setenv("TASKMAP_TUNE", "exhaustive")
    assert tune.default_mode() == "exhaustive"
    assert tune.choose(t, PROBLEM, cpu) == ONE_TASK and len(calls[0]) == 3
    assert tune.choose(t, PROBLEM, cpu, mode="model") == ONE_TASK   # the measured choice serves model mode
    monkeypatch.setenv("TASKMAP_TUNE", "fastest")
    with pytest.raises(TaskmapError, match=r"TASKMAP_TUNE='fastest' is not a tuning mode: use one of model, topk, "
                                           r"exhaustive"):
        tune.choose(t, PROBLEM, cpu)


def test_the_report_measures_a_losing_model_choice_again_side_by_side(cpu, monkeypatch):
    # Exhaustive: the model's choice (FAST) measured 3x the best (ONE_TASK); measured again as a
    # pair, in the confirmation's settings, it is 1.1x.  Without ``confirm`` there is no re-run.
    calls, settings = [], []
    passes = [{FAST: 3e-3, ONE_TASK: 1e-3, SLOW: 9e-3}, {FAST: 1.1e-3, ONE_TASK: 1e-3}]

    def measure(template, problem, target, schedules, s=None, on_result=None, on_built=None):
        settings.append(s)
        return fake_measure(passes[len(calls)], calls)(template, problem, target, schedules, s, on_result, on_built)

    monkeypatch.setattr(tune, "measure_candidates", measure)
    t = RowSumTemplate()
    plain = tune.compare_model_vs_exhaustive(t, PROBLEM, cpu)
    assert plain.ratio == 3.0 and plain.side_by_side is None and len(calls) == 1
    assert plain.model_choice == FAST and plain.best_choice == ONE_TASK
    report = tune.compare_model_vs_exhaustive(t, PROBLEM, cpu, confirm=tune.CONFIRM_SETTINGS)
    assert calls[1] == [FAST, ONE_TASK] and settings[1] is tune.CONFIRM_SETTINGS
    assert report.ratio == 3.0 and report.side_by_side == pytest.approx(1.1)


def test_mode_errors(cpu):
    t = RowSumTemplate()
    with pytest.raises(TaskmapError, match="unknown tuning mode 'best': use one of model, topk, exhaustive"):
        tune.choose(t, PROBLEM, cpu, mode="best")
    with pytest.raises(TaskmapError, match="mode='topk' needs k >= 1, not 0"):
        tune.choose(t, PROBLEM, cpu, mode="topk", k=0)
    with pytest.raises(TaskmapError, match="template toy_empty has no feasible schedule for RowSumProblem"):
        tune.choose(RowSumTemplate(points=(), name="toy_empty"), PROBLEM, cpu)


def test_all_candidates_failing_is_an_error_listing_the_reasons(cpu, monkeypatch):
    monkeypatch.setattr(tune, "measure_candidates", fake_measure({}, []))
    with pytest.raises(TaskmapError, match=r"no candidate could be measured:\n  reps=1, tasks=2, variant=normal: "
                                           r"failed"):
        tune.choose(RowSumTemplate(), PROBLEM, cpu, mode="exhaustive")


class _Local:
    pass


def test_a_template_that_does_not_pickle_is_reported(cpu):
    t = RowSumTemplate(points=(FAST, SLOW), name="toy_unpicklable")
    t.hook = lambda: None       # a lambda cannot travel to a worker process
    with pytest.raises(TaskmapError, match="cannot send the template or problem to a worker process: .* must "
                                           "pickle: make them instances of module-level classes"):
        tune.choose(t, PROBLEM, cpu, mode="exhaustive", progress=False, settings=QUICK)


@pytest.mark.skipif(cuda_available(), reason="an NVIDIA GPU is present")
def test_measuring_without_the_device_is_unsupported():
    # The worker builds the kernel (NVRTC needs no GPU) but cannot load it: no device.
    with pytest.raises(UnsupportedError, match="cannot measure on cuda:sm_80: no such device is present"):
        tune.choose(ScaleTemplate(), ScaleProblem(4096), cuda_target("sm_80"), mode="exhaustive", progress=False,
                    settings=QUICK)


@pytest.mark.cuda
def test_measuring_on_the_gpu():
    target = current_cuda_target()
    result = tune.tune(ScaleTemplate(), ScaleProblem(1 << 22), target, "exhaustive", progress=False, settings=QUICK)
    assert set(result.record.times) == {s for s in ScaleTemplate().space(None, target)}
    assert all(0 < t < 1e-2 for t in result.record.times.values())


@pytest.mark.cuda
@pytest.mark.parametrize("tf32", [False, True], ids=["simt", "tf32"])
def test_tuning_the_gpu_matmul_templates_with_split_k(tf32):
    # Long K over few output tiles: the spaces hold split-K chains (two kernels, a workspace).
    from taskmap.templates.matmul_problem import MatmulProblem
    from taskmap.templates.matmul_simt import MATMUL_SIMT
    from taskmap.templates.matmul_tc import MATMUL_TC
    target = current_cuda_target()
    template = MATMUL_TC if tf32 else MATMUL_SIMT
    problem = MatmulProblem(1, 128, 256, 4096, trans_b=True, bias=True, tf32=tf32)
    space = template.space(problem, target)
    picks = [next(s for s in space if s["split"] == 1), next(s for s in space if s["split"] > 1)]
    measured = measure_candidates(template, problem, target, picks, QUICK)
    assert [m.schedule for m in measured] == picks
    assert all(m.ok and 0 < m.time < 1e-2 for m in measured), measured


def test_a_template_the_worker_cannot_import_is_reported(cpu, monkeypatch):
    ghost = types.ModuleType("toy_ghost_module")       # importable here only (not on sys.path)
    ghost.Ghost = type("Ghost", (RowSumTemplate,), {"__module__": "toy_ghost_module"})
    monkeypatch.setitem(sys.modules, "toy_ghost_module", ghost)
    with pytest.raises(TaskmapError, match="cannot load the request in the worker process .*importable, "
                                           "module-level classes.*No module named 'toy_ghost_module'"):
        tune.choose(ghost.Ghost(name="toy_ghost"), PROBLEM, cpu, mode="exhaustive", progress=False, settings=QUICK)


def test_worker_processes_that_fail_to_start_are_reported(cpu, monkeypatch, tmp_path):
    t = RowSumTemplate(points=(FAST,), name="toy_no_worker")
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(TaskmapError, match="the tuner's worker process exited with status 1 while starting"):
        tune.choose(t, PROBLEM, cpu, mode="exhaustive", progress=False, settings=QUICK)
    sleeper = tmp_path / "python"
    sleeper.write_text("#!/bin/sh\nsleep 30\n")
    sleeper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(sleeper))
    with pytest.raises(TaskmapError, match="the tuner's worker process did not start within 0.5 s"):
        tune.choose(t, PROBLEM, cpu, mode="exhaustive", progress=False,
                    settings=dataclasses.replace(QUICK, startup_timeout=0.5))


def test_progress_bar_shows_the_best_time_on_a_terminal(cpu, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    monkeypatch.setattr(tune, "measure_candidates", fake_measure({FAST: 3e-3, ONE_TASK: 1e-3, SLOW: 9e-3}, []))
    tune.choose(RowSumTemplate(), PROBLEM, cpu, mode="exhaustive")
    assert "measuring toy_row_sum" in term.getvalue() and "best 1000.0 us" in term.getvalue()
    quiet = Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    tune.tune(RowSumTemplate(), PROBLEM, cpu, mode="exhaustive", progress=False, use_cache=False)
    assert quiet.getvalue() == ""


def test_samples_time_the_kernel_not_the_argument_checks(cpu, monkeypatch):
    """Every sample launches the prepared kernel: the arguments are checked once per candidate
    (the checks cost up to hundreds of microseconds — more than a small kernel runs)."""
    from taskmap.runtime.kernel import CompiledKernel
    from taskmap.schedule import worker
    prepared = []
    real = CompiledKernel.prepare
    monkeypatch.setattr(CompiledKernel, "prepare", lambda self, *a: prepared.append(1) or real(self, *a))
    seconds = worker.measure_candidate(RowSumTemplate(), PROBLEM, cpu, FAST, QUICK, first=lambda t: None)
    assert seconds > 0 and prepared == [1]
