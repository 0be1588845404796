"""What a train.py job prints: one line per event, in one format, naming the job in a sweep.

Hydra configures the logging (conf/hydra/job_logging/archsweep.yaml: `ConsoleFormatter` on the terminal, the full
format in <run dir>/train.log). Lightning's own console handler, which printed every Lightning line a second
time, is removed once Lightning is imported; its tips and the accelerator lines that say nothing on this machine
are dropped; Python warnings go through the same logging (and the ones that only concern Lightning's or W&B's
internals are dropped); W&B is silent, and train.py prints its run directory and sync command once.

A run on several processes (ddp, fsdp, torchrun) speaks with one voice: the console shows rank 0's lines and only
the errors of the others, each starting with `[rank N]`; every rank's full log is its own file in the run directory
(train.log, train_ddp_process_<rank>.log). Library advice no user of train.py can act on (Lightning's `sync_dist`
advice: our epoch metrics are summed over the processes already) goes to those files only.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

_JOB: list[str] = []  # the job's prefix in a sweep, e.g. "job 3 norm=pre" (empty: a single run)

# messages (their beginning) that never help the user of train.py
DROPPED = (
    "💡 Tip:",  # Lightning's advertisements
    "TPU available:", "HPU available:", "IPU available:",
    "Restoring states from the checkpoint path", "Restored all states from the checkpoint",  # fit.py says which
    "Loaded model weights from the checkpoint",
    "`weights_only` was not set",  # Lightning loading train.py's own checkpoint for the final evaluation
    "`Trainer(val_check_interval=1",  # fit.py says how often a short run validates (and why)
    "`Trainer.fit` stopped: `max_steps=",  # the steps asked for were taken (other stops, max_epochs say, are kept)
)
# advice the libraries print that the user of train.py cannot act on (a part of the message): in the log files only
CONSOLE_DROPPED = (
    "sync_dist=True)` when logging on epoch level",  # lit.py's epoch metrics are summed over the processes already
)
RANK_ENV = ("RANK", "LOCAL_RANK", "SLURM_PROCID")  # a launcher's word for the rank, before Lightning has its own
# Python warnings about the libraries' internals, not about anything the user set
QUIET_WARNINGS = (
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r"Experiment logs directory .* exists and is not empty.*",  # the CSV logger in a run directory train.py made
    r".*The anonymous setting has no effect.*",
    r"Checkpoint directory .* exists and is not empty.*",  # a resumed or overwritten run's own folder (rundir.py)
)


class ConsoleFormatter(logging.Formatter):
    """`HH:MM:SS message`; warnings and errors say so; in a sweep every line starts with `[job N cell]`; a line of a
    process other than rank 0 (an error: `OneVoice`) with `[rank N]`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).rstrip("\n")  # a captured warning ends with a newline: no empty line after
        stamp, _, message = text.partition(" ")
        if record.levelno >= logging.WARNING:
            message = f"{record.levelname.lower()}: {message}"
        rank = process_rank()
        prefix = " ".join([*(f"[{job}]" for job in _JOB), *([f"[rank {rank}]"] if rank else [])])
        if prefix:
            message = "\n".join(f"{prefix} {line}" for line in message.split("\n"))
        return f"{stamp} {message}"


class DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(DROPPED)


class OneVoice(logging.Filter):
    """The console's filter: rank 0's lines and the errors of the other ranks, without the advice of
    `CONSOLE_DROPPED` (the log files keep everything)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR and process_rank() != 0:
            return False
        message = record.getMessage()
        return not any(part in message for part in CONSOLE_DROPPED)


def process_rank() -> int:
    """This process's global rank in a run on several processes (0 in a run on one): Lightning's `rank_zero_only.rank`
    (set from the launcher's environment when Lightning loads, then by the strategy) once Lightning is loaded, the
    launcher's environment before that."""
    rank_zero = sys.modules.get("lightning.fabric.utilities.rank_zero")
    rank = getattr(getattr(rank_zero, "rank_zero_only", None), "rank", None)
    if isinstance(rank, int):
        return rank
    return next((int(os.environ[key]) for key in RANK_ENV if os.environ.get(key, "").isdigit()), 0)


def job_prefix(job_num: int | None, name: str | None) -> str:
    return f"job {job_num}" + (f" {name}" if name and name != "defaults" else "")


def set_job(prefix: str | None) -> None:
    """Prefix every console line with `prefix` (a sweep job's number and cell), or no prefix (None)."""
    _JOB.clear()
    if prefix:
        _JOB.append(prefix)


def quiet_libraries() -> None:
    """Before Lightning or W&B print anything (call before importing them is fine; after is needed for
    Lightning's handler): one console handler (Hydra's), no tips, no warnings about library internals, one voice
    on the console in a run on several processes."""
    os.environ.setdefault("WANDB_SILENT", "true")  # train.py prints the run directory and sync command itself
    logging.captureWarnings(True)
    for pattern in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    root = logging.getLogger()
    for handler in root.handlers:
        if not any(isinstance(f, DropNoise) for f in handler.filters):
            handler.addFilter(DropNoise())
        on_console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if on_console and not any(isinstance(f, OneVoice) for f in handler.filters):
            handler.addFilter(OneVoice())
    if "lightning" in sys.modules:  # `import lightning` adds a console handler of its own to the `lightning` logger
        drop_lightning_handler()


def drop_lightning_handler() -> None:
    lightning_log = logging.getLogger("lightning")
    if logging.getLogger().handlers:  # Hydra's handlers print it; without them keep Lightning's own
        for handler in list(lightning_log.handlers):
            lightning_log.removeHandler(handler)
        lightning_log.propagate = True
