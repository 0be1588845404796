"""`attn_gate` (Qiu et al. 2025, "Gated Attention for Large Language Models", arXiv 2505.06708, position G1): each
head's attention output is multiplied by sigmoid(X W_theta) before the output projection, X being the layer's
input (after its norm). `per: head`: one gate per head and token (the paper's headwise); `per: channel`: one per
channel (elementwise, the paper's best). A non-linear, sparse gate on the value path; the paper reports steadier
training and the attention sink mostly gone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import PROJECTIONS, AttentionPlugin

PER = ("head", "channel")  # the gate's granularity (this option's values, not option names)


@PLUGIN.register("attn_gate")
class OutputGate(AttentionPlugin):
    requires = frozenset({PROJECTIONS})
    label = "sigmoid output gate"

    def __init__(self, d_model: int, n_heads: int, head_dim: int, bias: bool, per: str = "channel") -> None:
        super().__init__()
        self.per, self.n_heads = per, n_heads
        self.gate_proj = nn.Linear(d_model, n_heads * (head_dim if per == "channel" else 1), bias=bias)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if options["per"] not in PER:
            raise ValueError(f"attn_gate: per={options['per']!r} must be one of {', '.join(PER)} (head: one gate per "
                             f"head, the paper's headwise; channel: one per channel, its elementwise)")

    def output(self, x: Tensor, y: Tensor) -> Tensor:
        """x: (B, T, D) the layer's input; y: (B, H, T, Dh) the heads' attention outputs -> gated y."""
        b, t, _ = x.shape
        gate = torch.sigmoid(self.gate_proj(x)).view(b, t, self.n_heads, -1).transpose(1, 2)  # (B, H, T, 1 or Dh)
        return y * gate

    def extra_repr(self) -> str:
        return f"per={self.per}"
