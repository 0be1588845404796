"""Each cell against a baseline cell on the sort metric (docs/training.md, Tuned comparisons): the difference of
means with its confidence interval and a p-value from Welch's t-test, or the paired t-test when both cells ran the
same seeds (scipy.stats), Holm's correction across the table's comparisons, a verdict, and the power side: the
smallest difference the seeds at hand detect with 80% power, and the seeds per cell a given difference needs. Power
is the two-sided t-test's exact power from the noncentral t distribution, with the pooled standard deviation (of the
per-seed differences when paired)."""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scipy import optimize, stats

from archsweep.core.report.cells import Cell, SortKey
from archsweep.core.report.runs import CompareError, canon, metric
from archsweep.core.report.sequential import EQUIVALENT, HIGHER, LOWER, MAXIMUM, Design, sequence

POWER = 0.8
MAX_SEEDS = 2**20  # seeds_needed gives up (None) beyond this


@dataclass
class Diff:
    """Mean of a minus mean of b, the confidence interval of that difference, the two-sided p-value."""

    diff: float
    low: float
    high: float
    p: float


def quiet(test: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """scipy warns of precision loss when a cell's values (nearly) coincide; the numbers say it (a tiny or nan p)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return test(*args, **kwargs)


def welch(a: list[float], b: list[float], confidence: float = 0.95) -> Diff:
    result = quiet(stats.ttest_ind, a, b, equal_var=False)
    ci = result.confidence_interval(confidence)
    return Diff(statistics.fmean(a) - statistics.fmean(b), float(ci.low), float(ci.high), float(result.pvalue))


def paired(a: list[float], b: list[float], confidence: float = 0.95) -> Diff:
    """a[i] and b[i] ran the same seed."""
    result = quiet(stats.ttest_rel, a, b)
    ci = result.confidence_interval(confidence)
    return Diff(statistics.fmean(a) - statistics.fmean(b), float(ci.low), float(ci.high), float(result.pvalue))


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest of m p-values times (m - i + 1), made non-decreasing in that
    order and capped at 1; reject where the adjusted value is below alpha (family-wise error at most alpha)."""
    m, running = len(ps), 0.0
    adjusted = [0.0] * m
    for rank, i in enumerate(sorted(range(m), key=ps.__getitem__)):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def design(sd: float, n_a: int, n_b: int, is_paired: bool) -> tuple[float, int]:
    """The standard error of the difference and the t-test's degrees of freedom (sd: pooled, or of the per-seed
    differences when paired, n_a = n_b pairs)."""
    if is_paired:
        return sd / math.sqrt(n_a), n_a - 1
    return sd * math.sqrt(1 / n_a + 1 / n_b), n_a + n_b - 2


def power(effect: float, se: float, df: int, alpha: float) -> float:
    """Probability that the two-sided t-test at alpha rejects when the true difference is `effect`."""
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = effect / se
    upper, lower = float(stats.nct.sf(crit, df, nc)), float(stats.nct.cdf(-crit, df, nc))
    # scipy's noncentral t can return nan far in a tail (df=1, large nc): there the tail's probability is ~0 or ~1
    upper = upper if math.isfinite(upper) else float(nc > crit)
    lower = lower if math.isfinite(lower) else float(-nc > crit)
    return upper + lower


def min_detectable(sd: float, n_a: int, n_b: int, alpha: float, is_paired: bool) -> float:
    """The difference detected with 80% power at these seeds."""
    if sd == 0:
        return 0.0
    se, df = design(sd, n_a, n_b, is_paired)
    short = lambda d: power(d, se, df, alpha) - POWER
    high = se
    while short(high) < 0:
        high *= 2
    return float(optimize.brentq(short, 0.0, high))


def seeds_needed(effect: float, sd: float, alpha: float, is_paired: bool) -> int | None:
    """The fewest seeds per cell (>= 2) that detect a difference `effect` with 80% power; None beyond MAX_SEEDS."""
    if sd == 0:
        return 2
    enough = lambda n: power(abs(effect), *design(sd, n, n, is_paired), alpha) >= POWER
    high = 2
    while not enough(high):
        if high >= MAX_SEEDS:
            return None
        high *= 2
    low = max(2, high // 2)
    if enough(low):
        return low
    while high - low > 1:  # enough(high), not enough(low)
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def pooled_sd(a: list[float], b: list[float]) -> float:
    return math.sqrt(((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b))
                     / (len(a) + len(b) - 2))


@dataclass
class Contrast:
    """One cell against the baseline; numbers None where not computable (`short` says why: '1 seed')."""

    n: int
    n_base: int
    paired: bool = False
    diff: float | None = None  # cell mean - baseline mean
    low: float | None = None
    high: float | None = None
    p: float | None = None
    p_holm: float | None = None
    verdict: str | None = None
    mde: float | None = None  # minimum detectable effect at these seeds (80% power)
    seeds_needed: int | None = None  # per cell, to detect --detect D
    short: str | None = None
    # sequential seeds (sequential.py): the seeds the decision used, the looks taken, the anytime-valid p times the
    # table's comparisons, and the seeds the next look needs (open comparisons only)
    seeds_used: int | None = None
    looks: int | None = None
    p_bonferroni: float | None = None
    next_seeds: int | None = None


def samples(cell: Cell, key: str) -> list[tuple[Any, float]]:
    """(seed, value) of the cell's completed runs that have a finite value."""
    out = []
    for run in cell.of("completed"):
        value = metric(run, key)
        if value is not None and math.isfinite(value):
            out.append((run.values.get("seed"), value))
    return out


def against(cell: list[tuple[Any, float]], base: list[tuple[Any, float]], confidence: float, alpha: float,
              detect: float | None) -> Contrast:
    a, b = [v for _, v in cell], [v for _, v in base]
    test = Contrast(len(a), len(b))
    if len(a) < 2 or len(b) < 2:
        test.short = "no runs" if not a or not b else "1 seed"
        return test
    seeds = [s for s, _ in cell]
    test.paired = (None not in seeds and len(set(seeds)) == len(seeds)
                   and sorted(seeds) == sorted(s for s, _ in base))
    if test.paired:
        by_seed = dict(base)
        a, b = [v for _, v in cell], [by_seed[s] for s in seeds]
        d = paired(a, b, confidence)
        sd = statistics.stdev([x - y for x, y in zip(a, b, strict=True)])
    else:
        d = welch(a, b, confidence)
        sd = pooled_sd(a, b)
    test.diff, test.low, test.high = d.diff, d.low, d.high
    test.p = d.p if math.isfinite(d.p) else None  # nan: no spread in either cell and equal means
    test.mde = min_detectable(sd, len(a), len(b), alpha, test.paired)
    if detect is not None:
        test.seeds_needed = seeds_needed(detect, sd, alpha, test.paired)
    return test


@dataclass
class Significance:
    baselines: list[Cell]  # one, or one per combination of the keys the spec leaves open
    metric: SortKey
    alpha: float
    detect: float | None
    spec: dict[str, str] = field(default_factory=dict)  # the baseline as given: {key: value}
    open_keys: list[str] = field(default_factory=list)  # compared keys the spec does not name (matched per cell)
    design: Design | None = None  # sequential seeds: each comparison looked at after each batch (sequential.py)
    biased: bool = False  # the metric tested is the one the tuned values were chosen on

    @property
    def confidence(self) -> float:
        return 1 - self.alpha

    @property
    def label(self) -> str:
        spec = " ".join(f"{k}={v}" for k, v in self.spec.items())
        if len(self.baselines) == 1:
            return self.baselines[0].label
        return f"{spec} at each cell's own {', '.join(self.open_keys)}"

    def is_baseline(self, cell: Cell) -> bool:
        return any(cell is b for b in self.baselines)

    def baseline_of(self, cell: Cell) -> Cell | None:
        """The baseline cell that agrees with `cell` on every key the spec leaves open (the only one if one)."""
        if len(self.baselines) == 1:
            return self.baselines[0]
        return next((b for b in self.baselines if all(b.values[k] == cell.values[k] for k in self.open_keys)), None)


def parse_baseline(spec: str, keys: list[str], tuned: list[str], name: str = "--baseline") -> dict[str, str]:
    """{key: value} of a cell spec such as 'norm=pre model.n_layers=6'; name: where the spec came from."""
    pairs = spec.split()
    if not pairs or not all("=" in p and p.split("=", 1)[0] and p.split("=", 1)[1] for p in pairs):
        raise CompareError(f"{name} {spec!r}: give the baseline cell as key=value pairs separated by spaces, "
                           f"e.g. --baseline 'norm=pre'")
    wanted = {p.split("=", 1)[0]: canon(p.split("=", 1)[1]) for p in pairs}
    for key in wanted:
        if key in tuned:
            raise CompareError(f"{name} {spec!r}: {key} is tuned per cell, not compared; name the baseline by "
                               f"the compared keys ({', '.join(keys) or 'none'}), or add --no-tune")
        if key not in keys:
            raise CompareError(f"{name} {spec!r}: {key} is not a key the cells differ by; choose from "
                               f"{', '.join(keys) or '(none: there is one cell)'}")
    return wanted


def find_baselines(spec: str, cells: list[Cell], keys: list[str], tuned: list[str],
                   name: str = "--baseline") -> tuple[dict[str, str], list[Cell]]:
    """The spec as {key: value} and the cells that match it: one, or, when the spec leaves keys open (norm=pre in a
    sweep over norm and depth), one per value of those keys, each the baseline of the cells that share that value.
    CompareError naming the cells when none match."""
    wanted = parse_baseline(spec, keys, tuned, name)
    found = [c for c in cells if all(c.values[k] == v for k, v in wanted.items())]
    if not found:
        labels = ", ".join(c.label for c in cells)
        raise CompareError(f"{name} {spec!r} matches none of the cells: {labels}; give one of them with "
                           f"--baseline, or --baseline none for no test")
    return wanted, found


def against_baseline(cells: list[Cell], baselines: list[Cell], order: SortKey, alpha: float,
                     detect: float | None, spec: dict[str, str] | None = None,
                     keys: list[str] | None = None, design: Design | None = None) -> Significance:
    """Every other cell's Contrast against its baseline on the sort metric (stored on the cell), Holm-adjusted
    across the cells that have a p-value, with a verdict. With several baselines (a spec that leaves `keys` open),
    a cell's baseline is the one that shares its values of the open keys; a cell with none says 'no baseline'."""
    if order.key == "target":
        raise CompareError("--baseline tests a final metric; --sort target (steps to a target) is not one: sort by a "
                           "metric, e.g. --sort val/loss")
    if not 0 < alpha < 1:
        raise CompareError(f"--alpha {alpha:g}: give a significance level between 0 and 1, e.g. --alpha 0.05")
    if detect is not None and not detect > 0:
        raise CompareError(f"--detect {detect:g}: give the difference to detect as a positive number in the units "
                           f"of {order.key}, e.g. --detect 0.01")
    spec = spec or {}
    sig = Significance(baselines, order, alpha, detect, spec, [k for k in keys or [] if k not in spec])
    tested = [c for c in cells if not sig.is_baseline(c)]
    if design is not None:
        family = sum(sig.baseline_of(c) is not None for c in tested)
        sig.design = Design(alpha, detect, design.start, design.batch, design.max_seeds, max(1, family),
                            design.scales)
        for cell in tested:
            base = sig.baseline_of(cell)
            cell.test = (Contrast(cell.seeds, 0, short="no baseline") if base is None else
                         sequential_against(samples(cell, order.key), samples(base, order.key), sig.design,
                                            order.lower_better))
        return sig
    for cell in tested:
        base = sig.baseline_of(cell)
        if base is None:
            cell.test = Contrast(cell.seeds, 0, short="no baseline")
            continue
        cell.test = against(samples(cell, order.key), samples(base, order.key), sig.confidence, alpha, detect)
    with_p = [c.test for c in tested if c.test is not None and c.test.p is not None]
    for test, adjusted in zip(with_p, holm([t.p for t in with_p]), strict=True):
        test.p_holm = adjusted
    for cell in tested:
        test = cell.test
        if test is None or test.short is not None:
            continue
        if test.p_holm is not None and test.p_holm < alpha and test.diff:
            better = (test.diff < 0) == order.lower_better
            test.verdict = "better" if better else "worse"
        else:
            test.verdict = f"no detectable difference at alpha={alpha:g}"
    return sig


def sequential_against(cell: list[tuple[Any, float]], base: list[tuple[Any, float]], design: Design,
                       lower_better: bool) -> Contrast:
    """The cell against its baseline by the sequential design: paired differences in seed order, looked at after
    each batch, stopped at the first decision (seeds past it are not used)."""
    by_seed = dict(base)
    shared = sorted((s for s, _ in cell if s in by_seed), key=seed_order)
    test = Contrast(len(cell), len(base), paired=True)
    if len({s for s, _ in cell}) != len(cell) or None in by_seed or not shared:
        test.short = "no shared seeds" if not shared else "repeated seeds"
        return test
    values = dict(cell)
    diffs = [values[s] - by_seed[s] for s in shared]
    if len(diffs) < design.start:
        test.short = f"{len(diffs)} shared seed{'s' * (len(diffs) != 1)}"
        test.next_seeds = design.start
        return test
    out = sequence(diffs, design)
    last = out.looks[-1]
    test.diff, test.low, test.high = last.diff, last.low, last.high
    test.p, test.p_bonferroni = out.p, min(1.0, out.p * design.comparisons)
    test.seeds_used, test.looks, test.next_seeds = out.seeds, len(out.looks), out.next_seeds
    test.verdict = verdict_of(out.decision, out.seeds, out.next_seeds, design.detect, lower_better)
    return test


def verdict_of(decision: str, seeds: int, next_seeds: int | None, detect: float | None, lower_better: bool) -> str:
    if decision in (HIGHER, LOWER):
        return "better" if (decision == LOWER) == lower_better else "worse"
    if decision == EQUIVALENT:
        return f"no difference as large as {detect:g}"
    if decision == MAXIMUM:
        return f"undecided at {seeds} seeds (the most)"
    return f"open: look again at {next_seeds} seeds"


def seed_order(seed: Any) -> tuple[int, float, str]:
    try:
        return (0, float(seed), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(seed))
