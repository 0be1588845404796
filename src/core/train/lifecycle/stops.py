"""A stop signal outside a fit, never lost (light: job.py installs it before Lightning is imported).

`STOPS` is the process's handler of SIGTERM, SIGUSR1, SIGUSR2 and SIGINT from the moment a job starts. During a
fit's training `interrupts.StopOnSignal` has them (and notes each here); at every other moment this handler does,
inside Lightning's runs too (`interrupts.OwnSignals` takes them back from Lightning's own handler): in the final
evaluation of a one-process run a signal stops at once; elsewhere (set-up, the start of a fit, the final evaluation
of a data-parallel run, records, the gaps between a sweep's jobs) it is noted and acted on at the next boundary: the
training's first step, the end of the evaluation, the next job's start, the process's end.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning as L

log = logging.getLogger("train")


class Interrupted(Exception):
    """Training stopped by a signal; `last.ckpt` holds the state after `step` optimiser steps."""

    def __init__(self, signum: int, step: int, checkpoint: str | None) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


# a scheduler's notices: SIGTERM (SLURM's preemption, `kill`, torchrun), SIGUSR1 (Lightning's SLURM requeue signal),
# SIGUSR2 (submitit's notice before a time-out; core/train/launch/submitit_job.py requeues the job after the stop)
SCHEDULER_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


STOP_SIGNALS = (*SCHEDULER_SIGNALS, signal.SIGINT)


class StopSignals:
    """The process's stop signals whenever no training runs (`StopOnSignal` has them during one; inside a fit,
    validation or test `take_back` takes them from Lightning's handler, and Lightning restores this one when the run
    ends). A signal is noted; inside `at_once` (the final evaluation, one process) it raises `Interrupted` at once.
    `check` raises for a noted signal, agreed across the processes of a data-parallel run so that all of them stop at
    the same boundary. `take` hands the noted signal to whoever records it (a job that has not started, the end of
    the process)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stop_at: tuple[int, str | None] | None = None  # (step, checkpoint) while a signal stops at once
        self.replaced: dict[int, Any] = {}  # signal -> the handler in place before this one (submitit's, say)
        self.untrained: int | None = None  # noted here, by no training's handler (`for_training`)

    def install(self) -> None:
        """Make this the handler of SIGTERM, SIGUSR1, SIGUSR2 and SIGINT (the main thread only: a job run in a
        worker thread leaves the signals to its process's main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            current = signal.getsignal(signum)
            if current != self.handle:
                self.replaced[signum] = current
                signal.signal(signum, self.handle)

    def take_back(self) -> None:
        """Be the handler of SIGTERM, SIGUSR1 and SIGUSR2 again, in place of Lightning's (`interrupts.OwnSignals`);
        unlike `install`, this keeps `handler_before` as it was."""
        if threading.current_thread() is threading.main_thread():
            for signum in SCHEDULER_SIGNALS:
                signal.signal(signum, self.handle)

    def handler_before(self, signum: int) -> Any:
        """The handler of `signum` before this one took it (the current one where this never did): submitit's
        requeue handler, which an interrupted job calls once its checkpoint is written."""
        current = signal.getsignal(signum)
        return self.replaced.get(signum) if current == self.handle else current

    def handle(self, signum: int, frame: Any) -> None:
        if self.signum == signal.SIGINT == signum:  # a second Ctrl+C: at once, whatever runs
            raise KeyboardInterrupt
        self.note(signum)
        self.untrained = signum
        if self.stop_at is not None:
            raise Interrupted(signum, *self.stop_at)
        log.warning(f"received {signal.Signals(signum).name}: stopping at the next point where the run can stop")

    def note(self, signum: int) -> None:
        self.signum = signum

    def for_training(self) -> int | None:
        """A signal this handler noted since the last training started (in the run's set-up, or in a fit before its
        training: its set-up, its sanity check), for the training starting now to stop at its first step. One a
        training's own handler noted is its fit's to answer for (`StopOnSignal.pending`), not the next fit's."""
        signum, self.untrained = self.untrained, None
        return signum

    def check(self, trainer: L.Trainer, step: int, checkpoint: str | None) -> None:
        """Raise `Interrupted` (step, checkpoint) for a noted signal; with several processes, one noted by any."""
        signum = self.signum or 0
        if trainer.world_size > 1:
            import torch

            noted = torch.tensor(signum, device=trainer.strategy.root_device)
            signum = int(trainer.strategy.reduce(noted, reduce_op="max"))
        if signum:
            self.signum = signum
            raise Interrupted(signum, step, checkpoint)

    @contextmanager
    def at_once(self, trainer: L.Trainer, step: int, checkpoint: str | None) -> Iterator[None]:
        """While inside, a signal raises `Interrupted` at once (one process: with several, a collective in progress
        on the others would wait for the process that left; they stop together at the next `check`)."""
        self.check(trainer, step, checkpoint)
        if trainer.world_size > 1:
            yield
            self.check(trainer, step, checkpoint)
            return
        self.stop_at = (step, checkpoint)
        try:
            yield
        finally:
            self.stop_at = None

    def take(self) -> int | None:
        """The noted signal, now recorded by the caller (and forgotten here)."""
        signum, self.signum, self.untrained = self.signum, None, None
        return signum


STOPS = StopSignals()
