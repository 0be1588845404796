"""`logit_softcap` (Gemma 2, Gemma Team 2024): output logits -> cap * tanh(logits / cap) (Gemma 2: cap 30), on
every prediction of the head (multi-token prediction's too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import OutputPlugin


@PLUGIN.register("logit_softcap")
class LogitSoftcap(OutputPlugin):
    label = "logit soft-cap"

    def __init__(self, cap: float = 30.0) -> None:
        super().__init__()
        self.cap = cap

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if not options["cap"] > 0:
            raise ValueError(f"logit_softcap: cap={options['cap']!r} must be positive (Gemma 2: 30); "
                             f"logit_softcap=none turns it off")

    def transform_logits(self, logits: Tensor) -> Tensor:
        return self.cap * torch.tanh(logits / self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap}"
