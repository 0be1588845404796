"""`learned`: an absolute position table trained with the model (Gehring et al. 2017; BERT, GPT-2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding


@POS.register("learned")
class LearnedPosition(PositionalEncoding):
    trace_label = "+ learned positions"

    def __init__(self, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_seq_len
        self.table = nn.Embedding(max_seq_len, d_model)

    @classmethod
    def max_positions(cls, sizes: Mapping[str, Any]) -> int | None:
        return sizes["max_seq_len"]

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.table(positions)
