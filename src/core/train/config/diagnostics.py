"""Training diagnostics for ablation studies: what they measure, their settings, and the check of those settings.

The quantities are the ones behind the classic questions: per-layer gradient norms and residual-stream norms (how
norm placement shapes training; Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture"),
attention entropy and attention maps per layer and head, loss spikes and divergence, and accuracy by source length
(length generalisation of positional encodings). The Lightning side is in
`archsweep.core.train.monitoring.diagnostic_callbacks`, the drawing in `archsweep.core.eval.attention_maps`, accuracy by
length in `archsweep.core.eval.metrics` (shared by training and evaluate.py).

This module imports nothing heavy: train.py checks the `diagnostics:` block before Lightning is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DivergenceConfig:
    enabled: bool = True  # stop a diverged run and mark it `diverged` in results.json
    factor: float = 2.0  # a check is bad when the loss exceeds factor * ln(number of outputs), a uniform guess
    patience: int = 3  # consecutive bad checks that make a run diverged (a non-finite loss needs one)

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"diagnostics.divergence.factor={self.factor!r} must be a number > 1: every run starts "
                             f"near the loss of a uniform guess, ln(number of outputs), and must not count as "
                             f"diverged there")
        if self.patience < 1:
            raise ValueError(f"diagnostics.divergence.patience={self.patience!r} must be a positive number of log "
                             f"steps")


@dataclass
class DiagnosticsConfig:
    """The `diagnostics:` block of train.yaml; also its schema (archsweep.core.train.config.schemas): the types are
    checked when the config is composed, the rules below when it becomes this class."""

    every_n_steps: int = 100  # per-layer gradient and residual-stream norms; 0: off
    attention_entropy: bool = True  # at each validation, per attention module
    attention_maps: bool = True  # at each validation, <run dir>/attention/step_<step>.png (and W&B)
    spike_factor: float = 2.0  # a loss above spike_factor * its running average counts as a spike
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)

    def __post_init__(self) -> None:
        if self.every_n_steps < 0:
            raise ValueError(f"diagnostics.every_n_steps={self.every_n_steps!r} must be a number of training steps "
                             f">= 0 (0 turns gradient and residual norms off)")
        if not self.spike_factor > 1:
            raise ValueError(f"diagnostics.spike_factor={self.spike_factor!r} must be a number > 1 (a spike is a "
                             f"loss above spike_factor times its running average; 2.0 is a good start)")


def diagnostics_config(block: dict[str, Any] | None) -> DiagnosticsConfig:
    """A plain-dict `diagnostics:` block (None: defaults) -> a checked DiagnosticsConfig, through the same schema
    as train.yaml's block: a wrong type or an unknown key is refused naming it; ValueError."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DiagnosticsConfig), block or {}))
    except OmegaConfBaseException as e:
        raise ValueError(f"diagnostics.{e.full_key}: {str(e.msg).splitlines()[0]}") from None


def check_diagnostics(cfg: Any) -> DiagnosticsConfig:
    """The `diagnostics:` block of a composed train.py config (a DictConfig; a missing block means the defaults),
    checked; raises ValueError naming the field, the value and the fix."""
    from omegaconf import OmegaConf

    block = cfg.get("diagnostics")
    return diagnostics_config(OmegaConf.to_container(block, resolve=True) if block is not None else None)
