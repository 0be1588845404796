"""`GPT2LMHeadModel` (Radford et al. 2019): learned positions, pre-LayerNorm, GELU, Conv1D weights stored (in, out)."""

from __future__ import annotations

from typing import Any

from archsweep.core.model.config import ModelConfig
from archsweep.core.model.hf.base import Layout, Weights, common_refusals


class GPT2(Layout):
    architecture, model_type, base_prefix = "GPT2LMHeadModel", "gpt2", "transformer."
    ACTIVATIONS = {"tanh": "gelu_new", "none": "gelu"}

    def refusals(self, cfg: ModelConfig) -> list[str]:
        out = common_refusals(cfg)
        checks = {"norm_type": (cfg.choice("norm_type"), "layernorm"), "norm_bias": (cfg.norm_bias, True),
                  "pos": (cfg.choice("pos"), "learned"), "ffn": (cfg.choice("ffn"), "gelu"),
                  "attention": (cfg.choice("attention"), "full"), "bias": (cfg.bias, True),
                  "tie_embeddings": (cfg.tie_embeddings, True), "n_kv_heads": (cfg.kv_heads, cfg.n_heads)}
        out += [f"{k}={v} (GPT-2 has {want})" for k, (v, want) in checks.items() if v != want]
        return out

    def hf_config(self, cfg: ModelConfig) -> dict[str, Any]:
        sizes = cfg.sizes()
        return {"vocab_size": cfg.vocab_size, "n_positions": cfg.max_seq_len, "n_embd": cfg.d_model,
                "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": cfg.d_ff,
                "activation_function": self.ACTIVATIONS[cfg.options("ffn")["approximate"]],
                "layer_norm_epsilon": cfg.norm_eps, "resid_pdrop": cfg.dropout, "embd_pdrop": sizes["emb_dropout"],
                "attn_pdrop": sizes["attn_dropout"], "tie_word_embeddings": True}

    def model_fields(self, hf: dict[str, Any]) -> dict[str, Any]:
        approximate = {v: k for k, v in self.ACTIVATIONS.items()}
        act = hf.get("activation_function", "gelu_new")
        if act not in approximate:
            raise ValueError(f"activation_function={act!r} has no archsweep ffn; GPT-2 layouts with "
                             f"{' or '.join(approximate)} are read")
        d_model = hf["n_embd"]
        return {"kind": "decoder_only", "vocab_size": hf["vocab_size"], "d_model": d_model,
                "n_heads": hf["n_head"], "n_layers": hf["n_layer"], "d_ff": hf.get("n_inner") or 4 * d_model,
                "max_seq_len": hf["n_positions"], "norm": "pre", "norm_type": "layernorm", "norm_bias": True,
                "norm_eps": hf.get("layer_norm_epsilon", 1e-5), "pos": "learned",
                "ffn": {"name": "gelu", "approximate": approximate[act]}, "attention": "full", "bias": True,
                "scale_embedding": False, "tie_embeddings": True, "output_bias": False}

    @staticmethod
    def pairs(cfg: ModelConfig) -> list[tuple[str, str, bool]]:
        """(their name, our name, transposed: GPT-2's Conv1D stores (in, out))."""
        out = [("transformer.wte.weight", "decoder.embed.weight", False),
               ("transformer.wpe.weight", "decoder.pos.table.weight", False),
               ("transformer.ln_f.weight", "decoder.final_norm.weight", False),
               ("transformer.ln_f.bias", "decoder.final_norm.bias", False)]
        for i in range(cfg.n_layers):
            h, b = f"transformer.h.{i}.", f"decoder.blocks.{i}."
            for theirs, ours, conv in (("ln_1", "attn_res.norm", False), ("ln_2", "ffn_res.norm", False),
                                       ("attn.c_attn", "self_attn.qkv_proj", True),
                                       ("attn.c_proj", "self_attn.out_proj", True), ("mlp.c_fc", "ffn.up_proj", True),
                                       ("mlp.c_proj", "ffn.down_proj", True)):
                out += [(f"{h}{theirs}.weight", f"{b}{ours}.weight", conv), (f"{h}{theirs}.bias", f"{b}{ours}.bias",
                                                                             False)]
        return out

    def to_hf(self, cfg: ModelConfig, ours: Weights) -> Weights:
        return {t: (ours[o].T if conv else ours[o]).contiguous() for t, o, conv in self.pairs(cfg)}

    def from_hf(self, cfg: ModelConfig, theirs: Weights) -> Weights:
        out = {o: (theirs[t].T if conv else theirs[t]).contiguous() for t, o, conv in self.pairs(cfg)}
        out["head.weight"] = out["decoder.embed.weight"]
        return out
