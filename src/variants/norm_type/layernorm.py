"""`layernorm` (Ba et al. 2016): centre and scale each position over its channels, then a learned gain and, with
`model.norm_bias`, a learned bias."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from archsweep.variants.norm_type import NORM_TYPE


@NORM_TYPE.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm calling the op directly: F.layer_norm's Python checks are a measurable share of a decoding step."""

    def __init__(self, dim: int, norm_eps: float, norm_bias: bool) -> None:
        super().__init__(dim, eps=norm_eps, bias=norm_bias)

    def forward(self, x: Tensor) -> Tensor:
        return torch.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
