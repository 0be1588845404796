"""Lightning callbacks and plugins of train.py: progress lines with throughput, atomic checkpoint writes, a
checkpoint callback whose paths stay inside the run that uses them, and a validation at the final step. (The stop on
SIGTERM / SIGINT is `archsweep.core.train.lifecycle.interrupts.StopOnSignal`.)"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from archsweep.core.model.checkpoint import atomic_save, safe_load
from archsweep.core.model.legacy import upgrade_checkpoint

log = logging.getLogger("train")
ETA_HALF_LIFE_S = 30.0  # the ETA's pace: earlier training counts half per this many seconds of it


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temporary file and renamed into place, and read back with weights_only=True
    whatever Lightning asks (a crafted file given as ckpt_path cannot run code), an older run's in today's form."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any = "cpu", weights_only: bool | None = None) -> dict[str, Any]:
        return upgrade_checkpoint(safe_load(path, map_location=map_location))  # an older run's names as today's


class RunCheckpoint(ModelCheckpoint):
    """A run's checkpoints in `dirpath`: best.ckpt (lowest val/loss) and last.ckpt. The state it restores names
    checkpoints by absolute path; a path outside this run's checkpoint folder is replaced by the file of the same
    name in this folder where one exists (a run copied or moved whole), and is dropped, with its score, where
    none does (a resume into a new run directory), so best.ckpt and last.ckpt are always this run's own.
    `saved_step` is the global step of the newest checkpoint this trainer wrote (None before any)."""

    def __init__(self, dirpath: str | Path) -> None:
        super().__init__(dirpath=str(dirpath), filename="best", monitor="val/loss", mode="min", save_top_k=1,
                         save_last=True, auto_insert_metric_name=False, enable_version_counter=False)
        self.saved_step: int | None = None

    @property
    def state_key(self) -> str:
        # the stock callback's key, so checkpoints written with ModelCheckpoint restore into this one and back
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        self.saved_step = trainer.global_step

    def own_path(self, path: str) -> str:
        """`path` if it is in this run's checkpoint folder, else the file of that name there, else ""."""
        if not path:
            return ""
        here = Path(str(self.dirpath))
        if Path(path).parent == here:
            return path
        mine = here / Path(path).name
        return str(mine) if mine.is_file() else ""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict, dirpath=self.dirpath)  # every field restored; the paths made this run's own
        moved = {path: self.own_path(path) for path in state.get("best_k_models", {})}
        state["best_k_models"] = {moved[p]: score for p, score in state.get("best_k_models", {}).items() if moved[p]}
        for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
            state[key] = self.own_path(state.get(key) or "")
        if not state["best_model_path"]:
            state["best_model_score"] = None
        if not state["kth_best_model_path"]:
            state.pop("kth_value", None)
        super().load_state_dict(state)


class Progress(L.Callback):
    """Measures tokens/s and training time, logs `train/tokens_per_s`, and prints one line per log step (with the
    ETA) and per validation. The ETA is the steps left times the seconds per step of this fit's recent log windows
    (see `pace`), validation excluded; a resumed fit starts its own. Counts come from the batch's
    `n_tokens` (a Python int set on the CPU): no device sync. Lightning's ThroughputMonitor would synchronise CUDA
    after every batch, reports nothing until its window of batches fills, and has no ETA; its FLOP and MFU side is
    ours in compute.py (mask-aware FLOPs, a CPU peak)."""

    def __init__(self, start_time: float, val_keys: tuple[str, ...] = ("loss", "ppl", "acc", "exact_match"),
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.start_time = start_time  # the job's start (a single run: its process's), for time to first step
        self.clock = clock  # seconds, for the training time, tokens/s and the ETA
        self.step_s: float | None = None  # seconds per optimiser step, smoothed over this fit's recent windows
        self.paced_s = self.paced_steps = 0.0  # decayed sums of training seconds and steps behind step_s
        self.windows = 0  # log windows of this fit timed so far
        self.window_step = 0  # global step where the current log window began
        self.val_keys = val_keys  # what the validation line shows (monitoring/summary.py: what fits the task)
        self.first_step_s: float | None = None
        self.lr: float | None = None  # of the step in progress
        self.tokens = self.window_tokens = 0
        self.train_s = 0.0  # fit time without validation
        self.val_s = 0.0
        self.window_start = self.fit_start = self.val_start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_start = self.window_start = self.clock()
        self.window_step, self.step_s, self.windows = trainer.global_step, None, 0  # a resumed fit's pace is its own

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.train_s = self.clock() - self.fit_start - self.val_s

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.first_step_s is None:
            self.first_step_s = time.time() - self.start_time
            log.info(f"first training step {self.first_step_s:.1f} s after start")
        if trainer.optimizers:  # the first parameter group's rate for this step (LearningRateMonitor logs them all),
            group = trainer.optimizers[0].param_groups[0]  # before a parametrisation's factor (`lr_scale`, mup)
            self.lr = group["lr"] / group.get("lr_scale", 1.0)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = self.clock()
        self.tokens += batch["n_tokens"]
        self.window_tokens += batch["n_tokens"]
        every = trainer.log_every_n_steps
        if every and trainer.global_step % every == 0 and (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
            spent = max(now - self.window_start, 1e-9)
            rate = self.window_tokens / spent
            pl_module.log("train/tokens_per_s", rate, on_step=True, on_epoch=False)
            self.pace(spent, trainer.global_step - self.window_step)
            self.window_tokens, self.window_start, self.window_step = 0, now, trainer.global_step
            self._print_step(trainer, rate)

    def pace(self, spent: float, steps: int) -> None:
        """Take a log window of `steps` optimiser steps in `spent` seconds (validation excluded) into the seconds per
        step: recent training time over recent steps, both sums halving every ETA_HALF_LIFE_S of training. The
        fit's first window (start-up: workers, first allocations) stands alone until the next one replaces it."""
        if steps <= 0:
            return
        keep = 0.5 ** (spent / ETA_HALF_LIFE_S) if self.windows > 1 else 0.0
        self.paced_s = self.paced_s * keep + spent
        self.paced_steps = self.paced_steps * keep + steps
        self.windows += 1
        self.step_s = self.paced_s / self.paced_steps

    def eta_s(self, step: int, total: int) -> float | None:
        """Seconds left to step `total` at the recent pace (None before a window is timed or without max_steps)."""
        if self.step_s is None or total <= 0:
            return None
        return self.step_s * max(total - step, 0)

    def _print_step(self, trainer: L.Trainer, rate: float) -> None:
        m = trainer.callback_metrics  # tensors -> floats here, once per log step
        step, total = trainer.global_step, trainer.max_steps
        eta = self.eta_s(step, total)
        parts = [f"step {step}/{total}", f"loss {float(m['train/loss']):.4f}"]
        if "train/acc" in m:
            parts.append(f"acc {float(m['train/acc']):.3f}")
        if self.lr is not None:
            parts.append(f"lr {self.lr:.2e}")
        parts.append(f"{rate:,.0f} tok/s")
        if eta is not None:
            parts.append(f"eta {eta:.0f}s")
        log.info(" | ".join(parts))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.val_start = self.clock()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        spent = self.clock() - self.val_start
        self.window_start += spent  # keep validation out of tokens/s and the ETA
        if trainer.state.fn == "fit":
            self.val_s += spent
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        keys = [f"val/{k}" for k in self.val_keys if f"val/{k}" in m]
        names = {"exact_match": "teacher-forced exact match"}  # decoded exact match: the decoding line
        log.info(f"validation at step {trainer.global_step}: " + ", ".join(
            f"{names.get(k.split('/')[1], k.split('/')[1])} {float(m[k]):.4f}" for k in keys))

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_s if self.train_s else 0.0


class ValidateAtEnd(L.Callback):
    """Validates after the final step when `val_check_interval` does not divide `max_steps` (a FLOP budget's step
    count, say), so the run's last weights are validated and can be its best checkpoint; without it the steps after
    the last multiple of the interval are never validated. It asks for a stop at the final step, which Lightning
    answers by validating before it ends (as it does for EarlyStopping)."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        batches = trainer.global_step * trainer.accumulate_grad_batches  # the stream's batches, as Lightning counts
        if (trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps
                and (batch_idx + 1) % trainer.accumulate_grad_batches == 0 and batches % trainer.val_check_batch):
            trainer.should_stop = True
