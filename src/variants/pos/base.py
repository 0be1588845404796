"""Base class of the positional encodings: three hooks that do nothing, so attention never branches on the variant.

- `embed(x, positions)`: absolute encodings add to the token embeddings here.
- `rotate_qk(q, k, positions)`: rotary encodings rotate queries and keys here (self-attention only).
- `attn_bias(q_idx, k_idx)`: relative encodings return an additive score bias (1, H, Tq, Tk) here.

`positions` is a (B or 1, T) long tensor of absolute positions (per-sequence offsets allow left-padded prompts);
`q_idx` and `k_idx` are 1-D index ranges, since bias-type encodings depend only on the distance between indices.
"""

from __future__ import annotations

from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    max_len: int | None = None  # longest sequence supported, None = unbounded

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def rotate_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def attn_bias(self, q_idx: Tensor, k_idx: Tensor) -> Tensor | None:
        return None


class NoPosition(PositionalEncoding):
    """`none`: no positional information at all (causal models can still infer position, Haviv et al. 2022)."""
