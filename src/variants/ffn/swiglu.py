"""`swiglu` (Shazeer 2020): down(silu(gate(x)) * up(x)); hidden size `gated_d_ff`, default round(2 d_ff / 3)."""

from __future__ import annotations

import torch.nn.functional as F

from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import GatedFeedForward, gated_hidden_size


@FFN.register("swiglu")
class SwiGLU(GatedFeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool, gated_d_ff: int | None = None) -> None:
        hidden = gated_d_ff if gated_d_ff is not None else gated_hidden_size(d_ff)
        super().__init__(d_model, hidden, F.silu, dropout, bias)
