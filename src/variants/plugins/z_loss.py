"""`z_loss` (PaLM, Chowdhery et al. 2022, section 5): an auxiliary loss, the mean over labelled positions of
log(Z)^2, Z the output softmax's normaliser; it keeps log Z near 0. Added to the training step's loss with `weight`
(PaLM: 1e-4) through the `aux_losses` hook and logged as `train/aux/z_loss`; the logits are unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from archsweep.variants.hooks import AuxLoss
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import OutputPlugin


@PLUGIN.register("z_loss")
class ZLoss(OutputPlugin):
    hf = "none"  # training only: the exported logits are the same without it
    label = "z-loss"

    def __init__(self, weight: float = 1e-4) -> None:
        super().__init__()
        self.weight = weight
        self.log_z: Tensor | None = None  # (...) of the last training forward

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if not options["weight"] >= 0:
            raise ValueError(f"z_loss: weight={options['weight']!r} must be >= 0 (PaLM: 1e-4); z_loss=none turns "
                             f"it off")

    def observe_logits(self, logits: Tensor) -> None:
        if self.weight and self.training and torch.is_grad_enabled():
            self.log_z = logits.float().logsumexp(dim=-1)  # (B, T) or (B,)

    def aux_losses(self, labelled: Tensor) -> dict[str, AuxLoss]:
        log_z, self.log_z = self.log_z, None
        if log_z is None:
            return {}
        if log_z.numel() != labelled.numel():
            raise ValueError(f"z_loss: the output has {log_z.numel()} positions but the labels {labelled.numel()}; "
                             f"the logits and labels of a step must align")
        real = labelled.reshape(log_z.shape)
        return {"z_loss": AuxLoss(self.weight, (log_z.square() * real).sum() / real.sum().clamp(min=1))}

    def extra_repr(self) -> str:
        return f"weight={self.weight}"
