"""Token embedding (scaled by sqrt(d_model) as in Vaswani et al. 2017, section 3.4) and the output projection,
optionally tied to the embedding matrix (Press & Wolf 2017)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archsweep.variants.hooks import ZLoss


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, scale: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model))
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, tokens: Tensor) -> Tensor:
        x = F.embedding(tokens, self.weight)  # (B, T, D)
        return x * self.scale if self.scale != 1.0 else x

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}, scale={self.scale:.3f}"


class LMHead(nn.Module):
    """Logits over the vocabulary; with `tied_to`, the weight is the embedding matrix itself (one Parameter).
    `z_loss` > 0: PaLM's z-loss on the logits, an auxiliary loss of the training step (`hooks.ZLoss`)."""

    def __init__(self, d_model: int, vocab_size: int, bias: bool, tied_to: TokenEmbedding | None,
                 softcap: float | None = None, z_loss: float = 0.0) -> None:
        super().__init__()
        self.z_loss = ZLoss(z_loss)
        self.softcap = softcap  # logits become softcap * tanh(logits / softcap) (Gemma 2); None: off
        if tied_to is None:
            self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * d_model ** -0.5)
        else:
            self.weight = tied_to.weight
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return self.z_loss(self.logits(x))

    def logits(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., V), recording no z-loss: for other predictions through the same head (multi-token)."""
        logits = F.linear(x, self.weight, self.bias)  # (B, T, V)
        return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)

    def flops(self, shape: Any) -> float:
        """2 V D per position, tied or not (a tied head is the same product with a shared matrix)."""
        return 2.0 * self.weight.shape[0] * self.weight.shape[1] * shape.tokens
