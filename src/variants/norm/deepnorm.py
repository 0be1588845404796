"""`deepnorm` (Wang et al. 2022, DeepNet): x = norm(alpha * x + sublayer(x)), with the sublayer's value, output
and FFN weights scaled by beta after initialisation (queries and keys keep gain 1); no final norm. alpha and beta
come from the paper's figure 2, for the stack's role and the model's depth."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from archsweep.variants.hooks import weight_matrices
from archsweep.variants.norm import NORM
from archsweep.variants.norm.base import NormFactory, Residual, Sublayer


def deepnorm_constants(role: str, n_layers: int, n_decoder_layers: int) -> tuple[float, float]:
    """(alpha, beta) for a stack: `encoder` / `decoder` of an encoder-decoder with N and M layers, or the single
    `stack` of a decoder- or encoder-only model with N layers."""
    n, m = n_layers, n_decoder_layers
    if role == "encoder":
        return 0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16)
    if role == "decoder":
        return (3 * m) ** 0.25, (12 * m) ** -0.25
    return (2 * n) ** 0.25, (8 * n) ** -0.25


@NORM.register("deepnorm")
class DeepNorm(Residual):
    formula = "norm(alpha x + sublayer(x))"

    def __init__(self, make_norm: NormFactory, dropout: float, role: str, n_layers: int,
                 n_decoder_layers: int) -> None:
        super().__init__(make_norm, dropout)
        self.alpha, self.beta = deepnorm_constants(role, n_layers, n_decoder_layers)

    def forward(self, x: Tensor, sublayer: Sublayer, *args: Any) -> Tensor:
        return self.norm(x * self.alpha + self.dropout(sublayer(x, *args)))

    @torch.no_grad()
    def init_sublayer(self, sublayer: nn.Module) -> None:
        if callable(getattr(sublayer, "value_output_weights", None)):  # attention: the layer knows its layout
            for matrix in sublayer.value_output_weights():
                matrix.mul_(self.beta)
        else:  # the FFN: every matrix, the ones it declares (`weight_matrices()`, e.g. stacked experts) too
            for matrix in weight_matrices(sublayer):
                matrix.mul_(self.beta)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4f}, beta={self.beta:.4f}, dropout={self.p}"
