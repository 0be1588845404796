"""`relu2` (So et al. 2021, "Primer: Searching for Efficient Transformers for Language Modeling"): squared ReLU,
down(relu(up(x))^2), one of the two changes that gave Primer most of its gain; used by modded-nanogpt."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import FeedForward


def relu_squared(x: Tensor) -> Tensor:
    return F.relu(x).square()


@FFN.register("relu2")
class ReLU2FFN(FeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool) -> None:
        super().__init__(d_model, d_ff, relu_squared, dropout, bias)
