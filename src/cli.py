"""Command-line entry points: `archsweep-train`, `-generate`, `-evaluate`, `-compare` (console scripts) and the
repository's `train.py`, `generate.py`, `evaluate.py`, `compare.py`, which call these. The configs come from the
package (`archsweep.conf_dir()`), so every entry point works from any working directory.

Only Hydra and OmegaConf are imported up front: `--help` and a refused config answer before torch loads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

START = time.time()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from archsweep import conf_dir  # noqa: E402
from archsweep.core.data.tasks.known import EXTRA_CONF_ENV  # noqa: E402  (more config folders, e.g. your variants)
from archsweep.core.train import rundir, schemas  # noqa: E402, F401  (register ${unique:}, the groups' schemas)

CONF = str(conf_dir())


def _extra_config_folders() -> None:
    """Put the folders named by $ARCHSWEEP_CONFIG_PATH on Hydra's search path, after the package's conf/, so
    their group options (conf/pos/my_encoding.yaml, ...) are options like the built-in ones, in --help too
    (a `hydra.searchpath=[...]` override composes them as well, but Hydra's --help does not list them)."""
    folders = [f for f in os.environ.get(EXTRA_CONF_ENV, "").split(os.pathsep) if f]
    if not folders:
        return
    from hydra.core.config_search_path import ConfigSearchPath
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    class ExtraConfigFolders(SearchPathPlugin):
        def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
            for folder in folders:
                search_path.append(provider="archsweep-extra", path=f"file://{Path(folder).resolve()}")

    Plugins.instance().register(ExtraConfigFolders)


_extra_config_folders()


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def _train(cfg: DictConfig) -> float:
    from archsweep.core.train.job import run_job

    global START
    try:
        return run_job(cfg, START)
    finally:  # a sweep's next job in this process counts its times from its own start, not the process's
        START = time.time()


def _checkpoint_entry(name: str):
    """The Hydra main of generate.py / evaluate.py: run `archsweep.core.eval.inference.run_<name>` on the composed
    config; a ValueError (bad input) ends the process with its message instead of a traceback."""

    @hydra.main(version_base="1.3", config_path=CONF, config_name=name)
    def main(cfg: DictConfig) -> None:
        from archsweep.core.model.checkpoint import check_checkpoint_file, resolve_checkpoint

        try:
            check_checkpoint_file(resolve_checkpoint(cfg.ckpt, "evaluate"))  # before torch: a wrong file answers fast
            from archsweep.core.eval import inference

            getattr(inference, f"run_{name}")(cfg)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None

    return main


_generate, _evaluate = _checkpoint_entry("generate"), _checkpoint_entry("evaluate")


def train(start_time: float | None = None) -> None:
    """Train a Transformer variant (README: Training from the command line)."""
    global START
    START = start_time or START
    _train()


def generate() -> None:
    """Decode from a train.py checkpoint (README: Decoding and evaluation)."""
    _generate()


def task_overrides_without_plus(argv: list[str]) -> list[str]:
    """evaluate.py's `task.<field>=value` overrides the checkpoint's task settings, which the entry config does not
    list (`task: {}`): given as `++task.<field>=value`, Hydra adds or replaces the key instead of refusing it."""
    return [f"++{a}" if a.startswith("task.") and "=" in a else a for a in argv]


def evaluate() -> None:
    """Test-set metrics of a train.py checkpoint, overall and by source length (README: Decoding and
    evaluation)."""
    sys.argv[1:] = task_overrides_without_plus(sys.argv[1:])
    _evaluate()


COMPARE_DOC = """Compare the runs of one or more sweeps (README: Comparing runs).

    compare.py outputs/sweeps/<time>                       # table, plots, comparison.md in that directory
    compare.py sweep_a sweep_b --out reports/pos           # several sweeps as one grid
    compare.py outputs/sweeps/<time> --target "val/exact_match>=0.99" --sort test_long/exact_match

Writes comparison.md, comparison.csv, comparison.json and PNG plots into the first directory (or --out), and
prints the table and the runs it skipped, with the reason. Exits 2 on bad input.
"""


def compare_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=COMPARE_DOC.split("\n\n")[0], epilog=COMPARE_DOC.split("\n\n", 1)[1],
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
    p.add_argument("--group-by", choices=["task"], default=None,
                   help="task: rank the cells within each task (runs of several tasks are refused without it)")
    p.add_argument("--scaling", metavar="KEY", help="fit loss against training compute as a power law for each "
                   "value of KEY (e.g. norm), through the best cell of each FLOP budget (experiment=scaling)")
    p.add_argument("--scaling-metric", default="val/loss", help="the final metric the --scaling fit uses "
                   "(default: val/loss)")
    return p.parse_args(argv)


def compare_main(argv: list[str] | None = None) -> int:
    args = compare_args(argv)
    from archsweep.core.report import CompareError, compare, terminal, write

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    try:
        report = compare(args.sweeps, args.out, args.target, args.sort, metrics, args.group_by, args.scaling,
                         args.scaling_metric)
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


def compare() -> None:
    sys.exit(compare_main())
