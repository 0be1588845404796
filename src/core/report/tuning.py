"""Tuned axes (docs/training.md, Tuned comparisons): keys such as optim.lr that a sweep varies so each compared cell
can be reported at its own best value, chosen on validation (never test), with a warning when that best value sits
at the edge of the values the cell tried."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from archsweep.core.report.cells import Cell, SortKey, Stat, parse_sort
from archsweep.core.report.runs import CompareError, Run, metric

# which way to extend a grid whose best value is at its edge
EDGES = {"low": ("<", "smallest", "downward"), "high": (">", "largest", "upward")}
SMALL = "?"  # fewer than 3 values tried: too few to tell whether the best is at an edge


@dataclass
class Point:
    """The runs of one cell at one combination of the tuned values, and their selection metric over seeds."""

    values: dict[str, str]  # tuned key -> value
    runs: list[Run]
    stat: Stat = field(default_factory=Stat)


@dataclass
class Tuning:
    keys: list[str]
    points: list[Point]
    chosen: Point | None  # None: no run at any value has the selection metric
    edges: dict[str, str] = field(default_factory=dict)  # key -> "low" | "high" | "small"
    grids: dict[str, list[str]] = field(default_factory=dict)  # key -> the values tried, in order

    def mark(self, key: str) -> str:
        edge = self.edges.get(key)
        return EDGES[edge][0] if edge in EDGES else SMALL if edge == "small" else ""


@dataclass(frozen=True)
class Selection:
    """The validation metric the tuned values are chosen on, and why that one."""

    sort: SortKey
    reason: str

    @property
    def key(self) -> str:
        return self.sort.key


def selection_metric(order: SortKey, available: list[str]) -> Selection:
    """The sort metric with its split replaced by val (test/acc -> val/acc, val/loss itself); val/loss when the
    runs have no such validation metric (or the sort is not a split's metric: tokens_per_s, target)."""
    split, _, name = order.key.partition("/")
    if name and order.key != "target":
        val = f"val/{name}"
        if val in available:
            how = "the sort metric" if split == "val" else f"the validation split of the sort metric {order.key}"
            return Selection(SortKey(val, order.lower_better), how)
    if "val/loss" in available:
        return Selection(parse_sort("val/loss", available), f"no validation metric matches the sort metric "
                                                             f"{order.key}, so validation loss")
    raise CompareError(f"cannot tune: the runs have no validation metric to choose by (no val/loss; sort metric "
                       f"{order.key}); compare without tuning: --no-tune")


def resolve_tune(asked: list[str] | None, from_runs: list[str], keys: list[str], notes: list[str]) -> list[str]:
    """The tuned keys: --tune's (asked; [] for --no-tune), else the runs' compare.tune. A key the runs do not vary
    is refused when asked for, and left out with a note when the runs' config names it."""
    if asked is not None:
        bad = [k for k in asked if k not in keys]
        if bad:
            raise CompareError(f"--tune {','.join(bad)}: not a key that varies across these runs; choose from "
                               f"{', '.join(keys) or '(none: every run has the same settings)'}, or --no-tune")
        return list(asked)
    unvaried = [k for k in from_runs if k not in keys]
    if unvaried:
        notes.append(f"compare.tune names {', '.join(unvaried)}, which these runs do not vary: not tuned")
    return [k for k in from_runs if k in keys]


def tune_cell(cell: Cell, keys: list[str], selection: Selection) -> None:
    """Group the cell's runs by their tuned values, choose the one with the best mean of the selection metric over
    its completed runs (validation only; over the seeds every value ran, when some ran more), and keep that value's
    runs as the cell's; the others stay in cell.others (counted, plotted in the sensitivity plot)."""
    points: dict[tuple[str, ...], Point] = {}
    for run in cell.runs:
        values = {k: run.values[k] for k in keys}
        points.setdefault(tuple(values.values()), Point(values, [])).runs.append(run)
    shared = shared_seeds(list(points.values()))
    for point in points.values():
        done = [metric(r, selection.key) for r in point.runs
                if r.status == "completed" and (shared is None or r.values.get("seed") in shared)]
        point.stat = Stat.of([v for v in done if v is not None and math.isfinite(v)])
    sign = 1 if selection.sort.lower_better else -1
    scored = [p for p in points.values() if p.stat.mean is not None]
    chosen = min(scored, key=lambda p: (sign * p.stat.mean, list(p.values.values()))) if scored else None
    tuning = Tuning(keys, sorted(points.values(), key=lambda p: [order_key(v) for v in p.values.values()]), chosen)
    for key in keys:
        tuning.grids[key] = sorted({p.values[key] for p in points.values()}, key=order_key)
        if chosen is not None:
            edge = edge_of(chosen.values[key], tuning.grids[key])
            if edge is not None:
                tuning.edges[key] = edge
    cell.tuning = tuning
    if chosen is not None:
        cell.others = [r for r in cell.runs if r not in chosen.runs]
        cell.runs = list(chosen.runs)


def shared_seeds(points: list[Point]) -> set | None:
    """The seeds every value of the cell ran (whatever became of the runs), when the values ran different seeds:
    seeds added later at the chosen value alone (sequential seeds) then cannot change which value is chosen. None
    when every value ran the same seeds, or they share none."""
    seeds = [{r.values.get("seed") for r in p.runs} for p in points]
    common = set.intersection(*seeds) if seeds else set()
    return None if not common or all(s == common for s in seeds) else common


def order_key(value: str) -> tuple[int, float, str]:
    """Numbers in numeric order, before any other value."""
    number = as_number(value)
    return (0, number, "") if number is not None else (1, 0.0, value)


def as_number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def edge_of(best: str, grid: list[str]) -> str | None:
    """'low' / 'high' when the best value is the smallest / largest of a numeric grid of >= 3 values; 'small'
    when fewer than 3 were tried; None inside the grid, or when the values have no order (not all numbers)."""
    numbers = [as_number(v) for v in grid]
    if any(n is None for n in numbers):
        return None
    if len(grid) < 3:
        return "small"
    value = as_number(best)
    return "low" if value == min(numbers) else "high" if value == max(numbers) else None


def edge_lines(cells: list[Cell]) -> list[str]:
    """One line per cell and tuned key whose best value is at an edge of its grid or whose grid is too small."""
    lines = []
    for cell in cells:
        tuning = cell.tuning
        if tuning is None or tuning.chosen is None:
            continue
        for key, edge in tuning.edges.items():
            best, grid = tuning.chosen.values[key], tuning.grids[key]
            if edge in EDGES:
                _, end, way = EDGES[edge]
                lines.append(f"cell {cell.label}: best {key} {best} is the {end} tried; extend the grid {way}")
            else:
                lines.append(f"cell {cell.label}: {key} tried at {len(grid)} value{'s' * (len(grid) != 1)} only "
                             f"({', '.join(grid)}): too few to tell whether the best, {best}, is at an edge "
                             "(tune over >= 3 values)")
    return lines
