"""Loss against compute as a power law, per architecture variant (`compare.py --scaling <key>`).

Each completed run is one point: its training FLOPs (results.json `total_flops`) and its final metric (val/loss
by default, from the checkpoint it was evaluated at); a run with budget branches (`schedule=wsd
schedule.branches=[...]`, results.json `budgets`) is one point per budget: the training FLOPs of that budget's
steps and its metric at the end of its decay. Points of one variant (the value of `<key>`) are bucketed by
compute (budgets within 2% are one budget; seeds of a cell are averaged first, budget by budget); the compute
frontier is the best point of each budget (the size that budget trains best), and

    log L = log a - b log C

is fitted to the frontier by least squares: b is the exponent, reported with its standard error (from the
residuals, n - 2 degrees of freedom; none with two points). Kaplan et al. 2020 and Hoffmann et al. 2022 fit the
same form (with an irreducible term, which a few small runs cannot pin down; without it the exponent is an
effective one over this range).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from archsweep.core.report.cells import Cell
from archsweep.core.report.runs import CompareError, Run, metric

SAME_BUDGET = 0.02  # runs whose compute differs by less than this share the budget


@dataclass
class Fit:
    variant: str
    exponent: float | None  # b in L = a C^(-b)
    exponent_se: float | None
    coefficient: float | None  # a
    frontier: list[tuple[float, float, str]]  # (compute, metric, the cell) of the best cell per budget
    points: list[tuple[float, float, str]] = field(default_factory=list)  # every cell: (compute, metric, cell)


def run_points(run: Run, metric_key: str) -> dict[float, tuple[float, float]]:
    """fraction of the run -> (training FLOPs, metric) of a completed run: each budget it recorded (schedule.branches)
    that has the metric, else the run itself as fraction 1; {} without total_flops or the metric."""
    budgets = run.results.budgets or []
    points = {float(b["fraction"]): (float(b["flops"]), float(b[metric_key])) for b in budgets
              if isinstance(b.get("flops"), (int, float)) and isinstance(b.get(metric_key), (int, float))
              and isinstance(b.get("fraction"), (int, float))}
    if points:
        return points
    flops, value = metric(run, "total_flops"), metric(run, metric_key)
    return {1.0: (flops, value)} if flops and value is not None else {}


def cell_points(cells: list[Cell], key: str, metric_key: str) -> dict[str, list[tuple[float, float, str]]]:
    """variant -> [(mean compute, mean metric, cell label)]: per cell and budget, over the cell's completed runs."""
    out: dict[str, list[tuple[float, float, str]]] = {}
    for cell in cells:
        by_budget: dict[float, list[tuple[float, float]]] = {}
        for run in cell.of("completed"):
            for fraction, point in run_points(run, metric_key).items():
                by_budget.setdefault(fraction, []).append(point)
        label = ", ".join(f"{k}={v}" for k, v in cell.values.items() if k != key)
        branched = len(by_budget) > 1
        for fraction, points in sorted(by_budget.items()):
            compute = statistics.fmean(p[0] for p in points)
            value = statistics.fmean(p[1] for p in points)
            if math.isfinite(value):
                where = f"{label}, budget {fraction:g}" if branched else label
                out.setdefault(cell.values.get(key, "-"), []).append((compute, value, where))
    return out


def frontier(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The best point of each compute budget, budgets in increasing order."""
    best: list[tuple[float, float, str]] = []
    for point in sorted(points):
        if best and point[0] <= best[-1][0] * (1 + SAME_BUDGET):
            if point[1] < best[-1][1]:
                best[-1] = point
        else:
            best.append(point)
    return best


def power_law(points: list[tuple[float, float, str]]) -> tuple[float | None, float | None, float | None]:
    """(b, standard error of b, a) of log L = log a - b log C; (None, None, None) with fewer than two budgets."""
    if len(points) < 2:
        return None, None, None
    x = np.log([p[0] for p in points])
    y = np.log([p[1] for p in points])
    slope, intercept = np.polyfit(x, y, 1)
    se = None
    if len(points) > 2:
        residual = y - (intercept + slope * x)
        se = float(math.sqrt(residual @ residual / (len(points) - 2) / ((x - x.mean()) @ (x - x.mean()))))
    return float(-slope), se, float(math.exp(intercept))


def scaling_fits(cells: list[Cell], key: str, keys: list[str], metric_key: str = "val/loss") -> list[Fit]:
    if key not in keys:
        raise CompareError(f"--scaling {key!r}: not a key that varies across these runs; choose one of "
                           f"{', '.join(keys) or '(none: the runs form one cell)'}")
    by_variant = cell_points(cells, key, metric_key)
    if not by_variant:
        raise CompareError("--scaling: no completed run has total_flops in its results.json (runs from before "
                           "FLOP accounting, or none finished); re-run them, e.g. python train.py -m "
                           "experiment=scaling (or experiment=scaling_branches: one run per width)")
    fits = []
    for variant, points in sorted(by_variant.items()):
        best = frontier(points)
        b, se, a = power_law(best)
        fits.append(Fit(variant, b, se, a, best, sorted(points)))
    return fits


def fit_text(fit: Fit) -> str:
    if fit.exponent is None:
        return f"{fit.variant}: one budget only, no fit"
    se = f" +- {fit.exponent_se:.4f}" if fit.exponent_se is not None else " (two budgets: no error estimate)"
    return f"{fit.variant}: loss = {fit.coefficient:.4g} C^-({fit.exponent:.4f}{se}) over {len(fit.frontier)} budgets"


def plot_scaling(fits: list[Fit], key: str, metric_key: str, path: Path) -> Path | None:
    from archsweep.core.report.plots import _axes, _save

    if not any(f.frontier for f in fits):
        return None
    fig, ax = _axes(f"{metric_key} against training compute, per {key}", "training FLOPs (log scale)",
                    f"{metric_key} (log scale)")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, ScalarFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())  # losses read as 2.4, not 2.4 x 10^0
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.yaxis.set_minor_locator(LogLocator(subs="all"))
    colours = plt.get_cmap("tab10").colors
    for i, fit in enumerate(fits):
        colour = colours[i % len(colours)]
        xs, ys = [p[0] for p in fit.points], [p[1] for p in fit.points]
        ax.plot(xs, ys, ls="none", marker="o", ms=4, alpha=0.35, color=colour)
        fx, fy = [p[0] for p in fit.frontier], [p[1] for p in fit.frontier]
        ax.plot(fx, fy, ls="none", marker="o", ms=7, color=colour,
                label=None if fit.exponent is not None else f"{key}={fit.variant}")
        if fit.exponent is not None:
            grid = np.geomspace(min(fx), max(fx), 50)
            ax.plot(grid, fit.coefficient * grid ** -fit.exponent, color=colour, ls="-", lw=1.5,
                    label=f"{key}={fit_text(fit)}")
    ax.text(0.01, 0.01, "faint: every cell; solid: the best cell of each budget; lines: power-law fits",
            transform=ax.transAxes, fontsize="x-small", alpha=0.7)
    return _save(fig, ax, path)
