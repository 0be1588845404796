"""The Lightning side of a run's fit: the task's data module, the Trainer made from the `trainer` group, and the
data-parallel details around it (the collectives' time-out and its error in our terms, a sweep job's DDP workers, an
error of a rank other than 0 named on the console).
"""

from __future__ import annotations

import datetime
import logging
import sys
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf, read_write

from archsweep.core.data.tasks.base import Task
from archsweep.core.train.config.rules import FSDP_STRATEGY, data_parallel, processes
from archsweep.core.train.launch.shard import sharded_strategy
from archsweep.core.train.lifecycle.interrupts import OwnSignals
from archsweep.core.train.lifecycle.stops import Interrupted
from archsweep.core.train.monitoring.callbacks import AtomicCheckpointIO
from archsweep.core.train.runs.runinfo import RunInfo

log = logging.getLogger("train")


class TaskData(L.LightningDataModule):
    """The task's dataloaders; training resumes at the batch the restored step count says."""

    def __init__(self, task: Task, kind: str, seed: int) -> None:
        super().__init__()
        self.task, self.kind, self.seed = task, kind, seed

    def _loader(self, split: str, start: int = 0) -> Any:
        t = self.trainer
        return self.task.dataloader(split, self.kind, self.seed, start, t.global_rank, t.world_size)

    def train_dataloader(self) -> Any:
        return self._loader("train", self.trainer.global_step * self.trainer.accumulate_grad_batches)

    def val_dataloader(self) -> Any:
        return self._loader("val")

    def test_dataloader(self) -> Any:
        splits = self.task.test_splits
        return self._loader(splits[0]) if len(splits) == 1 else [self._loader(s) for s in splits]


def sweep_job_for_ddp(info: RunInfo) -> None:
    """Lightning starts DDP workers by re-running the command line; in a sweep that line is the whole sweep.
    Point it at this job alone, in this job's directory."""
    from hydra.core.hydra_config import HydraConfig

    sys.argv = [sys.argv[0], *info.overrides]
    hc = HydraConfig.get()
    with read_write(hc):
        hc.run.dir = str(info.run_dir)


def validation_every(max_steps: int, interval: int) -> int:
    """Steps between validations: `interval`, or in a run shorter than it (a short sweep) the largest divisor of
    max_steps that gives 4 to 20 validations, the last at the final step, so loss curves are curves; where no
    divisor does (max_steps prime, say, as a FLOP budget can make it), 8 evenly spaced ones. Either way the final
    step is validated too (callbacks.ValidateAtEnd)."""
    if max_steps >= interval:
        return interval
    fitting = [d for d in range(1, max_steps // 4 + 1) if max_steps % d == 0 and max_steps // d <= 20]
    return max(fitting) if fitting else max(1, -(-max_steps // 8))


def make_trainer(cfg: DictConfig, loggers: list[Any], callbacks: list[Any], run_dir: Path) -> L.Trainer:
    args = OmegaConf.to_container(cfg.trainer, resolve=True)
    args.pop("peak_flops", None)  # ours (MFU), not Lightning's
    timeout = args.pop("collective_timeout_s", None)
    if args["strategy"] == FSDP_STRATEGY:  # trainer=fsdp (core/train/launch/shard.py)
        args["strategy"] = sharded_strategy(processes(cfg.trainer), timeout)
    else:
        args["strategy"] = with_collective_timeout(args["strategy"], timeout)
    accumulate = args.get("accumulate_grad_batches", 1)
    every = validation_every(args["max_steps"], args["val_check_interval"])
    if every != args["val_check_interval"]:
        log.info(f"trainer.max_steps={args['max_steps']} is below trainer.val_check_interval="
                 f"{args['val_check_interval']}: validating every {every} steps instead")
    args["val_check_interval"] = every * accumulate
    return L.Trainer(**args, logger=loggers, callbacks=[OwnSignals(), *callbacks, RankError()],
                     plugins=[AtomicCheckpointIO()], default_root_dir=str(run_dir))


class RankError(L.Callback):
    """An error that stops a rank other than 0 is named on the console at once, in one line (`[rank N] error: <type>:
    <message>`, monitoring/console.py): rank 0, finding the rank gone, may end the process before it prints its
    traceback. Rank 0's own traceback needs no such line (rank 0 is the console's voice); a stop by a signal is no
    error."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if trainer.global_rank == 0 or not isinstance(exception, Exception) or isinstance(exception, Interrupted):
            return  # rank 0's traceback follows; KeyboardInterrupt and Lightning's SIGTERMException are no Exception
        log.error(f"{type(exception).__name__}: {exception}")


class CollectiveTimeout(RuntimeError):
    """A data-parallel collective did not complete in trainer.collective_timeout_s."""


def with_collective_timeout(strategy: Any, seconds: float | None) -> Any:
    """A `ddp*` strategy name -> that strategy with this timeout on its collectives (torch's default is 30
    minutes, which looks like a hang); anything else unchanged."""
    if not isinstance(strategy, str) or not strategy.startswith("ddp") or not seconds:
        return strategy
    from lightning.pytorch.strategies import StrategyRegistry

    if strategy not in StrategyRegistry:
        return strategy  # not a registered name: Lightning says so
    entry = StrategyRegistry[strategy]  # {"strategy": class, "init_params": {...}}
    return entry["strategy"](**entry["init_params"], timeout=datetime.timedelta(seconds=float(seconds)))


def explain_collective_timeout(error: BaseException, cfg: DictConfig) -> BaseException:
    """gloo's "Timed out waiting ... for recv" / NCCL's watchdog timeout, said in our terms."""
    text = str(error)
    if not data_parallel(cfg.trainer.get("strategy", "")) or not (
            "Timed out" in text or "timed out" in text or "Watchdog caught collective operation timeout" in text):
        return error
    seconds = cfg.trainer.get("collective_timeout_s")
    return CollectiveTimeout(
        f"a collective across the data-parallel processes did not complete within trainer.collective_timeout_s="
        f"{seconds} s: another process stopped, hung or fell behind (its log is train_ddp_process_<rank>.log in "
        f"the run directory); if one step legitimately takes longer, raise trainer.collective_timeout_s "
        f"(torch: {text.splitlines()[0][:200]})")
