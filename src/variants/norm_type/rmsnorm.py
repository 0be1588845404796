"""`rmsnorm` (Zhang & Sennrich 2019): scale each position by the root mean square of its channels; no centring
and no bias (`model.norm_bias` does not apply)."""

from __future__ import annotations

from torch import nn

from archsweep.variants.norm_type import NORM_TYPE


@NORM_TYPE.register("rmsnorm")
class RMSNorm(nn.RMSNorm):
    def __init__(self, dim: int, norm_eps: float) -> None:
        super().__init__(dim, eps=norm_eps)
