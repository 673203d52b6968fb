"""Recurrent layers: ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` (and ``torch.lstm`` / ``torch.gru`` /
``torch.rnn_tanh`` / ``torch.rnn_relu``, ATen's ``lstm.input`` / ...), unrolled over the sequence;
their cells (``nn.LSTMCell`` / ``nn.GRUCell`` / ``nn.RNNCell``, ``torch.lstm_cell`` / ...), one
step each.

Per layer and direction, the input projection of every step is one linear (``T*B`` rows); each
step then adds the recurrent linear of the previous state and applies the gates (PyTorch's
equations, gate order i, f, g, o for the LSTM and r, z, n for the GRU; ``tanh`` or ``relu`` of
the sum for the plain RNN) — ops that fuse into the recurrent linear's epilogue and the next step's
prologue.  A step's slice of the projection is a view of it (no copy, no kernel of its own), so
every step of a layer runs the same kernels.  A bidirectional layer runs its second direction
from the last step back; the layer's output joins both along the features.  An LSTM with projections (``proj_size``) projects each step's state by
one more linear (``h = W_hr (o * tanh(c))``).  Eval mode: dropout between layers (training only)
is not converted, nor are packed sequences or sequences longer than :data:`MAX_STEPS`.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from ...graph import AxisAttrs, BinaryFn, OpKind, Tensor, UnaryFn
from .ops_nn import linear
from .registry import Converter, NotConvertible, register

#: The most steps stacked by one concatenation (:func:`_stack`).
FLAT_STACK = 32
#: The longest sequence unrolled; longer ones are left to PyTorch (``fallback=True``).  Each step
#: reads its slice of the input projection as a view and writes inside the stacked output
#: (:mod:`taskmap.graph.views`, :mod:`taskmap.runtime.concat_inplace`), so the steps share their
#: kernels, but the graph still grows with the sequence: a 2 x 512 LSTM compiles in 4 s cold at 128
#: steps, 7 s at 256 and 20 s at 1024 (half of it PyTorch's trace).
MAX_STEPS = 1024


def _gates(cv: Converter, g: Tensor, n: int, hidden: int) -> list[Tensor]:
    return [cv.slice(g, 1, k * hidden, (k + 1) * hidden) for k in range(n)]


def _sig(cv: Converter, x: Tensor) -> Tensor:
    return cv.unary(UnaryFn.SIGMOID, x)


def _lstm_step(cv: Converter, gx: Tensor, state: tuple[Tensor, ...], w_hh: Tensor, b_hh: Any,
               w_hr: Tensor | None = None) -> tuple[Tensor, ...]:
    h, c = state
    i, f, g, o = _gates(cv, cv.binary(BinaryFn.ADD, gx, linear(cv, h, w_hh, b_hh)), 4, c.shape[1])
    c = cv.binary(BinaryFn.ADD, cv.binary(BinaryFn.MUL, _sig(cv, f), c),
                  cv.binary(BinaryFn.MUL, _sig(cv, i), cv.unary(UnaryFn.TANH, g)))
    h = cv.binary(BinaryFn.MUL, _sig(cv, o), cv.unary(UnaryFn.TANH, c))
    return (h if w_hr is None else linear(cv, h, w_hr, None)), c


def _gru_step(cv: Converter, gx: Tensor, state: tuple[Tensor, ...], w_hh: Tensor, b_hh: Any,
              w_hr: None = None) -> tuple[Tensor, ...]:
    (h,) = state
    hidden = h.shape[1]
    xr, xz, xn = _gates(cv, gx, 3, hidden)
    hr, hz, hn = _gates(cv, linear(cv, h, w_hh, b_hh), 3, hidden)
    r, z = _sig(cv, cv.binary(BinaryFn.ADD, xr, hr)), _sig(cv, cv.binary(BinaryFn.ADD, xz, hz))
    n = cv.unary(UnaryFn.TANH, cv.binary(BinaryFn.ADD, xn, cv.binary(BinaryFn.MUL, r, hn)))
    # (1 - z) * n + z * h  ==  n + z * (h - n)
    return (cv.binary(BinaryFn.ADD, n, cv.binary(BinaryFn.MUL, z, cv.binary(BinaryFn.SUB, h, n))),)


def _elman_step(fn: UnaryFn) -> Any:
    """``nn.RNN``'s step: ``h = fn(x W_ih^T + b_ih + h W_hh^T + b_hh)``."""
    def step(cv: Converter, gx: Tensor, state: tuple[Tensor, ...], w_hh: Tensor, b_hh: Any,
             w_hr: None = None) -> tuple[Tensor, ...]:
        return (cv.unary(fn, cv.binary(BinaryFn.ADD, gx, linear(cv, state[0], w_hh, b_hh))),)
    return step


#: Per mode: the step and the number of states it carries.
STEPS = {"lstm": (_lstm_step, 2), "gru": (_gru_step, 1), "rnn_tanh": (_elman_step(UnaryFn.TANH), 1),
         "rnn_relu": (_elman_step(UnaryFn.RELU), 1)}


def _stack(cv: Converter, xs: Sequence[Tensor]) -> Tensor:
    """``torch.stack(xs)``: one concatenation of up to :data:`FLAT_STACK` steps; beyond, one of
    about ``sqrt(n)`` concatenations of ``sqrt(n)`` steps each.  (A concatenation is a chain of
    selects in the kernel that reads it: hundreds deep, the lowering's recursion would not reach
    its end; nested by halves, every level would repeat the index arithmetic of the one above.
    Each is a group of its own (:data:`taskmap.graph.partition.MAX_PROLOGUE_CONCAT`), its copy
    kernel dropped where the steps write in place.)"""
    parts = [cv.reshape(x, (1, *x.shape)) for x in xs]
    if len(parts) > FLAT_STACK:
        size = math.isqrt(len(parts) - 1) + 1
        parts = [cv.op(OpKind.CONCAT, parts[k:k + size], AxisAttrs(0)) if len(parts[k:k + size]) > 1 else parts[k]
                 for k in range(0, len(parts), size)]
    return parts[0] if len(parts) == 1 else cv.op(OpKind.CONCAT, parts, AxisAttrs(0))


def run_rnn(cv: Converter, mode: str, x: Tensor, hx: Sequence[Tensor], params: Sequence[Tensor], has_biases: bool,
            num_layers: int, dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, ...]:
    """``torch.lstm`` / ``torch.gru`` / ``torch.rnn_tanh`` / ``torch.rnn_relu`` on a padded batch: the
    output and the final states."""
    if not isinstance(x, Tensor) or x.ndim != 3:
        raise NotConvertible(f"{mode} of packed sequences")
    if train and dropout:
        raise NotConvertible(f"{mode} with dropout in training mode (call model.eval())")
    dirs, per = 2 if bidirectional else 1, 4 if has_biases else 2
    proj = mode == "lstm" and len(params) == num_layers * dirs * (per + 1)     # each layer's w_hr last
    if len(params) != num_layers * dirs * (per + proj):
        raise NotConvertible(f"{mode} with {len(params)} weights for {num_layers} layers")
    step, n_states = STEPS[mode]
    if batch_first:
        x = cv.permute(x, (1, 0, 2))
    steps, batch = x.shape[0], x.shape[1]
    if steps > MAX_STEPS:
        raise NotConvertible(f"{mode} over {steps} steps (taskmap unrolls at most {MAX_STEPS})")
    final: list[list[Tensor]] = [[] for _ in range(n_states)]
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = (layer * dirs + d) * (per + proj)
            w_ih, w_hh = params[k], params[k + 1]
            b_ih, b_hh = (params[k + 2], params[k + 3]) if has_biases else (None, None)
            w_hr = params[k + per] if proj else None
            gx = cv.reshape(linear(cv, cv.reshape(x, (steps * batch, x.shape[2])), w_ih, b_ih),
                            (steps, batch, w_ih.shape[0]))
            state = tuple(cv.reshape(cv.slice(s, 0, layer * dirs + d, layer * dirs + d + 1), (batch, s.shape[2]))
                          for s in hx)
            out: list[Any] = [None] * steps
            for t in (range(steps) if d == 0 else reversed(range(steps))):
                state = step(cv, cv.reshape(cv.slice(gx, 0, t, t + 1), (batch, gx.shape[2])), state, w_hh, b_hh,
                             w_hr)
                out[t] = state[0]
            outs.append(_stack(cv, out))
            for s, v in zip(final, state):
                s.append(v)
        x = outs[0] if dirs == 1 else cv.op(OpKind.CONCAT, outs, AxisAttrs(2))
    return (cv.permute(x, (1, 0, 2)) if batch_first else x, *(_stack(cv, s) for s in final))


def _zeros(cv: Converter, n: int, batch: int, hidden: int, like: Tensor) -> Tensor:
    return cv.const(torch.zeros(n, batch, hidden, dtype=getattr(torch, like.dtype.name)))


@register(torch.lstm)
def lstm(cv: Converter, x: Any, hx: Any, params: Any, has_biases: Any, num_layers: Any, dropout: Any, train: Any,
         bidirectional: Any, batch_first: Any = None) -> tuple[Tensor, ...]:
    if isinstance(hx, Tensor):             # (data, batch_sizes, hx, params, ...): packed sequences
        raise NotConvertible("lstm of packed sequences")
    return run_rnn(cv, "lstm", x, list(hx), list(params), has_biases, num_layers, dropout, train, bidirectional,
                   batch_first)


def _one_state(mode: str) -> Any:
    def convert(cv: Converter, x: Any, hx: Any, params: Any, has_biases: Any, num_layers: Any, dropout: Any,
                train: Any, bidirectional: Any, batch_first: Any = None) -> tuple[Tensor, ...]:
        if isinstance(params, Tensor):     # (data, batch_sizes, hx, params, ...): packed sequences
            raise NotConvertible(f"{mode} of packed sequences")
        return run_rnn(cv, mode, x, [hx], list(params), has_biases, num_layers, dropout, train, bidirectional,
                       batch_first)
    return convert


register(torch.gru)(_one_state("gru"))
register(torch.rnn_tanh)(_one_state("rnn_tanh"))
register(torch.rnn_relu)(_one_state("rnn_relu"))


def _mode(m: nn.Module) -> str:
    if isinstance(m, (nn.LSTM, nn.LSTMCell)):
        return "lstm"
    if isinstance(m, (nn.GRU, nn.GRUCell)):
        return "gru"
    return f"rnn_{m.nonlinearity}"


@register(nn.LSTM, nn.GRU, nn.RNN)
def rnn_module(cv: Converter, m: nn.RNNBase, x: Tensor, hx: Any = None) -> tuple[Any, Any]:
    """The module (a leaf of ``torch.fx.symbolic_trace``): its weights as constants; unbatched
    inputs get a batch of one, as the module does."""
    mode = _mode(m)
    unbatched = x.ndim == 2
    if unbatched:
        x = cv.reshape(x, (x.shape[0], 1, x.shape[1]) if not m.batch_first else (1, *x.shape))
    batch = x.shape[0 if m.batch_first else 1]
    dirs = 2 if m.bidirectional else 1
    if hx is None:
        zero = _zeros(cv, m.num_layers * dirs, batch, m.hidden_size, x)
        h0 = _zeros(cv, m.num_layers * dirs, batch, m.proj_size, x) if getattr(m, "proj_size", 0) else zero
        states = [h0, zero] if mode == "lstm" else [zero]
    else:
        states = list(hx) if mode == "lstm" else [hx]
        if unbatched:
            states = [cv.reshape(s, (s.shape[0], 1, s.shape[1])) for s in states]
    params = [cv.param(w, name) for name, w in zip(m._flat_weights_names, m._flat_weights)]
    out, *final = run_rnn(cv, mode, x, states, params, m.bias, m.num_layers, m.dropout, m.training,
                          m.bidirectional, m.batch_first)
    if unbatched:
        out = cv.reshape(out, (out.shape[0] if not m.batch_first else out.shape[1], out.shape[2]))
        final = [cv.reshape(s, (s.shape[0], s.shape[2])) for s in final]
    return out, (tuple(final) if mode == "lstm" else final[0])


def run_cell(cv: Converter, mode: str, x: Tensor, hx: Sequence[Tensor], w_ih: Tensor, w_hh: Tensor, b_ih: Any = None,
             b_hh: Any = None) -> tuple[Tensor, ...]:
    """One step of ``nn.LSTMCell`` / ``nn.GRUCell`` / ``nn.RNNCell`` on a batch: the new states."""
    if not isinstance(x, Tensor) or x.ndim != 2:
        raise NotConvertible(f"{mode} cell of a {getattr(x, 'ndim', '?')}-d input")
    step, _ = STEPS[mode]
    return step(cv, linear(cv, x, w_ih, b_ih), tuple(hx), w_hh, b_hh)


@register(torch.lstm_cell)
def lstm_cell(cv: Converter, x: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None,
              b_hh: Any = None) -> tuple[Any, ...]:
    return run_cell(cv, "lstm", x, list(hx), w_ih, w_hh, b_ih, b_hh)


def _cell(mode: str) -> Any:
    def convert(cv: Converter, x: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None, b_hh: Any = None) -> Tensor:
        return run_cell(cv, mode, x, [hx], w_ih, w_hh, b_ih, b_hh)[0]
    return convert


register(torch.gru_cell)(_cell("gru"))
register(torch.rnn_tanh_cell)(_cell("rnn_tanh"))
register(torch.rnn_relu_cell)(_cell("rnn_relu"))


@register(nn.LSTMCell, nn.GRUCell, nn.RNNCell)
def cell_module(cv: Converter, m: nn.RNNCellBase, x: Tensor, hx: Any = None) -> Any:
    """The cell module (a leaf of ``torch.fx.symbolic_trace``): states of zeros when none are given;
    an unbatched input (and state) gets a batch of one, as the module does."""
    mode = _mode(m)
    unbatched = x.ndim == 1
    if unbatched:
        x = cv.reshape(x, (1, x.shape[0]))
    if hx is None:
        zero = cv.const(torch.zeros(x.shape[0], m.hidden_size, dtype=getattr(torch, x.dtype.name)))
        states = [zero, zero] if mode == "lstm" else [zero]
    else:
        states = list(hx) if mode == "lstm" else [hx]
        if unbatched:
            states = [cv.reshape(s, (1, s.shape[0])) for s in states]
    biases = (cv.param(m.bias_ih, "bias_ih"), cv.param(m.bias_hh, "bias_hh")) if m.bias else (None, None)
    out = run_cell(cv, mode, x, states, cv.param(m.weight_ih, "weight_ih"), cv.param(m.weight_hh, "weight_hh"),
                   *biases)
    if unbatched:
        out = tuple(cv.reshape(s, (s.shape[1],)) for s in out)
    return out if mode == "lstm" else out[0]
