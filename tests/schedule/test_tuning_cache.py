"""The tuning cache: measured choices on disk, what they answer, what invalidates them."""
import dataclasses
import json

import pytest
from toy_templates import FAST, ONE_TASK, SLOW, RowSumProblem, RowSumTemplate
from toy_templates import cache_root, session_cache  # noqa: F401 (fixtures)

from taskmap import cli
from taskmap.backends import cuda_target, host_cpu_target
from taskmap.runtime import cache as cache_mod
from taskmap.runtime.cache import DiskCache, cache_info
from taskmap.schedule import tune, tuning_cache
from taskmap.schedule.measure import Measurement
from taskmap.schedule.tuning_cache import TuningRecord, tuning_key
from taskmap.templates.base import Schedule

pytestmark = pytest.mark.usefixtures("cache_root")   # a session compile cache, an empty tuning cache
PROBLEM = RowSumProblem(128, 512)
TIMES = {FAST: 3e-3, ONE_TASK: 1e-3, SLOW: 9e-3}     # measured: ONE_TASK wins, the model says FAST


@pytest.fixture
def calls(monkeypatch):
    """Replace the measurement with ``TIMES``; the list records each call's candidates."""
    made = []

    def measure(template, problem, target, schedules, settings=None, on_result=None, on_built=None):
        made.append(list(schedules))
        return [Measurement(s, TIMES[s]) for s in schedules]

    monkeypatch.setattr(tune, "measure_candidates", measure)
    return made


@pytest.fixture(scope="module")
def cpu():
    return host_cpu_target()


def test_a_cache_hit_avoids_measuring_again(cpu, calls):
    t = RowSumTemplate()
    assert tune.choose(t, PROBLEM, cpu, mode="exhaustive") == ONE_TASK
    assert tune.choose(t, PROBLEM, cpu, mode="exhaustive") == ONE_TASK
    assert len(calls) == 1
    result = tune.tune(t, PROBLEM, cpu, "exhaustive")
    assert result.from_cache and result.record.times == TIMES and len(calls) == 1
    # Another process (a fresh template object, an empty memo) reads the same entry.
    tune.clear_memo()
    assert tune.choose(RowSumTemplate(), PROBLEM, cpu, mode="exhaustive") == ONE_TASK and len(calls) == 1


def test_a_measured_choice_serves_model_and_topk_mode(cpu, calls):
    t = RowSumTemplate()
    assert tune.choose(t, PROBLEM, cpu, mode="model") == FAST            # the model's own choice
    tune.choose(t, PROBLEM, cpu, mode="exhaustive")
    assert tune.choose(t, PROBLEM, cpu, mode="model") == ONE_TASK        # measured beats modelled
    assert tune.choose(t, PROBLEM, cpu, mode="topk", k=2) == ONE_TASK    # exhaustive answers top-k
    assert len(calls) == 1
    # use_cache=False measures again and leaves the cache alone.
    assert tune.tune(t, PROBLEM, cpu, "exhaustive", use_cache=False).schedule == ONE_TASK and len(calls) == 2


def test_a_topk_entry_does_not_answer_exhaustive(cpu, calls):
    t = RowSumTemplate()
    tune.choose(t, PROBLEM, cpu, mode="topk", k=1)
    assert calls == [[FAST]]
    assert tune.choose(t, PROBLEM, cpu, mode="model") == FAST            # top-1 measured only FAST
    assert tune.choose(t, PROBLEM, cpu, mode="exhaustive") == ONE_TASK
    assert len(calls) == 2


def test_the_key_depends_on_problem_target_versions_mode_and_template(cpu, monkeypatch):
    t = RowSumTemplate()
    base = tuning_key(t, PROBLEM, cpu, "exhaustive")
    assert base == tuning_key(RowSumTemplate(), RowSumProblem(128, 512), cpu, "exhaustive")
    others = [
        tuning_key(t, RowSumProblem(128, 513), cpu, "exhaustive"),
        tuning_key(t, PROBLEM, dataclasses.replace(cpu, num_cores=cpu.num_cores + 1), "exhaustive"),
        tuning_key(t, PROBLEM, cuda_target("sm_90"), "exhaustive"),
        tuning_key(t, PROBLEM, cpu, "topk"),
        tuning_key(RowSumTemplate(name="other"), PROBLEM, cpu, "exhaustive"),
        tuning_key(RowSumTemplate(version=2), PROBLEM, cpu, "exhaustive"),
    ]
    monkeypatch.setattr(cache_mod, "__version__", "99.0")
    others.append(tuning_key(t, PROBLEM, cpu, "exhaustive"))
    assert len({base, *others}) == len(others) + 1


def test_a_new_taskmap_version_measures_again(cpu, calls, monkeypatch):
    tune.choose(RowSumTemplate(), PROBLEM, cpu, mode="exhaustive")
    monkeypatch.setattr(cache_mod, "__version__", "99.0")
    tune.choose(RowSumTemplate(), PROBLEM, cpu, mode="exhaustive")
    assert len(calls) == 2


def test_entries_are_json_with_every_time(cpu, calls):
    tune.choose(RowSumTemplate(), PROBLEM, cpu, mode="exhaustive")
    path = DiskCache("tuning").get(tuning_key(RowSumTemplate(), PROBLEM, cpu, "exhaustive"), ".json")
    data = json.loads(path.read_text())
    assert data["template"] == "toy_row_sum" and data["mode"] == "exhaustive" and data["k"] == 3
    assert data["best"] == [["reps", 1], ["tasks", 1], ["variant", "normal"]]
    assert sorted(t for _, t in data["times"]) == sorted(TIMES.values())
    assert data["problem"] == "RowSumProblem(rows=128, cols=512)" and data["target"] == cpu.name
    assert not list(path.parent.glob(".tmp-*"))                        # written atomically


def test_stale_and_corrupt_entries_are_ignored(cpu, calls, caplog):
    t = RowSumTemplate()
    tune.choose(t, PROBLEM, cpu, mode="exhaustive")
    # ONE_TASK left the space (the template changed without a version bump): measure again.
    shrunk = RowSumTemplate(points=(FAST, SLOW))
    assert tuning_cache.load(shrunk, PROBLEM, cpu, "exhaustive", shrunk.points) is None
    path = DiskCache("tuning").get(tuning_key(t, PROBLEM, cpu, "exhaustive"), ".json")
    path.write_text("{not json")
    assert tuning_cache.load(t, PROBLEM, cpu, "exhaustive", t.points) is None
    assert "ignoring unreadable tuning cache entry" in caplog.text
    assert tune.choose(t, PROBLEM, cpu, mode="exhaustive") == ONE_TASK and len(calls) == 2


def test_records_round_trip_with_tuple_parameters():
    a, b = Schedule.of(tile=(64, 32), warps=4), Schedule.of(tile=(32, 32), warps=4)
    rec = TuningRecord("t", "p", "cpu:x", "topk", 2, a, {a: 1e-3}, {b: "crashed"})
    back = TuningRecord.from_json(json.loads(json.dumps(rec.to_json())), [b, a])
    assert back.best is a and back.times == {a: 1e-3} and back.failures == {b: "crashed"}


def test_taskmap_cache_lists_the_tuning_namespace(cpu, calls, capsys):
    tune.choose(RowSumTemplate(), PROBLEM, cpu, mode="exhaustive")
    assert cache_info()["namespaces"]["tuning"]["files"] == 1
    assert cli.main(["cache"]) == 0
    assert "tuning" in capsys.readouterr().out
    assert cli.main(["cache", "--clear", "--namespace", "tuning"]) == 0
    tune.clear_memo()
    assert tune.choose(RowSumTemplate(), PROBLEM, cpu, mode="model") == FAST   # forgotten
