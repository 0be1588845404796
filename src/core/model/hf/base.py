"""The shape of a layout, and the options no layout here has a place for."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from archsweep.core.model.config import ModelConfig

Weights = dict[str, Tensor]


def stack_refusals(cfg: ModelConfig) -> list[str]:
    """Options no layout here has a place for, whatever the class: a placement other than pre-norm, and every
    plug-in that declares no Hugging Face equivalent (`hf`: None; a training-only one, e.g. a z-loss, is dropped)."""
    out = []
    if cfg.choice("norm") != "pre":
        out.append(f"norm={cfg.choice('norm')} (pre-norm only)")
    for name, options in cfg.plugins.items():
        if cfg.plugin(name).hf is None:
            shown = ", ".join(f"{k}={v}" for k, v in options.items() if k != "_target_")
            out.append(f"{name} ({shown or 'on'}: no Hugging Face equivalent; set {name}=none)")
    return out


def common_refusals(cfg: ModelConfig) -> list[str]:
    """Options no causal LM class of `transformers` has (the same for every causal layout here)."""
    out = []
    if cfg.kind != "decoder_only":
        out.append(f"kind={cfg.kind} (the causal LM classes read one sequence: kind=decoder_only)")
    out += stack_refusals(cfg)
    if cfg.scale_embedding:
        out.append("scale_embedding=true (set model.scale_embedding=false)")
    if cfg.output_bias:
        out.append("output_bias=true (set model.output_bias=false)")
    return out


def fold_parametrisation(cfg: ModelConfig, ours: Weights) -> tuple[ModelConfig, Weights]:
    """The standard-parametrisation model that computes what `cfg` (any `model.param`) computes, and its weights:
    a width-transferring parametrisation's forward constants (`param/base.py`: ForwardScales) folded into weights,
    so a layout with no place for them exports the same logits. The score factor multiplies the query rows of
    every fused self-attention projection (rotary is linear, so rotating the scaled queries is the same), or a
    QK-norm's query gain where one normalises them first; a tied head's logit factor becomes an untied head (the
    embedding times the factor). The embedding factor needs scale_embedding, which the layouts refuse anyway."""
    from archsweep.core.model.build import base_config, forward_scales

    if base_config(cfg) is None:
        return cfg, ours
    scales = forward_scales(cfg)
    out, rows = dict(ours), cfg.n_heads * cfg.head_dim
    if scales.scores != 1.0:
        for key, value in ours.items():
            stem, _, kind = key.rpartition(".")
            if stem.endswith("self_attn.qkv_proj"):
                norm = stem.removesuffix("qkv_proj") + "plugins.qk_norm.q_norm"
                if f"{norm}.weight" in ours:  # the queries are normalised after the projection: scale the gain
                    continue
                out[key] = value.clone()
                out[key][:rows] *= scales.scores
            elif stem.endswith("plugins.qk_norm.q_norm"):
                out[key] = value * scales.scores
    if scales.logits != 1.0 and cfg.tie_embeddings:
        embed = next(k for k in ("decoder.embed.weight", "encoder.embed.weight") if k in ours)
        out["head.weight"] = ours[embed] * scales.logits
    return folded_config(cfg), out


def folded_config(cfg: ModelConfig) -> ModelConfig:
    """The standard-parametrisation config `fold_parametrisation` exports `cfg` as (an untied head where a tied
    one has a logit factor); `cfg` itself under the standard parametrisation."""
    from archsweep.core.model.build import base_config, forward_scales

    if base_config(cfg) is None:
        return cfg
    tied = cfg.tie_embeddings and forward_scales(cfg).logits == 1.0
    return dataclasses.replace(cfg, param="sp", tie_embeddings=tied).validate()


def qkv_split(cfg: ModelConfig) -> list[int]:
    """Rows of our fused qkv_proj: queries, keys, values."""
    return [cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim]


class Layout:
    """One `transformers` architecture (its `architectures` name in config.json)."""

    architecture: str
    model_type: str
    causal = True  # a language model (generation config, tokenizer); False: an image classifier
    base_prefix = "model."  # the base model's weights; some published folders store them without it

    def refusals(self, cfg: ModelConfig) -> list[str]:
        raise NotImplementedError

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        raise NotImplementedError

    def model_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        """The ModelConfig fields a config.json of this layout sets."""
        raise NotImplementedError

    def to_hf(self, cfg: ModelConfig, ours: Weights) -> Weights:
        raise NotImplementedError

    def from_hf(self, cfg: ModelConfig, theirs: Weights) -> Weights:
        raise NotImplementedError
