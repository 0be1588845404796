"""Compare the runs of one or more sweeps (README: Comparing runs).

    python compare.py outputs/sweeps/<time>                       # table, plots, comparison.md in that directory
    python compare.py sweep_a sweep_b --out reports/pos           # several sweeps as one grid
    python compare.py outputs/sweeps/<time> --target "val/exact_match>=0.99" --sort test_long/exact_match

Writes comparison.md, comparison.csv, comparison.json and PNG plots into the first directory (or --out), and
prints the table and the runs it skipped, with the reason. Exits 2 on bad input.
"""

import argparse
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="+", help="sweep directories (every run below each is read)")
    p.add_argument("--out", help="directory for the outputs (default: the first sweep directory)")
    p.add_argument("--target", help="METRIC OP VALUE on a logged metric, e.g. 'val/exact_match>=0.9' (the default "
                   "when the runs log val/exact_match); 'none' for no steps-to-target column")
    p.add_argument("--sort", help="column to sort cells by, best first: val/loss (default), test/exact_match, "
                   "tokens_per_s, target, ...; lower or higher is better from the name, or add :min / :max")
    p.add_argument("--metrics", help="comma-separated final metrics to show instead of the default ones, "
                   "e.g. val/loss,test/acc,test_long/acc")
    p.add_argument("--length-metric", default="exact_match", choices=["exact_match", "acc"],
                   help="what the by-length plot shows (default: exact_match; acc: token accuracy)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from src.core.compare import CompareError, compare, terminal, write

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    try:
        report = compare(args.sweeps, args.out, args.target, args.sort, metrics)
        written = write(report, plots=not args.no_plots, length_metric=args.length_metric)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write the comparison: {e}; choose another directory with --out", file=sys.stderr)
        return 1
    print(terminal(report))
    print("\nwrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
