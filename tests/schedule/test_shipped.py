"""Shipped tuning records (``taskmap.schedule.shipped``, ``taskmap records export``): measured
choices exported from the tuning cache, one file per device, answer model-mode choices on that
device when the local cache has none — and only while they mean the same kernel (template name
and version, problem, schedule still in the space, same device)."""
import dataclasses
import json

import pytest
from toy_templates import FAST, MEDIUM, SLOW, RowSumProblem, RowSumTemplate
from toy_templates import cache_root, session_cache  # noqa: F401 (fixtures)

from taskmap import cli
from taskmap.backends import host_cpu_target
from taskmap.runtime.cache import clear_cache
from taskmap.schedule import shipped, tune
from taskmap.schedule.measure import Measurement

pytestmark = pytest.mark.usefixtures("cache_root")
PROBLEM = RowSumProblem(128, 512)
TEMPLATE = RowSumTemplate(points=(SLOW, MEDIUM, FAST))


@pytest.fixture
def measured(monkeypatch):
    """Tuning 'measures' a point the cost model does not choose as the fastest; returns (the
    model's choice, the measured one)."""
    model = tune.tune(TEMPLATE, PROBLEM, host_cpu_target(), "model", use_cache=False).schedule
    fastest = SLOW if model != SLOW else MEDIUM
    times = {s: 1e-3 if s == fastest else 2e-3 for s in TEMPLATE.points}

    def measure(template, problem, target, schedules, settings=None, on_result=None, on_built=None):
        return [Measurement(s, times[s], None) for s in schedules]

    monkeypatch.setattr(tune, "measure_candidates", measure)
    return model, fastest


@pytest.fixture
def shipped_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(shipped, "RECORDS_DIR", tmp_path / "records")
    shipped.clear()
    yield tmp_path / "records"
    shipped.clear()


def _forget_local():
    clear_cache("tuning")
    tune.clear_memo()


def test_exported_choices_answer_model_mode_on_the_same_device(measured, shipped_dir, capsys):
    (model, fastest), cpu, t = measured, host_cpu_target(), TEMPLATE
    assert tune.choose(t, PROBLEM, cpu) == model
    assert tune.tune(t, PROBLEM, cpu, "exhaustive", progress=False).schedule == fastest
    assert cli.main(["records", "export", str(shipped_dir)]) == 0
    path = shipped_dir / shipped.file_name(shipped.device_key(cpu))
    assert f"{path}: 1 records" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["device"] == f"{cpu.name}/{cpu.num_cores}" and data["records"][0]["mode"] == "exhaustive"
    _forget_local()
    assert tune.choose(t, PROBLEM, cpu) == fastest                   # shipped, no local record
    tune.clear_memo()
    # not the same kernel, problem, space or device: the model's choice again
    assert tune.choose(RowSumTemplate(points=t.points, version=2), PROBLEM, cpu) == model
    assert tune.choose(t, RowSumProblem(64, 512), cpu) == \
        tune.tune(t, RowSumProblem(64, 512), cpu, "model", use_cache=False).schedule
    without = RowSumTemplate(points=tuple(s for s in t.points if s != fastest))
    assert tune.choose(without, PROBLEM, cpu) == tune.tune(without, PROBLEM, cpu, "model", use_cache=False).schedule
    other = dataclasses.replace(cpu, num_cores=cpu.num_cores + 1)
    assert tune.choose(t, PROBLEM, other) == tune.tune(t, PROBLEM, other, "model", use_cache=False).schedule


def test_export_merges_and_keeps_exhaustive_evidence(measured, shipped_dir):
    cpu, t = host_cpu_target(), TEMPLATE
    tune.tune(t, PROBLEM, cpu, "exhaustive", progress=False)
    shipped.export(shipped_dir)
    _forget_local()
    tune.tune(t, PROBLEM, cpu, "topk", k=1, progress=False)         # top-1: the model's choice only
    tune.tune(t, RowSumProblem(256, 512), cpu, "topk", k=2, progress=False)
    (path, n), = shipped.export(shipped_dir).items()
    assert n == 2
    records = {r["problem"]: r for r in json.loads(open(path).read())["records"]}
    assert records[repr(PROBLEM)]["mode"] == "exhaustive"           # not replaced by the top-1 record
    assert records[repr(RowSumProblem(256, 512))]["mode"] == "topk"


def test_nothing_to_export_says_so(shipped_dir, capsys):
    assert cli.main(["records", "export", str(shipped_dir), "--device", "cuda:sm_90/132"]) == 0
    assert "no measured tuning records in the cache for cuda:sm_90/132" in capsys.readouterr().out
