"""`value_residual` (ResFormer, Zhou et al. 2024, arXiv 2410.17897): every layer after the first mixes its values
with the first layer's, v_n <- lambda1 v_n + lambda2 v_1, before attending (so the KV cache and every attention kind
see the mixed values). lambda2 = `weight` (the paper's 1/2), lambda1 = 1 - lambda2; `learnable: true` (the paper's
Learnable-ResFormer; modded-nanogpt learns them too): two scalars per layer, starting there. Values are mixed per
token, so a decoding step needs only the first layer's values of its own new tokens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import FIRST_LAYER, PROJECTIONS, AttentionPlugin


@PLUGIN.register("value_residual")
class ValueResidual(AttentionPlugin):
    requires = frozenset({PROJECTIONS, FIRST_LAYER})
    label = "value residual"

    def __init__(self, layer: int, learnable: bool = False, weight: float = 0.5) -> None:
        super().__init__()
        self.layer = layer
        lambdas = torch.tensor([1.0 - weight, weight])  # (lambda1, lambda2)
        if learnable and layer > 0:
            self.lambdas = nn.Parameter(lambdas)
        else:
            self.register_buffer("lambdas", lambdas, persistent=False)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if not 0.0 <= options["weight"] <= 1.0:
            raise ValueError(f"value_residual: weight={options['weight']!r} must be in [0, 1], the first layer's "
                             f"share lambda2 (ResFormer: 0.5)")

    def values(self, v: Tensor, ctx: Any) -> Tensor:
        """The first layer keeps its values (B, Hkv, T, Dh) for the others; a later one returns lambda1 v +
        lambda2 v_1."""
        if self.layer == 0:
            ctx.first_values = v
            return v
        return self.lambdas[0] * v + self.lambdas[1] * ctx.first_values

    def roles(self) -> dict[str, str]:
        return {"lambdas": "vector"} if isinstance(self.lambdas, nn.Parameter) else {}
