"""Hugging Face `transformers` layouts: which configurations have an exact equivalent there, their `config.json`,
and the weights moved between our names and theirs, both ways (export: `archsweep.core.eval.export`; import:
train.py `model.init_from=<folder>`). No `transformers` import: the layouts are written from their documented
`config.json` fields and weight names (GPT-2: Radford et al. 2019; Llama: Touvron et al. 2023; Mistral: Jiang et
al. 2023), so exporting needs only `safetensors`.

Each layout says, for a `ModelConfig`, every option it has no place for (`refusals`); a configuration is exported
as the first layout with none, else refused naming them. Options that change no logits at inference (dropout,
init, z_loss, activation checkpointing) carry over or are dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from archsweep.core.model.config import AXES, ModelConfig

Weights = dict[str, Tensor]


def stack_refusals(cfg: ModelConfig) -> list[str]:
    """Options no layout here has a place for, whatever the class."""
    out = []
    if cfg.choice("norm") != "pre":
        out.append(f"norm={cfg.choice('norm')} (pre-norm only)")
    for name in ("qk_norm", "attn_softcap", "logit_softcap", "value_residual"):
        if getattr(cfg, name) is not None:
            out.append(f"{name}={getattr(cfg, name)}")
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
        out.append("output_bias=true")
    if cfg.mtp:
        out.append(f"mtp={cfg.mtp} (the prediction modules have no place)")
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


class GPT2(Layout):
    architecture, model_type, base_prefix = "GPT2LMHeadModel", "gpt2", "transformer."
    ACTIVATIONS = {"tanh": "gelu_new", "none": "gelu"}

    def refusals(self, cfg: ModelConfig) -> list[str]:
        out = common_refusals(cfg)
        checks = {"norm_type": (cfg.norm_type, "layernorm"), "norm_bias": (cfg.norm_bias, True),
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


class Llama(Layout):
    """Llama: pre RMSNorm, rotary (rotate-half, as ours), SwiGLU, grouped-query heads; `attention_bias` and
    `mlp_bias` stand for our one `bias`."""

    architecture, model_type = "LlamaForCausalLM", "llama"
    attention = "full"

    def refusals(self, cfg: ModelConfig) -> list[str]:
        out = common_refusals(cfg)
        checks = {"norm_type": (cfg.norm_type, "rmsnorm"), "pos": (cfg.choice("pos"), "rotary"),
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


class ViT(Layout):
    """ViTForImageClassification (Dosovitskiy et al. 2021): patches, a class token, learned positions over them,
    pre-LayerNorm, GELU, one linear layer on the class token's final state."""

    architecture, model_type, causal, base_prefix = "ViTForImageClassification", "vit", False, "vit."
    ACTIVATIONS = {"tanh": "gelu_pytorch_tanh", "none": "gelu"}

    def refusals(self, cfg: ModelConfig) -> list[str]:
        out = [] if cfg.kind == "vit" else [f"kind={cfg.kind} (ViTForImageClassification reads images: kind=vit)"]
        out += stack_refusals(cfg)
        checks = {"norm_type": (cfg.norm_type, "layernorm"), "norm_bias": (cfg.norm_bias, True),
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


LAYOUTS: dict[str, Layout] = {x.architecture: x for x in (GPT2(), Llama(), Mistral(), ViT())}


def layout_for(cfg: ModelConfig) -> Layout:
    """The first layout with a place for every option of `cfg`; a ValueError naming, for the closest ones, each
    option that has none."""
    refused = {name: layout.refusals(cfg) for name, layout in LAYOUTS.items()}
    fitting = [name for name, reasons in refused.items() if not reasons]
    if fitting:
        return LAYOUTS[fitting[0]]
    fewest = min(len(r) for r in refused.values())
    closest = "; ".join(f"as {name}: {', '.join(r)}" for name, r in refused.items() if len(r) == fewest)
    raise ValueError(f"this model has no exact Hugging Face equivalent ({closest}); nothing was written. "
                     f"Exported are {', '.join(LAYOUTS)} configurations")


def layout_of(hf: dict[str, Any], where: str) -> Layout:
    """The layout a config.json names in `architectures`."""
    names = hf.get("architectures") or []
    found = [LAYOUTS[n] for n in names if n in LAYOUTS]
    if not found:
        raise ValueError(f"{where}: architectures={names} is none of the layouts archsweep reads "
                         f"({', '.join(LAYOUTS)})")
    return found[0]


# -- import: a Hugging Face folder as the start of a run (train.py model.init_from=<folder>) ------------------------

# fields whose value adds or shapes no weight: the run may set them otherwise than the folder's config.json (an
# ablation on top of published weights, e.g. another rotary scaling); the other fields come from the folder
WEIGHT_FREE = ("dropout", "attn_dropout", "emb_dropout", "init", "activation_checkpointing", "z_loss", "norm_eps",
               "max_seq_len", "attention", "attn_softcap", "logit_softcap")
OPTIONS_FREE = ("pos", "attention")  # axes whose options (not the choice) may differ: pos.scaling=linear


def read_folder(folder: str | Path) -> tuple[Layout, dict[str, Any]]:
    """The layout and config.json of a Hugging Face model folder; ValueError naming what is missing."""
    folder = Path(folder)
    where = f"model.init_from={folder}"
    if not folder.is_dir():
        raise ValueError(f"{where}: not a folder; give a Hugging Face model folder (config.json and "
                         f"model.safetensors)")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{where}: no config.json; give a Hugging Face model folder")
    hf = json.loads((folder / "config.json").read_text())
    layout = layout_of(hf, where)
    weight_files(folder)
    return layout, hf


def weight_files(folder: Path) -> list[Path]:
    """model.safetensors, or the shards its index names; ValueError when there are none."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ValueError(f"model.init_from={folder}: the index names {', '.join(missing[:3])}, which are not "
                             f"there; copy the whole folder")
        return [folder / n for n in names]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    others = sorted(p.name for p in folder.glob("*.bin"))
    found = f" (found {', '.join(others[:3])}: convert it to safetensors)" if others else ""
    raise ValueError(f"model.init_from={folder}: no weights (model.safetensors or model.safetensors.index.json)"
                     f"{found}; nothing is loaded from pickle files")


def import_fields(composed: dict[str, Any], hf_fields: dict[str, Any], overridden: set[str]) -> dict[str, Any]:
    """The model fields of a run starting from a folder: the folder's (`hf_fields`), except what the run set itself
    (`overridden`: keys given on the command line, as `n_layers`, `pos`, `pos.scaling`) to a weight-free value.
    A weight-bearing field the run sets otherwise than the folder is refused, naming both values."""
    fields = {**composed, **hf_fields}
    clashes = []
    for path in sorted(overridden):
        top, _, sub = path.partition(".")
        if top not in composed:
            continue
        if top in AXES and sub:
            theirs, ours = AXES[top].spec(fields[top]), AXES[top].spec(composed[top])
            if top in OPTIONS_FREE and theirs["name"] == ours["name"]:
                fields[top] = {**theirs, sub: ours[sub]}
            elif theirs.get(sub) != ours.get(sub):
                clashes.append(f"{path}={ours.get(sub)} (the folder's: {theirs.get(sub)})")
            continue
        if top in WEIGHT_FREE or top not in hf_fields:
            fields[top] = composed[top]
            continue
        theirs, ours = hf_fields[top], composed[top]
        if top in AXES:
            theirs, ours = AXES[top].spec(theirs)["name"], AXES[top].spec(ours)["name"]
        if theirs != ours:
            clashes.append(f"{top}={ours} (the folder's config.json: {theirs})")
    if clashes:
        raise ValueError(f"the run's options contradict the model it starts from: {', '.join(clashes)}; leave them "
                         f"unset (they come from the folder) or start from other weights")
    return fields


def load_folder_weights(model, folder: str | Path) -> None:
    """Load a folder's weights into `model`, built from `import_fields`; ValueError naming what does not fit."""
    from safetensors.torch import load_file

    folder = Path(folder)
    layout, _ = read_folder(folder)
    theirs: Weights = {}
    for path in weight_files(folder):
        theirs.update(load_file(str(path)))
    if not any(k.startswith(layout.base_prefix) for k in theirs):  # e.g. the original gpt2 folder: h.0.attn...
        theirs = {k if k.startswith("lm_head.") else layout.base_prefix + k: v for k, v in theirs.items()}
    cfg = model.config
    try:
        ours = layout.from_hf(cfg, theirs)
    except KeyError as e:
        raise ValueError(f"model.init_from={folder}: the weights lack {e.args[0]} that a {layout.architecture} of "
                         f"this config.json has; the folder is incomplete or of another layout") from None
    own = model.state_dict()
    missing = sorted(set(own) - set(ours))
    shapes = [f"{k} {tuple(ours[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(set(own) & set(ours))
              if ours[k].shape != own[k].shape]
    if missing or shapes:
        found = "; ".join(p for p in (f"the run's model also has {', '.join(missing[:4])}" if missing else "",
                                      f"shapes differ: {'; '.join(shapes[:4])}" if shapes else "") if p)
        raise ValueError(f"model.init_from={folder}: the weights do not fit the run's model ({found}); options "
                         f"that add weights (qk_norm, mtp, ...) cannot be added to imported weights")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in ours.items()})
