"""One train.py job: check the config without heavy imports, train, and record the outcome.

Everything a user can get wrong is checked here first (model fields, task/model compatibility, optimiser,
schedule, logger, trainer settings, the checkpoint to resume), so a refused config answers in well under a
second. Lightning, torchmetrics and wandb are imported only once the config is known to be good.
"""

from __future__ import annotations

import json
import logging
import math
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from src.core.checkpoint import resolve_ckpt_path
from src.core.config import DecodingConfig, ModelConfig
from src.core.loggers import LOGGERS, finish_wandb, wandb_mode
from src.core.runinfo import RunInfo, run_info
from src.core.sweep import append_summary
from src.core.tasks.base import Task

log = logging.getLogger("train")

OPTIMIZERS = ("adamw",)
SCHEDULES = ("noam", "cosine", "constant")
PRECISIONS = ("32-true", "32", 32, "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "64", 64,
              "transformer-engine", "transformer-engine-float16")


class ConfigError(ValueError):
    """A configuration that cannot work; raised before training starts."""


@dataclass
class Setup:
    model_cfg: ModelConfig
    task: Task
    ckpt_path: Path | None


def build_task(cfg: DictConfig) -> Task:
    try:
        task = instantiate(cfg.task)
    except Exception as e:  # Hydra wraps the constructor's TypeError/ValueError
        raise ConfigError(f"task: {e.__cause__ or e}") from None
    if not isinstance(task, Task):
        raise ConfigError(f"task._target_={cfg.task._target_} does not build a src.core.tasks.Task")
    return task


def model_config(cfg: DictConfig, task: Task) -> ModelConfig:
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    for key, value in task.model_fields().items():
        if fields.get(key) is None:
            fields[key] = value
    try:
        model_cfg = ModelConfig.from_dict(fields)
        task.check_model(model_cfg)
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None
    with open_dict(cfg):  # the resolved config records what was actually built
        for key in task.model_fields():
            cfg.model[key] = getattr(model_cfg, key)
    return model_cfg


def check_training(cfg: DictConfig) -> None:
    def fail(msg: str) -> None:
        raise ConfigError(msg)

    if cfg.optim.name not in OPTIMIZERS:
        fail(f"optim.name={cfg.optim.name!r} is not a known optimiser; valid options: {', '.join(OPTIMIZERS)}")
    if not cfg.optim.lr > 0:
        fail(f"optim.lr={cfg.optim.lr} must be positive")
    if cfg.schedule.name not in SCHEDULES:
        fail(f"schedule.name={cfg.schedule.name!r} is not a known schedule; valid options: {', '.join(SCHEDULES)}")
    if cfg.schedule.warmup_steps < 0:
        fail(f"schedule.warmup_steps={cfg.schedule.warmup_steps} must be >= 0")
    if cfg.schedule.name == "cosine" and cfg.schedule.total_steps <= cfg.schedule.warmup_steps:
        fail(f"schedule.total_steps={cfg.schedule.total_steps} must exceed schedule.warmup_steps="
             f"{cfg.schedule.warmup_steps} for the cosine schedule")
    if not 0.0 <= cfg.label_smoothing < 1.0:
        fail(f"label_smoothing={cfg.label_smoothing} must be in [0, 1)")
    if cfg.logger.name not in LOGGERS:
        fail(f"logger.name={cfg.logger.name!r} is not a known logger; valid options: {', '.join(LOGGERS)}")
    if cfg.logger.name == "wandb":
        try:
            wandb_mode(cfg.logger.mode)
        except ValueError as e:
            fail(str(e))
    trainer = cfg.trainer
    if not isinstance(trainer.max_steps, int) or trainer.max_steps < 1:
        fail(f"trainer.max_steps={trainer.max_steps} must be a positive integer (the training stream is endless)")
    if trainer.precision not in PRECISIONS:
        fail(f"trainer.precision={trainer.precision!r} is not a known precision; common options: 32-true, "
             f"bf16-mixed, 16-mixed")
    try:
        DecodingConfig.from_dict(OmegaConf.to_container(cfg.decoding, resolve=True))
    except ValueError as e:
        fail(str(e))
    if not isinstance(cfg.eval.decode_samples, int) or cfg.eval.decode_samples < 0:
        fail(f"eval.decode_samples={cfg.eval.decode_samples!r} must be a number of examples >= 0 (0: no decoding)")
    interval = trainer.get("val_check_interval")
    if not isinstance(interval, int) or interval < 1:
        fail(f"trainer.val_check_interval={interval!r} must be a positive number of training batches")


def prepare(cfg: DictConfig, info: RunInfo) -> Setup:
    task = build_task(cfg)
    model_cfg = model_config(cfg, task)
    check_training(cfg)
    ckpt = None
    if cfg.ckpt_path is not None:
        try:
            ckpt = resolve_ckpt_path(str(cfg.ckpt_path), cfg.output_root, info.overrides)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return Setup(model_cfg, task, ckpt)


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def record_failure(info: RunInfo, error: BaseException) -> dict[str, Any]:
    info.run_dir.mkdir(parents=True, exist_ok=True)
    (info.run_dir / "error.txt").write_text("".join(traceback.format_exception(error)))
    results = {"status": "failed", "error": f"{type(error).__name__}: {error}", "run_dir": str(info.run_dir),
               "name": info.name, "choices": info.choices, "overrides": info.overrides}
    write_json(info.run_dir / "results.json", results)
    return results


def run_job(cfg: DictConfig, start_time: float) -> float:
    """Train one configuration. Returns the final validation loss (NaN for a failed job in a sweep, which is
    recorded and does not stop the other jobs)."""
    info = run_info(cfg)
    try:
        setup = prepare(cfg, info)
        from src.core.fit import train  # heavy imports (lightning, torchmetrics, wandb) from here on

        results = train(cfg, setup, info, start_time)
    except Exception as error:
        finish_wandb(exit_code=1)
        results = record_failure(info, error)
        if info.multirun:
            append_summary(info, results)
            log.error(f"job {info.job_num} ({info.name}) failed: {results['error']} (details: "
                      f"{info.run_dir / 'error.txt'})")
            return math.nan
        if isinstance(error, ConfigError):
            raise SystemExit(f"error: {error}") from None
        raise
    if info.multirun and results:
        append_summary(info, results)
    return results["val"]["loss"] if results else math.nan
