"""Stopping a run early, in one place: the signals that ask for it, the exception that carries it, and where it
is caught.

- `StopOnSignal` (a callback of every fit): SIGTERM, SIGUSR1, SIGUSR2 or SIGINT during training ends the step in
  progress, writes last.ckpt and raises `Interrupted`.
- `OwnSignals` (the first callback of every trainer): Lightning's SIGTERM handler, which it puts in place at the
  start of every fit, validation and test, is replaced by `STOPS` at the first hook after it (on several processes
  that handler hangs the run).
- `STOPS` (`stops.StopSignals`, a module of its own that job.py imports before Lightning): the process's handler,
  installed when a job starts, for every moment no training is running: the final evaluation (one process: a
  signal stops it at once), the run's set-up, a fit's start and the records (noted, and acted on at the next phase
  boundary: a fit's first step, the end of the evaluation), and the gaps between a sweep's jobs (the next job records
  itself interrupted before it starts). A stop signal is never lost: it ends the process with 128 + its number.
- `HeldSignals`: between budget branches, when no fit is running, a signal is noted and `Interrupted` raised
  before the next branch.
- `caught_stops`: the guard fit.py puts around each phase of a run (its fit, its evaluation, its budget branches):
  any stop (`Interrupted`, Lightning's `SIGTERMException` under DDP) leaves it as one `Interrupted` naming the
  run's step and the checkpoint to continue from; any other error first ends a data-parallel run's other
  processes. fit.py catches `Interrupted` once and records it with `interrupted_results`.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from archsweep.core.train.config.setup import Setup
from archsweep.core.train.lifecycle.stops import SCHEDULER_SIGNALS, STOPS, Interrupted
from archsweep.core.train.monitoring.callbacks import RunCheckpoint
from archsweep.core.train.runs.results import RESULTS, Results
from archsweep.core.train.runs.runinfo import RunInfo

log = logging.getLogger("train")


class StopOnSignal(L.Callback):
    """SIGTERM, SIGUSR1 or SIGUSR2 (a scheduler's notices before a time-out or preemption) or SIGINT (Ctrl+C) during
    training: the step in progress completes (and one more when a validation is due after it); last.ckpt is written
    then and `Interrupted` raised, which fit.py turns into results.json `status: interrupted` and a non-zero exit.
    Resuming from that checkpoint continues exactly. A second SIGINT stops at once. With several processes (ddp,
    fsdp) a scheduler's signal, to any of them, is handled the same way: the processes agree at each step boundary
    on the signal one of them received (one small all-reduce, in place of Lightning's handler, whose broadcast from
    inside the signal handler can interleave with a sharded model's own collectives and hang), and all stop there
    together. Without `last_path` (a budget branch, which restarts from its own starting point) it stops after the
    current step and saves nothing."""

    def __init__(self, last_path: str | Path | None) -> None:
        self.last_path = str(last_path) if last_path is not None else None
        self.signum: int | None = None
        self.saved_step: int | None = None
        self.stopped = False  # Interrupted raised: the signal was acted on

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # until now `STOPS` had the signals (OwnSignals gave them back to it after Lightning had put its own handler
        # in place); Lightning restores STOPS's handler at the end of fit
        for signum in (*SCHEDULER_SIGNALS, signal.SIGINT) if trainer.world_size == 1 else SCHEDULER_SIGNALS:
            signal.signal(signum, self._handler)
        if trainer.world_size > 1:  # Ctrl+C: Python's KeyboardInterrupt, which Lightning turns into a stop of all
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self.signum = STOPS.for_training()  # one noted in the run's set-up, or in this fit before its training

    @property
    def pending(self) -> int | None:
        """A signal noted too late to stop this fit: in its last step (checkpoint written or not) or its final
        validation, after which the fit ended on its own without `Interrupted`. The caller decides (fit.py: before any
        budget branch, branches.py: before the next)."""
        return None if self.stopped else self.signum

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        STOPS.note(signum)  # a signal the fit ends too late for is acted on after it (`StopSignals.check`)
        log.warning(f"received {signal.Signals(signum).name}: stopping after the current step, with a checkpoint")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # the checkpoint is taken here, where Lightning resumes exactly; not before a due validation (a resumed run
        # would skip it) nor inside a step's micro-batches
        if (self.saved_step is not None or (batch_idx + 1) % trainer.accumulate_grad_batches
                or (batch_idx + 1) % trainer.val_check_batch == 0):
            return
        if trainer.world_size > 1:  # this process's signal, or another's (the highest number, if several)
            noted = torch.tensor(self.signum or 0, device=trainer.strategy.root_device)
            agreed = int(trainer.strategy.reduce(noted, reduce_op="max"))
            if not agreed:  # a signal that arrived during the reduce stays noted: all see it at the next boundary
                return
            self.signum = agreed
        if self.signum is None:
            return
        if self.last_path is not None:
            trainer.save_checkpoint(self.last_path, False)  # the full state (optimiser, loops), not weights only
        self.saved_step = trainer.global_step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.saved_step is not None:  # the step's metrics are written by now
            self.stopped = True
            raise Interrupted(self.signum, self.saved_step, self.last_path)


class OwnSignals(L.Callback):
    """The first callback of every trainer (trainer.make_trainer): the stop signals stay with this process's own
    handlers through the whole of each Lightning run. Lightning puts its SIGTERM handler in place at the start of
    every fit, validation and test (after the `setup` and `on_fit_start` hooks, before the sanity check); on several
    processes that handler sends the signal on to the processes Lightning started and broadcasts from inside the
    handler, a collective the other processes have not entered: they wait in their own next one (a barrier, a
    metric's gather) and the run hangs until the collective time-out (a SIGTERM during the sanity check, the
    peak-speed probe at the training's start or the final evaluation did). From the first hook after it, `STOPS`
    has the signals back (it notes them; in the final evaluation of one process it stops at once), and
    `StopOnSignal` takes them over for the training, with whatever `STOPS` noted. Left to Lightning's handler is the
    stretch from its registration, just after a barrier of all the processes, to that first hook: Lightning's next
    barrier and the making of the data loaders (milliseconds here; a signal there still meets it)."""

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        STOPS.take_back()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        STOPS.take_back()  # before the other callbacks' hooks (the peak-speed probe and its broadcast)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn != "fit":  # a fit's own validations have StopOnSignal's handler
            STOPS.take_back()

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        STOPS.take_back()


class HeldSignals:
    """SIGTERM / SIGINT while no branch is training (a branch's fit has StopOnSignal): noted, and `check` raises
    `Interrupted` for it before the next branch, so a stop between branches is an interrupted run too."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, step: int, pending: int | None = None) -> None:
        self.step = step  # the run's own, for the interrupted results
        self.signum: int | None = pending  # one the run's fit noted in its last step
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> HeldSignals:
        self.previous = {signum: signal.signal(signum, self.note) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def note(self, signum: int, frame: Any) -> None:
        self.signum = signum
        STOPS.note(signum)
        log.warning(f"received {signal.Signals(signum).name}: stopping before the next budget branch")

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum, self.step, None)


def stop_workers(trainer: L.Trainer) -> None:
    """After an error in rank 0 of a DDP run, end the other processes: Lightning leaves them running (except on
    Ctrl+C), and they would wait in their next collective, holding the run's output pipes open. A launcher ends
    only the processes it started itself: none where torchrun, SLURM or spawn's parent started them."""
    launcher = trainer.strategy.launcher
    if launcher is not None and trainer.is_global_zero:
        launcher.kill(signal.SIGKILL)


@contextmanager
def caught_stops(trainer: L.Trainer, ckpt_cb: RunCheckpoint, branch_from: str | None = None) -> Iterator[None]:
    """Around one phase of a run with `trainer`: a stop leaves as `Interrupted` with the run's step and the
    checkpoint to continue from. `branch_from`: the phase fits budget branches (their own trainers), and a stop in
    one continues the run from its last checkpoint (else `branch_from`), which re-fits that branch. Any other error
    in the run's own fit or evaluation ends the other processes of a data-parallel run (`stop_workers`)."""
    try:
        yield
    except (Interrupted, SIGTERMException) as stop:
        signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGTERM
        if branch_from is not None:
            raise Interrupted(signum, trainer.global_step, ckpt_cb.last_model_path or branch_from) from None
        if isinstance(stop, Interrupted):
            raise
        # Lightning's SIGTERM handling (DDP), a SystemExit with code 0 that must never end the run as a success:
        # the newest checkpoint is the last one saved
        raise Interrupted(signum, trainer.global_step, ckpt_cb.last_model_path or None) from None
    except BaseException:
        if branch_from is None:
            stop_workers(trainer)
        raise


def interrupted_results(trainer: L.Trainer, stop: Interrupted, info: RunInfo, seed: Any, setup: Setup,
                        n_params: int, run_id: str) -> dict[str, Any] | None:
    """results.json of a run stopped by a signal: status `interrupted`, the step, the checkpoint to resume from."""
    signum, step, checkpoint = stop.signum, stop.step, stop.checkpoint
    how = "re-run the sweep" if info.multirun else f"python train.py resume={info.run_dir} (or the same command again)"
    log.warning(f"interrupted by {signal.Signals(signum).name} at step {step}; to continue from {checkpoint}: {how}")
    if not trainer.is_global_zero:
        # rank 0 records the stop and ends with its code; another process ends with 0, without cli.py's line on a
        # signal after the last job (an agreed stop sets its STOPS too), since a non-zero end before rank 0's would
        # have Lightning's launcher kill rank 0, perhaps before its record
        STOPS.take()
        return None
    results = Results(
        status="interrupted",
        interrupted={"signal": signal.Signals(signum).name, "step": step, "exit_code": 128 + signum},
        name=info.name, group=info.group, run_dir=str(info.run_dir), choices=info.choices, overrides=info.overrides,
        seed=seed, params=n_params, steps=step, last_checkpoint=checkpoint,
        resumed_from=str(setup.ckpt_path) if setup.ckpt_path else None, wandb_run_id=run_id)
    results.write(info.run_dir / RESULTS)
    return results.to_dict()
