"""``ab_steps.py`` hook: every depthwise convolution and pool on the CPU runs its runner-up kernel
(rows, channels or whole planes in the lanes; see ``runner_up.py``)."""
from runner_up import runner_up

from taskmap.templates.window import WindowTemplate

runner_up(WindowTemplate, lambda s: "plane" if s.get("plane") else "chan" if s.get("chan") else "rows")
