"""`attn_softcap` (Gemma 2, Gemma Team 2024): attention scores -> cap * tanh(scores / cap) before masking, in self-
and cross-attention (Gemma 2: cap 50). It bounds the logits smoothly; the kernel then takes the explicit path (SDPA
has no hook for it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import SCORES, AttentionPlugin


@PLUGIN.register("attn_softcap")
class AttentionSoftcap(AttentionPlugin):
    cross = True
    requires = frozenset({SCORES})
    label = "score soft-cap"

    def __init__(self, cap: float = 50.0) -> None:
        super().__init__()
        self.cap = cap

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if not options["cap"] > 0:
            raise ValueError(f"attn_softcap: cap={options['cap']!r} must be positive (Gemma 2: 50); "
                             f"attn_softcap=none turns it off")

    def score_mod(self, scores: Tensor) -> Tensor:
        return self.cap * torch.tanh(scores / self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap}"
