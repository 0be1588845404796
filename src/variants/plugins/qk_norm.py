"""`qk_norm` (Dehghani et al. 2023, ViT-22B; OLMo-2): queries and keys normalised per head over their Dh channels,
after the positional rotation, in self- and cross-attention. It bounds the attention logits' growth that makes
large learning rates diverge (Wortsman et al. 2023)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from archsweep.variants.norm_type import NORM_TYPE, build_norm
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import PROJECTIONS, AttentionPlugin


@PLUGIN.register("qk_norm")
class QKNorm(AttentionPlugin):
    cross = True
    requires = frozenset({PROJECTIONS})
    label = "QK-norm"

    def __init__(self, head_dim: int, norm_eps: float, norm_bias: bool, type: str = "rmsnorm") -> None:
        super().__init__()
        self.q_norm = build_norm(type, head_dim, norm_eps, norm_bias)
        self.k_norm = build_norm(type, head_dim, norm_eps, norm_bias)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        try:
            NORM_TYPE.resolve(options["type"])
        except ValueError as e:
            raise ValueError(f"qk_norm: type={options['type']!r} is not a known norm type ({e})") from None

    def qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self.q_norm(q), self.k_norm(k)
