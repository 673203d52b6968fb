"""A model's ``forward`` signature: calls bound to parameter names (the compiled module's
key), the arguments that hold no tensor (traced as values), and bound arguments as a call again.

``inspect.signature`` costs ~15 us a call, more than launching a small compiled model: the
signature is read once per forward function, and calls of plain parameters bind without it.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree


@dataclass(frozen=True)
class ForwardSignature:
    """A model's ``forward`` signature (without ``self``) and what binding a call needs of it."""

    sig: inspect.Signature
    plain: bool            # parameters that positional arguments can fill, no ``*args`` / ``**kw``
    names: tuple[str, ...]
    required: int          # how many come before the first default
    defaults: dict[str, Any]
    named: tuple[str, ...]             # the parameters but ``*args`` / ``**kwargs``
    var_positional: str | None         # the ``*args`` parameter

    @staticmethod
    def of(sig: inspect.Signature) -> "ForwardSignature":
        ps = list(sig.parameters.values())
        plain = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY) for p in ps)
        required = next((i for i, p in enumerate(ps) if p.default is not p.empty), len(ps))
        return ForwardSignature(sig, plain, tuple(p.name for p in ps), required,
                                {p.name: p.default for p in ps if p.default is not p.empty},
                                tuple(p.name for p in ps if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)),
                                next((p.name for p in ps if p.kind is p.VAR_POSITIONAL), None))

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments by parameter name, defaults applied (``sig.bind`` + ``apply_defaults``)."""
        if self.plain and not kwargs and self.required <= len(args) <= len(self.names):
            out = dict(zip(self.names, args))
            for n in self.names[len(args):]:
                out[n] = self.defaults[n]
            return out
        bound = self.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        out = dict(bound.arguments)
        for name, p in self.sig.parameters.items():
            if p.kind is p.VAR_KEYWORD and name in out:
                out.update(out.pop(name))
        return out


def forward_signature(model: torch.nn.Module) -> ForwardSignature:
    """The signature of ``model.forward``, cached per forward function."""
    forward = model.forward
    fn = getattr(forward, "__func__", None)
    if fn is not None and getattr(forward, "__self__", None) is model:
        return _method_signature(fn)
    return ForwardSignature.of(inspect.signature(forward))


@functools.lru_cache(maxsize=256)
def _method_signature(fn: Callable[..., Any]) -> ForwardSignature:
    sig = inspect.signature(fn)
    return ForwardSignature.of(sig.replace(parameters=list(sig.parameters.values())[1:]))   # without self


def bind(model: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by forward-parameter name (defaults applied)."""
    return forward_signature(model).bind(args, kwargs)


def constant_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments that hold no tensor (see :func:`try_symbolic_trace`)."""
    return {n: v for n, v in arguments.items()
            if not any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(v))}


def call_arguments(fs: ForwardSignature, arguments: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Bound ``arguments`` as a call again: ``*args`` spread, the rest by keyword."""
    var = fs.var_positional
    if var is None:
        return [], dict(arguments)
    before = fs.names[:fs.names.index(var)]
    args = [arguments[n] for n in before if n in arguments] + list(arguments.get(var, ()))
    return args, {n: v for n, v in arguments.items() if n not in before and n != var}


__all__ = ["ForwardSignature", "bind", "call_arguments", "constant_arguments", "forward_signature"]
