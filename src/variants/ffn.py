"""Position-wise feed-forward networks.

- `relu` (Vaswani et al. 2017): down(relu(up(x))).
- `gelu` (Hendrycks & Gimpel 2016; BERT, GPT-2): down(gelu(up(x))); `approximate="tanh"` is GPT-2's gelu_new.
- `swiglu` / `geglu` (Shazeer 2020, "GLU Variants Improve Transformer"): down(act(gate(x)) * up(x)) with SiLU
  or GELU. Three matrices instead of two, so the hidden size defaults to 2/3 of d_ff to keep parameters equal.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn


def gated_hidden_size(d_ff: int) -> int:
    """Hidden size of a gated FFN with the parameter count of an ungated one of size d_ff."""
    return max(1, round(2 * d_ff / 3))


class FeedForward(nn.Module):
    """down_proj(activation(up_proj(x))), with dropout on the hidden activations as in the 2017 paper's code."""

    def __init__(self, d_model: int, d_ff: int, activation: Callable[[Tensor], Tensor], dropout: float,
                 bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation
        self.p = dropout

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.up_proj(x))
        return self.down_proj(F.dropout(hidden, self.p, self.training) if self.p > 0 else hidden)


class GatedFeedForward(nn.Module):
    """down_proj(activation(gate_proj(x)) * up_proj(x))."""

    def __init__(self, d_model: int, d_ff: int, activation: Callable[[Tensor], Tensor], dropout: float,
                 bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation
        self.p = dropout

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(F.dropout(hidden, self.p, self.training) if self.p > 0 else hidden)


def gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


def make_ffn(name: str, d_model: int, d_ff: int, dropout: float, bias: bool, gelu_approximate: str = "none",
             gated_d_ff: int | None = None) -> nn.Module:
    """Build the FFN option `name`; gated variants use `gated_d_ff` or the parameter-matched default."""
    gelu = gelu_tanh if gelu_approximate == "tanh" else F.gelu
    hidden = gated_d_ff if gated_d_ff is not None else gated_hidden_size(d_ff)
    if name == "relu":
        return FeedForward(d_model, d_ff, F.relu, dropout, bias)
    if name == "gelu":
        return FeedForward(d_model, d_ff, gelu, dropout, bias)
    if name == "swiglu":
        return GatedFeedForward(d_model, hidden, F.silu, dropout, bias)
    if name == "geglu":
        return GatedFeedForward(d_model, hidden, gelu, dropout, bias)
    raise ValueError(f"ffn={name!r} is not a known option; valid options: relu, gelu, swiglu, geglu")
