"""Base class and registry of the positional encodings: three hooks that do nothing, so attention never branches
on the variant.

- `embed(x, positions)`: absolute encodings add to the token embeddings here.
- `rotate_qk(q, k, positions)`: rotary encodings rotate queries and keys here (self-attention only).
- `attn_bias(q_len, k_len, device)`: relative encodings return an additive score bias (1, H, Tq, Tk) here.
- `content_bias(q, k, layer)`: encodings whose score term depends on the queries or keys too (Shaw et al.,
  DeBERTa) return it here, (B, H, Tq, Tk), per layer.

`positions` is a (B or 1, T) long tensor of absolute positions (per-sequence offsets allow left-padded prompts).
Bias-type encodings depend only on the distance between indices, so they get lengths: the queries are the last
q_len of the k_len keys (keys cached earlier come first).

A new encoding is one file in this folder, `@POS.register("<name>")` on its class, and `conf/pos/<name>.yaml`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    max_len: int | None = None  # longest sequence supported, None = unbounded
    trace_label: ClassVar[str | None] = None  # shape trace: what `embed` adds (None: acts inside attention)
    score_bias: ClassVar[bool] = False  # True where `attn_bias` or `content_bias` adds to the scores (Q K^T needed)
    image_only: ClassVar[bool] = False  # True where it acts on an image's patch grid (refused for token sequences)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        """Raise ValueError (naming the field, the value and the fix) if the model's sizes or the options
        cannot work."""

    @classmethod
    def max_positions(cls, sizes: Mapping[str, Any]) -> int | None:
        """Longest sequence a model with these sizes can take (a learned table), None = unbounded."""
        return None

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def rotate_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def attn_bias(self, q_len: int, k_len: int, device: torch.device) -> Tensor | None:
        return None

    def content_bias(self, q: Tensor, k: Tensor, layer: int) -> Tensor | None:
        """Score term of layer `layer` from its (rotated) queries (B, H, Tq, Dh) and keys (B, Hkv, Tk, Dh), the
        queries being the last Tq of the Tk positions; already scaled like the scores."""
        return None

    def flops(self, shape: Any) -> float:
        """Matrix products the encoding adds in all its layers (`shape`: an `archsweep.variants.flops.Shape`).
        Tables, sinusoids, rotations and score biases looked up by distance are not products: 0."""
        return 0.0

    @classmethod
    def rotates(cls) -> bool:
        return cls.rotate_qk is not PositionalEncoding.rotate_qk



def query_key_distance(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """(Tq, Tk) key index minus query index, the queries being the last q_len of k_len positions."""
    keys = torch.arange(k_len, device=device)
    return keys[None, :] - keys[k_len - q_len:, None]
