"""The loggers of a run: the local CSV metrics file always (monitoring/metrics_csv.py), plus the `logger` group's
choice, made by its `_target_` (with `_partial_: true`) called with the run (`LogRun`): W&B, TensorBoard, or
nothing (`_target_: null`). Lightning and W&B are imported only when the loggers are made.

W&B's mode `auto` means online when credentials exist (WANDB_API_KEY, an identity token, or a netrc entry for
the W&B host) and offline otherwise, so a machine without credentials never prompts or waits on the network.
An explicit WANDB_MODE in the environment wins over `auto`.
"""

from __future__ import annotations

import netrc
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

WANDB_MODES = ("auto", "online", "offline", "disabled")


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


@dataclass(frozen=True)
class LogRun:
    """What a logger factory (the `_target_` of conf/logger/*.yaml, with `_partial_: true`) is called with."""

    run_dir: Path
    name: str  # the run's name (the overrides that set it apart)
    group: str | None  # logger.group, else the experiment's name, else the sweep's (core/train/runs/runinfo.py)
    tags: list[str]  # `group=option` of every config choice, then logger.tags
    config: dict[str, Any]  # what W&B's config receives (runinfo.wandb_config)
    run_id: str  # kept across resumes, so a resumed run continues its W&B run


def wandb_logger(run: LogRun, mode: str, project: str, entity: str | None = None, group: str | None = None,
                 tags: list[str] | None = None) -> Any:
    """Lightning's WandbLogger on a W&B run this process starts itself with W&B's public `wandb.init` (Lightning
    would pass `anonymous`, a setting W&B now answers with a deprecation notice on every run). Only the global
    rank zero process starts one; the other DDP processes get a logger that writes nothing, as Lightning does.
    None when the mode resolves to `disabled`. `group` and `tags` are the yaml's; `run.group` and `run.tags`
    already hold them, with the run's own."""
    mode = wandb_mode(mode)
    if mode == "disabled":
        return None
    from lightning.pytorch.loggers import WandbLogger
    from lightning.pytorch.utilities import rank_zero_only

    experiment = None
    if rank_zero_only.rank == 0:
        import wandb

        experiment = wandb.init(name=run.name, dir=str(run.run_dir), project=project, entity=entity,
                                group=run.group, tags=run.tags, id=run.run_id, resume="allow", mode=mode,
                                config=run.config, job_type="train")
        # Lightning's log_metrics sends the step as `trainer/global_step`: W&B plots every metric against it
        experiment.define_metric("trainer/global_step")
        experiment.define_metric("*", step_metric="trainer/global_step", step_sync=True)
    return WandbLogger(name=run.name, save_dir=str(run.run_dir), project=project, id=run.run_id,
                       experiment=experiment)


def tensorboard_logger(run: LogRun) -> Any:
    """Lightning's TensorBoardLogger writing <run dir>/tensorboard (no hp_metric placeholder)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    return TensorBoardLogger(save_dir=str(run.run_dir), name="tensorboard", version="", default_hp_metric=False)


def check_logger(logger_cfg: Any) -> None:
    """The `logger` block before anything is imported but the target: ValueError naming the field and the fix."""
    target = logger_cfg.get("_target_")
    if target is None:  # logger=csv, logger=none: metrics.csv only
        return
    if not logger_cfg.get("_partial_"):
        raise ValueError(f"logger._partial_ must be true: {target} is called with the run (archsweep.core.train."
                         f"monitoring.loggers.LogRun); add `_partial_: true` to the logger's yaml")
    from archsweep.core.train.monitoring.callback_group import locate

    try:
        factory = locate(str(target))
    except ValueError as e:
        raise ValueError(f"logger._target_={target} cannot be imported ({e}); name a logger factory, e.g. "
                         f"archsweep.core.train.monitoring.loggers.wandb_logger (conf/logger/*.yaml)") from None
    if not callable(factory):
        raise ValueError(f"logger._target_={target} is not callable; name a logger factory, e.g. "
                         f"archsweep.core.train.monitoring.loggers.wandb_logger")
    if "mode" in logger_cfg:
        wandb_mode(logger_cfg["mode"])


def make_loggers(logger_cfg: dict[str, Any], run: LogRun, keep_before: int | None = None) -> list[Any]:
    """<run dir>/metrics.csv always, then the `logger` group's choice: its `_target_` called with `run` (none for
    logger=csv and logger=none, whose `_target_` is null)."""
    from hydra.utils import instantiate

    from archsweep.core.train.monitoring.metrics_csv import MetricsCSV

    loggers: list[Any] = [MetricsCSV(run.run_dir, keep_before)]
    if logger_cfg.get("_target_") is not None:
        chosen = instantiate(logger_cfg)(run)
        if chosen is not None:
            loggers.append(chosen)
    return loggers


def finish_wandb(exit_code: int = 0) -> None:
    """End the current W&B run, if any, so the next job of a sweep starts its own."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=exit_code)
