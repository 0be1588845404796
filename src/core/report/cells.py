"""The grid: runs grouped into cells by the keys that vary (seed aside), each cell's statistics over seeds, the
target and sort expressions, and the sorted table."""

from __future__ import annotations

import math
import operator
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from archsweep.core.report.runs import CompareError, Run, ignored, key_of, lookup, metric, read_config

OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
LOWER_BETTER = ("loss", "ppl", "bpb", "ppl_ratio", "params", "active_params", "target")
HIGHER_BETTER = ("acc", "exact_match", "decoded_exact_match", "bleu", "tokens_per_s")
TARGET_RE = re.compile(r"^\s*([\w./-]+)\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
DEFAULT_TARGET = "val/exact_match>=0.9"


@dataclass(frozen=True)
class Target:
    """A condition on a logged metric, e.g. val/exact_match>=0.9; a run reaches it at the first logged step where
    it holds."""

    metric: str
    op: str
    value: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"

    def step(self, run: Run) -> int | None:
        """First step meeting the target; None if never. Raises KeyError if the run has no metrics."""
        if run.metrics is None:
            raise KeyError(run.run_dir)
        hit = OPS[self.op]
        return next((s for s, v in run.metrics.get(self.metric, []) if hit(v, self.value)), None)


@dataclass(frozen=True)
class SortKey:
    key: str  # a table metric: val/loss, test/exact_match, tokens_per_s, params, target
    lower_better: bool

    def __str__(self) -> str:
        return f"{self.key} ({'lower' if self.lower_better else 'higher'} is better)"


def language_models(runs: list[Run]) -> bool:
    """Whether every completed (or diverged) run is a language model's, by results.json's `task_family`; runs
    written before the field existed do not say, and keep the general defaults. Exact match over a window of text
    is always 0."""
    families = {r.results.task_family for r in runs if r.status in ("completed", "diverged")}
    return families == {"lm"}  # failed runs record no family and do not count


def parse_target(expr: str | None, runs: list[Run]) -> Target | None:
    """None/'none'/'off' turns the column off; no expression: val/exact_match>=0.9 if the runs log it (not for
    language models)."""
    logged = sorted({k for r in runs if r.metrics for k in r.metrics})
    if expr is None:
        use = "val/exact_match" in logged and not language_models(runs)
        return parse_target(DEFAULT_TARGET, runs) if use else None
    if expr.strip().lower() in ("none", "off", ""):
        return None
    match = TARGET_RE.match(expr)
    if match is None:
        raise CompareError(f"--target {expr!r} is not METRIC OP VALUE; write e.g. --target 'val/exact_match>=0.9' "
                           "(OP one of >=, <=, >, <) or --target none")
    name, op, value = match.groups()
    if logged and name not in logged:
        raise CompareError(f"--target {expr!r}: no run logs {name!r}; metrics.csv columns: {', '.join(logged)}")
    return Target(name, op, float(value))


def parse_sort(expr: str, available: list[str]) -> SortKey:
    """'val/loss' (direction from the name: loss, ppl lower; acc, exact_match, bleu higher) or 'KEY:min|max'."""
    key, _, way = expr.strip().partition(":")
    if key not in available:
        raise CompareError(f"--sort {expr!r}: no such column; choose one of {', '.join(available)}")
    if way:
        if way not in ("min", "max"):
            raise CompareError(f"--sort {expr!r}: the direction after ':' must be min or max, e.g. {key}:min")
        return SortKey(key, way == "min")
    last = key.rsplit("/", 1)[-1]
    if last in LOWER_BETTER or last.endswith("loss"):
        return SortKey(key, True)
    if last in HIGHER_BETTER:
        return SortKey(key, False)
    raise CompareError(f"--sort {expr!r}: cannot tell whether lower or higher is better; write {key}:min or {key}:max")


def varying_keys(runs: list[Run], sweep_keys: list[str]) -> list[str]:
    """Keys whose value differs between runs, plus the sweep's own swept keys; seed and logging keys left out.
    A key missing from a run takes its value from the run's config.yaml (it was left at its default)."""
    order = [k for k in sweep_keys if k in {k for r in runs for k in r.values}]
    order += [k for r in runs for k in [*map(key_of, r.results.overrides or []), *r.values]]
    keys = [k for k in dict.fromkeys(order) if k != "seed" and not ignored(k)]
    for run in runs:
        missing = [k for k in keys if k not in run.values]
        config = read_config(run.run_dir) if missing else None
        run.values.update({k: lookup(config, k) or "-" for k in missing})
    return [k for k in keys if k in sweep_keys or len({r.values[k] for r in runs}) > 1]


@dataclass
class Stat:
    mean: float | None = None
    std: float | None = None  # sample standard deviation (n - 1); None for a single value
    n: int = 0

    @classmethod
    def of(cls, values: list[float]) -> Stat:
        if not values:
            return cls()
        std = statistics.stdev(values) if len(values) > 1 and all(map(math.isfinite, values)) else None
        return cls(statistics.fmean(values), std, len(values))


@dataclass
class Cell:
    values: dict[str, str]  # the varying keys' values
    runs: list[Run] = field(default_factory=list)
    stats: dict[str, Stat] = field(default_factory=dict)
    target_steps: list[int | None] = field(default_factory=list)  # per completed run with metrics; None: never
    best: bool = False
    # tuning.py's Tuning and significance.py's Contrast (typed Any here: those modules import this one)
    tuning: Any = None  # tuned keys: the values tried, the one chosen (whose runs are `runs`); None: nothing tuned
    others: list[Run] = field(default_factory=list)  # the runs at the tuned values not chosen
    test: Any = None  # the Contrast against the baseline; None: no baseline, or this is it

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items()) or "all runs"

    def of(self, status: str) -> list[Run]:
        return [r for r in self.runs if r.status == status]

    def every(self, status: str) -> list[Run]:
        """Of all the cell's runs, at every tuned value."""
        return [r for r in [*self.runs, *self.others] if r.status == status]

    @property
    def seeds(self) -> int:
        return len(self.of("completed"))

    def seed_values(self) -> list[str]:
        """The seeds the cell's runs (at its chosen tuned value) were started with, whatever their status."""
        return [str(r.values["seed"]) for r in self.runs if r.values.get("seed") is not None]

    def reached(self) -> list[int]:
        return [s for s in self.target_steps if s is not None]

    def sort_value(self, key: str) -> float | None:
        if key == "target":
            reached = self.reached()
            return statistics.fmean(reached) if reached and len(reached) == len(self.target_steps) else None
        return self.stats[key].mean if key in self.stats else None


def group_cells(runs: list[Run], keys: list[str]) -> list[Cell]:
    cells: dict[tuple[str, ...], Cell] = {}
    for run in runs:
        values = {k: run.values[k] for k in keys}
        cells.setdefault(tuple(values.values()), Cell(values)).runs.append(run)
    return list(cells.values())


def aggregate(cell: Cell, columns: list[str], target: Target | None) -> None:
    """Means and standard deviations over the cell's completed runs (diverged and failed ones are counted only)."""
    done = cell.of("completed")
    for key in columns:
        cell.stats[key] = Stat.of([v for v in (metric(r, key) for r in done) if v is not None])
    if target is not None:
        for run in done:
            try:
                cell.target_steps.append(target.step(run))
            except KeyError:
                continue


def sort_cells(cells: list[Cell], sort: SortKey) -> list[Cell]:
    """Best first, ties in label order; cells without a value (all failed, target never met) last."""
    def key(cell: Cell) -> tuple[Any, ...]:
        v = cell.sort_value(sort.key)
        missing = v is None or math.isnan(v)
        return (missing, 0.0 if missing else (v if sort.lower_better else -v), cell.label)

    ordered = sorted(cells, key=key)
    top = key(ordered[0])[:2] if ordered else (True,)
    for cell in ordered:  # cells tied with the best are all marked
        cell.best = top[0] is False and key(cell)[:2] == top
    return ordered


def metric_columns(runs: list[Run], wanted: list[str] | None) -> list[str]:
    """The final metrics shown: those asked for, or val loss, the final training loss and its spike count,
    val/test/test_long exact match, BLEU, whichever the completed runs have; for language models, loss,
    perplexity and bits per byte of val and test instead of exact match."""
    done = [r for r in runs if r.status == "completed"]
    have = lambda key: any(metric(r, key) is not None for r in done)
    if wanted:
        return list(wanted)
    default = ["val/loss", "train/loss", "train/loss_spikes", "val/exact_match", "test/exact_match",
               "test_long/exact_match", "val/bleu", "test/bleu", "by_context/ppl_ratio"]
    if language_models(runs):
        default = ["val/loss", "val/ppl", "val/bpb", "test/loss", "test/ppl", "test/bpb", "train/loss",
                   "train/loss_spikes", "by_context/ppl_ratio"]
    return [k for k in default if have(k)]


def available_columns(runs: list[Run]) -> list[str]:
    """Every final number the runs have: 'split/name' for the metric dicts, top-level numbers by name."""
    keys: set[str] = set()
    for run in runs:
        for key, value in run.results.to_dict().items():
            if isinstance(value, dict) and key not in ("choices", "by_length", "diverged"):
                keys |= {f"{key}/{name}" for name in value if metric(run, f"{key}/{name}") is not None}
            elif key not in ("seed", "version") and metric(run, key) is not None:
                keys.add(key)
    return sorted(keys, key=lambda k: ("/" not in k, k)) + ["target"]
