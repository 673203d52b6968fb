"""Make GPU compiler logs readable: point each error at the generated source lines around it.

NVRTC reports ``vec_add.cu(6): error: expected a ";"`` and clang-based hipRTC reports
``/tmp/comgr-1a2b/input/CompileSource:6:12: error: ...``.  Both logs are kept verbatim; after
every error block that refers to the generated program (not to an included header) the source
lines around the error are appended, numbered, with the offending line marked ``>``::

    vec_add.cu(6): error: expected a ";"
       a[0] = 1.0f
       ^

      generated source around line 6:
             4 | extern "C" __global__ void vec_add(float* a) {
             5 |   int i = threadIdx.x;
        >    6 |   a[0] = 1.0f
             7 | }
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

#: ``file(LINE): error: message`` (NVRTC / EDG front end); also "catastrophic error".
NVRTC_DIAG = re.compile(r"^(?P<file>[^\s()][^()]*?)\((?P<line>\d+)\): (?P<kind>(?:catastrophic )?error|warning)\b")
#: ``file:LINE:COL: error: message`` (clang, as used by hipRTC / comgr).
CLANG_DIAG = re.compile(r"^(?P<file>\S[^:]*?):(?P<line>\d+):(?P<col>\d+): (?P<kind>(?:fatal )?error|warning)\b")
#: Summary lines that end the last diagnostic block ("2 errors generated ...", "1 error detected ...").
_SUMMARY = re.compile(r"^\d+ errors? (generated|detected)")


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int
    kind: str
    text: str  # the whole diagnostic line


def diagnostics(log: str, pattern: re.Pattern[str]) -> list[Diagnostic]:
    """Every diagnostic line in ``log`` matching ``pattern`` (errors and warnings)."""
    out = []
    for text in log.splitlines():
        m = pattern.match(text)
        if m:
            out.append(Diagnostic(m["file"], int(m["line"]), m["kind"], text.strip()))
    return out


def first_error(log: str, pattern: re.Pattern[str]) -> str | None:
    """The first error line of ``log`` (for the one-line BuildError message), else None."""
    for d in diagnostics(log, pattern):
        if "error" in d.kind:
            return d.text
    for text in log.splitlines():  # e.g. "nvrtc: error: invalid value for --gpu-architecture"
        if "error" in text:
            return text.strip()
    return None


def source_excerpt(source: str, line: int, context: int = 2, indent: str = "  ") -> str:
    """Lines ``line-context .. line+context`` of ``source``, numbered, ``line`` marked ``>``."""
    lines = source.splitlines()
    if not 1 <= line <= len(lines):
        return f"{indent}(line {line} is outside the generated source, which has {len(lines)} lines)"
    lo, hi = max(1, line - context), min(len(lines), line + context)
    width = len(str(hi))
    rows = [f"{indent}generated source around line {line}:"]
    for n in range(lo, hi + 1):
        mark = ">" if n == line else " "
        rows.append(f"{indent}  {mark} {n:>{width}} | {lines[n - 1]}")
    return "\n".join(rows)


def annotate_log(
    log: str,
    source: str,
    pattern: re.Pattern[str],
    is_program: Callable[[str], bool],
    context: int = 2,
) -> str:
    """``log`` with a numbered source excerpt after each error block in the program itself.

    ``is_program(file)`` tells whether a diagnostic's file is the generated program (errors in
    headers are left alone).  A block ends at a blank line, at the next diagnostic, or at the end.
    """
    out: list[str] = []
    pending: int | None = None

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            out.append("")
            out.append(source_excerpt(source, pending, context))
            pending = None

    for text in log.rstrip().splitlines():
        m = pattern.match(text)
        if m or not text.strip() or _SUMMARY.match(text):
            flush()
        if m and "error" in m["kind"] and is_program(m["file"]):
            pending = int(m["line"])
        out.append(text)
    flush()
    return "\n".join(out)
