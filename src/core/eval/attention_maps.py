"""Attention entropy and attention-map grids from `capture_attention`'s probabilities (the maps as in Vaswani
et al. 2017, figures 3-5; entropy per head as in Clark et al. 2019, "What Does BERT Look At?").

Probabilities come per attention module as (B, H, Tq, Tk). Modules are grouped by kind (`encoder.self_attn`,
`decoder.self_attn`, `decoder.cross_attn`: the module name without `blocks.<i>`), and each kind becomes one grid
of layers x heads. Drawing uses matplotlib's `Figure` directly (Agg canvas, no pyplot, no display).
"""

from __future__ import annotations

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
CELL_INCHES, DPI, GAP = 1.2, 100, 1  # GAP: blank cells between tiles
LABELLED_TOKENS = 32  # tick labels only up to this many tokens per axis


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
                     title: str) -> Figure:
    """One figure, one panel per attention kind holding its layers x heads grid (`tile`), with the query tokens
    down the left and the key tokens along the bottom. labels: {kind: (query labels, key labels)}."""
    import matplotlib
    from matplotlib.figure import Figure

    shapes = grid_shapes(maps)
    rows = sum(r for r, _ in shapes.values())
    cols = max(c for _, c in shapes.values())
    fig = Figure(figsize=(cols * CELL_INCHES + 1.2, rows * CELL_INCHES + 0.9 * len(maps) + 0.3), dpi=DPI,
                 layout="constrained")
    fig.suptitle(title, fontsize=9)
    axes = fig.subplots(len(maps), 1, squeeze=False, height_ratios=[r for r, _ in shapes.values()])[:, 0]
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    for (kind, layers), ax in zip(maps.items(), axes, strict=True):
        image = tile(layers)
        ax.imshow(image.numpy(), vmin=0.0, vmax=1.0, cmap=cmap, aspect="auto", interpolation="nearest")
        ax.set_title(TITLES.get(kind, kind), fontsize=8, pad=12)
        ax.tick_params(length=0)
        tq, tk = max(m.shape[1] for m in layers), max(m.shape[2] for m in layers)
        n_rows, n_cols = shapes[kind]
        q_labels, k_labels = labels.get(kind, ((), ()))
        _ticks(ax.set_yticks, q_labels, tq, 1, {})
        _ticks(ax.set_xticks, k_labels, tk, 1, {"rotation": 90})
        for r in range(n_rows):
            ax.text(image.shape[1] - 0.2, r * (tq + GAP) + tq / 2 - 0.5, f"layer {r}", rotation=270, fontsize=6,
                    va="center", ha="left")
        for h in range(n_cols):
            ax.text(h * (tk + GAP) + tk / 2 - 0.5, -0.7, f"head {h}", fontsize=6, va="bottom", ha="center")
    return fig


def _ticks(set_ticks, names: Sequence[str], size: int, repeats: int, style: dict) -> None:
    """Token names under every tile of a row (or beside every tile of a column), when there are few enough."""
    if not names or len(names) != size or size > LABELLED_TOKENS:
        set_ticks([])
        return
    positions = [i * (size + GAP) + j for i in range(repeats) for j in range(size)]
    set_ticks(positions, list(names) * repeats, fontsize=5, **style)


def save_figure(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=DPI)
    tmp.replace(path)
    return path
