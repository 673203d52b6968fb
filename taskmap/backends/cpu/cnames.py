"""C spellings of the CPU backend: value types, argument types, entry-point names."""
from __future__ import annotations

from ...ir.dtypes import ScalarType, bf16, f16
from ..clike import CLikeFuncGen


def ctype(t: ScalarType) -> str:
    """The C type of a scalar *value* (bf16 values are computed in float, stored as uint16)."""
    return CLikeFuncGen.TYPES[t.name]


def scalar_abi_type(t: ScalarType) -> str:
    """The C type of a scalar argument of an exported entry (ctypes cannot pass half floats)."""
    return "float" if t in (f16, bf16) else ctype(t)


def entry_name(kernel: str) -> str:
    return f"tm_entry_{kernel}"


def packed_name(kernel: str) -> str:
    """The entry taking the arguments as one array of 64-bit words (``codegen.packed_entry``)."""
    return f"tm_packed_{kernel}"
