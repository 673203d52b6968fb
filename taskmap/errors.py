"""Every exception type taskmap raises on purpose, in one place.

All of them derive from :class:`TaskmapError`, so ``except taskmap.errors.TaskmapError`` catches
anything the library reports deliberately. Constructor arguments are kept in ``self.args`` so the
exceptions survive pickling (multiprocessing, pytest-xdist); the user-facing text is built by
``__str__``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from os import PathLike

#: How many trailing lines of a compiler log ``str(BuildError)`` shows (``.log`` keeps all).
LOG_TAIL_LINES = 60


class TaskmapError(Exception):
    """Base class of all taskmap errors."""


class DSLError(TaskmapError):
    """A mistake in user kernel code, pointing at the user's file, line and column.

    ``col`` is 0-based, as in Python's ``ast`` (``node.col_offset``); the header shows it 1-based,
    as compilers and editors do. Rendered as::

        path/to/file.py:12:15: error: name 'undefined_name' is not defined
            c[i] = a[i] + undefined_name
                          ^
    """

    def __init__(
        self,
        message: str,
        filename: str | None = None,
        lineno: int | None = None,
        col: int | None = None,
        source_line: str | None = None,
    ):
        super().__init__(message, filename, lineno, col, source_line)
        self.msg = message
        self.filename = filename
        self.lineno = lineno
        self.col = col
        self.source_line = source_line

    def __str__(self) -> str:
        location = self.filename or "<unknown>"
        if self.lineno is not None:
            location += f":{self.lineno}"
            if self.col is not None:
                location += f":{self.col + 1}"
        text = f"{location}: error: {self.msg}"
        if self.source_line and self.source_line.strip():
            line = self.source_line.rstrip("\r\n")
            body = line.lstrip()
            text += "\n    " + body
            if self.col is not None:
                # Pad with the same characters the line uses (tabs stay tabs) so the caret lines up.
                offset = max(self.col - (len(line) - len(body)), 0)
                pad = "".join(ch if ch == "\t" else " " for ch in body[:offset])
                text += "\n    " + pad + "^"
        return text


class IRError(TaskmapError):
    """The IR broke an invariant (raised by the verifier, and by passes on malformed input)."""


class LaunchError(TaskmapError, ValueError):
    """A compiled kernel was called with wrong shapes, dtypes, layouts or devices."""


class BuildError(TaskmapError):
    """A compiler (NVRTC, hipRTC, gcc) rejected generated code.

    ``log`` holds the full compiler output; ``str()`` shows its last :data:`LOG_TAIL_LINES` lines
    together with the generated source's path and a command that reproduces the failure.
    """

    def __init__(
        self,
        message: str,
        log: str = "",
        source_path: str | PathLike[str] | None = None,
        command: str | Sequence[str] | None = None,
    ):
        super().__init__(message, log, source_path, command)
        self.message = message
        self.log = log or ""
        self.source_path = source_path
        self.command = command

    def __str__(self) -> str:
        parts = [self.message]
        if self.source_path is not None:
            parts.append(f"  generated source: {self.source_path}")
        if self.command:
            cmd = self.command if isinstance(self.command, str) else shlex.join(map(str, self.command))
            parts.append(f"  reproduce with: {cmd}")
        lines = self.log.rstrip().splitlines()
        if lines:
            if len(lines) > LOG_TAIL_LINES:
                parts.append(f"  compiler log (last {LOG_TAIL_LINES} of {len(lines)} lines):")
                lines = lines[-LOG_TAIL_LINES:]
            else:
                parts.append("  compiler log:")
            parts.extend("    " + line for line in lines)
        return "\n".join(parts)


class ComputeError(TaskmapError, ValueError):
    """A malformed compute definition (bad shape, wrong number of indices, foreign tensors)."""


class OpError(TaskmapError, ValueError):
    """An operator of ``taskmap.ops`` got arguments it cannot accept: shapes that do not broadcast,
    an axis out of range, bad pads, a wrong ``normalized_shape``, an unsupported dtype."""


class UnsupportedError(TaskmapError):
    """A valid request that this version (or this target) does not handle."""


class CacheError(TaskmapError):
    """The on-disk compile cache cannot be used (e.g. it points at a directory it does not own)."""


class FusionError(TaskmapError, ValueError):
    """Post-scheduling fusion (``taskmap.fusion.fuse``) cannot splice a prologue or epilogue into
    an anchor kernel; the message says why.  Callers fall back to separate kernels."""


class CaptureError(UnsupportedError):
    """A PyTorch model that cannot be captured as one graph (``taskmap.compile`` needs its whole
    forward: data-dependent control flow, ``.item()`` / ``.tolist()`` feeding Python, ...)."""

    def __init__(self, model: str, reason: str, by: str = ""):
        super().__init__(model, reason, by)
        self.model, self.reason, self.by = model, reason, by

    def __str__(self) -> str:
        who = f"{self.by} could not" if self.by else "neither torch.fx, torch.export nor torch._dynamo.export could"
        return (f"{self.model}: taskmap.compile captures the whole forward as one graph, and {who} capture this "
                f"one:\n{self.reason}\n"
                'torch.compile(model, backend="taskmap") compiles the parts between such graph breaks (PyTorch '
                "runs the rest).")


class EagerFallbackWarning(UserWarning):
    """Under ``torch.compile(backend="taskmap")`` with ``fallback`` (the default), a graph (or a
    region of a split graph) that taskmap could not compile runs in PyTorch; the warning names
    the error."""


class UnsupportedOpsError(UnsupportedError):
    """A model uses operators the frontend cannot convert.  ``ops`` lists them all (one
    ``(op, where, reason)`` triple each); the message names every one and how to run the model
    anyway (``fallback=True`` runs those parts in PyTorch)."""

    FALLBACK_HINT = "Pass fallback=True to taskmap.compile (the default under torch.compile) to run them in PyTorch."

    def __init__(self, ops: Sequence[tuple[str, str, str]], hint: str = FALLBACK_HINT):
        super().__init__(list(ops))
        self.ops = list(ops)
        self.hint = hint

    def __str__(self) -> str:
        lines = [f"{len(self.ops)} unsupported operator(s):"]
        lines += [f"  {op} at {where}" + (f": {reason}" if reason else "") for op, where, reason in self.ops]
        lines.append(self.hint)
        return "\n".join(lines)
