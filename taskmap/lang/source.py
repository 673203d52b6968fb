"""Where kernel code comes from: a Python function's source text, its AST and its outer names.

Everything that turns an AST node into a user-facing location lives here, so that every
:class:`~taskmap.errors.DSLError` points at the user's file with the *absolute* line number and
the column in the *original* (not dedented) source line.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
import types
from typing import Any

from ..errors import DSLError

_MISSING = object()

# Friendly names of the Python syntax the DSL does not accept (``unsupported syntax: <what>``).
_SYNTAX_NAMES = {
    "Lambda": "lambda", "ListComp": "list comprehension", "SetComp": "set comprehension",
    "DictComp": "dict comprehension", "GeneratorExp": "generator expression", "Dict": "dict literal",
    "Set": "set literal", "JoinedStr": "f-string", "FormattedValue": "f-string",
    "Starred": "starred expression", "Slice": "slice", "Await": "await", "Yield": "yield",
    "YieldFrom": "yield from", "NamedExpr": "assignment expression (:=)", "With": "with statement",
    "AsyncWith": "async with statement", "Try": "try statement", "TryStar": "try statement",
    "Raise": "raise statement", "Global": "global statement", "Nonlocal": "nonlocal statement",
    "ClassDef": "class definition", "FunctionDef": "nested function definition",
    "AsyncFunctionDef": "async function definition", "AsyncFor": "async for loop",
    "Import": "import statement", "ImportFrom": "import statement", "Delete": "del statement",
    "Match": "match statement", "MatMult": "@ operator", "TypeAlias": "type alias",
}


def syntax_name(node: ast.AST) -> str:
    """How an unsupported AST node is named in error messages."""
    name = type(node).__name__
    return _SYNTAX_NAMES.get(name, name)


class KernelSource:
    """The parsed source of one Python function, with its globals and closure.

    ``tree`` is the function's ``ast.FunctionDef``; line numbers in it are relative to the
    dedented source, which :meth:`error` maps back to the file.
    """

    def __init__(self, fn: Any) -> None:
        if not isinstance(fn, types.FunctionType):
            raise TypeError(f"expected a Python function defined with `def`, got {fn!r}")
        self.fn = fn
        self.name: str = fn.__name__
        code = fn.__code__
        self.filename: str = code.co_filename
        try:
            lines, start = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise DSLError(
                f"cannot read the source code of '{self.name}' ({e}); kernels and device functions "
                "must be defined with `def` in a Python file (not with exec or in an interactive prompt)",
                self.filename, code.co_firstlineno,
            ) from None
        self.filename = inspect.getsourcefile(fn) or self.filename
        self.start: int = max(start, 1)
        self.orig_lines = [line.rstrip("\n") for line in lines]
        text = "".join(lines)
        self.shift = 0  # lines the parsed text has before the function's first line
        try:
            dedented = textwrap.dedent(text)
            module = ast.parse(dedented, filename=self.filename)
            self.ded_lines = dedented.split("\n")
        except SyntaxError as e:
            # A continuation line less indented than the `def` (a multi-line string) defeats
            # dedent; an `if` block accepts the original indentation as it is.
            try:
                module = ast.parse("if 1:\n" + text, filename=self.filename)
                module.body = module.body[0].body  # type: ignore[attr-defined]
                self.shift, self.ded_lines = 1, text.split("\n")
            except SyntaxError:
                lineno = e.lineno or 1
                raise DSLError(f"cannot parse the source of '{self.name}': {e.msg}", self.filename,
                               self.start + lineno - 1, None, self._orig(lineno)) from None
        node = module.body[0] if module.body else None
        if isinstance(node, ast.AsyncFunctionDef):
            raise self.error(node, "unsupported syntax: async function definition")
        if not isinstance(node, ast.FunctionDef):
            raise DSLError(
                f"'{self.name}' must be defined with `def` to be used as a kernel or device function "
                "(lambdas are not supported)", self.filename, self.start, None, self._orig(1))
        self.tree: ast.FunctionDef = node
        self.globals: dict[str, Any] = fn.__globals__
        self.closure: dict[str, Any] = {}
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                self.closure[name] = cell.cell_contents
            except ValueError:  # an empty cell: the outer variable is not assigned yet
                pass
        b = self.globals.get("__builtins__", builtins)
        self.builtins: dict[str, Any] = b if isinstance(b, dict) else vars(b)

    # ------------------------------------------------------------------ names
    def lookup_outer(self, name: str) -> Any:
        """The value of ``name`` in the closure, the globals or the builtins, else ``_MISSING``."""
        for ns in (self.closure, self.globals, self.builtins):
            if name in ns:
                return ns[name]
        return _MISSING

    def eval_annotation(self, node: ast.expr, name: str | None = None) -> Any:
        """Evaluate an annotation expression (or a string annotation) in the function's scope.

        Python already evaluated ``name``'s annotation when the ``def`` ran (unless the module uses
        ``from __future__ import annotations``); that value is used first, since it also sees the
        enclosing function's locals that the body does not mention (``def make(dt): ... a: dt[n]``).
        """
        evaluated = getattr(self.fn, "__annotations__", {}).get(name) if name is not None else None
        if evaluated is not None and not isinstance(evaluated, str):
            return evaluated
        code = compile(ast.Expression(body=node), self.filename, "eval")
        value = eval(code, self.globals, dict(self.closure))
        return self.eval_text(value) if isinstance(value, str) else value

    def eval_text(self, text: str) -> Any:
        """Evaluate a string annotation (``from __future__ import annotations`` style)."""
        return eval(text, self.globals, dict(self.closure))

    # ------------------------------------------------------------------ locations
    def _orig(self, lineno: int) -> str | None:
        return self.orig_lines[lineno - 1] if 0 < lineno <= len(self.orig_lines) else None

    def location(self, node: ast.AST | None) -> tuple[int, int | None, str | None]:
        """(absolute line, column in the original line, original line) of ``node``."""
        if node is None or getattr(node, "lineno", None) is None:
            node = self.tree
        lineno: int = node.lineno - self.shift  # type: ignore[attr-defined]
        col: int | None = getattr(node, "col_offset", None)
        orig = self._orig(lineno)
        if col is not None and orig is not None and lineno <= len(self.ded_lines):
            ded = self.ded_lines[lineno - 1]
            # ast columns count UTF-8 bytes; DSLError columns count characters.
            chars = len(ded.encode("utf-8")[:col].decode("utf-8", errors="ignore"))
            col = len(orig) - len(ded) + chars
        return self.start + lineno - 1, col, orig

    def error(self, node: ast.AST | None, message: str) -> DSLError:
        """A DSLError located at ``node`` (the function's ``def`` line when None)."""
        lineno, col, line = self.location(node)
        return DSLError(message, self.filename, lineno, col, line)

    def snippet(self, node: ast.AST, limit: int = 60) -> str:
        """The source text of ``node``, shortened for messages."""
        try:
            text = ast.unparse(node)
        except Exception:  # pragma: no cover - unparse handles every expression node
            text = type(node).__name__
        return text if len(text) <= limit else text[: limit - 3] + "..."
