"""What a tuned comparison cost and how early its ranking was known (docs/training.md, Pruned tuning): the training
FLOPs every run spent (runs pruned at a rung and cool-down branches included) against the full grid's (every job
trained to the end), the halving sweeper's rungs (halving.json), and, from the runs' budget branches, the rank
agreement (Kendall's tau) between each budget's validation metric and the end's, per cell over its tuned values."""

from __future__ import annotations

import json
import math
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scipy import stats

from archsweep.core.report.cells import Cell
from archsweep.core.report.runs import Run, metric
from archsweep.core.train.runs.halving import STATE, flops_spent, rung_score


@dataclass
class Agreement:
    """Kendall's tau between the budget `fraction`'s metric and the end's, per cell over the tuned values that
    have both, averaged over the cells where it is defined."""

    fraction: float
    tau: float | None
    cells: int
    values: int


@dataclass
class Pruning:
    spent: float | None  # training FLOPs of every run of every cell
    full: float | None  # the full grid's: every tuned value at every seed to the end, without branches (estimated)
    agreement: list[Agreement] = field(default_factory=list)
    halving: dict[str, Any] | None = None  # the sweep's halving.json

    @property
    def share(self) -> float | None:
        return self.spent / self.full if self.spent is not None and self.full else None


def run_flops(run: Run) -> float | None:
    return flops_spent(run.results.total_flops, run.results.budgets)


def cell_flops(cell: Cell) -> float | None:
    """Training FLOPs of all the cell's runs, every tuned value's, failed, diverged and pruned ones included."""
    numbers = [f for f in map(run_flops, [*cell.runs, *cell.others]) if f is not None]
    return sum(numbers) if numbers else None


def full_run_flops(cell: Cell) -> float | None:
    """What one job of the cell costs trained to the end: the mean total of its completed runs (branches aside)."""
    done = [r.results.total_flops for r in [*cell.runs, *cell.others]
            if r.status == "completed" and isinstance(r.results.total_flops, (int, float))]
    return statistics.fmean(done) if done else None


def full_grid(cell: Cell) -> float | None:
    """What the cell's full grid costs: every tuned value it tried at every seed it ran, each to the end."""
    runs = [*cell.runs, *cell.others]
    one = full_run_flops(cell)
    values = {tuple((k, v) for k, v in sorted(r.values.items()) if k != "seed") for r in runs}
    seeds = {r.values.get("seed") for r in runs}
    return one * len(values) * len(seeds) if one is not None else None


def cell_share(cell: Cell) -> float | None:
    """The cell's FLOPs spent over its full grid's."""
    spent, full = cell_flops(cell), full_grid(cell)
    return spent / full if spent is not None and full else None


def cell_rungs(cell: Cell, halving: dict[str, Any] | None) -> str | None:
    """How many of the cell's tuned values entered each rung and the end, e.g. '4>2>1' (halving.json)."""
    if not halving or not halving.get("rungs"):
        return None
    value_of = {run.run_dir.name: tuple(sorted(run.values.items())) for run in [*cell.runs, *cell.others]}
    stages = [*(r.get("jobs") or [] for r in halving["rungs"]), halving.get("final") or []]
    # a cell's values differ only in the tuned key and the seed: count distinct runs' values without the seed
    counts = [len({tuple((k, v) for k, v in value_of[str(j)] if k != "seed") for j in jobs if str(j) in value_of})
              for jobs in stages]
    return ">".join(map(str, counts)) if counts[0] else None


def budget_value(run: Run, fraction: float, key: str) -> float | None:
    """The run's `key` at the budget `fraction` (its branch's validation), None when it has none."""
    return rung_score({"budgets": run.results.budgets}, fraction, key)


def agreement(cells: list[Cell], key: str) -> list[Agreement]:
    """For each budget fraction below 1 that the runs recorded: Kendall's tau, within each tuned cell, between the
    values' mean `key` at that budget and at the end (the tuning's selection metric), averaged over cells."""
    fractions = sorted({float(b["fraction"]) for c in cells for r in [*c.runs, *c.others]
                        for b in r.results.budgets or [] if isinstance(b.get("fraction"), (int, float))
                        and b["fraction"] < 1})
    out = []
    for fraction in fractions:
        taus, values = [], 0
        for cell in cells:
            if cell.tuning is None:
                continue
            pairs = []
            for point in cell.tuning.points:
                early = [v for v in (budget_value(r, fraction, key) for r in point.runs) if v is not None]
                end = [v for v in (metric(r, key) for r in point.runs if r.status == "completed") if v is not None]
                if early and end and len(early) == len(point.runs):
                    pairs.append((statistics.fmean(early), statistics.fmean(end)))
            if len(pairs) >= 2:
                with warnings.catch_warnings():  # a constant ranking has no tau (nan), said below as "-"
                    warnings.simplefilter("ignore", RuntimeWarning)
                    tau = float(stats.kendalltau(*zip(*pairs, strict=True)).statistic)
                if math.isfinite(tau):
                    taus.append(tau)
                    values += len(pairs)
        out.append(Agreement(fraction, statistics.fmean(taus) if taus else None, len(taus), values))
    return out


def pruning(cells: list[Cell], sources: list[Path], key: str | None) -> Pruning | None:
    """The cost and the rank agreement of a tuned comparison (None when no run records FLOPs or budgets)."""
    spent = [f for f in map(cell_flops, cells) if f is not None]
    full = 0.0
    for cell in cells:
        one = full_grid(cell)
        full = math.nan if one is None or math.isnan(full) else full + one
    halving = next((read(s / STATE) for s in sources if (s / STATE).is_file()), None)
    found = agreement(cells, key) if key is not None else []
    if not spent and not found and halving is None:
        return None
    return Pruning(sum(spent) if spent else None, full if full and math.isfinite(full) else None, found, halving)


def read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def lines(p: Pruning, tuned: list[str]) -> list[str]:
    """The report's lines on cost and agreement."""
    out = []
    if p.halving is not None and p.halving.get("rungs"):
        rungs = p.halving["rungs"]
        counts = ", ".join(f"{len(r['jobs'])} to {r['fraction']:.3g}" for r in rungs)
        final = p.halving.get("final")
        out.append(f"Pruned by successive halving (halving.json; eta {p.halving.get('eta')}, by "
                   f"{p.halving.get('metric')}): {counts}"
                   + (f", {len(final)} to the end." if final is not None else "; the last rung is not finished."))
    if p.spent is not None:
        share = (f", {p.share:.0%} of the full grid's {p.full:.3g} (every tuned value at every seed, to the end)"
                 if p.share else "")
        out.append(f"Training FLOPs spent: {p.spent:.3g} (pruned runs and cool-down branches included){share}.")
    if any(a.cells for a in p.agreement):
        what = ", ".join(tuned) or "tuned"
        parts = [f"{a.fraction:.3g}: {'-' if a.tau is None else f'{a.tau:+.2f}'} ({a.cells} cell"
                 f"{'s' * (a.cells != 1)}, {a.values} values)" for a in p.agreement]
        out.append(f"Rank agreement of each budget with the end (Kendall's tau of each cell's {what} values by "
                   f"their mean, averaged over cells): {'; '.join(parts)}.")
    return out


@dataclass
class Replayed:
    """One cell of a full grid as the efficient design would have run it (`replay`)."""

    label: str
    chosen: str | None  # the tuned value the survivors' end chose
    rungs: list[int]  # values entering each rung, then the end
    seeds: int  # seeds the comparison used (its decision's; the baseline: the most any comparison used)
    verdict: str | None  # the sequential design's (None for the baseline)
    flops: float  # what the pruned, sequential design spent on this cell


def paused_cost(run: Run, fraction: float) -> float | None:
    """What `run` would have spent paused at budget `fraction`: its training to that budget's decay start and the
    decays of its branches up to it (from its recorded budgets; None when it has not that budget)."""
    budgets = {float(b["fraction"]): b for b in run.results.budgets or []
               if isinstance(b.get("fraction"), (int, float))}
    entry = next((b for f, b in budgets.items() if math.isclose(f, fraction, abs_tol=1e-9)), None)
    if entry is None or not isinstance(entry.get("flops"), (int, float)):
        return None
    decays = [b.get("branch_train_flops") or 0.0 for f, b in budgets.items() if f <= fraction + 1e-9 and f < 1]
    return float(entry["flops"]) - float(entry.get("branch_train_flops") or 0.0) + sum(decays)


def replay(cells: list[Cell], tuned: str, key: str, lower_better: bool, rungs: list[float], eta: int,
           start: int, design: Any, baseline_of: Any, sort_key: str, sort_lower: bool) -> list[Replayed]:
    """The efficient design replayed on a full grid whose runs recorded budget branches at `rungs`: halving on the
    first `start` seeds (each rung ranks a cell's values by `key` at that budget), the value chosen among the
    survivors on `key` at the end, then each cell against its baseline (`baseline_of`) by the sequential `design`
    on `sort_key`, seeds in order. Exact where pausing is (the paused run is the full run's prefix): its choices
    and costs are read from the full runs' results."""
    from archsweep.core.report.sequential import sequence
    from archsweep.core.report.significance import seed_order, verdict_of
    from archsweep.core.train.runs.halving import Job, survivors

    def seed_key(run: Run) -> tuple[int, float, str]:
        return seed_order(run.values.get("seed"))

    out: dict[int, Replayed] = {}
    picks: dict[int, list[Run]] = {}
    for cell in cells:
        runs = [*cell.runs, *cell.others]
        seeds = list(dict.fromkeys(r.values.get("seed") for r in sorted(runs, key=seed_key)))[:start]
        first = [r for r in runs if r.values.get("seed") in seeds]
        jobs = [Job(i, (), (cell.label,), str(r.values.get(tuned)), str(r.values.get("seed")))
                for i, r in enumerate(first)]
        alive, spent, counts = jobs, 0.0, []
        for fraction in rungs:
            counts.append(len({j.value for j in alive}))
            scores = {j.id: budget_value(first[j.id], fraction, key) for j in alive}
            kept = survivors(alive, scores, eta, lower_better)
            spent += sum(paused_cost(first[j.id], fraction) or 0.0 for j in alive if j not in kept)
            alive = kept
        counts.append(len({j.value for j in alive}))
        ends = {}
        for job in alive:
            value = metric(first[job.id], key)
            ends.setdefault(job.value, []).append(math.inf if value is None else value)
        sign = 1.0 if lower_better else -1.0
        chosen = min(ends, key=lambda v: sign * statistics.fmean(ends[v])) if ends else None
        picks[id(cell)] = sorted((r for r in runs if str(r.values.get(tuned)) == chosen and r.status == "completed"),
                                 key=seed_key)
        finalists = [first[j.id] for j in alive if j.value != chosen]
        spent += sum(run_flops(r) or 0.0 for r in finalists)
        out[id(cell)] = Replayed(cell.label, chosen, counts, 0, None, spent)
    tested = [c for c in cells if baseline_of(c) is not None and baseline_of(c) is not c]
    for cell in tested:
        base = baseline_of(cell)
        by_seed = {r.values.get("seed"): metric(r, sort_key) for r in picks[id(base)]}
        pairs = [(metric(r, sort_key), by_seed.get(r.values.get("seed"))) for r in picks[id(cell)]]
        diffs = [a - b for a, b in pairs if a is not None and b is not None]
        result = sequence(diffs, design) if len(diffs) >= design.start else None
        replayed = out[id(cell)]
        replayed.seeds = result.seeds if result is not None else len(diffs)
        replayed.verdict = (verdict_of(result.decision, result.seeds, result.next_seeds, design.detect, sort_lower)
                            if result is not None else f"{len(diffs)} seeds")
        out[id(base)].seeds = max(out[id(base)].seeds, replayed.seeds)
    for cell in cells:
        used = out[id(cell)].seeds or start
        out[id(cell)].flops += sum(run_flops(r) or 0.0 for r in picks[id(cell)][:used])
    return [out[id(c)] for c in cells]
