"""Numeric comparison with a per-dtype tolerance table, for numpy arrays and torch tensors.

torch is optional: tensors are recognised by duck typing (``type(x).__module__`` starts with
``"torch"``) and converted with ``x.detach().cpu()`` (``.float()`` first for bfloat16), so this
module never imports torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: (rtol, atol) per dtype name, for results computed in that dtype and compared element-wise
#: with ``|actual - expected| <= atol + rtol * |expected|``. Reductions over K terms accumulate
#: error roughly like sqrt(K) * eps: pass a larger atol for long reductions in low precision.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
    "complex128": (1e-12, 1e-12),
    "complex64": (1e-5, 1e-5),
    **{name: (0.0, 0.0) for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    )},
}

_ALIASES = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "double": "float64", "half": "float16",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
}


def dtype_name(dtype: Any) -> str:
    """Normalise a numpy dtype, torch dtype, or name (``'f32'``, ``'float32'``) to a name."""
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
        return _ALIASES.get(name, name)
    text = str(dtype)
    if text.startswith("torch."):
        name = text.removeprefix("torch.")
        return _ALIASES.get(name, name)
    try:
        return np.dtype(dtype).name
    except TypeError:
        name = getattr(dtype, "name", None)
        if isinstance(name, str):
            return _ALIASES.get(name, name)
        raise TypeError(f"not a dtype: {dtype!r}") from None


def tolerance(dtype: Any) -> tuple[float, float]:
    """``(rtol, atol)`` for ``dtype`` from :data:`TOLERANCES`."""
    name = dtype_name(dtype)
    try:
        return TOLERANCES[name]
    except KeyError:
        raise ValueError(f"no default tolerance for dtype {name!r}: pass rtol and atol") from None


def to_numpy(x: Any) -> tuple[np.ndarray, str]:
    """Convert an array-like to numpy; also returns the original dtype name (kept for bfloat16)."""
    if isinstance(x, np.ndarray):
        return x, x.dtype.name
    if type(x).__module__.startswith("torch"):
        t = x.detach().cpu()
        name = dtype_name(t.dtype)
        if name == "bfloat16":
            t = t.float()
        return t.numpy(), name
    if hasattr(x, "numpy"):
        arr = np.asarray(x.numpy())
        return arr, arr.dtype.name
    arr = np.asarray(x)
    return arr, arr.dtype.name


def _prepare(actual, expected, dtype, rtol, atol):
    a, a_name = to_numpy(actual)
    e, e_name = to_numpy(expected)
    if rtol is None or atol is None:
        if dtype is not None:
            default = tolerance(dtype)
        else:  # the looser of the two: an f16 result checked against an f32 reference gets f16's
            default = tuple(max(p, q) for p, q in zip(tolerance(e_name), tolerance(a_name)))
        rtol = default[0] if rtol is None else rtol
        atol = default[1] if atol is None else atol
    name = dtype_name(dtype) if dtype is not None else e_name
    return a, e, float(rtol), float(atol), name


def _close_mask(a: np.ndarray, e: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    if rtol == 0 and atol == 0 and a.dtype.kind in "biu" and e.dtype.kind in "biu":
        return a == e  # exact, with no rounding of large integers through float64
    wide = np.complex128 if "c" in (a.dtype.kind, e.dtype.kind) else np.float64
    return np.isclose(a.astype(wide), e.astype(wide), rtol=rtol, atol=atol, equal_nan=True)


def is_close(actual, expected, dtype=None, rtol: float | None = None, atol: float | None = None) -> bool:
    """True when the shapes match and every element is within tolerance (NaN matches NaN)."""
    a, e, rtol, atol, _ = _prepare(actual, expected, dtype, rtol, atol)
    return a.shape == e.shape and bool(_close_mask(a, e, rtol, atol).all())


def assert_close(
    actual,
    expected,
    dtype=None,
    rtol: float | None = None,
    atol: float | None = None,
    err_msg: str = "",
) -> None:
    """Assert ``actual`` matches ``expected`` element-wise within the dtype's tolerance.

    ``dtype`` picks the row of :data:`TOLERANCES` (default: the looser of the two operands'
    dtypes); ``rtol``/``atol`` override it. Shapes must be equal (no broadcasting); NaN must
    appear in the same places. On failure the message gives the number of mismatches, the worst
    element (index, actual, expected) and the largest absolute and relative errors.
    """
    a, e, rtol, atol, name = _prepare(actual, expected, dtype, rtol, atol)
    prefix = f"{err_msg}\n" if err_msg else ""
    if a.shape != e.shape:
        raise AssertionError(f"{prefix}shape mismatch: actual {a.shape} vs expected {e.shape}")
    close = _close_mask(a, e, rtol, atol)
    if close.all():
        return
    raise AssertionError(prefix + _report(a, e, close, rtol, atol, name))


def _report(a, e, close, rtol, atol, name) -> str:
    wide = np.complex128 if "c" in (a.dtype.kind, e.dtype.kind) else np.float64
    af, ef = a.astype(wide), e.astype(wide)
    bad = ~close
    with np.errstate(all="ignore"):
        abs_err = np.abs(af - ef)
        rel_err = abs_err / np.abs(ef)
        excess = abs_err - (atol + rtol * np.abs(ef))
    excess = np.where(np.isnan(excess), np.inf, excess)  # NaN or inf mismatches rank first
    worst = _index(np.argmax(np.where(bad, excess, -np.inf)), a.shape)
    lines = [
        f"arrays not close (dtype {name}, rtol={rtol:g}, atol={atol:g}): "
        f"{int(bad.sum())} of {a.size} elements mismatch ({100.0 * bad.sum() / a.size:.3g}%)",
        f"  worst at index {worst}: actual {a[worst].item()!r}, expected {e[worst].item()!r}",
    ]
    for label, err in (("abs", abs_err), ("rel", rel_err)):
        finite = np.where(np.isfinite(err), err, -1.0)
        if finite.max() >= 0:
            idx = _index(np.argmax(finite), a.shape)
            lines.append(f"  max {label} error {float(err[idx]):.6g} at index {idx}")
    nan_mismatch = np.isnan(af) != np.isnan(ef)
    if nan_mismatch.any():
        lines.append(f"  NaN in only one of the arrays at {int(nan_mismatch.sum())} element(s)")
    return "\n".join(lines)


def _index(flat: np.intp, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(flat), shape))


def round_tf32(x: Any) -> np.ndarray:
    """``x`` (f32) rounded to TF32 as the tensor cores' operands are (``cvt.rna.tf32.f32``: 10
    mantissa bits, to nearest, ties away from zero; inf and NaN stay): the reference for kernels
    that multiply on TF32 tensor cores (``mma_sync_m16n8k8_tf32``)."""
    a, _ = to_numpy(x)
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    finite = (u & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    return np.where(finite, (u + np.uint32(0x1000)) & np.uint32(0xFFFFE000), u).view(np.float32)
