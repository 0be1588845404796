"""`post` (Vaswani et al. 2017): x = norm(x + sublayer(x)); no norm after the stack."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archsweep.variants.norm import NORM
from archsweep.variants.norm.base import Residual, Sublayer


@NORM.register("post")
class PostNorm(Residual):
    formula = "Add & Norm: norm(x + sublayer(x))"

    def forward(self, x: Tensor, sublayer: Sublayer, *args: Any) -> Tensor:
        return self.norm(x + self.dropout(sublayer(x, *args)))
