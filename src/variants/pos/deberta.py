"""`deberta` (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention", section 3.1):
attention scores are content-to-content + content-to-position + position-to-content,

    A_ij = (q_i k_j^T + q_i (K^r_{d(i,j)})^T + k_j (Q^r_{d(j,i)})^T) / sqrt(3 Dh)      (equation 4, scaled)

with one table P of 2k relative position embeddings shared by all layers, projected per layer into
K^r = P W_k,r and Q^r = P W_q,r, and d(i, j) = clip(i - j, -k, k - 1) + k in [0, 2k). The 1/sqrt(3 Dh) scale is
applied by dividing q by sqrt(3) before the softmax kernel (which divides by sqrt(Dh)); the two position terms
come as a score bias. k = `max_distance`.

`p2c_index` chooses the index of the position-to-content term. `paper`: Q^r_{d(j,i)} as equation 4 writes it.
`code` (the default): Q^r_{d(i,j)}, what Microsoft's DeBERTa code and Hugging Face's `DebertaV2` compute (they
gather with clip(i - j) for both terms; microsoft/DeBERTa#162), so results compare with the published models.
The two differ by mirroring the relative position of that term (i - j against j - i).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding, query_key_distance

P2C_INDICES = ("code", "paper")


@POS.register("deberta")
class Disentangled(PositionalEncoding):
    score_bias = True

    def __init__(self, d_model: int, n_heads: int, head_dim: int, n_layers: int, n_decoder_layers: int, role: str,
                 max_distance: int = 128, p2c_index: str = "code") -> None:
        super().__init__()
        self.k, self.n_heads, self.head_dim = max_distance, n_heads, head_dim
        self.p2c_index = p2c_index
        layers = n_decoder_layers if role == "decoder" else n_layers
        self.table = nn.Embedding(2 * max_distance, d_model)  # P, shared by the layers
        self.q_rel = nn.ModuleList(nn.Linear(d_model, n_heads * head_dim, bias=False) for _ in range(layers))
        self.k_rel = nn.ModuleList(nn.Linear(d_model, n_heads * head_dim, bias=False) for _ in range(layers))

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if options["max_distance"] < 1:
            raise ValueError(f"pos=deberta: max_distance={options['max_distance']} must be at least 1")
        if options["p2c_index"] not in P2C_INDICES:
            raise ValueError(f"pos=deberta: p2c_index={options['p2c_index']!r} must be code (d(i, j), as Microsoft's "
                             f"and Hugging Face's code) or paper (d(j, i), as the paper's equation 4)")

    def flops(self, shape: Any) -> float:
        """Per layer: the table projected twice (2k x D by D x H Dh, once per forward, whatever the batch) and the
        two position terms q . K^r and k . Q^r (2 Dh 2k per position and head each)."""
        d_model, width = self.table.weight.shape[1], self.n_heads * self.head_dim
        table = 2 * 2.0 * (2 * self.k) * d_model * width
        terms = 2 * 2.0 * self.head_dim * (2 * self.k) * self.n_heads * shape.tokens
        return (table + terms) * len(self.q_rel)

    def rotate_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return q / math.sqrt(3.0), k  # content-to-content scaled by 1/sqrt(3 Dh) in all

    def content_bias(self, q: Tensor, k: Tensor, layer: int) -> Tensor:
        """q arrives divided by sqrt(3); k (B, Hkv, Tk, Dh) holds every key so far."""
        b, h, q_len, dh = q.shape
        k_len = k.shape[2]
        if k.shape[1] != h:
            k = k.repeat_interleave(h // k.shape[1], dim=1)
        p = self.table.weight.to(q.dtype)  # (2k, D)
        k_r = self.k_rel[layer](p).view(2 * self.k, h, dh).transpose(0, 1)  # (H, 2k, Dh)
        q_r = self.q_rel[layer](p).view(2 * self.k, h, dh).transpose(0, 1)
        distance = query_key_distance(q_len, k_len, q.device)  # (Tq, Tk): j - i
        to_key = (-distance).clamp(-self.k, self.k - 1) + self.k  # d(i, j)
        to_query = distance.clamp(-self.k, self.k - 1) + self.k if self.p2c_index == "paper" else to_key  # d(j, i)
        c2p = (q @ k_r.transpose(-1, -2)).gather(-1, to_key.expand(b, h, q_len, k_len))  # (q_i / sqrt 3) . K^r
        p2c = (k @ q_r.transpose(-1, -2)).gather(-1, to_query.T.expand(b, h, k_len, q_len))  # (B, H, Tk, Tq)
        return (c2p + p2c.transpose(-1, -2) / math.sqrt(3.0)) / math.sqrt(dh)
