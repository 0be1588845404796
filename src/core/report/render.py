"""The comparison as text: the terminal table, comparison.md, comparison.csv and comparison.json."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archsweep.core.report.cells import Cell, SortKey, Stat, Target
from archsweep.core.report.pruning import Pruning, cell_flops, cell_rungs, cell_share
from archsweep.core.report.pruning import lines as pruning_lines
from archsweep.core.report.runs import Run, Skipped
from archsweep.core.report.scaling import Fit, fit_text
from archsweep.core.report.significance import POWER, Contrast, Significance
from archsweep.core.report.transfer import TransferRow, transfer_lines
from archsweep.core.report.tuning import Selection, edge_lines

# shown last, without a deviation: what each cell cost and what was held fixed (parameters, FLOPs)
# (active_params: those one token uses, shown where some run's differ from its params: a mixture of experts)
COUNTS = ("tokens_per_s", "mfu", "peak_memory_mib", "params", "active_params", "flops_per_token", "total_flops")
HEADERS = {"tokens_per_s": "tokens/s", "peak_memory_mib": "peak MiB", "flops_per_token": "FLOPs/token",
           "active_params": "active params",
           "total_flops": "total FLOPs", "mfu": "MFU"}
FORMATS: dict[str, Callable[[float], str]] = {"mfu": lambda v: f"{100 * v:.1f}%",
                                              "flops_per_token": lambda v: f"{v:.4g}",
                                              "total_flops": lambda v: f"{v:.4g}"}


@dataclass
class Report:
    sources: list[Path]
    out_dir: Path
    keys: list[str]
    columns: list[str]  # final metrics shown, in order
    cells: list[Cell]  # sorted, best first
    target: Target | None
    sort: SortKey
    skipped: list[Skipped]
    notes: list[str]  # warnings about runs that were used (metrics.csv unreadable, duplicate seeds)
    plots: dict[str, Path]  # title -> PNG written
    scaling_key: str | None = None  # --scaling: the key whose variants get a power law of loss against compute
    scaling: list[Fit] = field(default_factory=list)
    scaling_metric: str = "val/loss"
    tuned: list[str] = field(default_factory=list)  # keys tuned per cell (tuning.py)
    selection: Selection | None = None  # the validation metric the tuned values are chosen on
    significance: Significance | None = None  # --baseline: each other cell's Contrast is on the cell
    pruning: Pruning | None = None  # FLOPs spent against the full grid's, halving rungs, rank agreement by budget
    sort_source: str = ""  # why this sort: "the preset's question" when it is the runs' compare.metric
    transfer_key: str | None = None  # compare.transfer: the width key
    transfer: list[TransferRow] = field(default_factory=list)  # per group and width: best value, drift, gap

    def runs(self, status: str) -> list[Run]:
        return [r for c in self.cells for r in c.every(status)]


def num(v: float | None, whole: bool = False) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    return f"{v:,.0f}" if whole or abs(v) >= 1000 else f"{v:.4f}"


def stat_text(s: Stat, whole: bool = False) -> str:
    return num(s.mean, whole) if s.std is None or whole else f"{num(s.mean)} +- {num(s.std)}"


def count_text(key: str, s: Stat) -> str:
    fmt = FORMATS.get(key)
    return stat_text(s, True) if fmt is None or s.mean is None or not math.isfinite(s.mean) else fmt(s.mean)


def target_text(cell: Cell) -> str:
    steps, reached = cell.target_steps, cell.reached()
    if not steps:
        return "-"
    if not reached:
        return "never"
    text = f"{statistics.fmean(reached):.0f}" + (f" +- {statistics.stdev(reached):.0f}" if len(reached) > 1 else "")
    return text + (f" ({len(reached)}/{len(steps)})" if len(reached) < len(steps) else "")


def table(report: Report) -> tuple[list[str], list[list[str]], list[bool]]:
    """Headers, rows of strings, and which columns are numeric (right-aligned)."""
    cols: list[tuple[str, Callable[[Cell], str], bool]] = [("best", lambda c: "*" if c.best else "", False)]
    cols += [(k, lambda c, k=k: c.values[k], False) for k in report.keys] or [("cell", lambda c: c.label, False)]
    cols += [(k, lambda c, k=k: tuned_text(c, k), True) for k in report.tuned]
    cols.append(("seeds", lambda c: str(c.seeds), True))
    cols += [(k, lambda c, k=k: stat_text(c.stats[k]), True) for k in report.columns if k not in COUNTS]
    if report.target is not None:
        cols.append(("steps to target", target_text, True))
    if report.significance is not None:
        cols += significance_columns(report.significance)
    if report.pruning is not None:
        cols += pruning_columns(report.pruning)
    cols += [(count_header(report, k), lambda c, k=k: count_text(k, c.stats[k]), True)
             for k in sorted((k for k in report.columns if k in COUNTS), key=COUNTS.index)]
    cols += [("diverged", lambda c: str(len(c.of("diverged"))), True),
             ("failed", lambda c: str(len(c.of("failed"))), True)]
    return [h for h, _, _ in cols], [[f(c) for _, f, _ in cols] for c in report.cells], [r for _, _, r in cols]


def pruning_columns(p: Pruning) -> list[tuple[str, Callable[[Cell], str], bool]]:
    """The training FLOPs each cell spent (its share of its full grid's), and with halving its values per rung."""
    def spent(cell: Cell) -> str:
        flops, share = cell_flops(cell), cell_share(cell)
        return "-" if flops is None else f"{flops:.3g}" + (f" ({share:.0%})" if share is not None else "")

    cols = [("FLOPs spent (of full)", spent, True)]
    if p.halving is not None:
        cols.append(("rate values by rung", lambda c: cell_rungs(c, p.halving) or "-", True))
    return cols


def count_header(report: Report, key: str) -> str:
    """A count's column header; MFU measured against a probed peak (a CPU's) says it is an estimate."""
    if key == "mfu" and estimated_mfu(report.cells):
        return "MFU (est.)"
    return HEADERS.get(key, key)


def estimated_mfu(cells: list[Cell]) -> list[Run]:
    """The completed runs whose MFU is measured against a probe, not a data sheet (results.json's mfu_estimate)."""
    return [r for c in cells for r in c.of("completed") if r.results.mfu is not None and r.results.mfu_estimate]


def tuned_text(cell: Cell, key: str) -> str:
    """The chosen value of a tuned key, marked < or > at the low or high edge of the cell's grid, ? when fewer than 3
    values were tried."""
    tuning = cell.tuning
    if tuning is None or tuning.chosen is None:
        return "-"
    mark = tuning.mark(key)
    return tuning.chosen.values[key] + (f" {mark}" if mark else "")


def signed(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:+,.0f}" if abs(v) >= 1000 else f"{v:+.4f}"


def p_text(p: float | None) -> str:
    return "-" if p is None else f"{p:.3g}"


def significance_columns(sig: Significance) -> list[tuple[str, Callable[[Cell], str], bool]]:
    """Difference of means with its CI, the test, p, Holm's p, the verdict, the minimum detectable effect and
    (--detect) the seeds needed; the baseline's row says so, a cell with one seed says "1 seed" in each."""

    def col(head: str, text: Callable[[Contrast], str], right: bool = True) -> tuple[str, Callable[[Cell], str], bool]:
        def show(cell: Cell) -> str:
            if sig.is_baseline(cell):
                return "baseline" if head.startswith("diff") else "-"
            test = cell.test
            return "-" if test is None else test.short or text(test)
        return head, show, right

    interval = lambda t: f"{signed(t.diff)} [{signed(t.low)}, {signed(t.high)}]"
    verdict = "verdict (biased)" if sig.biased else "verdict"
    if sig.design is not None:
        return [col(f"diff ({sig.confidence:.0%} CS)", interval),
                col("p", lambda t: p_text(t.p)), col("p Bonf.", lambda t: p_text(t.p_bonferroni)),
                col(verdict, lambda t: t.verdict or "-", False),
                col("seeds used", lambda t: f"{t.seeds_used} ({t.looks} look{'s' * (t.looks != 1)})")]
    cols = [col(f"diff ({sig.confidence:.0%} CI)", interval),
            col("test", lambda t: "paired" if t.paired else "Welch", False),
            col("p", lambda t: p_text(t.p)), col("p Holm", lambda t: p_text(t.p_holm)),
            col(verdict, lambda t: t.verdict or "-", False),
            col("MDE", lambda t: "-" if t.mde is None else f"{t.mde:.4g}")]
    if sig.detect is not None:
        cols.append(col(f"seeds for {sig.detect:g}", lambda t: "-" if t.seeds_needed is None else
                        str(t.seeds_needed)))
    return cols


def text_table(report: Report) -> str:
    headers, rows, right = table(report)
    widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(x.rjust(w) if r else x.ljust(w) for x, w, r in zip(cells, widths, right, strict=True))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def markdown_table(report: Report) -> str:
    headers, rows, right = table(report)
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---:" if r else "---" for r in right) + " |"]
    return "\n".join(out + ["| " + " | ".join(x.replace("|", "\\|") for x in row) + " |" for row in rows])


def where(path: Path, base: Path) -> str:
    """`path` relative to `base` when under it, else as it is."""
    try:
        return str(path.resolve().relative_to(base.resolve())) or "."
    except ValueError:
        return str(path)


def run_lists(report: Report, base: Path, md: bool) -> list[tuple[str, list[str]]]:
    """(title, lines) for the failed, diverged and skipped runs, and notes about the runs used; a run is named by
    its directory (relative to `base` when under it; in backticks in markdown), its cell and seed."""
    tick = (lambda p: f"`{p}`") if md else str

    def line(run_dir: Path, name: str, what: str) -> str:
        return f"{tick(where(run_dir, base))}" + (f" ({name})" if name else "") + f": {what}"

    def named(cell: Cell, run: Run) -> str:
        seed = f"seed={run.values['seed']}" if "seed" in run.values else ""
        tuned = " ".join(f"{k}={run.values[k]}" for k in report.tuned if k in run.values)
        return " ".join(x for x in (cell.label if report.keys else "", tuned, seed) if x)

    failed = [line(r.run_dir, named(c, r), first_line(r.results.error)) for c in report.cells
              for r in c.every("failed")]
    diverged = [line(r.run_dir, named(c, r), divergence(r)) for c in report.cells for r in c.every("diverged")]
    skipped = [line(s.run_dir, s.name, s.reason) for s in report.skipped]
    return [("Failed runs", failed), ("Diverged runs", diverged), ("Skipped runs", skipped), ("Notes", report.notes)]


def first_line(error: Any) -> str:
    lines = str(error or "no error recorded").strip().splitlines() or ["no error recorded"]
    return lines[0][:300]


def divergence(run: Run) -> str:
    info = run.results.diverged or {}
    return f"at step {info.get('step', '?')}: {info.get('reason', 'no reason recorded')}"


def summary(report: Report) -> str:
    n = {s: len(report.runs(s)) for s in ("completed", "failed", "diverged", "paused")}
    keys = ", ".join(report.keys) or "none (one cell)"
    paused = f"{n['paused']} pruned (paused at a rung), " if n["paused"] else ""
    lines = [f"{sum(n.values()) + len(report.skipped)} runs: {n['completed']} completed, {paused}{n['failed']} "
             f"failed, {n['diverged']} diverged, {len(report.skipped)} skipped. Cells by: {keys}.",
             f"Mean +- standard deviation over each cell's completed runs; sorted by {sort_text(report)}; * marks "
             "the best" + (" (a tie)." if sum(c.best for c in report.cells) > 1 else ".")]
    if report.tuned and report.selection is not None:
        lines.append(f"Tuned per cell: {', '.join(report.tuned)}. Each row is the cell's runs at the value with the "
                     f"best mean {report.selection.key} over seeds ({report.selection.reason}; chosen on validation, "
                     "never test); < or > marks a best value at the low or high edge of the values tried, ? fewer "
                     "than 3 values tried.")
    if report.target is not None:
        lines.append(f"Steps to {report.target}: the first logged step where it holds, mean over the runs that "
                     "reached it; (k/n) when only k of n did.")
    if report.significance is not None:
        lines += significance_summary(report.significance, report.cells)
    if report.pruning is not None:
        lines += pruning_lines(report.pruning, report.tuned)
    return "\n".join(lines)


def sort_text(report: Report) -> str:
    if report.sort_source:
        way = "lower" if report.sort.lower_better else "higher"
        return f"{report.sort.key} ({report.sort_source}; {way} is better)"
    return str(report.sort)


def significance_summary(sig: Significance, cells: list[Cell]) -> list[str]:
    biased = [f"Biased: the verdicts are on {sig.metric.key}, the metric that chose each cell's tuned values, so a "
              "cell's best of several values looks better than it is; judge on the test split (e.g. --sort "
              f"test/{sig.metric.key.partition('/')[2]}) for an unbiased verdict."] if sig.biased else []
    if sig.design is not None:
        return sequential_summary(sig, cells) + biased
    tests = [c.test for c in cells if c.test is not None]
    family = sum(t.p is not None for t in tests)
    lines = [f"Against the baseline {sig.label} on {sig.metric.key}: the difference of means (cell - "
             f"baseline) with its {sig.confidence:.0%} confidence interval; p from Welch's t-test, or the paired "
             f"t-test where both cells ran the same seeds; Holm-adjusted across {family} "
             f"comparison{'s' * (family != 1)}; the verdict at alpha={sig.alpha:g}. MDE: the smallest difference "
             "these seeds detect with 80% power (two-sided t-test, noncentral t, pooled standard deviation)"
             + (f"; seeds for {sig.detect:g}: the seeds per cell that detect a difference of {sig.detect:g}." if
                sig.detect is not None else ".")]
    if any(t.short == "1 seed" for t in tests) or (tests and any(b.seeds < 2 for b in sig.baselines)):
        lines.append("Significance needs >= 2 seeds per cell (the baseline's included): rows marked '1 seed' have "
                     "no test.")
    return lines + biased


def sequential_summary(sig: Significance, cells: list[Cell]) -> list[str]:
    """What the sequential design did, and the seeds each open comparison needs next."""
    design = sig.design
    assert design is not None
    looks = ", ".join(map(str, design.looks()))
    equivalent = (f", inside +-{design.detect:g} (--detect) 'no difference as large as {design.detect:g}'"
                  if design.detect is not None else " (--detect D also ends a comparison whose CS lies inside +-D)")
    lines = [f"Against the baseline {sig.label} on {sig.metric.key}, sequentially (docs/training.md, Sequential "
             f"seeds): paired differences in seed order, looked at after {looks} seeds; each comparison stops at "
             f"the first look that decides. CS: the always-valid {sig.confidence:.0%} confidence sequence of the "
             f"difference (cell - baseline) at level alpha/{design.comparisons} per comparison (Bonferroni over "
             f"the table), so every verdict of the table holds together with probability >= {sig.confidence:.0%} "
             f"however many looks were taken. 0 outside the CS decides better or worse{equivalent}. p: the "
             "anytime-valid p-value (1 / the largest Bayes factor of the safe t-test so far)."]
    waiting = [c for c in cells if c.test is not None and c.test.next_seeds is not None]
    if waiting:
        lines.append(f"{len(waiting)} comparison{'s are' if len(waiting) > 1 else ' is'} open: run the next seeds "
                     f"of each (the same command with these values), then compare again:")
        for cell in waiting:
            have = cell.seed_values()
            lines.append(f"  {cell.label}{chosen_text(cell)}: seed={','.join(next_seeds(have, cell.test.next_seeds))}")
        for base in sig.baselines:
            most = max((c.test.next_seeds for c in waiting if sig.baseline_of(c) is base), default=0)
            missing = next_seeds(base.seed_values(), most)
            if missing:
                lines.append(f"  {base.label}{chosen_text(base)} (baseline): seed={','.join(missing)}")
    return lines


def chosen_text(cell: Cell) -> str:
    tuning = cell.tuning
    if tuning is None or tuning.chosen is None:
        return ""
    return " " + " ".join(f"{k}={v}" for k, v in tuning.chosen.values.items())


def next_seeds(have: list[str], total: int) -> list[str]:
    """The smallest whole-number seeds not yet run that bring `have` up to `total`."""
    taken, out, seed = set(have), [], 0
    while len(taken) + len(out) < total:
        if str(seed) not in taken:
            out.append(str(seed))
        seed += 1
    return out


def scaling_lines(report: Report) -> list[str]:
    if not report.scaling:
        return []
    return [f"Loss against compute, per {report.scaling_key} (power law through the best cell of each budget):",
            *(f"  {report.scaling_key}={fit_text(f)}" for f in report.scaling)]


def width_transfer_lines(report: Report) -> list[str]:
    metric = report.selection.key if report.selection is not None else "metric"
    return transfer_lines(report.transfer, report.transfer_key or "", report.tuned[0], metric)


def terminal(report: Report) -> str:
    out = [summary(report), "", text_table(report)]
    edges = edge_lines(report.cells)
    if edges:
        out += ["", "Tuning grids:", *(f"  {x}" for x in edges)]
    if report.scaling:
        out += ["", *scaling_lines(report)]
    if report.transfer:
        out += ["", *width_transfer_lines(report)]
    for title, lines in run_lists(report, Path.cwd(), md=False):
        if lines:
            out += ["", f"{title}:", *(f"  {x}" for x in lines)]
    return "\n".join(out)


def markdown(report: Report) -> str:
    base = report.out_dir
    title = ", ".join(s.resolve().name for s in report.sources)
    sources = ", ".join(f"`{s}`" for s in report.sources)
    out = [f"# Comparison: {title}", "", f"Sweeps: {sources}.", "", summary(report).replace("\n", "\n\n"), "",
           markdown_table(report), ""]
    edges = edge_lines(report.cells)
    if edges:
        out += ["## Tuning grids", "", *(f"- {x}" for x in edges), ""]
    if report.scaling:
        lines = scaling_lines(report)
        out += ["## Scaling", "", lines[0], "", *(f"- {x.strip()}" for x in lines[1:]), ""]
    if report.transfer:
        lines = width_transfer_lines(report)
        out += ["## Width transfer", "", lines[0], "", "```", *lines[1:], "```", ""]
    out += [f"![{title}]({where(path, base)})\n" for title, path in report.plots.items()]
    for title, lines in run_lists(report, base, md=True):
        if lines:
            out += [f"## {title}", "", *(f"- {x}" for x in lines), ""]
    return "\n".join(out)


def csv_text(report: Report) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    stats = [f"{k}_{s}" for k in report.columns for s in ("mean", "std")]
    target = ["target_steps_mean", "target_steps_std", "target_reached", "target_runs"] if report.target else []
    tuned = [x for k in report.tuned for x in (k, f"{k}_edge")]
    sig = report.significance
    tests = ["diff", "ci_low", "ci_high", "test", "p", "p_holm", "verdict", "mde"] if sig else []
    tests += ["seeds_needed"] if sig and sig.detect is not None else []
    if sig and sig.design is not None:
        tests = ["diff", "cs_low", "cs_high", "test", "p", "p_bonferroni", "verdict", "seeds_used", "looks"]
    writer.writerow(["best", *report.keys, *tuned, "seeds", *stats, *target, *tests, "diverged", "failed"])
    for c in report.cells:
        st = [x for k in report.columns for x in (c.stats[k].mean, c.stats[k].std)]
        tg = [*_mean_std(c.reached()), len(c.reached()), len(c.target_steps)] if report.target else []
        tu = [x for k in report.tuned for x in tuned_csv(c, k)]
        te = test_csv(c, sig)[:len(tests)] if sig else []
        writer.writerow([int(c.best), *(c.values[k] for k in report.keys), *tu, c.seeds, *st, *tg, *te,
                         len(c.of("diverged")), len(c.of("failed"))])
    return buf.getvalue()


def tuned_csv(cell: Cell, key: str) -> tuple[str, str]:
    """The chosen value and its edge (low, high, small: fewer than 3 values tried; empty inside the grid)."""
    tuning = cell.tuning
    if tuning is None or tuning.chosen is None:
        return "", ""
    return tuning.chosen.values[key], tuning.edges.get(key, "")


def test_csv(cell: Cell, sig: Significance) -> list[Any]:
    if sig.is_baseline(cell):
        return ["", "", "", "", "", "", "baseline", "", ""]
    t = cell.test
    if t is None or t.short is not None:
        return ["", "", "", "", "", "", t.short if t else "", "", ""]
    if sig.design is not None:
        return [t.diff, t.low, t.high, "sequential", t.p, t.p_bonferroni, t.verdict, t.seeds_used, t.looks]
    return [t.diff, t.low, t.high, "paired" if t.paired else "welch", t.p, t.p_holm, t.verdict, t.mde,
            t.seeds_needed]


def _mean_std(values: list[int]) -> tuple[float | None, float | None]:
    s = Stat.of([float(v) for v in values])
    return s.mean, s.std


def json_text(report: Report) -> str:
    cells = [{"cell": c.values, "best": c.best, "seeds": c.seeds, "diverged": len(c.of("diverged")),
              "failed": len(c.of("failed")), "target_steps": c.target_steps,
              "stats": {k: vars(c.stats[k]) for k in report.columns},
              "runs": [{"run_dir": str(r.run_dir), "status": r.status, "seed": r.values.get("seed")} for r in c.runs],
              "tuned": tuned_json(c), "significance": test_json(c, report.significance), "flops_spent": cell_flops(c)}
             for c in report.cells]
    data = {"sources": [str(s) for s in report.sources], "keys": report.keys, "columns": report.columns,
            "target": str(report.target) if report.target else None, "sort": vars(report.sort),
            "sort_source": report.sort_source or None,
            "tuning": {"keys": report.tuned, "metric": report.selection.key, "why": report.selection.reason}
            if report.tuned and report.selection else None,
            "significance": significance_json(report.significance),
            "pruning": None if report.pruning is None else
            {"flops_spent": report.pruning.spent, "flops_full_grid": report.pruning.full,
             "share": report.pruning.share, "halving": report.pruning.halving,
             "agreement": [vars(a) for a in report.pruning.agreement]},
            "cells": cells,
            "failed": [{"run_dir": str(r.run_dir), "error": r.results.error} for r in report.runs("failed")],
            "diverged": [{"run_dir": str(r.run_dir), **(r.results.diverged or {})}
                         for r in report.runs("diverged")],
            "skipped": [{"run_dir": str(s.run_dir), "reason": s.reason} for s in report.skipped],
            "notes": report.notes, "plots": {t: str(p) for t, p in report.plots.items()},
            "transfer": {"key": report.transfer_key, "rows": [{**vars(r), "gap": r.gap} for r in report.transfer]}
            if report.transfer else None,
            "scaling": {"key": report.scaling_key, "fits": [vars(f) for f in report.scaling]} if report.scaling
            else None}
    return json.dumps(strict(data), indent=2, allow_nan=False)


def significance_json(sig: Significance | None) -> dict[str, Any] | None:
    if sig is None:
        return None
    return {"baseline": sig.spec, "baselines": [b.values for b in sig.baselines], "metric": vars(sig.metric),
            "alpha": sig.alpha, "confidence": sig.confidence, "detect": sig.detect, "power": POWER,
            "biased": sig.biased,
            "sequential": None if sig.design is None else
            {"looks": sig.design.looks(), "comparisons": sig.design.comparisons, "level": sig.design.level,
             "max_seeds": sig.design.max_seeds, "test": "safe paired t-test, confidence sequence (Bonferroni)"}}


def tuned_json(cell: Cell) -> dict[str, Any] | None:
    tuning = cell.tuning
    if tuning is None:
        return None
    return {"chosen": tuning.chosen.values if tuning.chosen else None, "edges": tuning.edges,
            "grid": [{"values": p.values, "selection": vars(p.stat),
                      "runs": [str(r.run_dir) for r in p.runs]} for p in tuning.points]}


def test_json(cell: Cell, sig: Significance | None) -> dict[str, Any] | None:
    if sig is None:
        return None
    if sig.is_baseline(cell):
        return {"baseline": True}
    return {"baseline": False, **vars(cell.test)} if cell.test is not None else None


def strict(x: Any) -> Any:
    """NaN and infinities as null: comparison.json stays valid JSON for any reader."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    return [strict(v) for v in x] if isinstance(x, (list, tuple)) else x
