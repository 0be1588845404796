"""Seeds until the answer is known (docs/training.md, Sequential seeds): an always-valid paired t-test that may be
looked at after every batch of seeds and stopped at any look, with the error rate it states.

The evidence against "no difference" after n paired seeds is a Bayes factor of the t-statistic, the safe t-test of
Grünwald, de Heide and Koolen (2024) and Pérez-Ortiz et al. (2024): with a normal prior N(0, g) on the standardised
difference and the right Haar prior on the scale, t / sqrt(1 + n g) follows Student's t with n - 1 degrees of
freedom under the alternative, so the factor is a ratio of two t densities (Gönen et al. 2005). It is the
likelihood ratio of the scale-free shape of the sample, a nonnegative martingale under the null whatever the
stopping rule, so by Ville's inequality it exceeds 1/alpha at some look with probability at most alpha. A mixture
over prior scales g (equal weights, a factor of 4 apart) keeps it a martingale and lets a large difference stop
after few seeds while a small one still accumulates evidence.

Inverting the test at every shift of the differences gives a confidence sequence: an interval around the mean
difference that holds the true one at every look at once with probability >= 1 - alpha. Every decision is read from
the running intersection of these intervals: 0 outside is a difference (its sign says which), an interval inside
(-X, X) is "no difference as large as X", so every wrong decision needs the interval to miss the truth. Across a
table of m comparisons each interval is at level alpha / m (Bonferroni), which bounds the chance of any wrong
decision in the table by alpha, equivalence decisions included.

Why not group-sequential boundaries (O'Brien-Fleming alpha spending): they are derived for a normal statistic with
known variance and planned looks; with 2 to 10 seeds the t-statistic's tails are far heavier than the normal's, and
a user who adds a batch the plan did not foresee breaks them. The safe test needs neither.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special

SCALES = tuple(4.0**k for k in range(7))  # prior variances g of the standardised difference, 1 to 4096

HIGHER, LOWER, EQUIVALENT, MAXIMUM, OPEN = "higher", "lower", "equivalent", "maximum reached", "open"


def log_e_value(t: np.ndarray | float, n: int, scales: Sequence[float] = SCALES) -> np.ndarray:
    """log of the mixture Bayes factor for a t-statistic `t` of n >= 2 paired differences (elementwise in t;
    t = +-inf, every difference equal and non-zero, gives the factor's ceiling)."""
    if n < 2:
        raise ValueError(f"the safe t-test needs at least 2 seeds, got n={n}")
    nu = n - 1
    t2 = np.square(np.asarray(t, dtype=float))
    logs = []
    for g in scales:
        grow = 1.0 + n * g
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(np.isinf(t2), math.log(grow),
                             np.log1p(t2 / nu) - np.log1p(t2 / (nu * grow)))
        logs.append(-0.5 * math.log(grow) + 0.5 * (nu + 1) * ratio)
    return special.logsumexp(np.stack(logs), axis=0) - math.log(len(scales))


def ceiling(n: int, scales: Sequence[float] = SCALES) -> float:
    """The largest factor n seeds can give (every difference equal): no decision at a level below 1/ceiling."""
    return float(np.exp(log_e_value(np.inf, n, scales)))


def critical_t(n: int, level: float, scales: Sequence[float] = SCALES) -> float:
    """The |t| at which the factor reaches 1/level (inf when n seeds cannot reach it)."""
    return _critical_t(n, level, tuple(scales))


@functools.lru_cache(maxsize=1024)
def _critical_t(n: int, level: float, scales: tuple[float, ...]) -> float:
    target = -math.log(level)
    if float(log_e_value(np.inf, n, scales)) <= target:
        return math.inf
    high = 1.0
    while float(log_e_value(high, n, scales)) < target:
        high *= 2
    return float(optimize.brentq(lambda t: float(log_e_value(t, n, scales)) - target, 0.0, high, xtol=1e-10))


def e_value(diffs: Sequence[float], null: float = 0.0, scales: Sequence[float] = SCALES) -> float:
    """The evidence against a mean difference equal to `null` after these paired differences (1 = none)."""
    n = len(diffs)
    if n < 2:
        return 1.0
    mean, sd = statistics.fmean(diffs) - null, statistics.stdev(diffs)
    if sd == 0:
        return 1.0 if mean == 0 else ceiling(n, scales)
    return float(np.exp(log_e_value(mean / (sd / math.sqrt(n)), n, scales)))


@dataclass(frozen=True)
class Design:
    """How seeds are added: `start` seeds first, then `batch` more at each look up to `max_seeds`, each comparison
    at level alpha / comparisons; `detect` (X, in the metric's units) is the difference worth finding, and a
    difference shown to be smaller than it ends the comparison too (None: only a difference ends it)."""

    alpha: float = 0.05
    detect: float | None = None
    start: int = 2
    batch: int = 2
    max_seeds: int = 10
    comparisons: int = 1
    scales: tuple[float, ...] = SCALES

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha={self.alpha:g} must be between 0 and 1, e.g. 0.05")
        if self.detect is not None and not self.detect > 0:
            raise ValueError(f"detect={self.detect:g} must be a positive difference in the metric's units")
        if self.start < 2 or self.batch < 1 or self.max_seeds < self.start:
            raise ValueError(f"start={self.start}, batch={self.batch}, max_seeds={self.max_seeds}: the first look "
                             f"needs >= 2 seeds, a batch >= 1 seed, and max_seeds >= start")
        if self.comparisons < 1:
            raise ValueError(f"comparisons={self.comparisons} must be at least 1")

    @property
    def level(self) -> float:
        return self.alpha / self.comparisons

    def looks(self) -> list[int]:
        """The seed counts at which the comparison is looked at."""
        out = list(range(self.start, self.max_seeds + 1, self.batch))
        return out if out[-1] == self.max_seeds else [*out, self.max_seeds]

    def first_possible(self) -> int | None:
        """The fewest seeds that can decide anything at this level (the factor's ceiling reaches 1/level)."""
        return next((n for n in self.looks() if ceiling(n, self.scales) >= 1 / self.level), None)


@dataclass
class Look:
    seeds: int
    diff: float  # mean paired difference (cell - baseline)
    low: float  # the running confidence sequence after this look
    high: float
    e: float  # the factor against "no difference" at this look


@dataclass
class Outcome:
    """Where a comparison stands: `decision` is HIGHER / LOWER (the cell's metric is above / below the
    baseline's), EQUIVALENT (no difference as large as the design's detect), MAXIMUM (max_seeds ran, undecided) or
    OPEN (undecided; `next_seeds` says how many seeds the next look needs)."""

    decision: str
    looks: list[Look] = field(default_factory=list)
    p: float = 1.0  # anytime-valid p-value: 1 / the largest factor so far (capped at 1)
    next_seeds: int | None = None

    @property
    def seeds(self) -> int:
        return self.looks[-1].seeds if self.looks else 0


def confidence_radius(n: int, sd: float, level: float, scales: Sequence[float] = SCALES) -> float:
    """Half the width of the level's confidence interval around the mean of n differences with this sd."""
    crit = critical_t(n, level, scales)
    if math.isinf(crit):
        return math.inf
    return crit * sd / math.sqrt(n)


def sequence(diffs: Sequence[float], design: Design) -> Outcome:
    """Look at the paired differences (in seed order) at each of the design's looks that they reach, stopping at
    the first decision."""
    looks: list[Look] = []
    low, high, best = -math.inf, math.inf, 1.0
    for n in design.looks():
        if n > len(diffs):
            return Outcome(OPEN, looks, min(1.0, 1 / best), next_seeds=n)
        part = diffs[:n]
        mean, sd = statistics.fmean(part), statistics.stdev(part)
        radius = confidence_radius(n, sd, design.level, design.scales)
        low, high = max(low, mean - radius), min(high, mean + radius)
        e = e_value(part, 0.0, design.scales)
        best = max(best, e)
        looks.append(Look(n, mean, low, high, e))
        decision = decide(low, high, design.detect)
        if decision is not None:
            return Outcome(decision, looks, min(1.0, 1 / best))
    return Outcome(MAXIMUM, looks, min(1.0, 1 / best))


def decide(low: float, high: float, detect: float | None) -> str | None:
    if low > 0:
        return HIGHER
    if high < 0:
        return LOWER
    if detect is not None and -detect < low and high < detect:
        return EQUIVALENT
    return None


@dataclass
class Simulated:
    """Decisions of many simulated comparisons under one true difference."""

    decisions: dict[str, float]  # decision -> share of the comparisons
    mean_seeds: float


def simulate(effect: float, sd: float, design: Design, trials: int, seed: int = 0) -> Simulated:
    """Run `trials` comparisons whose paired differences are drawn N(effect, sd^2), each looked at and stopped as
    `sequence` does."""
    data = np.random.default_rng(seed).normal(effect, sd, size=(trials, design.max_seeds))
    decided, seeds = decide_many(data, design)
    names, counts = np.unique(decided, return_counts=True)
    return Simulated({str(k): float(c) / trials for k, c in zip(names, counts, strict=True)}, float(seeds.mean()))


def decide_many(data: np.ndarray, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """`sequence`'s decision and seeds used for each row of paired differences (rows: comparisons, columns: seeds
    in order, at least max_seeds of them), vectorised over the rows."""
    trials = len(data)
    low, high = np.full(trials, -np.inf), np.full(trials, np.inf)
    decided = np.full(trials, "", dtype=object)
    seeds = np.zeros(trials, dtype=int)
    for n in design.looks():
        live = decided == ""
        part = data[:, :n]
        mean, sd_n = part.mean(axis=1), part.std(axis=1, ddof=1)
        crit = critical_t(n, design.level, design.scales)
        radius = np.full(trials, np.inf) if math.isinf(crit) else crit * sd_n / math.sqrt(n)
        low = np.where(live, np.maximum(low, mean - radius), low)
        high = np.where(live, np.minimum(high, mean + radius), high)
        seeds = np.where(live, n, seeds)
        now = np.full(trials, "", dtype=object)
        if design.detect is not None:
            now = np.where((low > -design.detect) & (high < design.detect), EQUIVALENT, now)
        now = np.where(high < 0, LOWER, now)
        now = np.where(low > 0, HIGHER, now)
        decided = np.where(live & (now != ""), now, decided)
    return np.where(decided == "", MAXIMUM, decided).astype(str), seeds
