"""`pre` (Wang et al. 2019; GPT-2; Xiong et al. 2020): x = x + sublayer(norm(x)); one final norm after the stack."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archsweep.variants.norm import NORM
from archsweep.variants.norm.base import Residual, Sublayer


@NORM.register("pre")
class PreNorm(Residual):
    final_norm = True
    formula = "x + sublayer(norm(x))"

    def forward(self, x: Tensor, sublayer: Sublayer, *args: Any) -> Tensor:
        return x + self.dropout(sublayer(self.norm(x), *args))
