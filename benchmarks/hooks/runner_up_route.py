"""``ab_steps.py`` hook: every 1x1 convolution on the CPU moves between the direct template and the
implicit GEMM (see ``runner_up.py``)."""
from runner_up import runner_up

from taskmap.ops.conv_route import GEMM, ConvRouteCpuTemplate

runner_up(ConvRouteCpuTemplate, lambda s: s.get("vec") == GEMM, lambda p: (p.kh, p.kw) == (1, 1))
