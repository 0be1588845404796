"""`relu` (Vaswani et al. 2017): down(relu(up(x)))."""

from __future__ import annotations

import torch.nn.functional as F

from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import FeedForward


@FFN.register("relu")
class ReLUFFN(FeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool) -> None:
        super().__init__(d_model, d_ff, F.relu, dropout, bias)
