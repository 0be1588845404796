"""`linear` (Katharopoulos et al. 2020, "Transformers are RNNs"): kernel attention with the feature map
phi(x) = elu(x) + 1, a positive map whose dot products stand in for exp(q.k); linear in the sequence length,
and an RNN in decoding (`kernel.py` has the shared causal prefix sum and recurrent state)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.kernel import FeatureMapAttention


@ATTENTION.register("linear")
class LinearAttention(FeatureMapAttention):
    label = "linear attention, phi(x) = elu(x) + 1"

    def __init__(self, layer: int, causal: bool, chunk_size: int = 64, eps: float = 1e-6) -> None:
        super().__init__(layer, causal, chunk_size, eps)

    def query_features(self, q: Tensor) -> tuple[Tensor, None]:
        return F.elu(q) + 1, None

    def key_features(self, k: Tensor) -> tuple[Tensor, None]:
        return F.elu(k) + 1, None

    def feature_flops(self, head_dim: int) -> float:
        return 2.0 * 2 * head_dim  # elu and + 1 on one query and one key
