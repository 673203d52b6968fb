"""Simplify index arithmetic and fold constant control flow (see ``ir.simplify``).

Expects: any IR.  Produces: the same program, with simpler expressions.
"""
from __future__ import annotations

from ..ir.func import Module
from ..ir.simplify import simplify_module


def simplify(module: Module) -> Module:
    return simplify_module(module)
