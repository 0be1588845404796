"""The comparison as one W&B run (compare.py --wandb): its table as a `wandb.Table` named `comparison` (one row per
cell: values, chosen tuned values, seeds, the sort metric, the test against the baseline, the training FLOPs its runs
spent) and its plots as images, in the W&B project and group the sweep's runs used, so the verdict sits beside the
runs it judges. Offline without credentials, like every run (core/train/monitoring/loggers.py). W&B is imported only
here, when asked for."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from archsweep import conf_dir
from archsweep.core.report.cells import Cell
from archsweep.core.report.pruning import cell_flops
from archsweep.core.report.render import Report
from archsweep.core.report.runs import CompareError, Run
from archsweep.core.train.monitoring.loggers import has_wandb_credentials, wandb_mode

MODES = ("off", "auto", "offline", "online")  # --wandb; auto: online with credentials, else offline
TABLE = "comparison"
TEST_COLUMNS = ("diff", "ci_low", "ci_high", "p", "p_holm", "verdict")
SEQUENTIAL_COLUMNS = ("diff", "cs_low", "cs_high", "p", "p_bonferroni", "verdict", "seeds_used", "looks")


class WandbError(RuntimeError):
    """W&B could not start, log or finish the comparison run (the comparison's files are written already)."""


def log_comparison(report: Report, written: list[Path], mode: str) -> Path | None:
    """Start one W&B run (job_type and name `comparison`) in report.out_dir/wandb, log the table and the PNGs among
    `written`, and finish it. Returns the run's directory (its offline `run-*.wandb` inside), None for mode `off` or
    when WANDB_MODE=disabled. CompareError for a bad mode, W&B not installed, or `online` without credentials;
    WandbError when W&B itself fails."""
    if mode not in MODES:
        raise CompareError(f"--wandb {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "off":
        return None
    resolved = wandb_mode(mode)
    if resolved == "disabled":
        return None
    if resolved == "online" and not has_wandb_credentials():
        raise CompareError("--wandb online: no W&B credentials (WANDB_API_KEY or `wandb login`); use --wandb "
                           "offline, or --wandb auto (offline without credentials)")
    try:
        import wandb
    except ImportError as e:
        raise CompareError(f"--wandb {mode}: W&B cannot be imported ({e}); pip install wandb, or --wandb off") from None
    project, entity = project_of(report)
    runs = all_runs(report)
    groups = Counter(r.results.group for r in runs if r.results.group)
    group = groups.most_common(1)[0][0] if groups else f"sweep-{report.sources[0].resolve().name}"
    columns, rows = table_rows(report)
    plots = {p.resolve(): title for title, p in report.plots.items()}
    images = {p.stem: wandb.Image(str(p), caption=plots.get(p.resolve(), p.stem))
              for p in written if p.suffix == ".png" and p.is_file()}
    try:
        run = wandb.init(project=project, entity=entity, group=group, job_type="comparison", name="comparison",
                         dir=str(report.out_dir), mode=resolved, config=headline(report, sorted(groups)),
                         reinit="create_new", settings=wandb.Settings(console="off"))
        try:
            run.log({TABLE: wandb.Table(columns=columns, data=rows, allow_mixed_types=True), **images})
            run.summary.update(verdicts(report))
            where = Path(run.dir).parent  # the run's folder: files/ and, offline, run-<id>.wandb
        except BaseException:
            run.finish(exit_code=1)
            raise
        run.finish()
    except wandb.Error as e:
        raise WandbError(f"W&B: {type(e).__name__}: {e}") from None
    return where


def all_runs(report: Report) -> list[Run]:
    """Every run of every cell, at every tuned value."""
    return [r for c in report.cells for r in [*c.runs, *c.others]]


def project_of(report: Report) -> tuple[str, str | None]:
    """The W&B project and entity the runs logged to (their config.yaml's logger block), else the defaults a train
    run would use (conf/logger/wandb.yaml)."""
    seen: Counter[tuple[str, str | None]] = Counter()
    for run in all_runs(report):
        logger = saved_logger(run.run_dir / "config.yaml")
        if logger.get("project"):
            seen[(str(logger["project"]), logger.get("entity"))] += 1
    if seen:
        return seen.most_common(1)[0][0]
    default = saved_logger(conf_dir() / "logger" / "wandb.yaml", whole=True)
    return str(default.get("project") or "archsweep"), default.get("entity")


def saved_logger(path: Path, whole: bool = False) -> dict[str, Any]:
    """The `logger` block of a resolved config (or the whole file, a logger yaml); {} when unreadable."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    if isinstance(data, dict) and not whole:
        data = data.get("logger")
    return data if isinstance(data, dict) else {}


def table_rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    """The table's columns and one row per cell, in the report's order (best first). The significance columns only
    when a test ran, the FLOPs only when some run records them."""
    key, sig = report.sort.key, report.significance
    columns = ["cell", *report.keys, *report.tuned, "best", "seeds", "runs", f"{key}_mean", f"{key}_std"]
    if sig is not None:
        columns += list(SEQUENTIAL_COLUMNS if sig.design is not None else TEST_COLUMNS)
    flops = [cell_flops(c) for c in report.cells]
    with_flops = any(f is not None for f in flops)
    columns += ["flops_spent"] if with_flops else []
    rows = []
    for cell, spent in zip(report.cells, flops, strict=True):
        chosen = cell.tuning.chosen.values if cell.tuning is not None and cell.tuning.chosen is not None else {}
        std = cell.stats[key].std if key in cell.stats else None
        row = [cell.label, *(cell.values[k] for k in report.keys), *(chosen.get(k) for k in report.tuned),
               cell.best, cell.seeds, len(cell.runs) + len(cell.others), cell.sort_value(key), std]
        row += test_row(cell, report) if sig is not None else []
        rows.append(row + ([spent] if with_flops else []))
    return columns, rows


def test_row(cell: Cell, report: Report) -> list[Any]:
    """diff, CI low and high, p, Holm's p, verdict (sequential: the CS, the anytime p and its Bonferroni
    adjustment, the verdict, the seeds and looks it took); 'baseline' for the baseline, the reason where no test
    ran."""
    sequential = report.significance.design is not None
    after = [None, None] if sequential else []
    if report.significance.is_baseline(cell):
        return [None] * 5 + ["baseline"] + after
    t = cell.test
    if t is None or t.short is not None:
        return [None] * 5 + [t.short if t is not None else None] + after
    if sequential:
        return [t.diff, t.low, t.high, t.p, t.p_bonferroni, t.verdict, t.seeds_used, t.looks]
    return [t.diff, t.low, t.high, t.p, t.p_holm, t.verdict]


def headline(report: Report, groups: list[str]) -> dict[str, Any]:
    """The run's config: what was compared, on what, against what."""
    sig = report.significance
    return {"metric": report.sort.key, "lower_better": report.sort.lower_better,
            "baseline": sig.label if sig is not None else None, "alpha": sig.alpha if sig is not None else None,
            "sequential": sig is not None and sig.design is not None, "biased": sig is not None and sig.biased,
            "keys": report.keys, "tuned": report.tuned,
            "selection": report.selection.key if report.tuned and report.selection is not None else None,
            "sources": [str(s) for s in report.sources], "run_groups": groups}


def verdicts(report: Report) -> dict[str, Any]:
    """The summary: the best cell(s) and how many cells each verdict got."""
    counts = Counter(c.test.verdict for c in report.cells if c.test is not None and c.test.verdict)
    out: dict[str, Any] = {"best": [c.label for c in report.cells if c.best], "cells": len(report.cells),
                           "runs": len(all_runs(report))}
    if report.significance is not None:
        out["verdicts"] = dict(counts)
    spent = [f for f in map(cell_flops, report.cells) if f is not None]
    if spent:
        out["flops_spent"] = sum(spent)
    return out
