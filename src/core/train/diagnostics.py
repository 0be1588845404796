"""Training diagnostics for ablation studies: what they measure, their settings, and the check of those settings.

The quantities are the ones behind the classic questions: per-layer gradient norms and residual-stream norms (how
norm placement shapes training; Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture"),
attention entropy and attention maps per layer and head, loss spikes and divergence, and accuracy by source length
(length generalisation of positional encodings). The Lightning side is in
`archsweep.core.train.diagnostic_callbacks`, the drawing in `archsweep.core.eval.attention_maps`, accuracy by
length in `archsweep.core.eval.metrics` (shared by training and evaluate.py).

This module imports nothing heavy: train.py checks the `diagnostics:` block before Lightning is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class DivergenceConfig:
    enabled: bool = True  # stop a diverged run and mark it `diverged` in results.json
    factor: float = 2.0  # a check is bad when the loss exceeds factor * ln(number of outputs), a uniform guess
    patience: int = 3  # consecutive bad checks that make a run diverged (a non-finite loss needs one)


@dataclass(frozen=True)
class DiagnosticsConfig:
    every_n_steps: int = 100  # per-layer gradient and residual-stream norms; 0: off
    attention_entropy: bool = True  # at each validation, per attention module
    attention_maps: bool = True  # at each validation, <run dir>/attention/step_<step>.png (and W&B)
    spike_factor: float = 2.0  # a loss above spike_factor * its running average counts as a spike
    divergence: DivergenceConfig = DivergenceConfig()


def _keys(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unknown(given: dict[str, Any], cls: type, prefix: str) -> None:
    for key in given:
        if key not in _keys(cls):
            raise ValueError(f"{prefix}.{key} is not a diagnostics setting; known keys: {', '.join(_keys(cls))}")


def diagnostics_config(block: dict[str, Any] | None) -> DiagnosticsConfig:
    """The plain-dict `diagnostics:` block (None: defaults) -> a checked DiagnosticsConfig; ValueError names the
    field, the value and the fix."""
    block = dict(block or {})
    _unknown(block, DiagnosticsConfig, "diagnostics")
    div = dict(block.pop("divergence", None) or {})
    _unknown(div, DivergenceConfig, "diagnostics.divergence")
    cfg = DiagnosticsConfig(**block, divergence=DivergenceConfig(**div))
    if not _is_int(cfg.every_n_steps) or cfg.every_n_steps < 0:
        raise ValueError(f"diagnostics.every_n_steps={cfg.every_n_steps!r} must be a number of training steps >= 0 "
                         f"(0 turns gradient and residual norms off)")
    for name in ("attention_entropy", "attention_maps"):
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"diagnostics.{name}={getattr(cfg, name)!r} must be true or false")
    if not _is_number(cfg.spike_factor) or not cfg.spike_factor > 1:
        raise ValueError(f"diagnostics.spike_factor={cfg.spike_factor!r} must be a number > 1 (a spike is a loss "
                         f"above spike_factor times its running average; 2.0 is a good start)")
    d = cfg.divergence
    if not isinstance(d.enabled, bool):
        raise ValueError(f"diagnostics.divergence.enabled={d.enabled!r} must be true or false")
    if not _is_number(d.factor) or not d.factor > 1:
        raise ValueError(f"diagnostics.divergence.factor={d.factor!r} must be a number > 1: every run starts near "
                         f"the loss of a uniform guess, ln(number of outputs), and must not count as diverged there")
    if not _is_int(d.patience) or d.patience < 1:
        raise ValueError(f"diagnostics.divergence.patience={d.patience!r} must be a positive number of log steps")
    return cfg


def check_diagnostics(cfg: Any) -> DiagnosticsConfig:
    """Check the `diagnostics:` block of a composed train.py config (a DictConfig; a missing block means the
    defaults) and return it; raises ValueError naming the field, the value and the fix."""
    from omegaconf import OmegaConf

    block = cfg.get("diagnostics")
    return diagnostics_config(OmegaConf.to_container(block, resolve=True) if block is not None else None)
