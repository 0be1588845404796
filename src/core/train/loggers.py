"""The loggers of a run: the local CSV metrics file always (core/train/metrics_csv.py), plus W&B, TensorBoard or
nothing (`logger=`). Lightning and W&B are imported only when the loggers are made.

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


def wandb_logger(run_dir: Path, name: str, group: str | None, tags: list[str], config: dict[str, Any], run_id: str,
                 mode: str, project: str, entity: str | None) -> Any:
    """Lightning's WandbLogger on a W&B run this process starts itself with W&B's public `wandb.init` (Lightning
    would pass `anonymous`, a setting W&B now answers with a deprecation notice on every run). Only the global
    rank zero process starts one; the other DDP processes get a logger that writes nothing, as Lightning does.
    None when `mode` is `disabled`."""
    if mode == "disabled":
        return None
    from lightning.pytorch.loggers import WandbLogger
    from lightning.pytorch.utilities import rank_zero_only

    run = None
    if rank_zero_only.rank == 0:
        import wandb

        run = wandb.init(name=name, dir=str(run_dir), project=project, entity=entity, group=group, tags=tags,
                         id=run_id, resume="allow", mode=mode, config=config, job_type="train")
        # Lightning's log_metrics sends the step as `trainer/global_step`: W&B plots every metric against it
        run.define_metric("trainer/global_step")
        run.define_metric("*", step_metric="trainer/global_step", step_sync=True)
    return WandbLogger(name=name, save_dir=str(run_dir), project=project, id=run_id, experiment=run)


def make_loggers(logger_cfg: dict[str, Any], run_dir: Path, name: str, group: str | None, tags: list[str],
                 config: dict[str, Any], run_id: str, keep_before: int | None = None) -> list[Any]:
    from archsweep.core.train.metrics_csv import MetricsCSV

    loggers: list[Any] = [MetricsCSV(run_dir, keep_before)]
    kind = logger_cfg["name"]
    if kind == "wandb":
        logger = wandb_logger(run_dir, name, group, tags, config, run_id, wandb_mode(logger_cfg["mode"]),
                              logger_cfg["project"], logger_cfg.get("entity"))
        if logger is not None:
            loggers.append(logger)
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
