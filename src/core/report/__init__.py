"""Report wing: compare the runs of one or more sweeps (docs/training.md): one table row per cell of the grid
(the keys that vary, seed aside) with statistics over seeds, loss and by-length plots, written as comparison.md,
.csv, .json and PNGs. Works on sweeps still running or partly failed: what cannot be used is listed with the
reason. Imports any other wing (it reads runs the train wing wrote)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from archsweep.core.report.cells import (
    SortKey,
    aggregate,
    available_columns,
    group_cells,
    metric_columns,
    parse_sort,
    parse_target,
    sort_cells,
    varying_keys,
)
from archsweep.core.report.plots import (
    plot_by_context,
    plot_by_length,
    plot_loss,
    plot_loss_vs_flops,
    plot_sensitivity,
)
from archsweep.core.report.pruning import pruning
from archsweep.core.report.render import COUNTS, Report, csv_text, estimated_mfu, json_text, markdown, terminal
from archsweep.core.report.runs import CompareError, Run, Skipped, find_runs, load_run
from archsweep.core.report.scaling import plot_scaling, scaling_fits
from archsweep.core.report.sequential import Design
from archsweep.core.report.significance import against_baseline, find_baselines
from archsweep.core.report.transfer import transfer_rows
from archsweep.core.report.tuning import resolve_tune, selection_metric, tune_cell
from archsweep.core.train.runs.halving import STATE as HALVING
from archsweep.variants.param import PARAM

__all__ = ["CompareError", "Report", "compare", "terminal", "write"]
FILES = {"md": "comparison.md", "csv": "comparison.csv", "json": "comparison.json",
         "loss": "comparison_val_loss.png", "length": "comparison_by_length.png",
         "context": "comparison_by_context.png", "flops": "comparison_val_loss_vs_flops.png",
         "scaling": "comparison_scaling.png", "sensitivity": "comparison_sensitivity.png"}
LENGTH_METRICS = ("exact_match", "acc")  # the metrics results.json's by_length holds per length


def run_dirs(sources: list[Path]) -> list[Path]:
    found: dict[Path, None] = {}
    for source in sources:
        if not source.exists():
            raise CompareError(f"{source} does not exist; give a sweep directory, e.g. outputs/sweeps/<time>")
        if not source.is_dir():
            raise CompareError(f"{source} is not a directory; give a sweep directory, e.g. outputs/sweeps/<time>")
        runs = find_runs(source)
        if not runs:
            raise CompareError(f"{source} holds no runs (no results.json or .hydra/overrides.yaml below it); give "
                               "a sweep directory, e.g. outputs/sweeps/<time>")
        found |= {r.resolve(): None for r in runs}
    return list(found)


def swept_keys(run_dirs: list[Path], notes: list[str]) -> list[str]:
    """The keys the sweeps themselves varied (their multirun.yaml), so a grid keeps its columns while some
    options have no finished run yet."""
    from archsweep.core.train.runs.runinfo import sweep_keys

    keys: list[str] = []
    for sweep in dict.fromkeys(d.parent for d in run_dirs if (d.parent / "multirun.yaml").is_file()):
        try:
            keys += [k for k in sweep_keys(sweep) if k not in keys]
        except Exception as e:  # a corrupt multirun.yaml costs its columns, not the comparison
            notes.append(f"{sweep / 'multirun.yaml'} unreadable, its swept keys not used: {type(e).__name__}: {e}")
    return keys


def choose_sort(expr: str | None, columns: list[str], available: list[str], has_target: bool,
                question: str | None = None, notes: list[str] | None = None) -> SortKey:
    """--sort's column; without it the runs' compare.metric (question), else val/loss or the first column."""
    if expr is None and question is not None:
        if question.partition(":")[0] in available:  # a metric with its direction (by_context/ppl_ratio:min)
            return parse_sort(question, available)
        if notes is not None:
            notes.append(f"the runs' compare.metric={question} is not in their results; sorted by the default")
    if expr is None:
        default = next((k for k in ["val/loss", *columns] if k in available and k != "target"), None)
        return parse_sort(default, available) if default else SortKey("val/loss", True)
    sort = parse_sort(expr, available)
    if sort.key == "target" and not has_target:
        raise CompareError(f"--sort {expr!r} needs a target; add e.g. --target 'val/exact_match>=0.9'")
    return sort


def run_notes(runs: list[Run], cells_of: dict[str, list[Run]]) -> list[str]:
    notes = [f"{r.run_dir}: {n}" for r in runs for n in r.notes]
    for label, members in cells_of.items():
        twice = [s for s, k in Counter(r.values.get("seed") for r in members if r.status == "completed").items()
                 if k > 1]
        if twice:
            notes.append(f"cell {label}: seed {', '.join(map(str, twice))} has more than one completed run; "
                         "each counts as a seed")
    return notes


def settings_of(runs: list[Run], notes: list[str]) -> dict:
    """The runs' `compare:` block (results.json); when they disagree, a note and the first run's."""
    blocks = [(r, r.results.compare) for r in runs if isinstance(r.results.compare, dict)]
    if not blocks:
        return {}
    first_run, first = blocks[0]
    other = next(((r, b) for r, b in blocks if b != first), None)
    if other is not None:
        notes.append(f"the runs disagree on their compare block: {first} ({first_run.run_dir.name}) but {other[1]} "
                     f"({other[0].run_dir.name}); using the first (override with --tune/--no-tune, --baseline, "
                     f"--sort)")
    return first


def mfu_notes(cells: list) -> list[str]:
    """What the MFU column is measured against, when it is an estimate (a probed peak: a CPU's, no data sheet)."""
    estimated = estimated_mfu(cells)
    if not estimated:
        return []
    sources = sorted({str(r.results.peak_source) for r in estimated})
    return [f"MFU (est.) of {len(estimated)} run{'s' * (len(estimated) > 1)} is an estimate, against a probed peak "
            f"({'; '.join(sources[:3])}{'; ...' if len(sources) > 3 else ''}); trainer.peak_flops=<FLOP/s> measures "
            f"it against a figure you give"]


GROUP_BY = ("task",)


def task_of(run: Run) -> str:
    return str(run.values.get("task") or (run.results.choices or {}).get("task") or "-")


def check_tasks(runs: list[Run], group_by: str | None) -> None:
    """Runs of different tasks have metrics on different scales (a loss over characters, over BPE pieces, over
    symbols): ranking them in one list says nothing. Refused unless the ranking is within each task."""
    if group_by is not None and group_by not in GROUP_BY:
        raise CompareError(f"--group-by {group_by!r}: choose one of {', '.join(GROUP_BY)}")
    tasks = sorted({task_of(r) for r in runs} - {"-"})  # a run that has not written results.json yet: unknown
    if len(tasks) > 1 and group_by != "task":
        raise CompareError(f"the runs are of {len(tasks)} tasks ({', '.join(tasks)}), whose metrics are not "
                           "comparable, so they are not ranked together; add --group-by task to rank the cells "
                           "within each task, or give the sweeps of one task")


def sort_within_tasks(cells: list, order: SortKey) -> list:
    """Each task's cells sorted and their best marked on its own; tasks in name order."""
    by_task: dict[str, list] = {}
    for cell in cells:
        by_task.setdefault(task_of(cell.runs[0]), []).append(cell)
    return [c for task in sorted(by_task) for c in sort_cells(by_task[task], order)]


def compare(sources: list[str | Path], out: str | Path | None = None, target: str | None = None,
            sort: str | None = None, metrics: list[str] | None = None, group_by: str | None = None,
            scaling: str | None = None, scaling_metric: str = "val/loss", tune: list[str] | None = None,
            baseline: str | None = None, alpha: float = 0.05, detect: float | None = None,
            sequential: bool | None = None, max_seeds: int | None = None, seed_batch: int | None = None,
            transfer: str | None = None) -> Report:
    """Read the runs under `sources` and build the report (nothing written; see `write`). target: e.g.
    'val/exact_match>=0.9', None for that default when logged, 'none' for no target column. sort: a column,
    e.g. 'val/loss' (default) or 'test/acc:max'. metrics: final metrics to show instead of the default ones.
    group_by: 'task' ranks the cells within each task (runs of several tasks are refused without it).
    scaling: a varying key (e.g. norm) whose variants each get a power-law fit of `scaling_metric` against
    training compute (core/report/scaling.py). tune: keys tuned per cell, chosen on validation (None: the runs'
    compare.tune; []: none, every (cell, value) a row). baseline: a cell spec, e.g. 'norm=pre', every other cell is
    tested against on the sort metric (None: the runs' compare.baseline; 'none': no test); alpha: the significance
    level; detect: a difference whose seeds per cell needed is reported (None: the runs' compare.detect); with
    sequential (None: the runs' compare.sequential), each comparison is decided by the sequential design
    (sequential.py) at max_seeds and seed_batch (None: the runs'). transfer: a width key (e.g. model.d_model) whose
    widths each get their best tuned value against the smallest width's (transfer.py; None: the runs'
    compare.transfer; 'none': off). The runs' compare.metric is the default sort."""
    paths = [Path(s) for s in sources]
    loaded = [load_run(d) for d in run_dirs(paths)]
    runs = [x for x in loaded if isinstance(x, Run)]
    skipped = [x for x in loaded if isinstance(x, Skipped)]
    notes: list[str] = []
    check_tasks(runs, group_by)
    settings = settings_of(runs, notes)
    keys = varying_keys(runs, swept_keys([r.run_dir for r in runs], notes))
    tuned = resolve_tune(tune, list(settings.get("tune") or []), keys, notes)
    keys = [k for k in keys if k not in tuned]
    if group_by == "task" and "task" in keys:
        keys = ["task", *(k for k in keys if k != "task")]
    tgt = parse_target(target, runs)
    available = available_columns(runs)
    bad = [m for m in metrics or [] if m not in available or m == "target"]
    if bad:
        raise CompareError(f"--metrics {','.join(bad)}: not in the results; choose from {', '.join(available[:-1])}")
    columns = metric_columns(runs, metrics)
    question = settings.get("metric") if sort is None else None
    order = choose_sort(sort, columns, available, tgt is not None, question, notes)
    asked = question is not None and order.key == question.partition(":")[0]
    if tuned and sort is None and not asked:
        order = held_out_sort(order, available, notes)
    if order.key not in columns and order.key != "target" and order.key in available:
        columns.append(order.key)
    routed = any(r.results.active_params not in (None, r.results.params) for r in runs)
    columns += [k for k in COUNTS if k in available and k not in columns and (k != "active_params" or routed)]
    cells = group_cells(runs, keys)
    selection = selection_metric(order, available) if tuned else None
    for cell in cells:
        if selection is not None:
            tune_cell(cell, tuned, selection)
        aggregate(cell, columns, tgt)
    notes += run_notes(runs, {c.label: c.runs for c in cells})
    notes += width_notes(runs, keys, tuned)
    if "mfu" in columns:
        notes += mfu_notes(cells)
    out_dir = Path(out) if out is not None else paths[0]
    ordered = sort_within_tasks(cells, order) if group_by == "task" else sort_cells(cells, order)
    fits = scaling_fits(cells, scaling, keys, scaling_metric) if scaling is not None else []
    report = Report(paths, out_dir, keys, columns, ordered, tgt, order, skipped, notes, {}, scaling, fits,
                    scaling_metric, tuned, selection, sort_source="the preset's question" if asked else "")
    design = sequential_design(settings, sequential, max_seeds, seed_batch)
    add_significance(report, baseline, settings.get("baseline"), alpha, detect, design, settings.get("detect"),
                     sequential_asked=bool(sequential))
    if report.significance is not None and selection is not None and selection.key == order.key:
        report.significance.biased = True
    if tuned or any((p / HALVING).is_file() for p in paths):
        report.pruning = pruning(report.cells, paths, selection.key if selection is not None else None)
    width_key = transfer if transfer is not None else settings.get("transfer")
    if width_key not in (None, "none"):
        if selection is None:
            raise CompareError(f"transfer={width_key}: compares tuned values across widths, but nothing is tuned; "
                               f"set compare.tune=[optim.lr] (or --tune optim.lr)")
        report.transfer_key = width_key
        report.transfer = transfer_rows(report.cells, width_key, tuned)
    return report


WIDTH = "model.d_model"


def width_notes(runs: list[Run], keys: list[str], tuned: list[str]) -> list[str]:
    """What a ladder of widths trained at one learning rate says about that rate: under a parametrisation that
    transfers it (param=mup) it is the rate tuned at the base width, reused (Tensor Programs V); otherwise nothing
    says it suits the wider models."""
    if WIDTH not in keys or "optim.lr" in tuned or "optim.lr" in keys:
        return []
    params = sorted({r.values.get("param", PARAM.default) for r in runs})
    try:
        transfers = all(PARAM.get(p).transfers_width for p in params)
    except ValueError:  # a parametrisation this install does not know
        return []
    if transfers:
        return [f"param={'/'.join(params)}: one learning rate serves every width here, the rate tuned at the base "
                "width (model.param.base_width) and reused, as the parametrisation lets it (archsweep-coordcheck "
                "checks the variants; experiment=mup_transfer measures the drift)"]
    return [f"param={'/'.join(params)} with one learning rate at every width: under a parametrisation that does not "
            "transfer, the best rate moves with the width, so wider models may train off their best rate "
            "(docs/options.md, Parametrisation: width transfer)"]


def held_out_sort(order: SortKey, available: list[str], notes: list[str]) -> SortKey:
    """For a tuned comparison sorted by default: the test split of a validation sort metric, so that the number
    that picks each cell's tuned value (on validation) is not the one that judges the cells."""
    split, _, name = order.key.partition("/")
    held_out = f"test/{name}"
    if split != "val" or held_out not in available:
        return order
    notes.append(f"sorted and tested on {held_out}, not {order.key}: the tuned values are chosen on {order.key}, "
                 f"and the number that picks a value must not be the one that judges it (--sort {order.key} to "
                 "judge on it anyway, marked biased)")
    return SortKey(held_out, order.lower_better)


def sequential_design(settings: dict, sequential: bool | None, max_seeds: int | None,
                      seed_batch: int | None) -> Design | None:
    """The sequential design the flags ask for, else the one the runs' compare block names; None: fixed seeds."""
    if not (sequential if sequential is not None else settings.get("sequential", False)):
        return None
    most = max_seeds if max_seeds is not None else settings.get("max_seeds", Design.max_seeds)
    batch = seed_batch if seed_batch is not None else settings.get("seed_batch", Design.batch)
    try:
        return Design(max_seeds=int(most), batch=int(batch))
    except ValueError as e:
        raise CompareError(f"sequential seeds: {e}") from None


def add_significance(report: Report, baseline: str | None, from_runs: str | None, alpha: float,
                      detect: float | None, design: Design | None = None, runs_detect: float | None = None,
                      sequential_asked: bool = False) -> None:
    """Every cell against the baseline (--baseline, else the runs' compare.baseline; 'none': no test). A baseline
    the runs name that does not fit them (a part of a preset's grid re-run on its own, e.g. post-norm alone) is a
    note and no test: the table is still wanted; a --baseline that does not fit is an error."""
    spec, name = (baseline, "--baseline") if baseline is not None else (from_runs, "the runs' compare.baseline")
    if spec is not None and spec.strip().lower() not in ("none", "off", ""):
        try:
            wanted, bases = find_baselines(spec, report.cells, report.keys, report.tuned, name)
        except CompareError as e:
            if baseline is not None or detect is not None or sequential_asked:
                raise
            report.notes.append(f"{e}. No significance test: the runs' baseline does not fit them (a part of "
                                f"their grid?); --baseline tests against one of these cells")
            return
        detect = detect if detect is not None else runs_detect
        report.significance = against_baseline(report.cells, bases, report.sort, alpha, detect, wanted, report.keys,
                                               design)
    elif design is not None and sequential_asked:
        raise CompareError("sequential seeds decide comparisons against a baseline: add --baseline, e.g. "
                           f"--baseline '{report.cells[0].label if report.cells and report.keys else 'norm=pre'}'")
    elif detect is not None:
        example = report.cells[0].label if report.cells and report.keys else "norm=pre"
        raise CompareError(f"--detect {detect:g} needs a baseline to test against: add --baseline, e.g. "
                           f"--baseline '{example}'")


def write(report: Report, plots: bool = True, length_metric: str = "exact_match") -> list[Path]:
    """Write the plots, comparison.md, .csv and .json into report.out_dir; returns the paths written.
    length_metric: what the by-length plot shows, exact_match or acc (token accuracy)."""
    if length_metric not in LENGTH_METRICS:
        raise CompareError(f"--length-metric {length_metric!r}: choose one of {', '.join(LENGTH_METRICS)}")
    d = report.out_dir
    d.mkdir(parents=True, exist_ok=True)
    if plots:
        made = {"validation loss": plot_loss(report.cells, d / FILES["loss"]),
                "validation loss against training FLOPs": plot_loss_vs_flops(report.cells, d / FILES["flops"]),
                f"{length_metric} by sequence length": plot_by_length(report.cells, d / FILES["length"],
                                                                       length_metric),
                "perplexity by evaluation context": plot_by_context(report.cells, d / FILES["context"])}
        if report.tuned:
            made[f"{report.selection.key} against the tuned {', '.join(report.tuned)}"] = plot_sensitivity(
                report.cells, report.tuned, report.selection, d / FILES["sensitivity"])
        if report.scaling:
            made["loss against compute"] = plot_scaling(report.scaling, report.scaling_key, report.scaling_metric,
                                                        d / FILES["scaling"])
        report.plots = {title: path for title, path in made.items() if path is not None}
    texts = {FILES["md"]: markdown(report), FILES["csv"]: csv_text(report), FILES["json"]: json_text(report)}
    for name, text in texts.items():
        (d / name).write_text(text + ("" if text.endswith("\n") else "\n"))
    return [*report.plots.values(), *(d / n for n in texts)]
