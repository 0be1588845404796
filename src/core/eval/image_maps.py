"""Figures of image classification: the confusion matrix, and attention over the patches drawn on the input
image (the class token's attention, as in Dosovitskiy et al. 2021, figure 6, per layer and averaged over heads).

    patch_attention(probs, n_prefix, grid)   # (B, H, T, T) of one layer -> (B, gh, gw) attention over patches
    attention_overlay_figure(images, maps, title)
    confusion_figure(matrix, class_names, title)

Drawing uses matplotlib's `Figure` directly (Agg canvas, no pyplot, no display), like `attention_maps`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100


def patch_attention(probs: Tensor, n_prefix: int, grid: tuple[int, int]) -> Tensor:
    """probs (B, H, T, T) of one layer, T = n_prefix + gh gw -> (B, gh, gw): with a class token (n_prefix > 0) its
    attention to each patch; without one, the attention each patch receives averaged over every query. Mean over
    heads; each map renormalised to sum to 1 over the patches."""
    p = probs.float().mean(1)  # (B, T, T)
    over = p[:, 0, n_prefix:] if n_prefix else p.mean(1)  # (B, N)
    over = over / over.sum(-1, keepdim=True).clamp(min=1e-12)
    return over.reshape(-1, *grid)


def to_display(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Standardised (B, C, H, W) -> (B, H, W, C) in [0, 1] for drawing."""
    m = torch.as_tensor(mean, dtype=torch.float32)[None, :, None, None]
    s = torch.as_tensor(std, dtype=torch.float32)[None, :, None, None]
    return (images.float().cpu() * s + m).clamp(0, 1).permute(0, 2, 3, 1)


def attention_overlay_figure(images: Tensor, maps: list[Tensor], title: str,
                             labels: Sequence[str] | None = None) -> Figure:
    """images (B, H, W, C) in [0, 1]; maps: one (B, gh, gw) per layer. One row per image: the image, then each
    layer's map upsampled to the image (nearest, so each patch is one block) over the image in grey."""
    from matplotlib.figure import Figure

    b, h, w, c = images.shape
    cols = 1 + len(maps)
    fig = Figure(figsize=(1.45 * cols + 1.0, 1.45 * b + 0.7), dpi=DPI, layout="constrained")
    fig.suptitle(f"{title}\n(brighter: more attention; each map scaled from its smallest to its largest value)",
                 fontsize=8)
    axes = fig.subplots(b, cols, squeeze=False)
    grey = images.mean(-1)  # (B, H, W)
    for i in range(b):
        shown = images[i, :, :, 0] if c == 1 else images[i]
        axes[i, 0].imshow(shown.numpy(), cmap="gray" if c == 1 else None, vmin=0, vmax=1, interpolation="nearest")
        axes[i, 0].set_title(labels[i] if labels else "input", fontsize=6)
        for j, layer in enumerate(maps, start=1):
            up = F.interpolate(layer[i][None, None].float(), size=(h, w), mode="nearest")[0, 0]  # (H, W)
            axes[i, j].imshow(grey[i].numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            drawn = axes[i, j].imshow(up.numpy(), cmap="inferno", alpha=0.6, interpolation="nearest")
            if i == 0:
                axes[i, j].set_title(f"layer {j - 1}", fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    if maps:
        bar = fig.colorbar(drawn, ax=axes[:, 1:].ravel().tolist(), shrink=0.5, ticks=[], aspect=25)
        bar.set_label("attention: low to high", fontsize=7)
    return fig


def confusion_figure(matrix: Tensor, class_names: Sequence[str], title: str) -> Figure:
    """matrix (K, K): rows the true class, columns the predicted one; counts written in the cells."""
    from matplotlib.figure import Figure

    k = matrix.shape[0]
    size = min(0.5 * k + 2.2, 14)
    fig = Figure(figsize=(size + 1.2, size), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    counts = matrix.cpu().long()
    rates = counts.float() / counts.sum(1, keepdim=True).clamp(min=1)
    image = ax.imshow(rates.numpy(), cmap="Blues", vmin=0, vmax=1)
    bar = fig.colorbar(image, ax=ax, shrink=0.8)
    bar.set_label("share of the true class (row)", fontsize=9)
    bar.ax.tick_params(labelsize=8)
    font = 9 if k <= 12 else 7 if k <= 20 else 6
    if k <= 30:
        for r in range(k):
            for col in range(k):
                if counts[r, col]:
                    ax.text(col, r, str(int(counts[r, col])), ha="center", va="center", fontsize=font,
                            color="white" if rates[r, col] > 0.5 else "black")
        upright = all(len(str(n)) <= 3 for n in class_names)
        ax.set_xticks(range(k), list(class_names), fontsize=font, rotation=0 if upright else 90)
        ax.set_yticks(range(k), list(class_names), fontsize=font)
    ax.set_xlabel("predicted class", fontsize=10)
    ax.set_ylabel("true class", fontsize=10)
    ax.set_title(title, fontsize=10)
    return fig
