"""Token embedding (scaled by sqrt(d_model) as in Vaswani et al. 2017, section 3.4) and the output projection,
optionally tied to the embedding matrix (Press & Wolf 2017)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archsweep.variants.param.base import ForwardScales
from archsweep.variants.plugins.base import OutputPlugins
from archsweep.variants.roles import HEAD


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, scale: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model))
        self.scale = math.sqrt(d_model) if scale else 1.0

    def scale_forward(self, scales: ForwardScales) -> None:
        if self.scale != 1.0:  # the sqrt(d_model) factor, held at the base width's
            self.scale *= scales.embedding

    def forward(self, tokens: Tensor) -> Tensor:
        x = F.embedding(tokens, self.weight)  # (B, T, D)
        return x * self.scale if self.scale != 1.0 else x

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}, scale={self.scale:.3f}"


class LMHead(nn.Module):
    """Logits over the vocabulary; with `tied_to`, the weight is the embedding matrix itself (one Parameter).
    `plugins`: the output plug-ins (`plugins/base.py`: a soft-cap transforms every prediction, a z-loss observes the
    head's own)."""

    def __init__(self, d_model: int, vocab_size: int, bias: bool, tied_to: TokenEmbedding | None,
                 plugins: OutputPlugins | None = None) -> None:
        super().__init__()
        self.plugins = plugins if plugins is not None else OutputPlugins()
        self.tied = tied_to is not None
        if tied_to is None:
            self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * d_model ** -0.5)
        else:
            self.weight = tied_to.weight
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None
        self.logit_scale = 1.0  # a parametrisation's factor on a tied head's logits (`scale_forward`)

    def scale_forward(self, scales: ForwardScales) -> None:
        if self.tied:  # an untied head's width factor is in its init and learning rate
            self.logit_scale = scales.logits

    def project(self, x: Tensor) -> Tensor:
        if self.logit_scale != 1.0:
            x = x * self.logit_scale  # (B, T, D): cheaper than scaling (B, T, V)
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.plugins(self.project(x))  # (B, T, V)

    def roles(self) -> dict[str, str]:
        return {} if self.tied else {"weight": HEAD}  # tied: the embedding's Parameter, and its role

    def logits(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., V), observed by no plug-in: for other predictions through the same head (multi-token)."""
        return self.plugins.transform(self.project(x))

    def flops(self, shape: Any) -> float:
        """2 V D per position, tied or not (a tied head is the same product with a shared matrix)."""
        return 2.0 * self.weight.shape[0] * self.weight.shape[1] * shape.tokens
