"""What job.py hands fit.py: one checked setup of a train.py job, and the error a config that cannot work raises.

job.py builds a `Setup` once, before the heavy imports; fit.py only reads it, so nothing is validated twice.
Light (no torch, Lightning or wandb).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archsweep.core.data.tasks.base import Task
from archsweep.core.model.config import DecodingConfig, ModelConfig
from archsweep.core.train.config.diagnostics import DiagnosticsConfig


class ConfigError(ValueError):
    """A configuration that cannot work; raised before training starts."""


@dataclass
class Budget:
    """budget.flops or budget.tokens as job.py turned it into trainer.max_steps (whole optimiser steps)."""

    unit: str  # "flops" or "tokens"
    requested: float  # what the budget asked for
    per_step: float  # what one optimiser step costs, by the same count
    max_steps: int  # the steps it gives: at least one, the nearest whole number

    def record(self, steps: int) -> dict[str, Any]:
        """results.json's `budget`: the request, the cost of a step, and what the `steps` trained spent."""
        spent = steps * self.per_step
        return {"unit": self.unit, "requested": self.requested, "per_step": self.per_step,
                "max_steps": self.max_steps, "steps": steps, "spent": spent,
                "spent_vs_requested": spent / self.requested - 1}


@dataclass
class Setup:
    model_cfg: ModelConfig  # task fields filled in, match_params applied
    task: Task
    ckpt_path: Path | None  # the checkpoint to resume from (a file)
    decoding: DecodingConfig  # the `decoding` group: how validation decodes
    diagnostics: DiagnosticsConfig  # the `diagnostics:` block
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)  # `callbacks` group: key -> entry with a
    # `_target_` naming a Lightning Callback, for hydra.utils.instantiate
    resume: dict[str, Any] | None = None  # the checkpoint's `archsweep` entry, checked against model_cfg
    resume_step: int | None = None  # the checkpoint's global step (metrics.csv keeps the rows logged before it)
    budget: Budget | None = None  # budget.flops / budget.tokens, when one set trainer.max_steps
    hf_init: str | None = None  # model.init_from: a Hugging Face folder whose weights (and tokenizer) start the run
