"""`attn_sink` (gpt-oss, OpenAI 2025; Miller 2023, "Attention is off by one"): one more logit per head in the
softmax denominator, softmax_j(s_ij) = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij)), so a head may attend to
nothing. `learned: true`: sink_h is a parameter starting at 0 (gpt-oss); false: sink_h = 0, fixed (off by one).
`attend` (attention/base.py) realises it on the SDPA path as one more key column whose score is sink_h and whose
value is zero."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from archsweep.variants.flops import Shape
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import SCORES, AttentionPlugin


@PLUGIN.register("attn_sink")
class AttentionSink(AttentionPlugin):
    requires = frozenset({SCORES})
    label = "sink logit"

    def __init__(self, n_heads: int, head_dim: int, learned: bool = True) -> None:
        super().__init__()
        self.head_dim = head_dim
        if learned:
            self.logits = nn.Parameter(torch.zeros(n_heads))  # (H,)
        else:
            self.register_buffer("logits", torch.zeros(n_heads), persistent=False)

    def sink(self) -> Tensor:
        return self.logits

    def roles(self) -> dict[str, str]:
        return {"logits": "vector"} if isinstance(self.logits, nn.Parameter) else {}

    def flops(self, shape: Shape) -> float:
        """The sink is one more key per query: its (zero) score and (zero) value products, 4 H Dh per token."""
        return 4.0 * self.logits.numel() * self.head_dim * shape.tokens

    def extra_repr(self) -> str:
        return f"learned={isinstance(self.logits, nn.Parameter)}"
