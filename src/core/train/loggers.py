"""The loggers of a run: the local CSV metrics file always, plus W&B, TensorBoard or nothing (`logger=`).

W&B's mode `auto` means online when credentials exist (WANDB_API_KEY, an identity token, or a netrc entry for
the W&B host) and offline otherwise, so a machine without credentials never prompts or waits on the network.
An explicit WANDB_MODE in the environment wins over `auto`.
"""

from __future__ import annotations

import netrc
import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

WANDB_MODES = ("auto", "online", "offline", "disabled")
LOGGERS = ("wandb", "csv", "tensorboard", "none")


def has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode(mode: str) -> str:
    if mode not in WANDB_MODES:
        raise ValueError(f"logger.mode={mode!r} is not a known option; valid options: {', '.join(WANDB_MODES)}")
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if has_wandb_credentials() else "offline"


def new_run_id() -> str:
    return secrets.token_hex(4)  # not from torch's or Python's seeded RNGs: leaves training randomness alone


def history_csv_logger(run_dir: Path, keep_before: int | None) -> Any:
    """Lightning's CSVLogger writing <run_dir>/metrics.csv. With `keep_before` (a run resumed in its own
    directory from the checkpoint of that step), the rows logged before that step are kept and the new ones
    appended; later rows, which the resumed run logs again, are dropped, so no step appears twice."""
    import csv

    from lightning.fabric.loggers.logger import rank_zero_experiment
    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    class HistoryWriter(ExperimentWriter):
        def _check_log_dir_exists(self) -> None:
            if keep_before is None or not os.path.isfile(self.metrics_file_path):
                return super()._check_log_dir_exists()
            with open(self.metrics_file_path, newline="") as f:
                reader = csv.DictReader(f)
                header = list(reader.fieldnames or [])
                kept = [r for r in reader if r.get("step", "").isdigit() and int(r["step"]) < keep_before]
            self.metrics_keys = sorted(header)
            with open(self.metrics_file_path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(kept)

    class HistoryCSVLogger(CSVLogger):
        @property
        @rank_zero_experiment
        def experiment(self) -> Any:
            if self._experiment is None:
                self._fs.makedirs(self.root_dir, exist_ok=True)
                self._experiment = HistoryWriter(log_dir=self.log_dir)
            return self._experiment

    return HistoryCSVLogger(save_dir=str(run_dir), name="", version="")


def make_loggers(logger_cfg: dict[str, Any], run_dir: Path, name: str, group: str | None, tags: list[str],
                 config: dict[str, Any], run_id: str, keep_before: int | None = None) -> list[Any]:
    loggers: list[Any] = [history_csv_logger(run_dir, keep_before)]  # <run_dir>/metrics.csv
    kind = logger_cfg["name"]
    if kind == "wandb":
        mode = wandb_mode(logger_cfg["mode"])
        if mode != "disabled":
            from lightning.pytorch.loggers import WandbLogger

            wandb_logger = WandbLogger(
                name=name, save_dir=str(run_dir), project=logger_cfg["project"], entity=logger_cfg.get("entity"),
                group=group, tags=tags, id=run_id, resume="allow", mode=mode, config=config, job_type="train")
            # Lightning passes anonymous=None, which W&B answers with a deprecation notice on every run
            wandb_logger._wandb_init.pop("anonymous", None)
            loggers.append(wandb_logger)
    elif kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="",
                                         default_hp_metric=False))
    elif kind not in ("csv", "none"):
        raise ValueError(f"logger.name={kind!r} is not a known logger; valid options: {', '.join(LOGGERS)}")
    return loggers


def finish_wandb(exit_code: int = 0) -> None:
    """End the current W&B run, if any, so the next job of a sweep starts its own."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=exit_code)
