"""``ab_steps.py`` hook: every convolution on the CPU's direct template runs its runner-up kind of
kernel (pixel, channel or Winograd; see ``runner_up.py``)."""
from runner_up import runner_up

from taskmap.templates.conv_cpu import ConvCpuTemplate

runner_up(ConvCpuTemplate, lambda s: s.get("vec") or "pixels")
