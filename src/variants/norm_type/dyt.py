"""`dyt`, Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization", arXiv 2503.10622): stands in for a
norm with no statistics at all, gamma * tanh(alpha x) + beta. No eps: nothing is divided."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from archsweep.variants.norm_type import NORM_TYPE


@NORM_TYPE.register("dyt")
class DynamicTanh(nn.Module):
    """DyT(x) = gamma * tanh(alpha x) + beta (the paper's equation 1): alpha one learnable scalar starting at
    `alpha` (the paper's default 0.5), gamma and beta per channel (ones, zeros; beta only with `model.norm_bias`)."""

    def __init__(self, dim: int, norm_bias: bool, alpha: float = 0.5) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(alpha))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if norm_bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.alpha * x) * self.weight
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, bias={self.bias is not None}"
