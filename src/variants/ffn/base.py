"""Position-wise feed-forward networks: the two shapes every option uses, and the registry.

- `FeedForward`: down_proj(activation(up_proj(x))) (Vaswani et al. 2017).
- `GatedFeedForward`: down_proj(activation(gate_proj(x)) * up_proj(x)) (Shazeer 2020, "GLU Variants Improve
  Transformer"): three matrices instead of two, so the hidden size defaults to 2/3 of d_ff to keep the
  parameter count of the ungated layer.

Dropout acts on the hidden activations, as in the 2017 paper's code. A new FFN is one file in this folder,
`@FFN.register("<name>")` on its class, and `conf/ffn/<name>.yaml`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from archsweep.variants.dropout import apply_dropout
from archsweep.variants.roles import HIDDEN_OUT


def gated_hidden_size(d_ff: int) -> int:
    """Hidden size of a gated FFN with the parameter count of an ungated one of size d_ff."""
    return max(1, round(2 * d_ff / 3))


class FFNBase(nn.Module):
    """What every FFN option shares: `hidden_size` (the width of its hidden layer) and its hooks."""

    hidden_size: int

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        """Raise ValueError if the options cannot work with these sizes."""

    @classmethod
    def follows_d_ff(cls, options: Mapping[str, Any]) -> bool:
        """Whether the hidden size is derived from d_ff (so matching parameters by solving d_ff works)."""
        return True

    def hidden_dropout(self, hidden: Tensor) -> Tensor:
        return hidden if self.p == 0.0 or not self.training else apply_dropout(hidden, self.p, True)


class FeedForward(FFNBase):
    """down_proj(activation(up_proj(x)))."""

    def __init__(self, d_model: int, d_ff: int, activation: Callable[[Tensor], Tensor], dropout: float,
                 bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation
        self.p = dropout
        self.hidden_size = d_ff

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.hidden_dropout(self.activation(self.up_proj(x))))

    def roles(self) -> dict[str, str]:
        return {"down_proj.weight": HIDDEN_OUT}


class GatedFeedForward(FFNBase):
    """down_proj(activation(gate_proj(x)) * up_proj(x))."""

    def __init__(self, d_model: int, d_ff: int, activation: Callable[[Tensor], Tensor], dropout: float,
                 bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation
        self.p = dropout
        self.hidden_size = d_ff

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        value = options.get("gated_d_ff")
        if value is not None and value < 1:
            raise ValueError(f"gated_d_ff={value!r} must be a positive integer, or null for 2/3 of d_ff")

    @classmethod
    def follows_d_ff(cls, options: Mapping[str, Any]) -> bool:
        return options.get("gated_d_ff") is None

    def roles(self) -> dict[str, str]:
        return {"down_proj.weight": HIDDEN_OUT}

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.hidden_dropout(self.activation(self.gate_proj(x)) * self.up_proj(x)))

