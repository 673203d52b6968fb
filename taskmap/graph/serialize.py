"""Saving objects that hold graphs: one ``.npz``-style zip with a pickle of the object (scalar
types by name, so they load as the interned singletons) and every constant's data as its own
array (written once, loaded without pickle).

    save(obj, "model.taskmap");  obj2 = load("model.taskmap")
"""
from __future__ import annotations

import io
import os
import pickle
import warnings
import zipfile
from typing import Any

import numpy as np

from ..ir.dtypes import ScalarType, scalar_type

FORMAT = 1


class _Pickler(pickle.Pickler):
    def __init__(self, f: Any) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays: list[np.ndarray] = []
        self._ids: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, ScalarType):
            return ("dtype", obj.name)
        if isinstance(obj, np.ndarray) and obj.size > 64:
            k = self._ids.get(id(obj))
            if k is None:
                k = self._ids[id(obj)] = len(self.arrays)
                self.arrays.append(obj)
            return ("array", k, obj.dtype.name) if obj.dtype.name == "bfloat16" else ("array", k)
        return None

    def stored(self) -> list[np.ndarray]:
        """The arrays as written: bfloat16 (``ml_dtypes``, no ``.npy`` format of its own) as its bits."""
        return [a.view(np.uint16) if a.dtype.name == "bfloat16" else a for a in self.arrays]


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: Any, arrays: dict[int, np.ndarray]) -> None:
        super().__init__(f)
        self.arrays = arrays

    def persistent_load(self, pid: Any) -> Any:
        kind, value, *dtype = pid
        if kind == "dtype":
            return scalar_type(value)
        if kind == "array":
            return self.arrays[value].view(scalar_type(dtype[0]).numpy_dtype) if dtype else self.arrays[value]
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    buf = io.BytesIO()
    p = _Pickler(buf)
    p.dump((FORMAT, obj))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("object.pkl", buf.getvalue())
        for k, a in enumerate(p.stored()):
            with z.open(f"arrays/{k}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(a), allow_pickle=False)


def load(path: str | os.PathLike[str]) -> Any:
    with zipfile.ZipFile(path) as z:
        arrays = {}
        for name in z.namelist():
            if name.startswith("arrays/"):
                with z.open(name) as f:
                    arrays[int(name[7:-4])] = np.lib.format.read_array(f, allow_pickle=False)
        with warnings.catch_warnings():  # torch's pickled pytree specs warn about their own classes
            warnings.simplefilter("ignore", FutureWarning)
            fmt, obj = _Unpickler(io.BytesIO(z.read("object.pkl")), arrays).load()
    if fmt != FORMAT:
        raise ValueError(f"{path}: saved with format {fmt}, this version reads {FORMAT}")
    return obj


__all__ = ["load", "save"]
