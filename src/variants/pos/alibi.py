"""`alibi` (Press et al. 2022, "Train Short, Test Long"): subtract slope_h * |i - j| from head h's scores.

Slopes are the geometric sequence 2^(-8/n), 2^(-16/n), ... for n heads; when n is not a power of two, the
paper's recipe takes the slopes of the closest smaller power of two and fills in with every other slope of
twice that count. In encoders the penalty is symmetric (|i - j|); in causal attention future keys are masked.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding, query_key_distance


def alibi_slopes(n_heads: int) -> list[float]:
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    lower = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(lower) + alibi_slopes(2 * lower)[0::2][: n_heads - lower]


@POS.register("alibi")
class ALiBi(PositionalEncoding):
    score_bias = True

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)

    def attn_bias(self, q_len: int, k_len: int, device: torch.device) -> Tensor:
        distance = query_key_distance(q_len, k_len, device).abs().float()  # (Tq, Tk)
        return (-self.slopes[:, None, None] * distance).unsqueeze(0)  # (1, H, Tq, Tk)
