"""PNG plots of a comparison: validation loss curves per cell, and exact match by sequence length per cell, each
the mean over the cell's completed runs with a band of one standard deviation. Matplotlib is imported here only,
with the Agg backend, so the rest of compare.py starts fast and needs no display."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from archsweep.core.report.cells import Cell
from archsweep.core.report.runs import Run, Series, metric
from archsweep.core.report.tuning import Selection, as_number, order_key


def mean_band(curves: list[dict[float, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs logged at different x: each curve is interpolated onto the union of all x within its own range
    (never extrapolated); mean and std (n - 1; 0 where one run) over the runs present at each x."""
    grid = np.array(sorted({x for c in curves for x in c}), dtype=float)
    stack = np.full((len(curves), len(grid)), np.nan)
    for i, curve in enumerate(curves):
        xs = np.array(sorted(curve), dtype=float)
        stack[i] = np.interp(grid, xs, [curve[x] for x in xs], left=np.nan, right=np.nan)
    present = ~np.isnan(stack)
    count = present.sum(0)
    mean = np.where(present, stack, 0).sum(0) / count
    sq = np.where(present, (stack - mean) ** 2, 0).sum(0)
    std = np.sqrt(sq / np.maximum(count - 1, 1)) * (count > 1)
    return grid, mean, std


def loss_curves(cell: Cell, key: str = "val/loss") -> list[dict[float, float]]:
    runs = [r for r in cell.of("completed") if r.metrics and r.metrics.get(key)]
    return [dict(points(r.metrics[key])) for r in runs]  # type: ignore[index]


def points(series: Series) -> list[tuple[float, float]]:
    return [(float(s), v) for s, v in series]


def by_length(run: Run, name: str = "exact_match") -> dict[float, float]:
    """Length -> metric over all test splits (weighted by examples where a length is in several)."""
    sums: dict[float, list[float]] = {}
    for split in (run.results.by_length or {}).values():
        for length, m in (split or {}).items():
            try:
                n, value = float(m.get("n", 1)), float(m[name])
                acc = sums.setdefault(float(length), [0.0, 0.0])
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
            acc[0], acc[1] = acc[0] + n * value, acc[1] + n
    return {x: s / n for x, (s, n) in sums.items() if n > 0}


def train_length_edge(runs: list[Run]) -> float | None:
    """Where test lengths end and test_long lengths begin: the longest length seen in training, as far as the
    results say."""
    edges = []
    for run in runs:
        splits = run.results.by_length or {}
        if isinstance(splits.get("test"), dict) and splits.get("test_long"):
            try:
                edges.append(max(float(k) for k in splits["test"]))
            except ValueError:
                continue
    return max(edges) if edges else None


MANY = 10  # more cells than this: colours from a gradient in table order (best first), no markers, faint bands


def _axes(title: str, xlabel: str, ylabel: str, n_cells: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5 if n_cells <= 20 else 6), dpi=110)
    _style(ax, title, xlabel, ylabel, n_cells)
    return fig, ax


def _style(ax: Any, title: str, xlabel: str, ylabel: str, n_cells: int) -> None:
    import matplotlib.pyplot as plt
    from cycler import cycler

    if n_cells <= MANY:  # few: distinct colours
        ax.set_prop_cycle(cycler(color=plt.get_cmap("tab10").colors[:n_cells]))
    else:  # many: the legend's order (the table's, best first) runs dark to light, so rank reads off the colour
        colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.92, n_cells))
        ax.set_prop_cycle(cycler(color=colors))
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)


def _title(what: str, drawn: list[tuple[str, list]]) -> str:
    seeds = {len(curves) for _, curves in drawn}
    n = "seeds" if len(seeds) != 1 else "1 seed per cell" if seeds == {1} else f"{seeds.pop()} seeds per cell"
    return f"{what} (mean +- 1 std over {n})" + (f"; {len(drawn)} cells, best first" if len(drawn) > MANY else "")


def _label(label: str, curves: list, drawn: list[tuple[str, list]]) -> str:
    same = len({len(c) for _, c in drawn}) == 1  # then the title says how many seeds
    return label if same else f"{label} (n={len(curves)})"


def _draw(ax: Any, label: str, curves: list[dict[float, float]], n_cells: int = 1) -> None:
    x, mean, std = mean_band(curves)
    marker = "o" if len(x) <= 40 and n_cells <= MANY else None  # few points, few lines: show where they are
    line = ax.plot(x, mean, marker=marker, ms=3, lw=1.6 if n_cells <= MANY else 1.1, label=label)[0]
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2 if n_cells <= MANY else 0.06, lw=0)


def _save(fig: Any, ax: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    entries = len(ax.get_legend_handles_labels()[1])
    columns = 1 if entries <= 16 else 2 if entries <= 40 else 3  # the legend stays about as tall as the axes
    ax.legend(fontsize="small" if entries <= 16 else "x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0, ncol=columns)  # beside the axes, never over the curves
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def _plot(ax: Any, drawn: list[tuple[str, list]]) -> None:
    for label, curves in drawn:
        _draw(ax, _label(label, curves, drawn), curves, len(drawn))


def plot_loss(cells: list[Cell], path: Path, key: str = "val/loss") -> Path | None:
    drawn = [(c.label, curves) for c in cells if (curves := loss_curves(c, key))]
    if not drawn:
        return None
    fig, ax = _axes(_title(f"{key} per cell", drawn), "step", key, len(drawn))
    _plot(ax, drawn)
    return _save(fig, ax, path)


def flops_curves(cell: Cell, key: str = "val/loss") -> list[dict[float, float]]:
    """Each completed run's `key` against the training FLOPs spent when it was measured: the logged running
    total train/flops, interpolated at the metric's step (linear from step 0 at 0 FLOPs)."""
    curves = []
    for run in cell.of("completed"):
        if not run.metrics or not run.metrics.get(key) or not run.metrics.get("train/flops"):
            continue
        spent = [(0.0, 0.0), *points(run.metrics["train/flops"])]
        steps, flops = np.array([p[0] for p in spent]), np.array([p[1] for p in spent])
        slope = flops[-1] / steps[-1] if steps[-1] > 0 else 0.0
        curve = {}
        for step, value in points(run.metrics[key]):
            at = np.interp(step, steps, flops) if step <= steps[-1] else flops[-1] + slope * (step - steps[-1])
            if at > 0:
                curve[float(at)] = value
        if curve:
            curves.append(curve)
    return curves


def plot_loss_vs_flops(cells: list[Cell], path: Path, key: str = "val/loss") -> Path | None:
    drawn = [(c.label, curves) for c in cells if (curves := flops_curves(c, key))]
    if not drawn:
        return None
    fig, ax = _axes(_title(f"{key} against training compute", drawn), "training FLOPs (log scale)", key,
                    len(drawn))
    ax.set_xscale("log")
    _plot(ax, drawn)
    return _save(fig, ax, path)


def plot_by_length(cells: list[Cell], path: Path, name: str = "exact_match") -> Path | None:
    drawn = [(c.label, curves) for c in cells
             if (curves := [x for r in c.of("completed") if (x := by_length(r, name))])]
    if not drawn:
        return None
    fig, ax = _axes(_title(f"test {name} by sequence length", drawn), "sequence length", name, len(drawn))
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-0.03, 1.03)  # a fraction of examples or tokens
    _plot(ax, drawn)
    edge = train_length_edge([r for c in cells for r in c.of("completed")])
    if edge is not None:
        ax.axvline(edge + 0.5, color="grey", ls="--", lw=1, label=f"training lengths end ({edge:g}): test | test_long")
    return _save(fig, ax, path)


def by_context(run: Run) -> dict[float, float]:
    """Evaluation length -> test perplexity (non-overlapping windows) from results.json's by_context."""
    rows = (run.results.by_context or {}).get("rows") or []
    return {float(r["length"]): float(r["ppl"]) for r in rows
            if isinstance(r, dict) and r.get("applicable") and r.get("mode") == "non_overlapping"}


def plot_by_context(cells: list[Cell], path: Path) -> Path | None:
    """Perplexity (log scale) against evaluation length per cell, with a line at the training context."""
    drawn = [(c.label, curves) for c in cells if (curves := [x for r in c.of("completed") if (x := by_context(r))])]
    if not drawn:
        return None
    fig, ax = _axes(_title("test perplexity by evaluation context", drawn), "evaluation context (tokens)",
                    "perplexity", len(drawn))
    ax.set(xscale="log", yscale="log")
    _plot(ax, drawn)
    trained = {(r.results.by_context or {}).get("train_length") for c in cells for r in c.of("completed")}
    trained.discard(None)
    for length in sorted(trained):
        ax.axvline(length, color="grey", ls="--", lw=1, label=f"training context ({length})")
    return _save(fig, ax, path)


def sensitivity(cell: Cell, key: str, metric_key: str) -> list[tuple[str, float, float, float]]:
    """(value, mean, min, max) of the metric over the completed runs at each value of one tuned key, the other
    tuned keys held at the cell's chosen values."""
    tuning = cell.tuning
    if tuning is None or tuning.chosen is None:
        return []
    rest = {k: v for k, v in tuning.chosen.values.items() if k != key}
    out = []
    for point in tuning.points:
        if any(point.values[k] != v for k, v in rest.items()):
            continue
        values = [v for r in point.runs if r.status == "completed" and (v := metric(r, metric_key)) is not None
                  and np.isfinite(v)]
        if values:
            out.append((point.values[key], float(np.mean(values)), min(values), max(values)))
    return out


def plot_sensitivity(cells: list[Cell], keys: list[str], selection: Selection, path: Path) -> Path | None:
    """Per tuned key, the selection metric against the key's value, one line per cell (mean over seeds, bars from
    the lowest to the highest seed), the chosen value starred: whether a cell wins by being better or by being
    more forgiving of the value. Log axis when every value is a positive number. Points of different cells at one
    value are spread a little sideways so their bars do not hide each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = {k: [(c, pts) for c in cells if (pts := sensitivity(c, k, selection.key))] for k in keys}
    if not any(drawn.values()):
        return None
    n = len(cells)
    colors = plt.get_cmap("tab10").colors if n <= MANY else plt.get_cmap("viridis")(np.linspace(0.0, 0.92, n))
    fig, axes = plt.subplots(1, len(keys), figsize=(7 * len(keys), 5 if n <= 20 else 6), dpi=110, squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        rows = drawn[key]
        values = sorted({v for _, pts in rows for v, *_ in pts}, key=order_key)
        numbers = [as_number(v) for v in values]
        log = all(x is not None and x > 0 for x in numbers)
        where = dict(zip(values, numbers if log or all(x is not None for x in numbers) else range(len(values)),
                         strict=True))
        held = [k for k in keys if k != key]
        title = f"{selection.key} against {key}\n(mean over seeds, bars: lowest to highest seed; stars: chosen)"
        title += f"\n{', '.join(held)} at each cell's chosen value" if held else ""
        _style(ax, title, f"{key}" + (" (log scale)" if log else ""), f"{selection.key} (validation)", n)
        if log:
            ax.set_xscale("log")
            ax.minorticks_off()
        if len(values) <= 12:  # the values tried, as the runs wrote them (0.003, not 3x10^-3)
            ax.set_xticks([where[v] for v in values], values)
        for i, (cell, pts) in enumerate(rows):
            shift = (i - (len(rows) - 1) / 2) * 0.012  # in decades on a log axis, else in units of the spacing
            step = 1.0 if log else min(np.diff(sorted(where.values())), default=1.0)
            x = [where[v] * 10**shift if log else where[v] + shift * step for v, *_ in pts]
            mean = np.array([m for _, m, _, _ in pts])
            bars = [mean - np.array([lo for *_, lo, _ in pts]), np.array([hi for *_, hi in pts]) - mean]
            color = colors[[id(c) for c in cells].index(id(cell))]  # one colour per cell in every panel
            line = ax.errorbar(x, mean, yerr=bars, marker="o", ms=4, capsize=3, lw=1.4, color=color,
                               label=cell.label)[0]
            chosen = cell.tuning.chosen.values[key]
            at = [(xi, m) for xi, (v, m, _, _) in zip(x, pts, strict=True) if v == chosen]
            if at:
                ax.plot(*at[0], marker="*", ms=15, color=line.get_color(), mec="black", mew=0.8, zorder=5)
    ax = axes[0][-1]
    ax.plot([], [], ls="", marker="*", ms=12, color="white", mec="black", label="chosen (best on validation)")
    entries = len(ax.get_legend_handles_labels()[1])
    ax.legend(fontsize="small" if entries <= 16 else "x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0, ncol=1 if entries <= 16 else 2)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
