"""`full` (Vaswani et al. 2017, section 3.2.1): softmax(Q K^T / sqrt(Dh)) V over every visible key, with
PyTorch's fused `scaled_dot_product_attention`; its cost grows with the square of the sequence length."""

from __future__ import annotations

from torch import Tensor

from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.base import AttentionKernel, AttnContext, attend


@ATTENTION.register("full")
class FullAttention(AttentionKernel):
    label = "full softmax attention"

    def __init__(self, layer: int) -> None:
        super().__init__()
        self.layer = layer  # index into the KV cache

    def forward(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext, dropout: float,
                record: list[Tensor] | None) -> Tensor:
        if ctx.cache is not None:
            k, v = ctx.cache.append(self.layer, k, v)  # (B, Hkv, cached + T, Dh)
        mask, is_causal = ctx.layer_mask(q, k, self.layer)
        return attend(q, k, v, mask, is_causal, dropout, record, ctx.score_mod, ctx.sink)
