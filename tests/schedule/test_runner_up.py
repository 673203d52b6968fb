"""``benchmarks/runner_up.py``: the hook that makes a template's cost model pick its runner-up kind
of kernel (the survey of session 46), on a subclass so that the real template is untouched."""
import sys
from pathlib import Path

from taskmap.backends.base import host_cpu_target
from taskmap.templates.conv_cpu import ConvCpuTemplate
from taskmap.templates.conv_problem import ConvProblem

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from runner_up import runner_up  # noqa: E402

CPU = host_cpu_target()


def kind(s):
    return s.get("vec") or "pixels"


def test_the_runner_up_kind_wins_and_one_kind_spaces_are_left_alone():
    class Surveyed(ConvCpuTemplate):
        pass
    plain, surveyed = ConvCpuTemplate(), Surveyed()
    runner_up(Surveyed, kind)
    p = ConvProblem(1, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, "float32", False, True)
    space = plain.space(p, CPU)
    costs = {s: plain.cost(p, CPU, s) for s in space}
    first = min(space, key=costs.get)
    runner = min((s for s in space if kind(s) != kind(first)), key=costs.get)
    assert len({kind(s) for s in space}) > 1
    assert min(space, key=lambda s: surveyed.cost(p, CPU, s)) == runner
    assert all(surveyed.cost(p, CPU, s) == costs[s] for s in space if kind(s) != kind(first))
    grouped = ConvProblem(1, 32, 9, 9, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 16, "float32", False, True)
    gspace = plain.space(grouped, CPU)                          # 2 channels a group: the pixel kernel only
    assert {kind(s) for s in gspace} == {"pixels"}
    assert all(surveyed.cost(grouped, CPU, s) == plain.cost(grouped, CPU, s) for s in gspace)
