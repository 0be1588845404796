"""`ViTForImageClassification` (Dosovitskiy et al. 2021), exported only."""

from __future__ import annotations

from typing import Any

from archsweep.core.model.config import ModelConfig
from archsweep.core.model.hf.base import Layout, Weights, qkv_split, stack_refusals


class ViT(Layout):
    """ViTForImageClassification (Dosovitskiy et al. 2021): patches, a class token, learned positions over them,
    pre-LayerNorm, GELU, one linear layer on the class token's final state."""

    architecture, model_type, causal, base_prefix = "ViTForImageClassification", "vit", False, "vit."
    ACTIVATIONS = {"tanh": "gelu_pytorch_tanh", "none": "gelu"}

    def refusals(self, cfg: ModelConfig) -> list[str]:
        out = [] if cfg.kind == "vit" else [f"kind={cfg.kind} (ViTForImageClassification reads images: kind=vit)"]
        out += stack_refusals(cfg)
        checks = {"norm_type": (cfg.choice("norm_type"), "layernorm"), "norm_bias": (cfg.norm_bias, True),
                  "pos": (cfg.choice("pos"), "learned"), "ffn": (cfg.choice("ffn"), "gelu"),
                  "attention": (cfg.choice("attention"), "full"), "bias": (cfg.bias, True),
                  "n_kv_heads": (cfg.kv_heads, cfg.n_heads), "pooling": (cfg.pooling, "cls"),
                  "head_hidden": (cfg.head_hidden, None)}
        out += [f"{k}={v} (ViT has {want})" for k, (v, want) in checks.items() if v != want]
        return out

    def n_tokens(self, cfg: ModelConfig) -> int:
        from archsweep.variants.patches import patch_grid

        gh, gw = patch_grid(cfg.image_size, cfg.patch_size)
        return gh * gw + 1

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        sizes = cfg.sizes()
        size = cfg.image_size if isinstance(cfg.image_size, int) else list(cfg.image_size)
        return {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
                "intermediate_size": cfg.d_ff, "hidden_act": self.ACTIVATIONS[cfg.options("ffn")["approximate"]],
                "layer_norm_eps": cfg.norm_eps, "image_size": size, "patch_size": cfg.patch_size,
                "num_channels": cfg.in_channels, "qkv_bias": True, "hidden_dropout_prob": cfg.dropout,
                "attention_probs_dropout_prob": sizes["attn_dropout"], "num_labels": cfg.n_classes}

    def model_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("a ViTForImageClassification folder is exported, not imported; model.init_from reads "
                         "GPT-2, Llama and Mistral folders")

    @staticmethod
    def pairs(cfg: ModelConfig) -> list[tuple[str, str]]:
        out = [("vit.embeddings.cls_token", "embed.cls_token"),
               ("vit.embeddings.patch_embeddings.projection.weight", "embed.proj.weight"),
               ("vit.embeddings.patch_embeddings.projection.bias", "embed.proj.bias"),
               ("vit.layernorm.weight", "encoder.final_norm.weight"), ("vit.layernorm.bias", "encoder.final_norm.bias"),
               ("classifier.weight", "classifier.weight"), ("classifier.bias", "classifier.bias")]
        for i in range(cfg.n_layers):
            h, b = f"vit.encoder.layer.{i}.", f"encoder.blocks.{i}."
            for theirs, ours in (("layernorm_before", "attn_res.norm"), ("layernorm_after", "ffn_res.norm"),
                                 ("attention.output.dense", "self_attn.out_proj"),
                                 ("intermediate.dense", "ffn.up_proj"), ("output.dense", "ffn.down_proj")):
                out += [(f"{h}{theirs}.{w}", f"{b}{ours}.{w}") for w in ("weight", "bias")]
        return out

    def to_hf(self, cfg: ModelConfig, ours: Weights) -> Weights:
        out = {t: ours[o].contiguous() for t, o in self.pairs(cfg)}
        table = ours["encoder.pos.table.weight"]  # (max_seq_len, D): the rows the image's tokens use
        out["vit.embeddings.position_embeddings"] = table[:self.n_tokens(cfg)].unsqueeze(0).contiguous()
        for i in range(cfg.n_layers):
            for w in ("weight", "bias"):
                fused = ours[f"encoder.blocks.{i}.self_attn.qkv_proj.{w}"]
                for name, part in zip(("query", "key", "value"), fused.split(qkv_split(cfg)), strict=True):
                    out[f"vit.encoder.layer.{i}.attention.attention.{name}.{w}"] = part.contiguous()
        return out

    def from_hf(self, cfg: ModelConfig, theirs: Weights) -> Weights:
        raise ValueError("ViT folders are exported, not imported")
