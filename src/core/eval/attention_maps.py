"""Attention entropy and attention-map grids from `capture_attention`'s probabilities (the maps as in Vaswani
et al. 2017, figures 3-5; entropy per head as in Clark et al. 2019, "What Does BERT Look At?").

Probabilities come per attention module as (B, H, Tq, Tk). Modules are grouped by kind (`encoder.self_attn`,
`decoder.self_attn`, `decoder.cross_attn`: the module name without `blocks.<i>`), and each kind becomes one grid
of layers x heads. Drawing uses matplotlib's `Figure` directly (Agg canvas, no pyplot, no display).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LAYER = re.compile(r"^(?P<stack>.+)\.blocks\.(?P<layer>\d+)\.(?P<attn>\w+)$")
TITLES = {"encoder.self_attn": "encoder self-attention", "decoder.self_attn": "decoder self-attention",
          "decoder.cross_attn": "cross-attention (decoder queries, encoder keys)"}
# (query axis, key axis) of each kind: what a row and a column of a tile are
AXES = {"encoder.self_attn": ("query: source token", "key: source token"),
        "decoder.self_attn": ("query: token (predicting the next)", "key: token attended to (earlier or the same)"),
        "decoder.cross_attn": ("query: target token (predicting the next)", "key: source token")}
DPI, GAP = 100, 1  # GAP: blank cells between tiles
TILE_INCHES = (1.3, 3.0)  # a tile's side: 0.055 in per token, within these bounds, so long inputs get room
LABEL_POINTS = 7.5  # tick labels at least this far apart (points); more tokens: every k-th is labelled
GAMMA = 0.5  # colour scale: square root, so that the many small probabilities of a long row are told apart
SHOWN = {" ": "\u2423", "\n": "\u21b5", "\t": "\u21e5"}  # characters a tick label would not show


def tile_inches(tokens: int) -> float:
    return min(max(0.055 * tokens, TILE_INCHES[0]), TILE_INCHES[1])


def parse_name(name: str) -> tuple[str, str, int]:
    """`decoder.blocks.3.cross_attn` -> (stack `decoder`, kind `decoder.cross_attn`, layer 3)."""
    m = LAYER.match(name)
    if m is None:
        raise ValueError(f"attention module name {name!r} is not <stack>.blocks.<i>.<attn>")
    return m["stack"], f"{m['stack']}.{m['attn']}", int(m["layer"])


def mean_entropy(probs: Tensor, query_mask: Tensor | None) -> Tensor:
    """probs (B, H, Tq, Tk), rows summing to 1 over the keys a query may see -> mean over batch, heads and real
    queries of -sum_k p log p, in nats (masked keys have p = 0 and add nothing). query_mask (B, Tq) True at
    real tokens, or None."""
    entropy = torch.special.entr(probs.float()).sum(-1)  # (B, H, Tq)
    if query_mask is None:
        return entropy.mean()
    weights = query_mask[:, None, :].to(entropy.dtype).expand_as(entropy)  # (B, H, Tq)
    return (entropy * weights).sum() / weights.sum().clamp(min=1)


def grid_shapes(maps: dict[str, list[Tensor]]) -> dict[str, tuple[int, int]]:
    """{kind: [one (H, Tq, Tk) map per layer]} -> {kind: (rows = layers, cols = heads)}."""
    return {kind: (len(layers), max(m.shape[0] for m in layers)) for kind, layers in maps.items()}


def tile(layers: list[Tensor]) -> Tensor:
    """[one (H, Tq, Tk) map per layer] -> one image (L (Tq + GAP) - GAP, H (Tk + GAP) - GAP): layer r, head h at
    rows r (Tq + GAP) .., columns h (Tk + GAP) ..; NaN (drawn blank) between tiles. One image per attention kind
    draws in a fraction of the time of one axes per head."""
    n_heads = max(m.shape[0] for m in layers)
    tq, tk = max(m.shape[1] for m in layers), max(m.shape[2] for m in layers)
    out = torch.full((len(layers) * (tq + GAP) - GAP, n_heads * (tk + GAP) - GAP), float("nan"))
    for r, probs in enumerate(layers):
        for h in range(probs.shape[0]):
            top, left = r * (tq + GAP), h * (tk + GAP)
            out[top:top + probs.shape[1], left:left + probs.shape[2]] = probs[h].float().cpu()
    return out


def attention_figure(maps: dict[str, list[Tensor]], labels: dict[str, tuple[Sequence[str], Sequence[str]]],
                     title: str, axes_names: dict[str, tuple[str, str]] | None = None) -> Figure:
    """One figure, one panel per attention kind holding its layers x heads grid (`tile`), with the query tokens
    down the left, the key tokens under every head, axis titles saying what each side is, and one colour bar.
    A tile's size grows with its number of tokens; labels are thinned when they would overlap. Probabilities of
    exactly 0 (masked keys: the future of a causal model, padding) are drawn white, apart from small values; the
    colour scale is a square root (`GAMMA`), so that a long row's many small probabilities are told apart.
    labels: {kind: (query labels, key labels)}; axes_names: {kind: (query axis, key axis)} instead of `AXES`."""
    import matplotlib
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure

    shapes = grid_shapes(maps)
    sizes = {kind: (max(m.shape[1] for m in layers), max(m.shape[2] for m in layers)) for kind, layers in maps.items()}
    widths = [c * tile_inches(sizes[k][1]) for k, (_, c) in shapes.items()]
    heights = [r * tile_inches(sizes[k][0]) for k, (r, _) in shapes.items()]
    fig = Figure(figsize=(max(widths) + 2.4, sum(heights) + 1.25 * len(maps) + 0.5), dpi=DPI, layout="constrained")
    fig.suptitle(title, fontsize=10)
    axes = fig.subplots(len(maps), 1, squeeze=False, height_ratios=heights)[:, 0]
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    drawn = None
    for (kind, layers), ax in zip(maps.items(), axes, strict=True):
        image = tile(layers)
        image = image.masked_fill(image == 0, float("nan"))  # masked keys: white, not "attention 0"
        drawn = ax.imshow(image.numpy(), norm=PowerNorm(GAMMA, vmin=0.0, vmax=1.0), cmap=cmap, aspect="auto",
                          interpolation="nearest")
        ax.set_title(TITLES.get(kind, kind), fontsize=9, pad=14)
        ax.tick_params(length=0)
        tq, tk = sizes[kind]
        n_rows, n_cols = shapes[kind]
        q_labels, k_labels = labels.get(kind, ((), ()))
        _ticks(ax.set_yticks, q_labels, tq, 1, tile_inches(tq), {})
        upright = all(len(str(n)) <= 2 for n in k_labels)  # single characters read best unrotated
        _ticks(ax.set_xticks, k_labels, tk, n_cols, tile_inches(tk), {} if upright else {"rotation": 90})
        q_axis, k_axis = (axes_names or {}).get(kind) or AXES.get(kind, ("query", "key"))
        ax.set_ylabel(f"{q_axis}\n(one row of tiles per layer)", fontsize=7)
        ax.set_xlabel(f"{k_axis}  (one column of tiles per head)", fontsize=7)
        for r in range(n_rows):
            ax.text(image.shape[1] - 0.2, r * (tq + GAP) + tq / 2 - 0.5, f"layer {r}", rotation=270, fontsize=7,
                    va="center", ha="left")
        for h in range(n_cols):
            ax.text(h * (tk + GAP) + tk / 2 - 0.5, -0.7, f"head {h}", fontsize=7, va="bottom", ha="center")
    colorbar = fig.colorbar(drawn, ax=list(axes), shrink=min(0.6, 5.0 / max(sum(heights), 1.0)), pad=0.03,
                            aspect=20)
    colorbar.set_label("attention probability (square-root scale;\nwhite: masked)", fontsize=7)
    colorbar.ax.tick_params(labelsize=6)
    return fig


def _ticks(set_ticks, names: Sequence[str], size: int, repeats: int, inches: float, style: dict) -> None:
    """Token names beside the first tile of a row or under every tile of a column; every k-th name when there
    are too many to be read (k from the tile's size)."""
    if not names or len(names) != size:
        set_ticks([])
        return
    every = max(1, math.ceil(LABEL_POINTS / (inches * 72 / size)))
    shown = [SHOWN.get(n, n) for n in names]
    positions = [i * (size + GAP) + j for i in range(repeats) for j in range(0, size, every)]
    set_ticks(positions, [shown[j] for _ in range(repeats) for j in range(0, size, every)], fontsize=7, **style)


def save_figure(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=DPI)
    tmp.replace(path)
    return path
