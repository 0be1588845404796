"""Successive halving of a tuned key's grid within each cell of a sweep (`hydra/sweeper=halving`; docs/training.md,
Pruned tuning), after Jamieson and Talwalkar (2016) and ASHA (Li et al. 2020), on the budget branches of
warmup-stable-decay runs (Hägele et al. 2024).

Every job of the grid trains to the first rung's fraction of its steps and pauses there (`pause_at`), after the
cool-down branch of that budget has been validated; within each cell (the jobs that differ only in the tuned key
and the seed) the tuned values are ranked by that branch's validation metric, averaged over seeds, and the best
1/eta of them continue, from their checkpoints, to the next rung; the last survivors train to the end. Nothing
here starts a process: the sweeper (hydra_plugins/archsweep_halving) launches the jobs these functions choose, and
`halving.json` in the sweep directory records each rung's scores and survivors.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archsweep.core.train.runs.results import RESULTS
from archsweep.core.train.runs.runinfo import override_key

STATE = "halving.json"
DONE = ("completed", "diverged", "failed")  # a job past every rung: nothing left to train


@dataclass(frozen=True)
class Job:
    """One job of the grid: its overrides (the sweep's choice of each swept key), its cell (the overrides other than
    the tuned key's and the seed's), its tuned value and its seed; `id` is its place in the grid, which names its
    directory in every rung."""

    id: int
    overrides: tuple[str, ...]
    cell: tuple[str, ...]
    value: str
    seed: str | None


def jobs_of(grid: list[list[str]], tune: str) -> list[Job]:
    """The grid's jobs (each a list of key=value overrides, in the launcher's order). ValueError when the tuned key
    is not swept over at least 2 values: there is nothing to prune."""
    values = {v for overrides in grid for o in overrides if override_key(o) == tune for v in [o.split("=", 1)[1]]}
    if len(values) < 2:
        raise ValueError(f"hydra.sweeper.tune={tune}: the sweep must vary it over at least 2 values to prune them "
                         f"(e.g. '{tune}=1e-3,3e-3,1e-2'); it has {sorted(values) or 'none'}")
    jobs = []
    for i, overrides in enumerate(grid):
        by_key = {override_key(o): o for o in overrides}
        cell = tuple(o for o in overrides if override_key(o) not in (tune, "seed"))
        seed = by_key["seed"].split("=", 1)[1] if "seed" in by_key else None
        jobs.append(Job(i, tuple(overrides), cell, by_key[tune].split("=", 1)[1], seed))
    return jobs


def results_of(sweep_dir: Path, job: Job) -> dict[str, Any] | None:
    """The job's results.json, None when it has none that reads."""
    try:
        data = json.loads((sweep_dir / str(job.id) / RESULTS).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def reached(results: dict[str, Any] | None, fraction: float | None) -> bool:
    """Whether a job whose results are these needs no training to reach `fraction` (None: the end): it paused at or
    beyond it, or it is past every rung (completed, diverged, failed)."""
    if results is None:
        return False
    status = results.get("status")
    if status in DONE:
        return True
    paused = results.get("paused") if status == "paused" else None
    at = paused.get("at") if isinstance(paused, dict) else None
    return fraction is not None and isinstance(at, (int, float)) and at >= fraction - 1e-9


def rung_score(results: dict[str, Any] | None, fraction: float, metric: str) -> float | None:
    """The job's `metric` (e.g. val/loss) at the budget `fraction`: its cool-down branch's validation, from
    results.json's budgets; None when it has none (failed, diverged, or stopped before that budget)."""
    for entry in (results or {}).get("budgets") or []:
        if isinstance(entry, dict) and math.isclose(float(entry.get("fraction", -1)), fraction, abs_tol=1e-9):
            value = entry.get(metric)
            return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
    return None


def point_scores(jobs: list[Job], scores: dict[int, float | None]) -> dict[tuple[tuple[str, ...], str], float]:
    """(cell, tuned value) -> the mean of its jobs' scores; +inf when any of its seeds has none (a failed or
    diverged run ranks last: a value that breaks one seed is not a value to keep)."""
    grouped: dict[tuple[tuple[str, ...], str], list[float | None]] = {}
    for job in jobs:
        grouped.setdefault((job.cell, job.value), []).append(scores.get(job.id))
    return {key: (math.inf if any(s is None for s in values) else sum(values) / len(values))  # type: ignore[misc]
            for key, values in grouped.items()}


def keep(n: int, eta: int) -> int:
    """How many of n values survive a rung: the best ceil(n / eta), at least one."""
    return max(1, math.ceil(n / eta))


def survivors(jobs: list[Job], scores: dict[int, float | None], eta: int, lower_better: bool = True) -> list[Job]:
    """The jobs of each cell's best ceil(n/eta) tuned values by their mean score over seeds (ties: the earlier value
    in the grid)."""
    points = point_scores(jobs, scores)
    order = {v: i for i, v in enumerate(dict.fromkeys(j.value for j in jobs))}
    kept: set[tuple[tuple[str, ...], str]] = set()
    for cell in dict.fromkeys(j.cell for j in jobs):
        values = [v for (c, v) in points if c == cell]
        sign = 1.0 if lower_better else -1.0
        ranked = sorted(values, key=lambda v: (sign * points[cell, v] if math.isfinite(points[cell, v]) else math.inf,
                                               order[v]))
        kept |= {(cell, v) for v in ranked[:keep(len(values), eta)]}
    return [j for j in jobs if (j.cell, j.value) in kept]


class State:
    """halving.json: the rungs taken so far, each with its fraction, the jobs scored, their scores and the jobs
    kept, rewritten whole (atomically) after each rung."""

    def __init__(self, sweep_dir: Path, settings: dict[str, Any], n_grid: int) -> None:
        self.path = sweep_dir / STATE
        try:  # the directories of seeds added by an earlier launch of this sweep keep their numbers
            seeds = json.loads(self.path.read_text()).get("seeds") or {}
        except (OSError, ValueError, AttributeError):
            seeds = {}
        self.data: dict[str, Any] = {**settings, "rungs": [], "seeds": seeds}
        self.n_grid = n_grid

    def seed_job(self, template: Job, seed: str) -> Job:
        """`template` (a job of the cell, at its chosen value) with another seed, in a directory numbered after the
        grid's: the same number for the same cell, value and seed at every launch of the sweep."""
        key = f"{template.id}:{seed}"
        if key not in self.data["seeds"]:
            self.data["seeds"][key] = self.n_grid + len(self.data["seeds"])
            self.write()
        overrides = tuple(o if override_key(o) != "seed" else f"seed={seed}" for o in template.overrides)
        if "seed" not in {override_key(o) for o in overrides}:
            overrides = (*overrides, f"seed={seed}")
        return Job(self.data["seeds"][key], overrides, template.cell, template.value, seed)

    def add_rung(self, fraction: float, jobs: list[Job], scores: dict[int, float | None], kept: list[Job]) -> None:
        self.data["rungs"] = [r for r in self.data["rungs"] if r["fraction"] != fraction]
        self.data["rungs"].append({"fraction": fraction, "jobs": [j.id for j in jobs],
                                   "scores": {str(j.id): scores.get(j.id) for j in jobs},
                                   "kept": [j.id for j in kept]})
        self.write()

    def finish(self, final: list[Job]) -> None:
        self.data["final"] = [j.id for j in final]
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        tmp.replace(self.path)


def flops_spent(total_flops: Any, budgets: Any) -> float | None:
    """The training FLOPs one run spent: its own (`total_flops`, to where it stopped or paused) and each budget
    branch's decay (`branch_train_flops`); None when it records neither."""
    spent = [total_flops, *(b.get("branch_train_flops") for b in budgets or [] if isinstance(b, dict))]
    numbers = [float(x) for x in spent if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)]
    return sum(numbers) if numbers else None
