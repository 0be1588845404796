"""Base class of the positional encodings: three hooks that do nothing, so attention never branches on the variant.

- `embed(x, positions)`: absolute encodings add to the token embeddings here.
- `rotate_qk(q, k, positions)`: rotary encodings rotate queries and keys here (self-attention only).
- `attn_bias(q_len, k_len, device)`: relative encodings return an additive score bias (1, H, Tq, Tk) here.

`positions` is a (B or 1, T) long tensor of absolute positions (per-sequence offsets allow left-padded prompts).
Bias-type encodings depend only on the distance between indices, so they get lengths: the queries are the last
q_len of the k_len keys (keys cached earlier come first).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    max_len: int | None = None  # longest sequence supported, None = unbounded

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def rotate_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def attn_bias(self, q_len: int, k_len: int, device: torch.device) -> Tensor | None:
        return None


def query_key_distance(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """(Tq, Tk) key index minus query index, the queries being the last q_len of k_len positions."""
    keys = torch.arange(k_len, device=device)
    return keys[None, :] - keys[k_len - q_len:, None]


class NoPosition(PositionalEncoding):
    """`none`: no positional information at all (causal models can still infer position, Haviv et al. 2022)."""
