"""`xpos` (Sun et al. 2022, "A Length-Extrapolatable Transformer"): rotary positions with an exponential decay.
Query channel pair i at position n is scaled by zeta_i^(n / scale_base), key pair i at position m by
zeta_i^(-m / scale_base), zeta_i = (2i / Dh + gamma) / (1 + gamma), so the score of a query and a key falls off as
zeta_i^((n - m) / scale_base) with their distance, faster for low channels. `scale_base: null` turns the decay off:
plain rotary.

Positions are absolute (the KV cache keeps keys scaled once), so the scale factors stay within fp32 for
n / scale_base up to about 70 (36,000 tokens at the default 512).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from archsweep.variants.pos import POS
from archsweep.variants.pos.rotary import Rotary


@POS.register("xpos")
class XPos(Rotary):
    def __init__(self, head_dim: int, base: float = 10000.0, scale_base: float | None = 512.0,
                 gamma: float = 0.4) -> None:
        super().__init__(head_dim, base)
        self.scale_base = scale_base
        zeta = (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim + gamma) / (1 + gamma)
        self.register_buffer("zeta", zeta, persistent=False)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        super().check(sizes, options)
        if options["scale_base"] is not None and options["scale_base"] <= 0:
            raise ValueError(f"pos=xpos: scale_base={options['scale_base']} must be positive (512 in the paper), "
                             f"or null for no decay")
        if options["gamma"] <= 0:
            raise ValueError(f"pos=xpos: gamma={options['gamma']} must be positive (0.4 in the paper)")

    def rotate_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        q, k = super().rotate_qk(q, k, positions)
        if self.scale_base is None:
            return q, k
        power = positions.float().unsqueeze(-1) / self.scale_base  # (B, T, 1)
        scale = self.zeta ** power  # (B, T, Dh/2)
        scale = torch.cat((scale, scale), dim=-1).unsqueeze(1).to(q.dtype)  # (B, 1, T, Dh), rotate-half pairs
        return q * scale, k / scale


