"""Budget branches of a warmup-stable-decay run (`schedule=wsd schedule.branches=[0.25,0.5,1.0]`): several
training budgets from one run, as in Hägele et al. 2024 (section 4) and WSD-S.

The stable phase does not depend on the run's length, so the WSD run of B steps is exactly this run's state at B's
decay start s, then steps s..B under the schedule of total_steps=B. `StablePoints` saves the full training state
(weights, optimiser, schedule step, data position, FLOP totals) at each s into `<run dir>/branches/stable_step<s>.ckpt`;
after the run's own fit (the 1.0 budget) and evaluation, `Budgets.complete` fits each branch from its checkpoint to
B steps, validates it on the run's validation batches (the weights at the end of its decay), and records it in
`branches/budgets.json`, rewritten whole (atomically) after each branch. A run stopped during a branch is an
interrupted run; continued, it re-fits only the branches not recorded (a branch restarts from its stable
checkpoint) and records each budget once. No logger sees the branches: metrics.csv and W&B keep the run's own
curve; the budgets are in results.json `budgets`.

`pause_at=f` (`PauseAt`) stops the run's fit at the decay start of the budget f instead, with last.ckpt at that step;
the branches up to f are fitted then (fit.py `record_paused`), and the run, continued from last.ckpt, is the run
that never paused.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf

from archsweep.core.train.config.wsd import Branch, branch_plan
from archsweep.core.train.lifecycle.interrupts import HeldSignals, StopOnSignal
from archsweep.core.train.monitoring.callbacks import Progress
from archsweep.core.train.monitoring.compute import Compute
from archsweep.core.train.runs.results import Results

log = logging.getLogger("train")

BRANCH_DIR = "branches"
STATE = "budgets.json"  # in BRANCH_DIR: {"run": the run's own results, "budgets": [each recorded branch]}


def plan_of(cfg: DictConfig) -> list[Branch]:
    """The budgets a run's schedule asks for ([] without branches), the run itself (fraction 1.0) last."""
    fractions = list(cfg.schedule.get("branches") or [])
    if not fractions:
        return []
    return branch_plan(int(cfg.schedule.total_steps), float(cfg.schedule.decay_fraction), fractions)


def stable_path(run_dir: Path, step: int) -> Path:
    return run_dir / BRANCH_DIR / f"stable_step{step}.ckpt"


class StablePoints(L.Callback):
    """Saves the full training state after `step` optimiser steps to `paths[step]`, for each step given (where
    Lightning resumes exactly: after the step, at the end of its last micro-batch)."""

    def __init__(self, paths: dict[int, Path]) -> None:
        self.paths = paths

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step in self.paths and (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
            trainer.save_checkpoint(self.paths[step], False)  # optimiser and loops included


class PauseAt(L.Callback):
    """Stops the fit after `step` optimiser steps (the decay start of the budget `pause_at` names) through
    `trainer.should_stop`, set before the next batch trains (LitModel skips a batch a stop was asked before), so the
    fit validates at `step` only where the run that does not pause validates too. The state to continue from is the
    checkpoint callback's last.ckpt written after that validation, where one was due at `step`; else the state at the
    end of the step (where Lightning resumes exactly, as after `StopOnSignal`), saved here to `path`, which `keep`
    makes last.ckpt once the fit has ended (the checkpoint callback writes last.ckpt at the end of a fit that has
    not written one). A fit resumed at or past `step` stops before its first step, its checkpoint kept as it was.
    `paused_step`: where it stopped (None: the fit ended otherwise)."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path
        self.paused_step: int | None = None
        self.saved = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step >= self.step:
            self.paused_step = trainer.global_step
            trainer.should_stop = True
            shutil.copyfile(trainer.ckpt_path, self.path)  # the file it resumed from may be last.ckpt itself
            self.saved = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step != self.step or (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        self.paused_step = self.step
        if (batch_idx + 1) % trainer.val_check_batch:  # no validation due: the state after the step is the one
            trainer.save_checkpoint(self.path, False)
            self.saved = True

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.paused_step is not None:
            trainer.should_stop = True

    def keep(self, last: Path | None) -> None:
        """After the fit: the state saved at `step` becomes `last` (the checkpoint to continue from); with None (the
        fit did not end paused: the divergence check stopped it at that step) it is dropped."""
        if self.saved and last is not None:
            self.path.replace(last)
        elif self.saved:
            self.path.unlink(missing_ok=True)


def stable_points(plan: list[Branch], run_dir: Path, resume_step: int | None) -> StablePoints:
    """The callback saving each branch's decay start. A run from step 0 (`resume_step` None) forgets budgets
    recorded by an earlier attempt in this directory; a resumed one must not have passed a decay start whose state
    it lacks (ValueError naming the branch and the fix), as when a resume changes trainer.max_steps."""
    if resume_step is None:
        (run_dir / BRANCH_DIR / STATE).unlink(missing_ok=True)
    budgets = Budgets(plan, run_dir)
    for branch in plan:
        path = stable_path(run_dir, branch.decay_start)
        if (branch.fraction < 1.0 and resume_step is not None and branch.decay_start < resume_step
                and not path.is_file() and budgets.recorded(branch) is None):
            raise ValueError(f"schedule.branches: the branch at {branch.fraction} ({branch.steps} steps) decays from "
                             f"step {branch.decay_start}, which this run, resumed at step {resume_step}, has passed "
                             f"without saving {path.name} (its trainer.max_steps changed?); continue it with the "
                             f"steps it was started with, or start a new run")
    return StablePoints({b.decay_start: stable_path(run_dir, b.decay_start) for b in plan if b.fraction < 1.0})


class Budgets:
    """The branches of one run: reads and writes branches/budgets.json, fits the branches not yet recorded."""

    def __init__(self, plan: list[Branch], run_dir: Path) -> None:
        self.plan, self.run_dir = plan, run_dir
        self.path = run_dir / BRANCH_DIR / STATE
        try:
            self.state: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.state = {}
        recorded = self.state.get("budgets")
        self.state["budgets"] = [b for b in recorded if isinstance(b, dict)] if isinstance(recorded, list) else []

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=2) + "\n")
        tmp.replace(self.path)

    def recorded(self, branch: Branch) -> dict[str, Any] | None:
        return next((b for b in self.state["budgets"] if b.get("steps") == branch.steps
                     and b.get("decay_start") == branch.decay_start), None)

    def run_results(self, done: Results, trained: bool) -> Results:
        """The run's own results: `done`, kept here before any branch; or, when this process trained no step (a
        run continued after its fit had finished, stopped during a branch), the ones kept then, whose training
        figures (FLOPs, time, tokens/s, final training loss) this process could not measure."""
        kept = self.state.get("run")
        if not trained and isinstance(kept, dict):
            return Results.from_dict({**kept, "resumed_from": done.resumed_from})
        self.state["run"] = done.to_dict()
        self.write()
        return done

    def complete(self, done: Results, fit_branch: Callable[[Branch], tuple[dict[str, Any], int | None]],
                 pending: int | None = None) -> list[dict[str, Any]]:
        """results.json's `budgets`, increasing: each branch (fitted by `fit_branch` unless recorded), then the run
        itself from `done`. `fit_branch` returns the branch's entry and a signal its fit noted too late to stop it;
        `pending` is one the run's own fit noted so. `Interrupted` from a branch, or for a signal between branches
        (or noted so), propagates with the branches before it recorded."""
        budgets = []
        with HeldSignals(done.steps or 0, pending) as held:
            for branch in self.plan:
                if branch.fraction >= 1.0:
                    budgets.append(run_budget(branch, done))
                    continue
                entry = self.recorded(branch)
                if entry is None:
                    held.check()
                    entry, late = fit_branch(branch)
                    self.state["budgets"].append(entry)
                    self.write()
                    if late is not None:  # in the branch's last step or its validation: it is recorded, stop now
                        held.signum = late
                budgets.append(entry)
            held.check()
        return budgets


def run_budget(branch: Branch, done: Results) -> dict[str, Any]:
    """The 1.0 budget: the run itself, its validation metrics as results.json reports them."""
    val = {f"val/{k}": v for k, v in done.splits.get("val", {}).items()}
    tokens = round(done.total_flops / done.flops_per_token) if done.total_flops and done.flops_per_token else None
    return {**asdict(branch), "tokens": tokens, "flops": done.total_flops, "branch_train_flops": None, **val}


def branch_trainer_cfg(cfg: DictConfig, branch: Branch) -> DictConfig:
    """The trainer settings of a branch: the run's, to `branch.steps`, validating once at the end, writing no
    checkpoints of its own."""
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer.update(max_steps=branch.steps, val_check_interval=branch.steps, enable_checkpointing=False)
    return OmegaConf.create({"trainer": trainer})


def fit_branch(branch: Branch, lit: L.LightningModule, data: L.LightningDataModule, trainer: L.Trainer,
               compute: Compute, run_dir: Path) -> tuple[dict[str, Any], int | None]:
    """Fit `lit` (a new model of the run's config whose schedule has total_steps=branch.steps) from the branch's
    stable checkpoint with `trainer` (from `branch_callbacks`' StopOnSignal and `compute` among its callbacks); its
    budget's entry with its validation metrics (loss, ppl, and bpb for a language model, as the run logs them), and
    a signal received in its last step or validation, which the fit completed despite it (else None).
    `Interrupted` when a signal stops it earlier."""
    ckpt = stable_path(run_dir, branch.decay_start)
    if not ckpt.is_file():
        raise FileNotFoundError(f"schedule.branches: the branch at {branch.fraction} needs {ckpt}, the state at step "
                                f"{branch.decay_start}, which the run did not save (resumed past it from a checkpoint "
                                f"of another run?); start the run again from step 0 to record this budget")
    log.info(f"budget branch {branch.fraction:g}: {branch.steps} steps, its decay from step {branch.decay_start} "
             f"({ckpt.name})")
    with warnings.catch_warnings():  # the run's checkpoint also holds the state of callbacks a branch does not use
        warnings.filterwarnings("ignore", message=".*callbacks used to create the checkpoint.*")
        trainer.fit(lit, datamodule=data, ckpt_path=str(ckpt))
    val = {k.split("/", 1)[1]: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    if trainer.global_step != branch.steps or "loss" not in val:
        raise RuntimeError(f"budget branch {branch.fraction}: the fit ended at step {trainer.global_step} of "
                           f"{branch.steps} with {sorted(val) or 'no validation'}")
    val = {f"val/{k}": v for k, v in val.items()}
    entry = {**asdict(branch), "tokens": compute.tokens, "flops": compute.flops,
             "branch_train_flops": compute.flops_this_fit, **val}
    log.info(f"budget {branch.fraction:g} ({branch.steps} steps): val/loss {val['val/loss']:.4f}, "
             f"{compute.flops:.4g} training FLOPs, of which its decay {compute.flops_this_fit:.4g}")
    late = next((c.pending for c in trainer.callbacks if isinstance(c, StopOnSignal) and c.pending), None)
    return entry, late


def branch_callbacks(compute: Compute, start_time: float, val_keys: tuple[str, ...]) -> list[L.Callback]:
    """A branch's callbacks: FLOP totals (continued from the checkpoint), progress lines, and a stop on SIGTERM /
    SIGINT without a checkpoint (the branch restarts from its stable checkpoint)."""
    return [compute, Progress(start_time, val_keys), StopOnSignal(None)]

