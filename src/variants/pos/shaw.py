"""`shaw` (Shaw et al. 2018, "Self-Attention with Relative Position Representations"): a learned vector a_ij per
clipped distance clip(j - i, -k, k), added to the keys: e_ij = q_i (k_j + a^K_ij)^T / sqrt(Dh) (equation 4),
so each layer adds q_i . a^K_ij / sqrt(Dh) to its scores. One table of 2k + 1 vectors per layer, shared by the
heads, as in the paper; k = `max_distance` (16 in the paper's base model). The value term a^V (equation 3) is not
implemented: the paper's own ablation found it unnecessary (Table 3), and it would need explicit probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding, query_key_distance


@POS.register("shaw")
class ShawRelative(PositionalEncoding):
    score_bias = True

    def __init__(self, n_heads: int, head_dim: int, n_layers: int, n_decoder_layers: int, role: str,
                 max_distance: int = 16) -> None:
        super().__init__()
        self.max_distance, self.n_heads, self.head_dim = max_distance, n_heads, head_dim
        layers = n_decoder_layers if role == "decoder" else n_layers
        self.tables = nn.ModuleList(nn.Embedding(2 * max_distance + 1, head_dim) for _ in range(layers))

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if options["max_distance"] < 1:
            raise ValueError(f"pos=shaw: max_distance={options['max_distance']} must be at least 1 (the paper's "
                             f"base model uses 16)")

    def flops(self, shape: Any) -> float:
        """q_i . a_d for every query, head and distance: 2 Dh (2k + 1) per query and head, in each layer."""
        per_layer = 2.0 * self.head_dim * (2 * self.max_distance + 1) * self.n_heads * shape.tokens
        return per_layer * len(self.tables)

    def content_bias(self, q: Tensor, k: Tensor, layer: int) -> Tensor:
        b, h, q_len, head_dim = q.shape
        k_len = k.shape[2]
        bucket = query_key_distance(q_len, k_len, q.device).clamp(-self.max_distance, self.max_distance)
        bucket = bucket + self.max_distance  # (Tq, Tk) in [0, 2k]
        per_distance = q @ self.tables[layer].weight.T.to(q.dtype)  # (B, H, Tq, 2k + 1): q_i . a_d
        return per_distance.gather(-1, bucket.expand(b, h, q_len, k_len)) / math.sqrt(head_dim)
