"""Command-line entry points: `archsweep-train`, `-generate`, `-evaluate`, `-compare` (console scripts) and the
repository's `train.py`, `generate.py`, `evaluate.py`, `compare.py`, which call these. The configs come from the
package (`archsweep.conf_dir()`), so every entry point works from any working directory.

Only Hydra and OmegaConf are imported up front: `--help` and a refused config answer before torch loads.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

START = time.time()

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from hydra.errors import OverrideParseException  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf, open_dict  # noqa: E402

from archsweep import conf_dir  # noqa: E402
from archsweep.core.data.tasks.known import EXTRA_CONF_ENV  # noqa: E402  (more config folders, e.g. your variants)
from archsweep.core.train.config import schemas  # noqa: E402, F401  (registers the groups' schemas)
from archsweep.core.train.runs import rundir  # noqa: E402, F401  (registers ${unique:})
from hydra_plugins.archsweep_halving import halving_sweeper  # noqa: E402  (hydra/sweeper=halving)

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
halving_sweeper.register()

# Hydra's own command-line flags that take the next argument as their value
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                    "-cd", "--experimental-rerun", "--shell-completion", "-sc"}
INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
EXAMPLES = {"ckpt": "ckpt=outputs/runs/<run>/checkpoints/best.ckpt, or the run directory",
            "init_from": "init_from=outputs/runs/<run>, the run whose weights to start from"}


def config_folders() -> list[Path]:
    return [Path(CONF), *(Path(f) for f in os.environ.get(EXTRA_CONF_ENV, "").split(os.pathsep) if f)]


def group_options(group: str) -> str:
    """`${group_options:decoding}` in a --help template (conf/hydra/help/): the group's options, your folders' too."""
    return ", ".join(sorted({p.stem for folder in config_folders() for p in (folder / group).glob("*.yaml")}))


if not OmegaConf.has_resolver("group_options"):
    OmegaConf.register_new_resolver("group_options", group_options)


def known_top_keys(config_name: str) -> set[str]:
    """Top-level keys an override may name: the entry config's own keys, the config groups, and the keys that
    global presets (`# @package _global_` files such as conf/experiment/*.yaml) add."""
    keys = set(OmegaConf.load(Path(CONF) / f"{config_name}.yaml").keys()) | {"hydra"}
    for folder in config_folders():
        for group in (g for g in folder.iterdir() if g.is_dir()):
            keys.add(group.name)
            for option in group.glob("*.yaml"):
                if option.read_text().startswith("# @package _global_"):
                    keys.update(str(k) for k in (OmegaConf.load(option) or {}).keys())
    return keys - {"defaults"}


def check_overrides(argv: list[str], config_name: str) -> str | None:
    """The one-line refusal for a command-line argument Hydra would reject with a grammar error that does not name
    it, or accept into a key nothing reads (`+nrom=pre` trains post-norm); None when every argument is fine."""
    parser, known, skip = OverridesParser.create(), None, False
    for i, arg in enumerate(argv):
        if skip or arg.startswith("-"):
            skip = not skip and (arg in FLAGS_WITH_VALUE
                                 or (arg == "--info" and i + 1 < len(argv) and argv[i + 1] in INFO_TOPICS))
            continue
        try:
            override = parser.parse_overrides([arg])[0]
        except OverrideParseException as e:
            if arg.endswith(",") or (i > 0 and argv[i - 1].endswith(",")):
                return (f"cannot read the argument {arg!r}: a sweep's values are one argument without spaces, "
                        f"e.g. norm=pre,post")
            lines = [line for line in str(e).splitlines()
                     if line.strip() and not line.startswith(("Error parsing", "See"))]
            reason = lines[0].split(" expecting")[0] if lines else "Hydra's override grammar"
            fix = "an override is key=value, e.g. norm=pre" if "=" not in arg else "quote a value with spaces"
            return f"cannot read the argument {arg!r} ({reason}); {fix}"
        top = override.key_or_group.split("/")[0].split(".")[0]
        known = known if known is not None else known_top_keys(config_name)
        if top not in known:
            near = close_match(top, sorted(known))
            return (f"{arg}: {top!r} is not a setting of {config_name}.py{near}; `python {config_name}.py --help` "
                    f"lists the groups and settings")
    return None


def close_match(value: str, valid: list[str]) -> str:
    from archsweep.composition import near

    return near(value, valid)


def refuse_bad_overrides(config_name: str) -> None:
    problem = check_overrides(sys.argv[1:], config_name)
    if problem:
        raise SystemExit(f"error: {problem}")


def override_args(argv: list[str]) -> list[str]:
    """The arguments of `argv` that are overrides (not flags nor a flag's value)."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip or arg.startswith("-"):
            skip = not skip and (arg in FLAGS_WITH_VALUE
                                 or (arg == "--info" and i + 1 < len(argv) and argv[i + 1] in INFO_TOPICS))
            continue
        out.append(arg)
    return out


def refuse_uncomposable(config_name: str) -> None:
    """Hydra's composition errors (`norm=prex`, `model.d_modle=3`, `-m norm=pre,pst`) as one line naming the
    argument, before Hydra's main makes a run or sweep directory (src/composition.py)."""
    from archsweep.composition import NOT_CHECKED, composition_error

    if any(a in NOT_CHECKED for a in sys.argv[1:]):
        return
    printing = any(a in ("--cfg", "-c") for a in sys.argv[1:])  # shows the config, mandatory values unset included
    problem = composition_error(override_args(sys.argv[1:]), CONF, config_name, None if printing else missing_values)
    if problem:
        raise SystemExit(f"error: {problem}")


def mandatory(tree: Any, prefix: str = "") -> set[str]:
    """The dotted keys whose value is `???` in a config file read without resolving."""
    if not isinstance(tree, dict):
        return {prefix} if tree == "???" else set()
    return {k for key, value in tree.items() for k in mandatory(value, f"{prefix}{key}" if not prefix
                                                                  else f"{prefix}.{key}")}


def missing_values(cfg: DictConfig, choices: dict[str, str] | None = None, swept: set[str] = frozenset()) -> str | None:
    """One line naming the mandatory (`???`) settings left unset, each with an example. A global preset's `???`
    (experiment=rope_scaling's `init_from`) is lost when Hydra merges it over train.yaml's null: the preset files
    among `choices` (group -> option) are read for them. Settings a sweeper sets (`swept`) count as set."""
    missing = set(OmegaConf.missing_keys(cfg))
    for group, option in (choices or {}).items():
        for folder in config_folders():
            preset = folder / group / f"{option}.yaml"
            if preset.is_file() and preset.read_text().startswith("# @package _global_"):
                missing |= {k for k in mandatory(OmegaConf.to_container(OmegaConf.load(preset), resolve=False))
                            if OmegaConf.select(cfg, k, throw_on_missing=False) is None}
    missing = sorted(missing - set(swept))
    if not missing:
        return None
    return "set " + "; ".join(f"{k}, e.g. {EXAMPLES.get(k, k + '=...')}" for k in missing)


def raw_prompts(cfg: DictConfig) -> None:
    """`prompt=31415` reaches us as the number 31415 (Hydra types what it reads): the text the user typed is the
    override's own, so a prompt is always the characters given (`prompt=3.10` stays "3.10", not 3.1)."""
    typed = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in HydraConfig.get().overrides.task if "=" in o}
    with open_dict(cfg):
        if cfg.get("prompt") is not None and not isinstance(cfg.prompt, str):
            cfg.prompt = typed.get("prompt", str(cfg.prompt))
        if cfg.get("prompts"):
            cfg.prompts = [p if isinstance(p, str) else str(p) for p in cfg.prompts]


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def _train(cfg: DictConfig) -> float:
    from archsweep.core.train.lifecycle.job import run_job

    # A single run counts its times from the process's start (imports included); a sweep's job from its own start:
    # a launcher that runs jobs in worker processes (joblib, submitit) ships this function to them by value, with
    # the START of the process that launched the sweep.
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    return run_job(cfg, time.time() if multirun else START)


def _checkpoint_entry(name: str):
    """The Hydra main of generate.py / evaluate.py: run `archsweep.core.eval.inference.run_<name>` on the composed
    config; a ValueError (bad input) ends the process with its message instead of a traceback."""

    @hydra.main(version_base="1.3", config_path=CONF, config_name=name)
    def main(cfg: DictConfig) -> None:
        from archsweep.core.model.checkpoint import check_checkpoint_file, resolve_checkpoint

        if missing_values(cfg):
            raise SystemExit(f"error: {missing_values(cfg)}")
        raw_prompts(cfg)
        try:
            check_checkpoint_file(resolve_checkpoint(cfg.ckpt, "evaluate"))  # before torch: a wrong file answers fast
            from archsweep.core.eval import inference

            getattr(inference, f"run_{name}")(cfg)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None

    return main


_generate, _evaluate = _checkpoint_entry("generate"), _checkpoint_entry("evaluate")


def train(start_time: float | None = None) -> None:
    """Train a Transformer variant (docs/training.md)."""
    global START
    START = start_time or START
    old_spellings()
    refuse_bad_overrides("train")
    continue_run()
    old_spellings()  # a resumed run's saved overrides may be older
    refuse_uncomposable("train")
    _train()
    stopped_after_the_last_job()


def stopped_after_the_last_job() -> None:
    """A stop signal that arrived after the last job had recorded its results still ends the process as stopped
    (128 + its number): a scheduler must not read success from a job it asked to stop."""
    from archsweep.core.train.lifecycle.stops import STOPS
    from archsweep.core.train.monitoring.console import process_rank

    signum = STOPS.take()
    if signum is not None:
        if process_rank() == 0:  # a data-parallel worker's stop was recorded by rank 0
            print(f"stopped by {signal.Signals(signum).name} after the last job had finished (its results are "
                  f"complete)", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)


def old_spellings() -> None:
    """The command line's old spellings of model options (`model.attn_gate=headwise`) as today's
    (`attn_gate=headwise`), each with a note on stderr naming what it became (core/model/legacy.py)."""
    from archsweep.core.model.legacy import upgrade_overrides

    sys.argv[1:], notes = upgrade_overrides(sys.argv[1:])
    for note in notes:
        print(f"note: {note}", file=sys.stderr, flush=True)


def continue_run() -> None:
    """`resume=<run dir>`, or the same command re-run after an interrupt: the command line becomes the run's saved
    overrides with `ckpt_path` and `hydra.run.dir` set to it (core/train/runs/resume.py), before Hydra composes. A
    data-parallel worker is started with rank 0's command line, which is this one already; under torchrun, which
    starts every rank with the user's, rank 0 expands it and the other ranks take rank 0's."""
    from archsweep.core.train.launch import torchrun
    from archsweep.core.train.runs.resume import expand

    if torchrun.under_torchrun() and any(a in ("-m", "--multirun") for a in sys.argv[1:]):
        raise SystemExit("error: torchrun starts one run on several processes; a sweep (-m) under torchrun would run "
                         "it once per process. Run the sweep without torchrun, with trainer=ddp trainer.devices=<N> "
                         "(each job then starts its own processes)")
    if torchrun.under_torchrun() and torchrun.rank() != 0:
        sys.argv[1:] = torchrun.agree_argv([])
        return
    if rundir.is_worker_process():
        return
    default_root = str(OmegaConf.load(Path(CONF) / "train.yaml").output_root)
    try:
        sys.argv[1:], note = expand(sys.argv[1:], default_root)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if note:
        print(note, flush=True)
    if torchrun.under_torchrun():
        torchrun.agree_argv(sys.argv[1:])


def generate() -> None:
    """Decode from a train.py checkpoint (docs/decoding.md)."""
    refuse_bad_overrides("generate")
    refuse_uncomposable("generate")
    _generate()


def task_overrides_without_plus(argv: list[str]) -> list[str]:
    """evaluate.py's `task.<field>=value` overrides the checkpoint's task settings, which the entry config does not
    list (`task: {}`): given as `++task.<field>=value`, Hydra adds or replaces the key instead of refusing it."""
    return [f"++{a}" if a.startswith("task.") and "=" in a else a for a in argv]


def evaluate() -> None:
    """Test-set metrics of a train.py checkpoint, overall and by source length (docs/decoding.md,
    evaluation)."""
    refuse_bad_overrides("evaluate")
    sys.argv[1:] = task_overrides_without_plus(sys.argv[1:])
    refuse_uncomposable("evaluate")
    _evaluate()


COMPARE_DOC = """Compare the runs of one or more sweeps (docs/training.md, Comparing runs).

    compare.py outputs/sweeps/<time>                       # table, plots, comparison.md in that directory
    compare.py sweep_a sweep_b --out reports/pos           # several sweeps as one grid
    compare.py outputs/sweeps/<time> --target "val/exact_match>=0.99" --sort test_long/exact_match
    compare.py outputs/sweeps/<time> --tune optim.lr --baseline 'norm=pre'   # each cell at its best lr, tested

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
    p.add_argument("--sort", "--metric", dest="sort", metavar="COLUMN",
                   help="column to sort and star the cells by, best first (default: the runs' compare.metric, the "
                   "metric that answers their preset's question, else val/loss): test/exact_match, tokens_per_s, "
                   "target, ...; lower or higher is better from the name, or add :min / :max")
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
    tune = p.add_mutually_exclusive_group()
    tune.add_argument("--tune", metavar="KEY[,KEY]", help="keys tuned per cell rather than compared, e.g. optim.lr: "
                      "each cell is shown at its best value on validation (default: the runs' compare.tune)")
    tune.add_argument("--no-tune", action="store_true", help="tune nothing: a row per (cell, tuned value)")
    p.add_argument("--baseline", metavar="SPEC", help="test every other cell against this one on the sort metric, "
                   "e.g. 'norm=pre' (key=value pairs, space-separated; keys it leaves out are matched: in a sweep over "
                   "norm and depth, each cell against pre-norm at its own depth; default: the runs' "
                   "compare.baseline; 'none': no test)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the tests (default: 0.05)")
    p.add_argument("--detect", type=float, metavar="D", help="with a baseline: also the seeds per cell needed to "
                   "detect a difference D of the sort metric with 80%% power (sequential: a comparison whose "
                   "confidence sequence lies inside +-D ends as 'no difference as large as D'; default: the runs' "
                   "compare.detect)")
    p.add_argument("--sequential", action=argparse.BooleanOptionalAction, default=None,
                   help="decide each comparison by seeds looked at in batches, with an always-valid test, and say "
                   "which seeds the open ones need next (default: the runs' compare.sequential)")
    p.add_argument("--max-seeds", type=int, metavar="N", help="sequential: the most seeds a comparison gets "
                   "(default: the runs' compare.max_seeds, 10)")
    p.add_argument("--seed-batch", type=int, metavar="N", help="sequential: seeds added between two looks (default: "
                   "the runs' compare.seed_batch, 2)")
    p.add_argument("--transfer", metavar="KEY", help="a width key of a tuned sweep (e.g. model.d_model): each width's "
                   "best tuned value against the smallest width's, its drift in grid steps and the loss at the "
                   "smallest width's value (default: the runs' compare.transfer; 'none': off)")
    p.add_argument("--wandb", metavar="MODE", choices=["off", "auto", "offline", "online"], default="off",
                   help="also log the table and plots as one W&B run named comparison, in the runs' project and "
                   "group: off (default), auto (online with credentials, else offline), offline, online")
    return p.parse_args(argv)


def compare_main(argv: list[str] | None = None) -> int:
    args = compare_args(argv)
    from archsweep.core.report import CompareError, compare, terminal, write

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    try:
        tune = [] if args.no_tune else [k.strip() for k in args.tune.split(",") if k.strip()] if args.tune else None
        report = compare(args.sweeps, args.out, args.target, args.sort, metrics, args.group_by, args.scaling,
                         args.scaling_metric, tune, args.baseline, args.alpha, args.detect, args.sequential,
                         args.max_seeds, args.seed_batch, args.transfer)
        written = write(report, plots=not args.no_plots, length_metric=args.length_metric)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write the comparison: {e}; choose another directory with --out", file=sys.stderr)
        return 1
    print(terminal(report))
    print("\nwrote " + ", ".join(str(p) for p in written))
    if args.wandb != "off":
        return compare_wandb(report, written, args.wandb)
    return 0


def compare_wandb(report: Any, written: list[Path], mode: str) -> int:
    """--wandb: the comparison as one W&B run; the files already written stay whatever happens."""
    from archsweep.core.report import CompareError
    from archsweep.core.report.wandb_log import WandbError, log_comparison

    try:
        where = log_comparison(report, written, mode)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (WandbError, OSError) as e:
        print(f"error: the W&B comparison run was not written: {e}", file=sys.stderr)
        return 1
    print(f"W&B comparison run: {where}" if where else "W&B comparison run: none (WANDB_MODE=disabled)")
    return 0


def compare() -> None:
    sys.exit(compare_main())


COORDCHECK_DOC = """Does every module's output keep its size as the model widens? Trains the model the overrides compose
at several widths for a few steps and prints, per module, how far its output moved (root mean square of the change
since initialisation, averaged over seeds) at each width, and the spread (largest / smallest). Under a
width-transferring parametrisation (param=mup) it exits 1 when a module's spread exceeds --threshold.

examples:
  archsweep-coordcheck model=decoder_only task=shakespeare_char param=mup
  archsweep-coordcheck model=decoder_only task=copy param=sp --widths 64,128,256,512
"""


def coordcheck_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="archsweep-coordcheck", description=COORDCHECK_DOC.split("\n\n")[0],
                                epilog=COORDCHECK_DOC.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="train.py overrides of the model, task and optimiser")
    p.add_argument("--widths", help="comma-separated d_model values, at least 2 (default: the composed d_model "
                   "times 1, 2, 4, 8)")
    p.add_argument("--steps", type=int, default=4, help="training steps at each width (default: 4)")
    p.add_argument("--seeds", type=int, default=3, help="seeds averaged at each width (default: 3)")
    p.add_argument("--threshold", type=float, default=1.5, help="the largest spread a module may have under a "
                   "width-transferring parametrisation (default: 1.5)")
    p.add_argument("--plot", metavar="PNG", help="where the plot goes (default: <output_root>/coordcheck/"
                   "<param>.png); 'none' for no plot")
    return p.parse_args(argv)


def coordcheck_main(argv: list[str] | None = None) -> int:
    args = coordcheck_args(argv)
    from archsweep.composition import composition_error

    problem = check_overrides(args.overrides, "train") or composition_error(args.overrides, CONF, "train")
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.steps < 1 or args.seeds < 1 or args.threshold <= 1:
        print(f"error: --steps={args.steps} and --seeds={args.seeds} must be at least 1 and --threshold="
              f"{args.threshold} above 1", file=sys.stderr)
        return 2
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from archsweep.core.report.coordcheck import coordcheck, plot, report
    from archsweep.core.train.lifecycle.checks import ConfigError, build_task, model_config

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("train", overrides=args.overrides)
    try:
        task = build_task(cfg)
        model_cfg = model_config(cfg, task, args.overrides)
        widths = ([int(w) for w in args.widths.split(",") if w.strip()] if args.widths
                  else [model_cfg.d_model * k for k in (1, 2, 4, 8)])
        check = coordcheck(model_cfg, task, OmegaConf.to_container(cfg.optim, resolve=True), widths, args.steps,
                           args.seeds, args.threshold, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(check))
    if args.plot != "none":
        path = Path(args.plot or Path(cfg.output_root) / "coordcheck" / f"{check.param}.png")
        print(f"plot: {plot(check, path)}")
    return 0 if check.passed() else 1


def coordcheck() -> None:
    sys.exit(coordcheck_main())
