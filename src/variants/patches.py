"""Patch embedding of the Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", eq. 1):
the image is cut into P x P patches, each flattened and projected linearly to D, and a learned class token is
prepended. The projection is a strided convolution (kernel = stride = P), which computes exactly flatten + linear
with the weight reshaped (`patchify` is that reshape; a test holds the equality)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from archsweep.variants.roles import EMBEDDING


def image_hw(image_size: int | list[int] | tuple[int, ...]) -> tuple[int, int]:
    """`image_size` (an int for a square, or [H, W]) -> (H, W)."""
    return (image_size, image_size) if isinstance(image_size, int) else (int(image_size[0]), int(image_size[1]))


def patch_grid(image_size: int | list[int] | tuple[int, ...], patch_size: int) -> tuple[int, int]:
    """(H / P, W / P): the patch grid of an image."""
    h, w = image_hw(image_size)
    return h // patch_size, w // patch_size


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C P P), patches in row-major order, each flattened channel-first like a conv
    weight (C, P, P)."""
    b, c, h, w = images.shape
    p = patch_size
    x = images.reshape(b, c, h // p, p, w // p, p)  # (B, C, H/P, P, W/P, P)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)  # (B, N, C P P)


class PatchEmbedding(nn.Module):
    """images (B, C, H, W) -> tokens (B, N + class token, D), N = (H / P)(W / P)."""

    def __init__(self, in_channels: int, patch_size: int, d_model: int, class_token: bool) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model)) if class_token else None  # zeros, as the paper's

    def roles(self) -> dict[str, str]:
        """The patch projection and the class token are the input embedding of an image."""
        return {"proj.weight": EMBEDDING, **({"cls_token": EMBEDDING} if self.cls_token is not None else {})}

    @property
    def n_prefix(self) -> int:
        """Tokens before the patches (the class token)."""
        return 0 if self.cls_token is None else 1

    def patches(self, images: Tensor) -> Tensor:
        x = self.proj(images)  # (B, D, H/P, W/P)
        return x.flatten(2).transpose(1, 2)  # (B, N, D)

    def flops(self, shape: Any) -> float:
        """The stride-P convolution is one (C P P) x D product per patch (`shape.length` patches per image)."""
        weight = self.proj.weight  # (D, C, P, P)
        return 2.0 * weight.numel() * shape.tokens

    def forward(self, images: Tensor) -> Tensor:
        x = self.patches(images)  # (B, N, D)
        if self.cls_token is None:
            return x
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)  # (B, 1 + N, D)
