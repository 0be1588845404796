"""`sinusoidal` (Vaswani et al. 2017, section 3.5): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same).

Computed from the positions on the fly, so any length works (no table to outgrow).
"""

from __future__ import annotations

import torch
from torch import Tensor

from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding


def sinusoidal_table(positions: Tensor, d_model: int, base: float = 10000.0) -> Tensor:
    """(..., T) positions -> (..., T, d_model) encodings, sin on even and cos on odd channels (interleaved)."""
    inv_freq = base ** (-torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32) / d_model)
    angles = positions.float().unsqueeze(-1) * inv_freq  # (..., T, d/2)
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., T, d) interleaved
    return table[..., :d_model]


@POS.register("sinusoidal")
class Sinusoidal(PositionalEncoding):
    trace_label = "+ sinusoidal positions"

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + sinusoidal_table(positions, self.d_model).to(x.dtype)
