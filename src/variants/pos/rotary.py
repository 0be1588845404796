"""`rotary` (Su et al. 2021, RoFormer): rotate each query/key channel pair by an angle proportional to position.

Rotate-half convention of Hugging Face Llama and GPT-NeoX: channel i pairs with channel i + head_dim/2, and
frequency theta_i = base^(-2i/head_dim). Scores then depend on positions only through their difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


@POS.register("rotary")
class Rotary(PositionalEncoding):
    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if sizes["head_dim"] % 2:
            raise ValueError(f"pos=rotary needs an even head dimension, but d_model/n_heads = "
                             f"{sizes['d_model']}/{sizes['n_heads']} = {sizes['head_dim']}; change d_model or n_heads")
        if options["base"] <= 1:
            raise ValueError(f"pos=rotary: base={options['base']} must be greater than 1 (10000 is the usual value)")

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        angles = positions.float().unsqueeze(-1) * self.inv_freq  # (B, T, Dh/2)
        angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)  # (B, 1, T, Dh)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(positions, q.dtype)  # q, k: (B, H, T, Dh)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
