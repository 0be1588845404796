"""AdamW with decay only on matrices (Loshchilov & Hutter 2019), Muon for the blocks' hidden matrices (`muon.py`),
and warm-up learning-rate schedules.

Schedules are multipliers of optim.lr per optimiser step: `noam` is the 2017 paper's inverse square root
(section 5.3) normalised to peak at 1 after warm-up, `cosine` decays to min_lr_ratio, `constant` holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from archsweep.core.train.muon import Muon
from archsweep.variants.blocks import Block
from archsweep.variants.embedding import TokenEmbedding

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("noam", "cosine", "constant")


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
    """ids of the weights of the linear layers inside the Transformer blocks (attention and FFN projections):
    what Muon updates. Embeddings, position tables, the output head, a ViT's patch embedding and class head, norms
    and biases are outside this set."""
    return {id(m.weight) for block in model.modules() if isinstance(block, Block)
            for m in block.modules() if isinstance(m, nn.Linear)}


def muon_param_groups(model: nn.Module, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Muon for the hidden matrices (first group, so train/lr logs Muon's rate), AdamW (at optim.adamw_lr) for the
    rest, split as `param_groups` splits it for weight decay."""
    hidden = hidden_matrices(model)
    decay, keep = param_groups(model, cfg["weight_decay"], cfg.get("decay_embeddings", False))
    groups = [{"params": [p for p in decay["params"] if id(p) in hidden], "muon": True, "lr": cfg["lr"],
               "weight_decay": cfg["weight_decay"]},
              {"params": [p for p in decay["params"] if id(p) not in hidden], "lr": cfg["adamw_lr"],
               "weight_decay": cfg["weight_decay"]},
              {"params": keep["params"], "lr": cfg["adamw_lr"], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(model: nn.Module, cfg: dict[str, Any]) -> torch.optim.Optimizer:
    if cfg["name"] not in OPTIMIZERS:
        raise ValueError(f"optim.name={cfg['name']!r} is not a known optimiser; valid: {', '.join(OPTIMIZERS)}")
    if cfg["name"] == "muon":
        return Muon(muon_param_groups(model, cfg), lr=cfg["lr"], momentum=cfg["momentum"], nesterov=cfg["nesterov"],
                    ns_steps=cfg["ns_steps"], ns_dtype=cfg["ns_dtype"], scaling=cfg["scaling"],
                    betas=tuple(cfg["betas"]), eps=cfg["eps"])
    groups = param_groups(model, cfg["weight_decay"], cfg.get("decay_embeddings", False))
    return torch.optim.AdamW(groups, lr=cfg["lr"], betas=tuple(cfg["betas"]), eps=cfg["eps"])


def lr_multiplier(cfg: dict[str, Any]) -> Callable[[int], float]:
    """step (0-based optimiser steps taken) -> factor applied to optim.lr."""
    warmup = max(int(cfg["warmup_steps"]), 0)
    name = cfg["name"]

    def warm(step: int) -> float:
        return (step + 1) / warmup if step + 1 < warmup else 1.0

    if name == "noam":
        return lambda step: min(warm(step), math.sqrt(max(warmup, 1) / (step + 1)))
    if name == "constant":
        return warm
    if name == "cosine":
        total, floor = int(cfg["total_steps"]), float(cfg["min_lr_ratio"])

        def cosine(step: int) -> float:
            if step + 1 < warmup:
                return warm(step)
            progress = min((step + 1 - warmup) / max(total - warmup, 1), 1.0)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        return cosine
    raise ValueError(f"schedule.name={name!r} is not a known schedule; valid: {', '.join(SCHEDULES)}")


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: dict[str, Any]) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg))
