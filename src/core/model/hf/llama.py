"""`LlamaForCausalLM` (Touvron et al. 2023) and `MistralForCausalLM` (Jiang et al. 2023): pre-RMSNorm, rotary,
SwiGLU, grouped-query heads; Mistral windows every layer's attention."""

from __future__ import annotations

from typing import Any

import torch

from archsweep.core.model.config import ModelConfig
from archsweep.core.model.hf.base import Layout, Weights, common_refusals, qkv_split


class Llama(Layout):
    """Llama: pre RMSNorm, rotary (rotate-half, as ours), SwiGLU, grouped-query heads; `attention_bias` and
    `mlp_bias` stand for our one `bias`."""

    architecture, model_type = "LlamaForCausalLM", "llama"
    attention = "full"

    def refusals(self, cfg: ModelConfig) -> list[str]:
        out = common_refusals(cfg)
        checks = {"norm_type": (cfg.choice("norm_type"), "rmsnorm"), "pos": (cfg.choice("pos"), "rotary"),
                  "ffn": (cfg.choice("ffn"), "swiglu"), "attention": (cfg.choice("attention"), self.attention)}
        out += [f"{k}={v} ({self.architecture} has {want})" for k, (v, want) in checks.items() if v != want]
        if cfg.choice("pos") == "rotary" and cfg.options("pos")["scaling"] == "yarn":
            out.append("pos.scaling=yarn (Hugging Face's YaRN ramps frequencies by rounded dimension indices, ours by "
                       "turns: not the same logits)")
        return out

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        sizes, rope = cfg.sizes(), cfg.options("pos")
        theta, scaling = rope["base"], None
        if rope["scaling"] == "ntk":  # a static change of base: plain RoPE with the changed base
            theta = theta * rope["factor"] ** (cfg.head_dim / (cfg.head_dim - 2))
        elif rope["scaling"] == "linear" and rope["factor"] != 1:
            scaling = {"rope_type": "linear", "factor": rope["factor"]}
        return {"vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": self.hidden(cfg),
                "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
                "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
                "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, "rope_theta": theta,
                "rope_scaling": scaling, "attention_bias": cfg.bias, "mlp_bias": cfg.bias,
                "attention_dropout": sizes["attn_dropout"], "tie_word_embeddings": cfg.tie_embeddings}

    @staticmethod
    def hidden(cfg: ModelConfig) -> int:
        from archsweep.variants.ffn.base import gated_hidden_size

        gated = cfg.options("ffn").get("gated_d_ff")
        return gated if gated is not None else gated_hidden_size(cfg.d_ff)

    def model_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "linear"):
            raise ValueError(f"rope_scaling rope_type={kind!r} has no exact archsweep equivalent; default and "
                             f"linear are read")
        theta = hf.get("rope_theta", scaling.get("rope_theta", 10000.0))
        pos = {"name": "rotary", "base": float(theta), "scaling": "linear" if kind == "linear" else "none",
               "factor": float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0}
        bias = bool(hf.get("attention_bias", False))
        if bool(hf.get("mlp_bias", bias)) != bias:
            raise ValueError(f"attention_bias={bias} but mlp_bias={hf.get('mlp_bias')}: archsweep has one `bias` "
                             f"for both")
        d_model, heads = hf["hidden_size"], hf["num_attention_heads"]
        if hf.get("head_dim") not in (None, d_model // heads):
            raise ValueError(f"head_dim={hf['head_dim']} is not hidden_size/num_attention_heads = {d_model}/{heads}: "
                             f"archsweep derives head_dim from d_model and n_heads")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={hf['hidden_act']!r}: archsweep's swiglu uses silu")
        return {"kind": "decoder_only", "vocab_size": hf["vocab_size"], "d_model": d_model, "n_heads": heads,
                "n_kv_heads": hf.get("num_key_value_heads") or heads, "n_layers": hf["num_hidden_layers"],
                "d_ff": hf["intermediate_size"], "max_seq_len": hf.get("max_position_embeddings", 2048),
                "norm": "pre", "norm_type": "rmsnorm", "norm_eps": hf.get("rms_norm_eps", 1e-6), "pos": pos,
                "ffn": {"name": "swiglu", "gated_d_ff": hf["intermediate_size"]}, "attention": self.attention_of(hf),
                "bias": bias, "scale_embedding": False, "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
                "output_bias": False}

    def attention_of(self, hf: dict[str, Any]) -> str | dict[str, Any]:
        return "full"

    @staticmethod
    def names(cfg: ModelConfig) -> list[tuple[str, str]]:
        """(their name, our name) of the weights stored alike (the fused qkv aside)."""
        out = [("model.embed_tokens.weight", "decoder.embed.weight"),
               ("model.norm.weight", "decoder.final_norm.weight")]
        if not cfg.tie_embeddings:
            out.append(("lm_head.weight", "head.weight"))
        kinds = ["weight", "bias"] if cfg.bias else ["weight"]
        for i in range(cfg.n_layers):
            h, b = f"model.layers.{i}.", f"decoder.blocks.{i}."
            out += [(f"{h}input_layernorm.weight", f"{b}attn_res.norm.weight"),
                    (f"{h}post_attention_layernorm.weight", f"{b}ffn_res.norm.weight")]
            out += [(f"{h}self_attn.o_proj.{w}", f"{b}self_attn.out_proj.{w}") for w in kinds]
            out += [(f"{h}mlp.{p}.{w}", f"{b}ffn.{p}.{w}") for p in ("gate_proj", "up_proj", "down_proj")
                    for w in kinds]
        return out

    def to_hf(self, cfg: ModelConfig, ours: Weights) -> Weights:
        out = {t: ours[o].contiguous() for t, o in self.names(cfg)}
        for i in range(cfg.n_layers):
            for w in ["weight", "bias"] if cfg.bias else ["weight"]:
                fused = ours[f"decoder.blocks.{i}.self_attn.qkv_proj.{w}"]
                for name, part in zip("qkv", fused.split(qkv_split(cfg)), strict=True):
                    out[f"model.layers.{i}.self_attn.{name}_proj.{w}"] = part.contiguous()
        return out

    def from_hf(self, cfg: ModelConfig, theirs: Weights) -> Weights:
        out = {o: theirs[t] for t, o in self.names(cfg)}
        if cfg.tie_embeddings:
            out["head.weight"] = out["decoder.embed.weight"]
        for i in range(cfg.n_layers):
            for w in ["weight", "bias"] if cfg.bias else ["weight"]:
                parts = [theirs[f"model.layers.{i}.self_attn.{n}_proj.{w}"] for n in "qkv"]
                out[f"decoder.blocks.{i}.self_attn.qkv_proj.{w}"] = torch.cat(parts)
        return out


class Mistral(Llama):
    """Llama with every layer's attention over a sliding window (`sliding_window` keys, itself included)."""

    architecture, model_type = "MistralForCausalLM", "mistral"
    attention = "sliding_window"

    def refusals(self, cfg: ModelConfig) -> list[str]:
        out = super().refusals(cfg)
        if cfg.bias:
            out.append("bias=true (Mistral has no biases; set model.bias=false)")
        if cfg.choice("attention") == "sliding_window" and set(cfg.options("attention")["layer_pattern"]) != {"L"}:
            out.append(f"attention.layer_pattern={cfg.options('attention')['layer_pattern']} (Mistral's layers are "
                       f"all windowed: L)")
        return out

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        out = super().hf_config(cfg)
        del out["attention_bias"], out["mlp_bias"]
        return {**out, "sliding_window": cfg.options("attention")["window"]}

    def attention_of(self, hf: dict[str, Any]) -> str | dict[str, Any]:
        window = hf.get("sliding_window")
        return "full" if window is None else {"name": "sliding_window", "window": window}
