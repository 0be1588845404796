"""`sandwich` (Ding et al. 2021, CogView): x = x + norm_out(sublayer(norm_in(x))); final norm after the stack."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archsweep.variants.norm import NORM
from archsweep.variants.norm.base import NormFactory, Residual, Sublayer


@NORM.register("sandwich")
class SandwichNorm(Residual):
    final_norm = True
    formula = "x + norm(sublayer(norm(x)))"

    def __init__(self, make_norm: NormFactory, dropout: float) -> None:
        super().__init__(make_norm, dropout)
        self.out_norm = make_norm()

    def forward(self, x: Tensor, sublayer: Sublayer, *args: Any) -> Tensor:
        return x + self.dropout(self.out_norm(sublayer(self.norm(x), *args)))
