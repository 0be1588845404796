"""The shape of a layout, and the options no layout here has a place for."""

from __future__ import annotations

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
