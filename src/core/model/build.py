"""Assemble a model from a `ModelConfig` (plain PyTorch: no lightning, hydra or wandb needed).

    from archsweep.core.model.build import ModelConfig, build_model
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=65, norm="pre", pos="rotary"))
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from archsweep.core.model.config import ModelConfig
from archsweep.variants.attention import CrossAttention, SelfAttention
from archsweep.variants.blocks import Block, Stack
from archsweep.variants.embedding import LMHead, TokenEmbedding
from archsweep.variants.ffn import make_ffn
from archsweep.variants.init import deepnorm_constants, init_weights, scale_for_deepnorm
from archsweep.variants.model import DecoderOnly, EncoderDecoder, EncoderOnly
from archsweep.variants.norm import make_norm
from archsweep.variants.pos import ALiBi, LearnedPosition, NoPosition, PositionalEncoding, RelativeBias, Rotary, Sinusoidal
from archsweep.variants.residual import PLACEMENTS, DeepNorm, Residual

__all__ = ["ModelConfig", "build_model", "count_parameters", "match_d_ff", "parameter_count"]


def make_pos(cfg: ModelConfig, causal: bool) -> PositionalEncoding:
    if cfg.pos == "sinusoidal":
        return Sinusoidal(cfg.d_model)
    if cfg.pos == "learned":
        return LearnedPosition(cfg.max_seq_len, cfg.d_model)
    if cfg.pos == "relative":
        return RelativeBias(cfg.n_heads, bidirectional=not causal, num_buckets=cfg.rel_num_buckets,
                            max_distance=cfg.rel_max_distance)
    if cfg.pos == "rotary":
        return Rotary(cfg.head_dim, cfg.rope_base)
    if cfg.pos == "alibi":
        return ALiBi(cfg.n_heads)
    return NoPosition()


def make_residual(cfg: ModelConfig, alpha: float) -> Residual:
    norm = functools.partial(make_norm, cfg.norm_type, cfg.d_model, cfg.norm_eps)
    if cfg.norm == "deepnorm":
        return DeepNorm(norm, cfg.dropout, alpha)
    return PLACEMENTS[cfg.norm](norm, cfg.dropout)


def make_stack(cfg: ModelConfig, embed: TokenEmbedding, n_layers: int, causal: bool, cross: bool,
               alpha: float) -> Stack:
    attn_dropout = cfg.attn_dropout if cfg.attn_dropout is not None else cfg.dropout
    emb_dropout = cfg.emb_dropout if cfg.emb_dropout is not None else cfg.dropout
    attn_args = (cfg.d_model, cfg.n_heads, cfg.kv_heads, attn_dropout, cfg.bias)
    blocks = [
        Block(
            SelfAttention(*attn_args, layer=i),
            make_ffn(cfg.ffn, cfg.d_model, cfg.d_ff, cfg.dropout, cfg.bias, cfg.gelu_approximate, cfg.gated_d_ff),
            functools.partial(make_residual, cfg, alpha),
            CrossAttention(*attn_args, layer=i) if cross else None,
        )
        for i in range(n_layers)
    ]
    final_norm = make_norm(cfg.norm_type, cfg.d_model, cfg.norm_eps) if PLACEMENTS[cfg.norm].final_norm else None
    stack = Stack(embed, make_pos(cfg, causal), blocks, final_norm, causal, emb_dropout)
    stack.checkpointing = cfg.activation_checkpointing
    return stack


def build_model(cfg: ModelConfig) -> nn.Module:
    """Validate `cfg` and build the model it describes, initialised by `cfg.init`. The model keeps `cfg` as
    `model.config`."""
    cfg.validate()
    deepnorm = deepnorm_constants(cfg.kind, cfg.n_layers, cfg.decoder_layers)
    alpha = {name: a if cfg.norm == "deepnorm" else 1.0 for name, (a, _) in deepnorm.items()}
    tgt_embed = TokenEmbedding(cfg.vocab_size, cfg.d_model, cfg.scale_embedding)
    head = LMHead(cfg.d_model, cfg.vocab_size, cfg.output_bias, tgt_embed if cfg.tie_embeddings else None)
    stacks: dict[str, Stack]
    if cfg.kind == "encoder_decoder":
        src_embed = tgt_embed if cfg.share_src_tgt_embeddings else TokenEmbedding(
            cfg.src_vocab_size or cfg.vocab_size, cfg.d_model, cfg.scale_embedding)
        stacks = {
            "encoder": make_stack(cfg, src_embed, cfg.n_layers, False, False, alpha["encoder"]),
            "decoder": make_stack(cfg, tgt_embed, cfg.decoder_layers, True, True, alpha["decoder"]),
        }
        model: nn.Module = EncoderDecoder(stacks["encoder"], stacks["decoder"], head)
    elif cfg.kind == "decoder_only":
        stacks = {"stack": make_stack(cfg, tgt_embed, cfg.n_layers, True, False, alpha["stack"])}
        model = DecoderOnly(stacks["stack"], head)
    else:
        stacks = {"stack": make_stack(cfg, tgt_embed, cfg.n_layers, False, False, alpha["stack"])}
        model = EncoderOnly(stacks["stack"], head, cfg.d_model, cfg.n_classes, cfg.pooling)
    init_weights(model, cfg.init, cfg.n_layers)
    if cfg.norm == "deepnorm":
        for name, stack in stacks.items():
            scale_for_deepnorm(stack, deepnorm[name][1])
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
    if cfg.ffn in ("swiglu", "geglu") and cfg.gated_d_ff is not None:
        raise ValueError(f"match_params adjusts d_ff, but ffn={cfg.ffn} uses gated_d_ff={cfg.gated_d_ff}; "
                         f"set model.gated_d_ff=null so it follows d_ff")
    with_d_ff = lambda d_ff: dataclasses.replace(cfg, d_ff=d_ff)
    base, slope = parameter_count(with_d_ff(3)), (parameter_count(with_d_ff(303)) - parameter_count(with_d_ff(3))) / 300
    if target < base - 3 * slope:
        raise ValueError(f"match_params={target:,} is below the {base - 3 * slope:,.0f} parameters this model has "
                         f"without its FFNs; raise match_params or shrink d_model / n_layers")
    guess = max(1, round(3 + (target - base) / slope))
    counts = {d: parameter_count(with_d_ff(d)) for d in range(max(1, guess - 2), guess + 3)}
    best = min(counts, key=lambda d: (abs(counts[d] - target), d))
    return with_d_ff(best), counts[best]
