"""Assemble a model from a `ModelConfig` (plain PyTorch: no lightning, hydra or wandb needed).

    from archsweep.core.model.build import ModelConfig, build_model
    model = build_model(ModelConfig(vocab_size=65))  # the 2017 paper's choices; any axis by its option name

The kind assembles itself from `Parts` (embeddings, the output head, stacks); each stack's norm placement,
positional encoding, attention kind and FFN come from their registries, built with the sizes they ask for.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn

from archsweep.core.model.config import ModelConfig
from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.layers import CrossAttention, SelfAttention
from archsweep.variants.blocks import Block, Stack
from archsweep.variants.embedding import LMHead, TokenEmbedding
from archsweep.variants.ffn import FFN
from archsweep.variants.init import init_weights
from archsweep.variants.model import KIND
from archsweep.variants.norm import NORM, make_norm
from archsweep.variants.pos import POS

__all__ = ["ModelConfig", "build_model", "count_parameters", "match_d_ff", "parameter_count"]


class Parts:
    """The factories a model kind assembles itself from (see `archsweep.variants.model.base.Parts`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.sizes = cfg.sizes()

    def embedding(self, vocab_size: int) -> TokenEmbedding:
        return TokenEmbedding(vocab_size, self.cfg.d_model, self.cfg.scale_embedding)

    def head(self, embedding: TokenEmbedding) -> LMHead:
        cfg = self.cfg
        return LMHead(cfg.d_model, cfg.vocab_size, cfg.output_bias, embedding if cfg.tie_embeddings else None,
                      cfg.logit_softcap)

    def stack(self, role: str, embedding: TokenEmbedding, n_layers: int, causal: bool, cross: bool) -> Stack:
        cfg, sizes = self.cfg, self.sizes
        norm = functools.partial(make_norm, cfg.norm_type, cfg.d_model, cfg.norm_eps, cfg.norm_bias)
        context: dict[str, Any] = {**sizes, "causal": causal, "role": role, "make_norm": norm}
        attn_args = (cfg.d_model, cfg.n_heads, cfg.kv_heads, sizes["attn_dropout"], cfg.bias)
        qk_norm = functools.partial(make_norm, cfg.qk_norm, eps=cfg.norm_eps, bias=cfg.norm_bias) \
            if cfg.qk_norm is not None else None  # called with head_dim
        blocks = [
            Block(
                SelfAttention(*attn_args, layer=i, kernel=ATTENTION.build(cfg.attention, {**context, "layer": i}),
                              qk_norm=qk_norm, value_residual=cfg.value_residual,
                              value_lambda=cfg.value_residual_lambda),
                FFN.build(cfg.ffn, context),
                functools.partial(NORM.build, cfg.norm, context),
                CrossAttention(*attn_args, layer=i, qk_norm=qk_norm, softcap=cfg.attn_softcap) if cross else None,
            )
            for i in range(n_layers)
        ]
        final_norm = norm() if cfg.variant("norm").final_norm else None
        stack = Stack(embedding, POS.build(cfg.pos, context), blocks, final_norm, causal, sizes["emb_dropout"],
                      cfg.attn_softcap)
        stack.checkpointing = cfg.activation_checkpointing
        return stack


def build_model(cfg: ModelConfig) -> nn.Module:
    """Validate `cfg` and build the model it describes, initialised by `cfg.init`. The model keeps `cfg` as
    `model.config`."""
    cfg.validate()
    model = KIND.get(cfg.kind).assemble(Parts(cfg))
    init_weights(model, cfg.init, cfg.n_layers)
    for module in model.modules():
        if isinstance(module, Block):
            module.after_init()
    model.config = cfg
    return model


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Parameters counted once even when shared (tied embeddings)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def parameter_count(cfg: ModelConfig) -> int:
    """Trainable parameters of the model `cfg` describes, built on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        return count_parameters(build_model(cfg))


def match_d_ff(cfg: ModelConfig, target: int) -> tuple[ModelConfig, int]:
    """The config with the d_ff (>= 1) whose model comes closest to `target` parameters, and that count.

    The count is affine in d_ff for ReLU/GELU FFNs and nearly so for gated ones (hidden = round(2 d_ff / 3)), so
    two probes give the slope and a few neighbours of the estimate settle the rounding.
    """
    if not isinstance(target, int) or isinstance(target, bool) or target < 1:
        raise ValueError(f"match_params={target!r} must be a positive parameter count, model fields naming a "
                         f"reference model (e.g. {{ffn: relu}}), or null to turn it off")
    cfg.validate()
    if not cfg.variant("ffn").follows_d_ff(cfg.options("ffn")):
        fixed = {k: v for k, v in cfg.options("ffn").items() if v is not None}
        raise ValueError(f"match_params adjusts d_ff, but ffn={cfg.choice('ffn')} fixes its hidden size ({fixed}); "
                         f"set those model.ffn options to null so it follows d_ff")
    with_d_ff = lambda d_ff: dataclasses.replace(cfg, d_ff=d_ff)
    base, slope = parameter_count(with_d_ff(3)), (parameter_count(with_d_ff(303)) - parameter_count(with_d_ff(3))) / 300
    if target < base - 3 * slope:
        raise ValueError(f"match_params={target:,} is below the {base - 3 * slope:,.0f} parameters this model has "
                         f"without its FFNs; raise match_params or shrink d_model / n_layers")
    guess = max(1, round(3 + (target - base) / slope))
    counts = {d: parameter_count(with_d_ff(d)) for d in range(max(1, guess - 2), guess + 3)}
    best = min(counts, key=lambda d: (abs(counts[d] - target), d))
    return with_d_ff(best), counts[best]
