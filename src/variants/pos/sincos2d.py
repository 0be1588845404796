"""`sincos2d`: fixed 2D sine-cosine positions over an image's patch grid ("Better plain ViT baselines for
ImageNet-1k", Beyer et al. 2022; big_vision's `posemb_sincos_2d`): a quarter of the channels each holds
sin(x w), cos(x w), sin(y w), cos(y w) of the patch's column x and row y, w = temperature^(-i / (D/4 - 1)).

Only for image input (kind=vit): the last (H/P)(W/P) tokens of the sequence are the patches in row-major order;
tokens before them (the class token) get no position, as in the paper's code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from archsweep.variants.patches import patch_grid
from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding


def sincos2d_table(rows: int, cols: int, d_model: int, temperature: float = 10000.0) -> Tensor:
    """(rows cols, d_model): row-major patch positions, channels [sin x, cos x, sin y, cos y] (D/4 each)."""
    y, x = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    quarter = d_model // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32) / max(quarter - 1, 1))  # (D/4,)
    x = x.flatten().float()[:, None] * omega[None, :]  # (N, D/4)
    y = y.flatten().float()[:, None] * omega[None, :]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)  # (N, D)


@POS.register("sincos2d")
class SinCos2D(PositionalEncoding):
    trace_label = "+ 2D sine-cosine positions (patches)"
    image_only = True  # acts on an image's patch grid: refused for token-sequence kinds (archsweep.variants.rules)

    def __init__(self, d_model: int, image_size: int | list[int] | None, patch_size: int,
                 temperature: float = 10000.0) -> None:
        super().__init__()
        rows, cols = patch_grid(image_size, patch_size)
        self.register_buffer("table", sincos2d_table(rows, cols, d_model, temperature), persistent=False)  # (N, D)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if sizes["d_model"] % 4:
            raise ValueError(f"pos=sincos2d splits d_model into four quarters (sin and cos of column and row), but "
                             f"d_model={sizes['d_model']} is not a multiple of 4")

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        n = self.table.shape[0]
        if x.shape[1] < n:
            raise ValueError(f"pos=sincos2d expects the {n} patch tokens of its grid, but the sequence has "
                             f"{x.shape[1]} tokens")
        pos = torch.cat([self.table.new_zeros(x.shape[1] - n, self.table.shape[1]), self.table])  # (T, D)
        return x + pos.to(x.dtype)
