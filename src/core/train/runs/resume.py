"""`train.py resume=<run dir>`: continue a run in its own directory with the overrides it was started with.

Hydra fixes the run directory before any of our code runs, so the command line is rewritten before Hydra composes:
`resume=<dir> [extra ...]` becomes the run's saved overrides (`<dir>/.hydra/overrides.yaml`), the extras (which win
over a saved override of the same key), and `ckpt_path=<dir> hydra.run.dir=<dir>`. Extras may change anything but
the model and the data (e.g. `trainer.max_steps=80`): `task=`, `seed=` and a `task.<field>` other than where the data
lives or how it is evaluated (WHERE_OR_EVAL) are refused here, a model change by job.py's check of the checkpoint's
model; both list the saved overrides.

The same command re-run after an interrupt continues the run too, by one rule: without `hydra.run.dir`, the newest
run under `<output_root>/runs` launched with exactly these overrides, when that run was interrupted; with
`hydra.run.dir=<dir>`, that directory, when it holds an interrupted run launched with these overrides. A finished
or failed newest run, different overrides, a sweep (`-m`, which resumes its cells itself) or any `ckpt_path`,
`overwrite` or `resume` on the command line leave the command as it is. A paused run (`pause_at`) counts as
finished here: its command ended as asked (exit 0), and the same command with another pause_at is another
command line; `resume=<dir> pause_at=<later or null>` continues it.

Light (PyYAML only): all of it runs before Hydra composes.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from archsweep.core.model.checkpoint import CKPT_DIR
from archsweep.core.train.runs.results import RESULTS
from archsweep.core.train.runs.rundir import STARTS
from archsweep.core.train.runs.runinfo import override_key

SAVED = Path(".hydra") / "overrides.yaml"  # what Hydra writes into every run directory
NOT_SAVED = ("resume", "ckpt_path")  # how a run was resumed, not what it trains
RUN_DIR = "hydra.run.dir"
DATA_KEYS = ("task", "seed")  # what the run trains on: the task, its settings, the data stream's seed
WHERE_OR_EVAL = {"data_dir", "cache_dir", "path", "val_batches", "test_batches", "eval_seed", "long_max_len"}
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # PyYAML without libyaml has only the Python one


def saved_overrides(run_dir: Path) -> list[str] | None:
    """The overrides `run_dir`'s run was launched with (resume and ckpt_path left out); None when it records none.
    In a directory this process claimed, the file as it was before Hydra rewrote it for this start."""
    before = STARTS.get(run_dir.resolve())
    try:
        text = before.hydra[SAVED.name] if before is not None and before.existed else (run_dir / SAVED).read_bytes()
        saved = yaml.load(text, Loader=LOADER)  # the C loader: a start may read every run's file (interrupted_rerun)
    except (OSError, KeyError, yaml.YAMLError):
        return None
    if not isinstance(saved, list):
        return None
    return [str(o) for o in saved if override_key(str(o)) not in NOT_SAVED]


def run_status(run_dir: Path) -> tuple[str | None, int | None]:
    """(status, steps) from `run_dir`'s results.json; (None, None) when it has none that reads."""
    try:
        res = json.loads((run_dir / RESULTS).read_text())
        return res.get("status"), res.get("steps")
    except (OSError, ValueError, AttributeError):
        return None, None


def resume_args(run_dir: Path, extras: list[str]) -> list[str]:
    """The command line that continues `run_dir`'s run: its saved overrides, then `extras`, then where to resume.
    ValueError naming the problem and the fix when `run_dir` is not a run that can be continued."""
    value = f"resume={run_dir}"
    if not run_dir.is_dir():
        raise ValueError(f"{value}: no such directory; give the run directory an interrupted run printed, e.g. "
                         f"resume=outputs/runs/<time>")
    saved = saved_overrides(run_dir)
    if saved is None:
        raise ValueError(f"{value}: not a train.py run directory ({run_dir / SAVED} is missing or unreadable); give "
                         f"the run directory an interrupted run printed, e.g. resume=outputs/runs/<time>")
    again = " ".join(saved) or "(no overrides)"
    if not (run_dir / CKPT_DIR / "last.ckpt").is_file():
        raise ValueError(f"{value}: no {CKPT_DIR}/last.ckpt there (the run stopped before its first checkpoint); "
                         f"start it again with: python train.py {again}")
    for arg in extras:
        key = override_key(arg)
        if key in (RUN_DIR, "ckpt_path", "overwrite") or arg in ("-m", "--multirun"):
            raise ValueError(f"{value} with {arg}: resume= continues that one run, in its own directory, from its "
                             f"last checkpoint; leave {arg} out")
    for arg in extras:
        key = override_key(arg)
        if key in DATA_KEYS or (key.startswith("task.") and key.split(".", 1)[1] not in WHERE_OR_EVAL):
            if arg in saved:
                continue
            was = next((o for o in saved if override_key(o) == key), None)
            anew = " ".join([*(o for o in saved if override_key(o) != key), arg])
            raise ValueError(f"{value} with {arg}: that changes the data the run trains on (it was started with "
                             f"{was or f'the config default for {key}'}); resume= continues the run as it was "
                             f"started, with extras that keep its model and data (trainer.max_steps, logger, "
                             f"task.data_dir, task.val_batches, ...): leave {arg} out, or start a new run from its "
                             f"weights with: python train.py {anew} init_from={run_dir}")
    status, steps = run_status(run_dir)
    asked = [a.split("=", 1)[1] for a in extras if override_key(a) == "trainer.max_steps" and "=" in a]
    longer = bool(asked) and asked[-1].isdigit() and int(asked[-1]) > (steps or 0)
    pause = [a.split("=", 1)[1] for a in extras if override_key(a) == "pause_at" and "=" in a]
    paused_earlier = bool(pause) and pause[-1] not in ("", "null", "None")  # job.py returns its results as they are
    if status == "completed" and not longer and not paused_earlier:
        raise ValueError(f"{value}: that run completed its {steps} steps; to train it further add "
                         f"trainer.max_steps=<more than {steps}>")
    given = {override_key(a) for a in extras}
    kept = [o for o in saved if override_key(o) not in given]
    return [*kept, *extras, value, f"ckpt_path={run_dir}", f"{RUN_DIR}={run_dir}"]


def interrupted_rerun(argv: list[str], default_root: str) -> Path | None:
    """The run directory the command `argv` continues by the re-run rule (module docstring), else None."""
    if any(a.startswith("-") for a in argv):  # a sweep, --help, --cfg, ...: Hydra's business
        return None
    if {override_key(a) for a in argv} & {"resume", "ckpt_path", "overwrite", "trace_shapes"}:
        return None
    values = {override_key(a): a.split("=", 1)[1] for a in argv if "=" in a}
    wanted = sorted(a for a in argv if not override_key(a).startswith("hydra."))
    if RUN_DIR in values:
        candidates = [Path(values[RUN_DIR])]
    else:
        runs = Path(values.get("output_root", default_root)) / "runs"
        found = [p for p in runs.glob(f"*/{SAVED}") if p.is_file()] if runs.is_dir() else []
        candidates = [p.parent.parent for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)]
    for run_dir in candidates:
        saved = saved_overrides(run_dir)
        if saved is None or sorted(saved) != wanted:
            continue
        interrupted = run_status(run_dir)[0] == "interrupted" and (run_dir / CKPT_DIR / "last.ckpt").is_file()
        return run_dir if interrupted else None  # the newest run with these overrides decides
    return None


def expand(argv: list[str], default_root: str) -> tuple[list[str], str | None]:
    """train.py's command line with `resume=` (or a re-run of an interrupted run) turned into the overrides that
    continue the run, and a line to print saying so (None when the command is left as it is)."""
    given = [a for a in argv if override_key(a) == "resume" and "=" in a]
    if given:
        value = given[-1].split("=", 1)[1]
        if value in ("", "null"):
            return [a for a in argv if a not in given], None
        run_dir = Path(value)
        return resume_args(run_dir, [a for a in argv if a not in given]), f"resuming the run in {run_dir}"
    run_dir = interrupted_rerun(argv, default_root)
    if run_dir is None:
        return argv, None
    hydra_args = [a for a in argv if override_key(a).startswith("hydra.") and override_key(a) != RUN_DIR]
    how = ("" if RUN_DIR in {override_key(a) for a in argv}
           else f"the newest run with these overrides; to start a new one instead, add {RUN_DIR}=<a new folder>")
    return (resume_args(run_dir, hydra_args),
            f"continuing the interrupted run in {run_dir} ({how or 'the hydra.run.dir given'}; the same as "
            f"resume={run_dir})")
