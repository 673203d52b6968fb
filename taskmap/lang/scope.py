"""Name resolution for kernel bodies: bindings, run-time blocks, and which names are local.

The rule for local names (Python scoping, made explicit for a compiler):

* A name is **local** if the function assigns it anywhere (as in Python); reading a local before
  its first assignment is an error, reading a non-local resolves in the closure, the globals,
  then the builtins.
* A local is a **compile-time value** (no IR variable; its uses see the Python value) when

  - its value is not a number (a task mapping, a tuple, a config object, a tensor alias...), or
  - its value is a Python number, or an expression of symbolic sizes and constants only, and
    the name has exactly one assignment statement in the function (no ``+=``, no annotation).

* Every other local is a **run-time scalar variable**: its first assignment declares it
  (``DeclScalar``, typed by the value), later ones assign it (the value cast to its type).
* Blocks (bodies of run-time ``for``/``while``/``if``) nest: a variable declared in a block is
  visible in that block and in blocks nested in it. A variable first assigned inside a block and
  read after it is *hoisted*: the transpiler declares it (uninitialised, with the type of its
  first assignment) just before the compound statement, so ``if c: y = 1.0`` / ``else: y = 2.0``
  followed by a use of ``y`` works as in Python.
* ``if`` with a compile-time condition keeps only the branch taken and opens no block.
"""
from __future__ import annotations

import ast
import enum
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator


class BindKind(enum.Enum):
    SCALAR = "scalar"  # a mutable local scalar (DeclScalar)
    PARAM = "param"    # a scalar parameter (mutable, like a C parameter)
    TENSOR = "tensor"  # a tensor parameter, a shared/register tensor, or an alias of one
    LOOP = "loop"      # a loop variable (read-only)
    CONST = "const"    # a compile-time Python value


class LoopKind(enum.Enum):
    NONE = "none"        # not a loop (a branch of an if)
    RANGE = "range"      # for over range/unroll/parallel/vectorize, or while
    MAPPING = "mapping"  # for over a task mapping


@dataclass(eq=False)
class Frame:
    """One run-time block: the compound statement that opened it, and whether it is a loop."""

    node: ast.AST
    loop: LoopKind = LoopKind.NONE


@dataclass(eq=False)
class Binding:
    kind: BindKind
    value: Any                     # a Var (SCALAR/PARAM/TENSOR/LOOP) or a Python value (CONST)
    frames: tuple[Frame, ...]      # the blocks open where the binding was made


class Scope:
    """The bindings of one function (names are function-scoped) and the stack of open blocks."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.bindings: dict[str, Binding] = {}

    @contextmanager
    def block(self, frame: Frame) -> Iterator[Frame]:
        self.frames.append(frame)
        try:
            yield frame
        finally:
            self.frames.pop()

    def bind(self, name: str, kind: BindKind, value: Any) -> Binding:
        b = Binding(kind, value, tuple(self.frames))
        self.bindings[name] = b
        return b

    def get(self, name: str) -> Binding | None:
        return self.bindings.get(name)

    def common(self, b: Binding) -> int:
        """How many of the blocks open at ``b``'s binding are still open now."""
        n = 0
        for x, y in zip(b.frames, self.frames):
            if x is not y:
                break
            n += 1
        return n

    def visible(self, b: Binding) -> bool:
        """Whether ``b`` was made in the current block or in one enclosing it."""
        return self.common(b) == len(b.frames)

    def same_block(self, b: Binding) -> bool:
        return self.visible(b) and len(b.frames) == len(self.frames)

    def innermost_loop(self) -> Frame | None:
        for f in reversed(self.frames):
            if f.loop is not LoopKind.NONE:
                return f
        return None

    @property
    def top_level(self) -> bool:
        return not self.frames


@dataclass
class AssignmentInfo:
    """What a pre-scan of the function body says about its local names."""

    sites: Counter = field(default_factory=Counter)   # assignment statements per name
    loop_targets: set[str] = field(default_factory=set)
    runtime: set[str] = field(default_factory=set)     # names that must be run-time variables

    @property
    def assigned(self) -> set[str]:
        """Names Python would treat as local to the function."""
        return set(self.sites) | self.loop_targets

    def single_site(self, name: str) -> bool:
        return self.sites[name] <= 1 and name not in self.runtime


def target_names(target: ast.AST) -> list[str]:
    """The plain names bound by an assignment target (nested tuples included)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in target_names(elt)]
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    return []


def scan_assignments(fn: ast.FunctionDef) -> AssignmentInfo:
    """Count the assignment statements of every local name of ``fn`` (nested defs excluded)."""
    info = AssignmentInfo()
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue  # rejected later as unsupported syntax
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for name in target_names(t):
                    info.sites[name] += 1
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            for name in target_names(node.target):
                info.sites[name] += 1
                info.runtime.add(name)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            info.loop_targets.update(target_names(node.target))
        todo.extend(ast.iter_child_nodes(node))
    info.runtime.update(n for n, c in info.sites.items() if c > 1)
    return info
