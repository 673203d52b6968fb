"""C spellings: type names, unique identifiers, entry-point names."""
from __future__ import annotations

import re

from ...ir.dtypes import ScalarType, bf16, f16
from ...ir.expr import Var

_CTYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "float16": "_Float16", "bfloat16": "float", "float32": "float", "float64": "double",
}
_C_KEYWORDS = frozenset("""auto break case char const continue default do double else enum extern float for
goto if inline int long register restrict return short signed sizeof static struct switch typedef union
unsigned void volatile while bool true false main NAN INFINITY
""".split())
#: Identifiers the generated code calls or names inside functions that also hold user names: a
#: parameter called ``exp`` or ``free`` must not shadow them.
_C_RESERVED = _C_KEYWORDS | frozenset("""exp expf exp2 exp2f log logf log2 log2f sqrt sqrtf tanh tanhf erf erff
fabs fabsf sin sinf cos cosf floor floorf ceil ceilf nearbyint nearbyintf pow powf fma fmaf fmin fminf fmax fmaxf
fmod fmodf free malloc calloc aligned_alloc memset memcpy mmap munmap int8_t int16_t int32_t int64_t uint8_t
uint16_t uint32_t uint64_t uintptr_t size_t
""".split())


def ctype(t: ScalarType) -> str:
    """The C type of a scalar *value* (bf16 values are computed in float, stored as uint16)."""
    return _CTYPES[t.name]


def scalar_abi_type(t: ScalarType) -> str:
    """The C type of a scalar argument of an exported entry (ctypes cannot pass half floats)."""
    return "float" if t in (f16, bf16) else ctype(t)


def entry_name(kernel: str) -> str:
    return f"tm_entry_{kernel}"


class CNames:
    """Unique, valid C identifiers for IR variables and symbolic sizes."""

    def __init__(self) -> None:
        self._by_id: dict[int, str] = {}
        self._sizes: dict[str, str] = {}
        self._used: set[str] = set()
        self._keep: list[Var] = []

    def _fresh(self, base: str) -> str:
        base = re.sub(r"\W", "_", base) or "v"
        reserved_prefix = base.lower().startswith("tm_") or (base[0] == "_" and base[1:2].isupper()) \
            or base.startswith("__")
        if base[0].isdigit() or base in _C_RESERVED or reserved_prefix:
            base = "v_" + base
        name, k = base, 0
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name

    def __call__(self, v: Var) -> str:
        name = self._by_id.get(id(v))
        if name is None:
            name = self._by_id[id(v)] = self._fresh(v.name)
            self._keep.append(v)
        return name

    def size(self, name: str) -> str:
        c = self._sizes.get(name)
        if c is None:
            c = self._sizes[name] = self._fresh(name)
        return c
