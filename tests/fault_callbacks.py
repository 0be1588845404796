"""Faults for the reliability tests, as Lightning callbacks a test run adds with +callbacks.<name>._target_=..."""

from __future__ import annotations

import time

import lightning as L


class StallRank(L.Callback):
    """Rank `rank` stops at training step `step` for `seconds` (a hung process), so the others wait in the next
    gradient all-reduce."""

    def __init__(self, rank: int = 1, step: int = 2, seconds: float = 120.0) -> None:
        self.rank, self.step, self.seconds = rank, step, seconds

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            time.sleep(self.seconds)
