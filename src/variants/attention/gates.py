"""Two small modules of self-attention that every softmax kind shares (`model.attn_gate`, `model.attn_sink`).

- `OutputGate` (Qiu et al. 2025, "Gated Attention for Large Language Models", arXiv 2505.06708, position G1): the
  attention output of each head is multiplied by sigmoid(X W_theta) before the output projection, X being the
  layer's input (after its norm). `headwise`: one gate per head and token; `elementwise`: one per channel. A
  non-linear, sparse gate on the value path; the paper reports steadier training (fewer loss spikes, larger usable
  learning rates) and the attention sink mostly gone.
- `AttentionSink` (gpt-oss, OpenAI 2025; Miller 2023, "Attention is off by one"): one more logit per head in the
  softmax denominator, softmax_j(s_ij) = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij)), so a head may attend to
  nothing. `learned`: sink_h is a parameter (starting at 0); `off_by_one`: sink_h = 0, fixed.
  `attend` (base.py) realises it on the SDPA path as one more key column whose score is sink_h (through the
  mask, after every bias and mask term) and whose value is zero.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from archsweep.variants.attention import GATES, SINKS
from archsweep.variants.flops import Shape


class OutputGate(nn.Module):
    def __init__(self, d_model: int, n_heads: int, head_dim: int, kind: str, bias: bool) -> None:
        super().__init__()
        if kind not in GATES[1:]:
            raise ValueError(f"attn_gate={kind!r} is not a gate; valid: {', '.join(GATES[1:])} (or none for no gate)")
        self.kind, self.n_heads = kind, n_heads
        self.gate_proj = nn.Linear(d_model, n_heads * (head_dim if kind == "elementwise" else 1), bias=bias)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """x: (B, T, D) the layer's input; y: (B, H, T, Dh) the heads' attention outputs -> gated y."""
        b, t, _ = x.shape
        gate = torch.sigmoid(self.gate_proj(x)).view(b, t, self.n_heads, -1).transpose(1, 2)  # (B, H, T, 1 or Dh)
        return y * gate

    def extra_repr(self) -> str:
        return f"kind={self.kind}"


class AttentionSink(nn.Module):
    def __init__(self, n_heads: int, head_dim: int, kind: str) -> None:
        super().__init__()
        if kind not in SINKS[1:]:
            raise ValueError(f"attn_sink={kind!r} is not a sink; valid: {', '.join(SINKS[1:])} (or none for no sink)")
        self.kind, self.head_dim = kind, head_dim
        if kind == "learned":
            self.logits = nn.Parameter(torch.zeros(n_heads))  # (H,)
        else:
            self.register_buffer("logits", torch.zeros(n_heads), persistent=False)

    def flops(self, shape: Shape) -> float:
        """The sink is one more key per query: its (zero) score and (zero) value products, 4 H Dh per token."""
        return 4.0 * self.logits.numel() * self.head_dim * shape.tokens

    def extra_repr(self) -> str:
        return f"kind={self.kind}"
