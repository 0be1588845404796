"""`geglu` (Shazeer 2020): down(gelu(gate(x)) * up(x)); hidden size `gated_d_ff`, default round(2 d_ff / 3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import GatedFeedForward, gated_hidden_size
from archsweep.variants.ffn.gelu import check_approximate, gelu


@FFN.register("geglu")
class GeGLU(GatedFeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool, gated_d_ff: int | None = None,
                 approximate: str = "none") -> None:
        hidden = gated_d_ff if gated_d_ff is not None else gated_hidden_size(d_ff)
        super().__init__(d_model, hidden, gelu(approximate), dropout, bias)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        super().check(sizes, options)
        check_approximate(options)
