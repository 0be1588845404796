"""Finding and reading the runs of one or more sweep directories: results.json, metrics.csv and the job's
overrides. Nothing here raises on a bad file; a run that cannot be used becomes a Skipped with the reason."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from archsweep.core.train.runs.results import RESULTS, Results
from archsweep.core.train.runs.runinfo import is_setting, override_key

METRICS, OVERRIDES = "metrics.csv", ".hydra/overrides.yaml"

Series = list[tuple[int, float]]  # (step, value), step counted from 1: the optimiser steps taken


class CompareError(ValueError):
    """Bad input to compare.py: the message names the value and the fix."""


@dataclass
class Run:
    run_dir: Path
    status: str  # completed | failed | diverged
    results: Results
    values: dict[str, str]  # key -> value: the group choices and the job's overrides, seed included
    metrics: dict[str, Series] | None = None  # None: metrics.csv missing or unreadable
    notes: list[str] = field(default_factory=list)  # why some of it could not be read


@dataclass
class Skipped:
    run_dir: Path
    reason: str
    name: str = ""  # its overrides, as far as they can be read


key_of = override_key
ignored = is_setting  # where or how a run is logged or executed (output_root, logger*, hydra.*, threads, ...)


def canon(value: Any) -> str:
    """One spelling per value, so that 3e-4 (an override) and 0.0003 (a resolved config) are one cell, and true
    (YAML, a --baseline) and True (the override Hydra's sweeper writes for it) too."""
    if isinstance(value, bool) or value is None:
        return "null" if value is None else str(value).lower()
    text = str(value)
    if text.lower() in ("true", "false"):
        return text.lower()
    for parse in (int, float):
        try:
            return str(parse(text)) if parse is int else repr(parse(text))
        except ValueError:
            pass
    return text


def find_runs(directory: str | Path) -> list[Path]:
    """Run directories under `directory` (itself included): those holding results.json or .hydra/overrides.yaml."""
    directory = Path(directory)
    found = {p.parent for p in directory.rglob(RESULTS)} | {p.parent.parent for p in directory.rglob("overrides.yaml")
                                                             if p.parent.name == ".hydra"}
    return sorted(found, key=lambda p: [int(s) if s.isdigit() else s for s in p.parts])


def read_metrics(path: str | Path) -> dict[str, Series]:
    """metrics.csv as one series per column. Rows that do not parse (a line being written) are left out.
    Validation rows logged after training (train.py validates and tests the best checkpoint at the final step)
    are dropped, so val/ series hold the curve seen while training."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if "step" not in (reader.fieldnames or []):
            raise ValueError("no 'step' column")
        rows = list(reader)
    series: dict[str, Series] = {}
    for row in rows:
        try:
            step = int(float(row["step"]))
        except (TypeError, ValueError):
            continue
        for key, text in row.items():
            if key in ("step", "epoch") or not text:
                continue
            try:
                series.setdefault(key, []).append((step + 1, float(text)))
            except (TypeError, ValueError):
                continue
    return drop_final_evaluation(series)


def drop_final_evaluation(series: dict[str, Series]) -> dict[str, Series]:
    tested = [s for key, points in series.items() if key.startswith("test") for s, _ in points]
    if not tested:
        return series
    end = min(tested)
    return {k: [(s, v) for s, v in pts if not (k.startswith("val/") and s >= end)] for k, pts in series.items()}


def last_step(run_dir: Path) -> str:
    try:
        steps = [s for pts in read_metrics(run_dir / METRICS).values() for s, _ in pts]
        return f"last logged step {max(steps)}" if steps else "nothing logged yet"
    except FileNotFoundError:
        return f"no {METRICS} yet"
    except (OSError, ValueError, csv.Error) as e:
        return f"{METRICS} unreadable ({e})"


def job_name(run_dir: Path) -> str:
    """The job's overrides that say what is trained (.hydra/overrides.yaml), '' if unreadable."""
    try:
        overrides = yaml.safe_load((run_dir / OVERRIDES).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ""
    if not isinstance(overrides, list):
        return ""
    return " ".join(str(o) for o in overrides if not ignored(key_of(str(o))))


def read_values(results: Results) -> dict[str, str]:
    values = {g: canon(o) for g, o in (results.choices or {}).items() if not ignored(g)}
    for override in results.overrides or []:
        key = key_of(override)
        if not ignored(key):
            values[key] = canon(override.split("=", 1)[1]) if "=" in override else "(deleted)"
    if results.seed is not None and "seed" not in values:
        values["seed"] = canon(results.seed)
    return values


def read_results(path: str | Path) -> Results:
    """results.json of any version training wrote (core/train/runs/results.py); ValueError saying what is wrong."""
    return Results.read(path)


def load_run(run_dir: str | Path) -> Run | Skipped:
    run_dir = Path(run_dir)
    path = run_dir / RESULTS
    if not path.is_file():
        return Skipped(run_dir, f"running or interrupted: no {RESULTS}, {last_step(run_dir)}", job_name(run_dir))
    try:
        results = read_results(path)
    except (OSError, UnicodeDecodeError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        return Skipped(run_dir, f"unreadable {RESULTS}: {e}", job_name(run_dir))
    if results.status == "interrupted":  # stopped by a signal; resuming it finishes it
        stop = results.interrupted or {}
        return Skipped(run_dir, f"interrupted by {stop.get('signal', 'a signal')} at step {stop.get('step', '?')}: "
                                f"resume it (ckpt_path=<this dir>, or re-run the sweep)", job_name(run_dir))
    run = Run(run_dir, results.status, results, read_values(results))
    if run.status != "failed":
        try:
            run.metrics = read_metrics(run_dir / METRICS)
        except (OSError, UnicodeDecodeError, ValueError, csv.Error) as e:
            run.notes.append(f"{METRICS} left out: {e}")
    return run


def number(value: Any) -> float | None:
    """A metric value as a float; None for anything that is not a number (missing, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def metric(run: Run, key: str) -> float | None:
    """A final metric by table key: 'val/loss', 'test_long/exact_match', 'tokens_per_s', 'params'."""
    return number(run.results.value(key))


def read_config(run_dir: str | Path) -> Any:
    """The run's resolved config.yaml; None if missing or unreadable."""
    try:
        return yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def lookup(config: Any, dotted: str) -> str | None:
    """A key's value in a resolved config (for a key set in other runs but left at its default in this one)."""
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return None
        config = config[part]
    return None if isinstance(config, (dict, list)) else canon(config)
