"""One train.py job: check the config without heavy imports (checks.py), train (fit.py), and record the outcome:
results.json or a failure's error.txt, a sweep's summary line, the exit code a scheduler reads. In a sweep, a job
also holds its directory's lock, skips a cell that finished earlier, continues one that was interrupted or paused,
and requeues a submitit job stopped by preemption. A run continued with a pause_at it has reached already (paused
there or later, or finished) trains nothing and returns its results as they are.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import signal
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from archsweep.core.model.checkpoint import CKPT_DIR, CheckpointError, check_checkpoint_file, safe_load
from archsweep.core.train.config.rules import AFTER_IMPORTS, check_rules, processes
from archsweep.core.train.config.setup import ConfigError, Setup
from archsweep.core.train.config.wsd import FRACTION_TOLERANCE
from archsweep.core.train.launch.submitit_job import join_tasks, requeue
from archsweep.core.train.lifecycle.checks import check_resume, prepare
from archsweep.core.train.lifecycle.stops import STOPS
from archsweep.core.train.monitoring.console import job_prefix, quiet_libraries, set_job
from archsweep.core.train.monitoring.loggers import finish_wandb
from archsweep.core.train.runs.results import RESULTS, Results, paused_beyond
from archsweep.core.train.runs.rundir import (
    DirectoryInUse,
    DirectoryLock,
    clean_stale_temp,
    is_worker_process,
    withdraw,
)
from archsweep.core.train.runs.runinfo import RunInfo, run_info
from archsweep.core.train.runs.sweep import FINISHED, append_summary, earlier_run, failure_line

log = logging.getLogger("train")


def run_job(cfg: DictConfig, start_time: float) -> float:
    """Train one configuration. Returns the final validation loss (NaN for a failed job in a sweep, which is
    recorded and does not stop the other jobs)."""
    info = run_info(cfg)
    set_job(job_prefix(info.job_num, info.name) if info.multirun else None)
    quiet_libraries()
    STOPS.install()
    lock = None
    try:
        lock = claim_job(cfg, info)
        if lock is not None:
            clean_stale_temp(info.run_dir)
        stopped_before_start(cfg, info)
        setup = prepare(cfg, info)
        if cfg.trace_shapes:
            from archsweep.core.eval.trace import trace_shapes

            print(trace_shapes(setup.model_cfg, setup.task, cfg.seed))
            return math.nan
        done = skip_or_resume(cfg, info, setup)
        if done is not None:
            if info.multirun:
                append_summary(info, done, skipped=True)
            return objective_value(done, cfg.objective, cfg.get("pause_at"))
        results = train_checked(cfg, info, setup, start_time)
    except CellConflict as error:  # never record anything in that directory
        log.error(f"job {info.job_num} ({info.name}) not run: {error}")
        append_summary(info, {"status": "failed", "error": str(error)})
        return math.nan
    except Exception as error:
        if failed_in_sweep(error, cfg, info):
            return math.nan
        raise
    finally:
        if lock is not None:
            lock.release()
    return finished(cfg, info, results)


def stopped_before_start(cfg: DictConfig, info: RunInfo) -> None:
    """A signal that arrived since the previous job of the sweep ended (or while this one composed) stops the sweep
    here: this job is recorded interrupted at step 0 (a re-run of the sweep starts it) and the process ends with
    128 + the signal's number."""
    if STOPS.signum is None or is_worker_process():
        return
    signum = STOPS.take()
    name = signal.Signals(signum).name
    how = "re-run the sweep" if info.multirun else "run the same command again"
    log.warning(f"stopped by {name} before this job started; to continue: {how}")
    results = Results(status="interrupted", interrupted={"signal": name, "step": 0, "exit_code": 128 + signum},
                      name=info.name, group=info.group, run_dir=str(info.run_dir), choices=info.choices,
                      overrides=info.overrides, seed=cfg.seed, steps=0).to_dict()
    try:
        info.run_dir.mkdir(parents=True, exist_ok=True)
        Results.from_dict(results).write(info.run_dir / RESULTS)
        if info.multirun:
            append_summary(info, results)
    except OSError as e:
        log.error(f"could not record the stop in {info.run_dir}: {e}")
    raise SystemExit(128 + signum)


def claim_job(cfg: DictConfig, info: RunInfo) -> DirectoryLock | None:
    """A sweep job: join the other tasks of its submitit job (launch/submitit_job.py), and, in the first process,
    take its directory's lock (jobs of a sweep never share a directory); None where no lock is taken."""
    if not info.multirun:
        return None
    try:
        join_tasks(processes(cfg.trainer))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if is_worker_process():
        return None
    try:
        return DirectoryLock(info.run_dir, f"sweep job {info.job_num}").acquire()
    except DirectoryInUse as e:
        raise CellConflict(str(e)) from None


def train_checked(cfg: DictConfig, info: RunInfo, setup: Setup, start_time: float) -> dict[str, Any] | None:
    """The heavy part, once the config is known to be good: torch's threads, the rules that need torch, the
    checkpoint to resume (read now), then fit.py's training. Returns results.json's content (None in DDP workers)."""
    threads = cpu_threads(cfg)
    import torch  # noqa: I001  (heavy imports from here on)

    if threads is not None:
        torch.set_num_threads(threads)
        log.info(f"torch CPU threads: {threads}")
    try:
        check_rules(cfg, setup.task, AFTER_IMPORTS)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_resume(setup, cfg.get("resume"), info.overrides)
    from archsweep.core.train.lifecycle.fit import train

    quiet_libraries()  # now that Lightning is imported: its own console handler goes
    return train(cfg, setup, info, start_time)


def failed_in_sweep(error: Exception, cfg: DictConfig, info: RunInfo) -> bool:
    """A job that raised `error`: True when it is a sweep's job, its failure recorded (results.json, error.txt,
    the sweep's summary) so the other jobs run on. A single run's refused config (no run directory is left; a resumed
    run's is left as it was) or full disk ends the process with one line; any other error is recorded and the caller
    raises it."""
    finish_wandb(exit_code=1)
    if isinstance(error, ConfigError) and not info.multirun:  # refused before training
        withdraw(info.run_dir)
        raise SystemExit(f"error: {error}") from None
    results = record_failure(info, error, cfg.seed)
    if info.multirun:  # an error other jobs of the sweep printed already is named, not repeated
        line = failure_line(info, results["error"])
        append_summary(info, results)
        log.error(line)
        return True
    if getattr(error, "errno", None) == errno.ENOSPC:  # the disk is full: one line, not a traceback
        raise SystemExit(f"error: {error.strerror if isinstance(error, OSError) else error}") from None
    return False


def finished(cfg: DictConfig, info: RunInfo, results: dict[str, Any] | None) -> float:
    """After training: the sweep's summary line; an interrupted run ends the process with a non-zero code (a
    scheduler must not read success; the sweep stops too), a submitit job stopped by preemption requeued."""
    if info.multirun and results:
        append_summary(info, results)
    if results and results["status"] == "interrupted":
        STOPS.take()  # recorded: the process ends with its code
        finish_wandb(exit_code=1)
        # a submitit job stopped by submitit's preemption notice: its handler requeues it
        requeue(results["interrupted"]["signal"], STOPS.handler_before)
        raise SystemExit(results["interrupted"]["exit_code"])
    return objective_value(results, cfg.objective, cfg.get("pause_at")) if results else math.nan


def record_failure(info: RunInfo, error: BaseException, seed: Any) -> dict[str, Any]:
    failed = Results(status="failed", error=f"{type(error).__name__}: {error}", run_dir=str(info.run_dir),
                     name=info.name, choices=info.choices, overrides=info.overrides, seed=seed)
    results = failed.to_dict()
    try:
        info.run_dir.mkdir(parents=True, exist_ok=True)
        (info.run_dir / "error.txt").write_text("".join(traceback.format_exception(error)))
        failed.write(info.run_dir / RESULTS)
    except OSError as e:  # e.g. the disk that made the run fail is full
        log.error(f"could not record the failure in {info.run_dir}: {e}")
    return results


def cpu_threads(cfg: DictConfig) -> int | None:
    """cfg.threads; else under a launcher that runs several jobs on one machine, that job's share of the cores
    (torch would otherwise start one thread per core in every job, and the jobs would slow each other many
    times); else None (torch's default)."""
    if cfg.threads is not None:
        return cfg.threads
    from hydra.core.hydra_config import HydraConfig

    launcher = HydraConfig.get().launcher
    target = str(launcher.get("_target_", ""))
    if launcher.get("cpus_per_task"):  # submitit: what the scheduler allots each job
        return int(launcher.cpus_per_task)
    if "JoblibLauncher" in target:
        cores, n_jobs = os.cpu_count() or 1, launcher.get("n_jobs") or 1
        return max(1, cores // (cores if n_jobs < 0 else n_jobs))  # joblib: n_jobs=-1 is one job per core
    if target.endswith("submitit_launcher.LocalLauncher"):
        return 1  # submitit_local starts every job at once
    return None


def skip_or_resume(cfg: DictConfig, info: RunInfo, setup: Setup) -> dict[str, Any] | None:
    """In a sweep re-run into its own directory: the earlier results of a finished cell (the job is skipped),
    or None after pointing an interrupted or paused cell at its last checkpoint. A single run continued in its
    directory (resume=) with a pause_at it has reached: its results (nothing is trained)."""
    if not info.multirun:
        return reached_pause(cfg, info) if cfg.get("resume") else None
    try:
        state, results = earlier_run(info.run_dir, OmegaConf.to_container(cfg, resolve=True))
    except ValueError as e:
        raise CellConflict(str(e)) from None
    if state == "finished":
        log.info(f"{results['status']} earlier in {info.run_dir}; skipped")  # the line's [job N cell] names it
        return results
    if state == "resume" and setup.ckpt_path is None:
        setup.ckpt_path = usable_checkpoint(info)
        if setup.ckpt_path is not None:
            log.info(f"resuming the {(results or {}).get('status') or 'interrupted'} run from {setup.ckpt_path}")
    return None


def reached_pause(cfg: DictConfig, info: RunInfo) -> dict[str, Any] | None:
    """The results of the run in `info.run_dir` when they hold the budget pause_at asks for (paused there or at a
    later budget, or finished), else None."""
    pause_at = cfg.get("pause_at")
    try:
        results = Results.read(info.run_dir / RESULTS).to_dict() if pause_at is not None else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if results is None or not (results["status"] in FINISHED or paused_beyond(results, pause_at)):
        return None
    where = f"budget {results['paused']['at']:g}" if results["status"] == "paused" else "its end"
    log.info(f"{info.run_dir} is {results['status']} at {where}, at or beyond pause_at={pause_at:g}: nothing to "
             f"train; its results are kept as they are")
    return results


def usable_checkpoint(info: RunInfo) -> Path | None:
    """The interrupted cell's checkpoint to resume from: last.ckpt, else (when it does not load) best.ckpt, else
    None: the cell restarts. A checkpoint that does not load is renamed to <name>.corrupt and the log says so."""
    for name in ("last.ckpt", "best.ckpt"):
        path = info.run_dir / CKPT_DIR / name
        if not path.is_file():
            continue
        try:
            check_checkpoint_file(path)
            safe_load(path)
            return path
        except CheckpointError as e:
            path.replace(path.with_name(name + ".corrupt"))
            log.warning(f"{e}; kept as {path.name}.corrupt")
    log.warning("no checkpoint of the interrupted run loads; the cell restarts from step 0")
    return None


class CellConflict(RuntimeError):
    """A sweep job's directory holds a run of another configuration; it is left untouched."""


def objective_value(results: dict[str, Any], objective: str, pause_at: float | None = None) -> float:
    """results[split][name] for objective "split/name" (NaN, with a logged error, when the run has no such metric).
    With pause_at, a validation metric is that budget branch's (results.json `budgets`: what a paused run has),
    where the run recorded that budget."""
    split, _, name = objective.partition("/")
    budget = next((b for b in results.get("budgets") or [] if pause_at is not None and split == "val"
                   and abs(b.get("fraction", -1.0) - pause_at) <= FRACTION_TOLERANCE), None)
    value = budget.get(objective) if budget is not None else (results.get(split) or {}).get(name)
    if not isinstance(value, (int, float)):
        known = [k for k in budget if k.startswith("val/")] if budget is not None else \
            [f"{s}/{k}" for s in ("val", "test") for k in results.get(s) or {}]
        log.error(f"objective={objective!r}: the run recorded no such metric; available: {', '.join(known)}")
        return math.nan
    return float(value)
