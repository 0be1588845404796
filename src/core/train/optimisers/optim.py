"""AdamW with decay only on matrices (Loshchilov & Hutter 2019), Muon for the blocks' hidden matrices (`muon.py`),
and warm-up learning-rate schedules.

The `optim` and `schedule` config groups choose these by `_target_` (with `_partial_: true`: the model, or the
optimiser, is given at build time): `adamw` and `muon` build optimisers, `noam`, `cosine`, `constant` and `wsd`
schedules, which are multipliers of optim.lr per optimiser step. `noam` is the 2017 paper's inverse square root
(section 5.3) normalised to peak at 1 after warm-up, `cosine` decays to min_lr_ratio, `constant` holds, `wsd` holds
and then decays over the last decay_fraction of the steps (`wsd.py`). The schemas of both groups, which check
the settings before torch is imported, are in `schemas.py`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from archsweep.core.model.build import parameter_widths, parametrisation
from archsweep.core.train.config.wsd import decay_start, decayed
from archsweep.core.train.optimisers.muon import Muon, update_scale
from archsweep.variants.blocks import Block
from archsweep.variants.embedding import TokenEmbedding
from archsweep.variants.hooks import weight_matrices


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict[str, Any]]:
    """Two groups: weight matrices (decayed) and norms, biases and embeddings/position tables (not decayed; with
    `decay_embeddings`, as some recipes do, the tables are decayed too). A tied output projection shares the
    embedding Parameter, so it follows the embedding."""
    no_decay = set() if decay_embeddings else {id(p) for m in model.modules()
                                               if isinstance(m, (nn.Embedding, TokenEmbedding))
                                               for p in m.parameters(recurse=False)}
    decay, keep = [], []
    for p in model.parameters():  # each shared Parameter once
        if not p.requires_grad:
            continue
        (keep if p.ndim < 2 or id(p) in no_decay else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def hidden_matrices(model: nn.Module) -> set[int]:
    """ids of the weight matrices inside the Transformer blocks (attention and FFN projections, and the matrices a
    module declares with `weight_matrices()`, e.g. stacked experts): what Muon updates. Embeddings, position
    tables, the output head, a ViT's patch embedding and class head, norms and biases are outside this set."""
    return {id(p) for block in model.modules() if isinstance(block, Block) for p in weight_matrices(block)}


def muon_param_groups(model: nn.Module, lr: float, adamw_lr: float, weight_decay: float,
                      decay_embeddings: bool = False) -> list[dict[str, Any]]:
    """Muon for the hidden matrices (first group, so train/lr logs Muon's rate), AdamW (at adamw_lr) for the rest,
    split as `param_groups` splits it for weight decay."""
    hidden = hidden_matrices(model)
    decay, keep = param_groups(model, weight_decay, decay_embeddings)
    groups = [{"params": [p for p in decay["params"] if id(p) in hidden], "muon": True, "lr": lr,
               "weight_decay": weight_decay},
              {"params": [p for p in decay["params"] if id(p) not in hidden], "lr": adamw_lr,
               "weight_decay": weight_decay},
              {"params": keep["params"], "lr": adamw_lr, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def lr_scales(model: nn.Module, muon_ids: frozenset[int] = frozenset(), scaling: str = "reference"
              ) -> dict[int, float]:
    """{id(parameter): factor on its group's learning rate} under the model's parametrisation (`model.param`); empty
    under the standard one. Adam-type updates take the parametrisation's `adam_lr`; Muon's (`muon_ids`) its
    `spectral_lr`, divided by the change in Muon's own shape factor (`update_scale`) from the base shape, so the
    orthogonalised update's spectral norm is what the parametrisation asks for."""
    widths = parameter_widths(model)
    if not widths:
        return {}
    param = parametrisation(model.config)
    scales = {}
    for name, (role, width) in widths.items():
        p = model.get_parameter(name)
        if id(p) in muon_ids:
            rows, cols = p.shape[-2], p.shape[-1]
            own = update_scale(rows / width.fan_out, cols / width.fan_in, scaling) / update_scale(rows, cols, scaling)
            scales[id(p)] = param.spectral_lr(role, width) * own
        else:
            scales[id(p)] = param.adam_lr(role, width)
    return scales


def scale_groups(groups: list[dict[str, Any]], scales: dict[int, float], lr: float) -> list[dict[str, Any]]:
    """Each group split by its parameters' learning-rate factors (`lr_scales`), in first-seen order, with `lr` (the
    group's own, else `lr`) times the factor and the factor as `lr_scale`; unchanged when `scales` is empty."""
    if not scales:
        return groups
    out = []
    for group in groups:
        by_scale: dict[float, list[nn.Parameter]] = {}
        for p in group["params"]:
            by_scale.setdefault(scales.get(id(p), 1.0), []).append(p)
        out += [{**group, "params": params, "lr": group.get("lr", lr) * scale, "lr_scale": scale}
                for scale, params in by_scale.items()]
    return out


def adamw(model: nn.Module, lr: float, betas: list[float], eps: float, weight_decay: float,
          decay_embeddings: bool = False) -> torch.optim.AdamW:
    """optim=adamw."""
    groups = scale_groups(param_groups(model, weight_decay, decay_embeddings), lr_scales(model), lr)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps)


def muon(model: nn.Module, lr: float, momentum: float, nesterov: bool, ns_steps: int, ns_dtype: str, scaling: str,
         weight_decay: float, adamw_lr: float, betas: list[float], eps: float, decay_embeddings: bool = False) -> Muon:
    """optim=muon."""
    groups = muon_param_groups(model, lr, adamw_lr, weight_decay, decay_embeddings)
    muon_ids = frozenset(id(p) for g in groups if g.get("muon") for p in g["params"])
    groups = scale_groups(groups, lr_scales(model, muon_ids, scaling), lr)
    return Muon(groups, lr=lr, momentum=momentum,
                nesterov=nesterov, ns_steps=ns_steps, ns_dtype=ns_dtype, scaling=scaling, betas=tuple(betas), eps=eps)


def make_optimizer(model: nn.Module, cfg: dict[str, Any]) -> torch.optim.Optimizer:
    """The `optim` group (a resolved dict): its `_target_` builds the optimiser of `model`; `name` is the option's
    label (W&B tags, results.json), not an argument."""
    return instantiate({k: v for k, v in cfg.items() if k != "name"})(model)


def warm(step: int, warmup_steps: int) -> float:
    """Linear warm-up: the factor at `step` (0-based optimiser steps taken), 1 once warm."""
    return (step + 1) / warmup_steps if step + 1 < warmup_steps else 1.0


def noam(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """schedule=noam: warm-up, then 1/sqrt(step) normalised to 1 at the end of the warm-up."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(warm(step, warmup_steps), math.sqrt(max(warmup_steps, 1) / (step + 1))))


def constant(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """schedule=constant: warm-up, then optim.lr."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warm(step, warmup_steps))


def cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
           min_lr_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    """schedule=cosine: warm-up, then a cosine from 1 to min_lr_ratio at total_steps, held after."""

    def factor(step: int) -> float:
        if step + 1 < warmup_steps:
            return warm(step, warmup_steps)
        progress = min((step + 1 - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def wsd_factor(step: int, warmup_steps: int, total_steps: int, decay_fraction: float, decay_shape: str,
               min_lr_ratio: float) -> float:
    """The warmup-stable-decay factor for optimiser step `step` (0-based): the warm-up, 1, then from the decay's
    start the shape's fall to min_lr_ratio, reached at the last step (as `cosine` reaches its floor)."""
    start = decay_start(total_steps, decay_fraction)
    if step < start:
        return warm(step, warmup_steps)
    progress = min((step + 1 - start) / (total_steps - start), 1.0)
    return min_lr_ratio + (1 - min_lr_ratio) * decayed(progress, decay_shape)


def wsd(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, decay_fraction: float,
        decay_shape: str, min_lr_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    """schedule=wsd: warm-up, constant, then a decay of `decay_shape` over the last `decay_fraction` of
    total_steps (Hägele et al. 2024)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: wsd_factor(
        step, warmup_steps, total_steps, decay_fraction, decay_shape, min_lr_ratio))


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: dict[str, Any]) -> torch.optim.lr_scheduler.LRScheduler:
    """The `schedule` group (a resolved dict): its `_target_` builds the scheduler of `optimizer`; `name` and
    `branches` (budget branches: fit.py's, see branches.py) are not its arguments."""
    return instantiate({k: v for k, v in cfg.items() if k not in ("name", "branches")})(optimizer)
