"""What the efficient comparison (hparams_search=halving: pruned rates, then sequential seeds) would have decided and
spent on a full grid, read from the full grid's own runs: no run is trained again.

    python bench/halving_replay.py outputs/sweeps/norm_placement --rungs 0.5,0.75 --eta 3

The full grid must be a tuned comparison (compare.tune, compare.baseline) whose runs recorded budget branches at
the rungs (`schedule=wsd 'schedule.branches=[...,1.0]'`). A pruned run is the full run's prefix (pause_at resumes
bit for bit on a CPU), so the rungs' choices and a paused run's cost (its training to the rung's decay start and its
branches' decays) are the full runs' own figures. The sequential seeds take each chosen value's seeds in order.
Printed per cell: the full grid's chosen rate and verdict (fixed seeds, Holm), the replay's (values per rung, seeds
used, sequential verdict), and both FLOP totals with their ratio; then Kendall's tau of each rung with the end.
The full grid's FLOPs are every value at the seeds every value ran (--full-seeds), at the cost of a run without branch
decays: what the plain tuned preset costs. Its verdicts are compare.py's on all the runs given.
"""

from __future__ import annotations

import argparse
import sys

from archsweep.core.report import CompareError, compare
from archsweep.core.report.pruning import replay
from archsweep.core.report.sequential import Design


def claim(verdict: str | None) -> str:
    """What a verdict says about better or worse: the fixed design's "no detectable difference" and the sequential
    one's "undecided", "open" or "no difference as large as D" all claim neither."""
    word = (verdict or "").split(" ")[0]
    return word if word in ("better", "worse") else "neither"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweeps", nargs="+", help="a full grid's sweep directory (or several: more seeds of it)")
    p.add_argument("--rungs", required=True, help="comma-separated budget fractions, e.g. 0.25,0.5")
    p.add_argument("--eta", type=int, default=3, help="each rung keeps the best 1/eta of a cell's values (3)")
    p.add_argument("--start", type=int, default=2, help="seeds the rungs run on, and the first look (2)")
    p.add_argument("--seed-batch", type=int, default=2, help="seeds added between looks (2)")
    p.add_argument("--detect", type=float, help="the equivalence bound of the sequential design (none)")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--full-seeds", type=int, help="seeds of the full grid the replay is measured against (default: "
                   "the seeds every value of a cell ran; more seeds of some values, given as more sweeps, add none)")
    args = p.parse_args(argv)
    try:
        report = compare(args.sweeps, alpha=args.alpha)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sig, selection = report.significance, report.selection
    if not report.tuned or sig is None or selection is None:
        print("error: the sweep must be a tuned comparison with a baseline (compare.tune, compare.baseline)",
              file=sys.stderr)
        return 2
    rungs = [float(x) for x in args.rungs.split(",")]
    most = max(c.seeds for c in report.cells)
    design = Design(args.alpha, args.detect, args.start, args.seed_batch, max(most, args.start),
                    max(1, sum(not sig.is_baseline(c) for c in report.cells)))
    replayed = replay(report.cells, report.tuned[0], selection.key, selection.sort.lower_better, rungs, args.eta,
                      args.start, design, sig.baseline_of, report.sort.key, report.sort.lower_better)
    def full_of(cell) -> float:
        """The full grid's FLOPs for the cell: every value it tried at --full-seeds seeds, at its runs' mean cost."""
        runs = [*cell.runs, *cell.others]
        by_value: dict[str, set] = {}
        for r in runs:
            by_value.setdefault(str(r.values.get(report.tuned[0])), set()).add(r.values.get("seed"))
        seeds = args.full_seeds or min(len(s) for s in by_value.values())
        cost = [r.results.total_flops for r in runs if r.status == "completed" and r.results.total_flops]
        return len(by_value) * seeds * sum(cost) / len(cost) if cost else float("nan")

    full_total = sum(full_of(c) for c in report.cells)
    print(f"{' '.join(args.sweeps)}: {len(report.cells)} cells, {report.tuned[0]} tuned on {selection.key}, "
          f"verdicts on {report.sort.key} against {sig.label}; rungs {rungs}, eta {args.eta}, {args.start} seeds "
          f"to start, up to {design.max_seeds}")
    head = f"{'cell':<40} {'full: value':>12} {'verdict':>10} | {'replay: value':>13} {'rungs':>8} {'seeds':>5} " \
           f"{'verdict':>32} {'FLOPs full':>11} {'replay':>9} {'ratio':>6}"
    print(head)
    agree_value = agree_verdict = 0
    for cell, rep in zip(report.cells, replayed, strict=True):
        full = full_of(cell)
        value = cell.tuning.chosen.values[report.tuned[0]] if cell.tuning and cell.tuning.chosen else "-"
        verdict = "baseline" if sig.is_baseline(cell) else (cell.test.verdict or "-") if cell.test else "-"
        agree_value += value == rep.chosen
        agree_verdict += sig.is_baseline(cell) or claim(rep.verdict) == claim(verdict)
        print(f"{cell.label:<40} {value:>12} {verdict[:10]:>10} | {rep.chosen or '-':>13} "
              f"{'>'.join(map(str, rep.rungs)):>8} {rep.seeds:>5} {(rep.verdict or 'baseline')[:32]:>32} "
              f"{full:>11.3g} {rep.flops:>9.3g} {rep.flops / full if full else float('nan'):>6.0%}")
    spent = sum(r.flops for r in replayed)
    print(f"same chosen value: {agree_value}/{len(replayed)} cells; the same claim (better, worse or neither): "
          f"{agree_verdict}/{len(replayed)}; "
          f"FLOPs: replay {spent:.4g} of the full grid's {full_total:.4g} = {spent / full_total:.1%}")
    for a in report.pruning.agreement if report.pruning else []:
        print(f"Kendall's tau of budget {a.fraction:g} with the end: "
              f"{'-' if a.tau is None else f'{a.tau:+.3f}'} (mean over {a.cells} cells, {a.values} values)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
