"""``torch.autocast`` in captured graphs: the products autocast runs in lower precision get casts.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (or ``"cuda"`` with float16) PyTorch runs
its "lower precision" ops — linear, matmul / mm / bmm / addmm / baddbmm, the convolutions,
``scaled_dot_product_attention``, prelu — on their floating inputs cast to the autocast dtype,
and everything else as it is.  A graph dynamo or ``torch.export`` captured holds those ops
uncast: the dispatcher casts at run time.  The importer does what the dispatcher would:

* the state when the graph is imported (a model compiled or first called inside ``autocast``:
  :func:`current`; dynamo guards on it, ``taskmap.compile`` keys its graphs by it: :func:`state`);
* ``with torch.autocast(...)`` inside the captured code (dynamo's ``_enter_autocast`` /
  ``_exit_autocast`` calls: :class:`Regions`);
* per op of the lower-precision list (:func:`lowers`), its floating graph-tensor inputs — and a
  module's parameters — cast to the autocast dtype (``CAST`` ops; a constant weight's folds).
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F

from ...ir.dtypes import ScalarType, scalar_type

#: torch functions and Tensor methods autocast runs in lower precision (``torch.amp``'s CPU and
#: CUDA lists, those taskmap has graph ops for).
_FUNCTIONS = {F.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.addbmm, F.conv1d,
              F.conv2d, torch.conv1d, torch.conv2d, F.conv_transpose1d, F.conv_transpose2d,
              F.scaled_dot_product_attention, F.prelu, operator.matmul}
_METHODS = {"matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "__matmul__", "__rmatmul__"}
_MODULES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d,
            torch.nn.PReLU)
_ATEN = ("linear", "mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "convolution", "conv1d", "conv2d",
         "conv_transpose1d", "conv_transpose2d", "_scaled_dot_product", "scaled_dot_product_attention", "prelu")
#: dynamo's calls for ``with torch.autocast(...)`` inside compiled code.
ENTER, EXIT = torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast


def _device_type(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


def current(device: str) -> ScalarType | None:
    """The autocast dtype for ``device``'s type now (None: autocast is off)."""
    kind = _device_type(device)
    if not torch.is_autocast_enabled(kind):
        return None
    return scalar_type(str(torch.get_autocast_dtype(kind)).replace("torch.", ""))


_OFF = (None, None)
_ANY = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def state() -> tuple[Any, ...]:
    """What a compiled graph depends on: the autocast dtype of the CPU and of CUDA (or None).
    (Asked on every call of a compiled model: one check when autocast is off.)"""
    return (current("cpu"), current("cuda")) if _ANY() else _OFF


def lowers(op: str, target: Any) -> bool:
    """Whether autocast runs this node's op in lower precision."""
    if op == "call_module":
        return isinstance(target, _MODULES)
    if op == "call_method":
        return target in _METHODS
    if target in _FUNCTIONS:
        return True
    name = getattr(target, "__name__", "")
    return isinstance(target, torch._ops.OpOverload) and name.split(".")[0] in _ATEN


class Regions:
    """The autocast dtype in force while a graph's nodes are imported: the state at import, then
    the ``with torch.autocast(...)`` regions the graph enters and leaves."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.stack: list[ScalarType | None] = [current(device)]

    @property
    def dtype(self) -> ScalarType | None:
        return self.stack[-1]

    def enter(self, device_type: str, dtype: Any = None, enabled: bool = True, *_: Any) -> object:
        """``_enter_autocast(device_type, dtype, enabled, cache_enabled)``: a region (its
        token, which ``exit`` is given back)."""
        if device_type != _device_type(self.device):
            self.stack.append(self.dtype)            # another device's autocast: nothing changes here
        elif not enabled:
            self.stack.append(None)
        else:
            dtype = dtype or torch.get_autocast_dtype(device_type)
            self.stack.append(scalar_type(str(dtype).replace("torch.", "")))
        return self

    def exit(self, *_: Any) -> None:
        if len(self.stack) > 1:
            self.stack.pop()


__all__ = ["ENTER", "EXIT", "Regions", "current", "lowers", "state"]
