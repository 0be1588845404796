"""`mla`: multi-head latent attention (DeepSeek-V2, Liu et al. 2024, arXiv 2405.04434, section 2.1): keys and values
are decompressed from one small latent per token, so the decoding cache keeps that latent instead of every head's
keys and values.

Per token x: the latent c = RMSNorm(x W_dkv) (kv_lora_rank wide) and one rotary key k_R = RoPE(x W_kr)
(qk_rope_head_dim wide) shared by all heads; per head, keys [c W_uk ; k_R] and values c W_uv. Queries come from x,
or from their own normalised latent (q_lora_rank > 0), as [q_nope ; RoPE(q_rope)]. The positional encoding rotates
only the qk_rope_head_dim channels (the "decoupled" rotary part); scores are scaled by 1/sqrt(qk_nope + qk_rope).
Sizes left null follow DeepSeek-V3's ratios to the head size Dh = d_model / n_heads: nope = v = Dh, rope = Dh / 2,
kv_lora_rank = 4 Dh. The cache keeps [c ; k_R]: kv_lora_rank + qk_rope_head_dim numbers per token and layer.
Layout of the weights as Hugging Face's DeepseekV3Attention with `rope_interleave=False`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.base import AttentionKernel, AttnContext, attend, mean_keys
from archsweep.variants.pos.base import PositionalEncoding
from archsweep.variants.pos.rotary import Rotary
from archsweep.variants.roles import HIDDEN_OUT

SIZES = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def resolve(head_dim: int, options: Mapping[str, Any]) -> dict[str, int]:
    """The sizes with nulls replaced by DeepSeek-V3's ratios to Dh (q_lora_rank null or 0: no query latent)."""
    ratio = {"q_lora_rank": 0, "kv_lora_rank": 4 * head_dim, "qk_nope_head_dim": head_dim,
             "qk_rope_head_dim": max(2, head_dim // 2 // 2 * 2), "v_head_dim": head_dim}
    return {name: ratio[name] if options[name] is None else options[name] for name in SIZES}


@ATTENTION.register("mla")
class LatentAttention(AttentionKernel):
    projects = True

    def __init__(self, d_model: int, n_heads: int, head_dim: int, bias: bool, norm_eps: float, layer: int,
                 q_lora_rank: int | None = None, kv_lora_rank: int | None = None, qk_nope_head_dim: int | None = None,
                 qk_rope_head_dim: int | None = None, v_head_dim: int | None = None) -> None:
        super().__init__()
        s = resolve(head_dim, {"q_lora_rank": q_lora_rank, "kv_lora_rank": kv_lora_rank, "v_head_dim": v_head_dim,
                               "qk_nope_head_dim": qk_nope_head_dim, "qk_rope_head_dim": qk_rope_head_dim})
        self.layer, self.n_heads = layer, n_heads
        self.nope, self.rope, self.v_dim, self.rank = (s["qk_nope_head_dim"], s["qk_rope_head_dim"], s["v_head_dim"],
                                                       s["kv_lora_rank"])
        qk = n_heads * (self.nope + self.rope)
        if s["q_lora_rank"]:
            self.q_proj = nn.Sequential(nn.Linear(d_model, s["q_lora_rank"], bias=bias),  # down, norm, up
                                        nn.RMSNorm(s["q_lora_rank"], eps=norm_eps),
                                        nn.Linear(s["q_lora_rank"], qk, bias=False))
        else:
            self.q_proj = nn.Linear(d_model, qk, bias=False)
        self.kv_down_proj = nn.Linear(d_model, self.rank + self.rope, bias=bias)  # latent and the rotary key
        self.kv_norm = nn.RMSNorm(self.rank, eps=norm_eps)
        self.kv_up_proj = nn.Linear(self.rank, n_heads * (self.nope + self.v_dim), bias=False)
        self.out_proj = nn.Linear(n_heads * self.v_dim, d_model, bias=bias)
        self.cache_width = self.rank + self.rope  # numbers the cache keeps per token
        self.label = (f"latent attention (Q, K: {self.nope} + {self.rope} rotary, V: {self.v_dim} per head; cache "
                      f"{self.rank} + {self.rope} per token)")

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        for name in SIZES:
            value, least = options[name], 0 if name == "q_lora_rank" else 1
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                raise ValueError(f"attention.{name}={value!r} must be an integer >= {least}, or null for DeepSeek-V3's "
                                 f"ratio to the head size")
        rope = resolve(sizes["head_dim"], options)["qk_rope_head_dim"]
        if rope % 2:
            raise ValueError(f"attention.qk_rope_head_dim={rope} must be even (rotary turns channel pairs)")
        if sizes["n_kv_heads"] != sizes["n_heads"]:
            raise ValueError(f"n_kv_heads={sizes['n_kv_heads']} does not apply to attention=mla: every head's keys and "
                             f"values come from one shared latent; leave n_kv_heads null")

    @classmethod
    def rotary_dim(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> int:
        return resolve(sizes["head_dim"], options)["qk_rope_head_dim"]

    @classmethod
    def pos_refusal(cls, pos: type, pos_options: Mapping[str, Any]) -> str | None:
        if pos.content_bias is not PositionalEncoding.content_bias:
            return ("its score term multiplies per-head queries and keys of d_model / n_heads channels with position "
                    "embeddings, while latent attention's keys are decompressed from a shared latent and split into "
                    "rotary and non-rotary parts")
        if pos.rotates() and pos.rotate_qk is not Rotary.rotate_qk:
            return ("it changes the magnitude of queries and keys with their positions, which would act on the "
                    "rotary channels only (DeepSeek's decoupled RoPE is a pure rotation)")
        if pos.rotates() and pos_options.get("scaling") == "yarn":
            return ("YaRN's attention temperature would scale only the qk_rope_head_dim rotary channels (DeepSeek "
                    "scales the whole softmax by mscale^2 instead); use scaling=none, linear or ntk")
        return None

    def project_attend(self, x: Tensor, ctx: AttnContext, dropout: float, record: list[Tensor] | None) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.nope + self.rope).transpose(1, 2)  # (B, H, T, nope + rope)
        q_nope, q_rot = q.split([self.nope, self.rope], dim=-1)
        latent, k_rot = self.kv_down_proj(x).split([self.rank, self.rope], dim=-1)  # (B, T, rank), (B, T, rope)
        q_rot, k_rot = ctx.rotate_qk(q_rot, k_rot.unsqueeze(1), ctx.positions)  # k_rot: (B, 1, T, rope)
        cached = torch.cat([self.kv_norm(latent).unsqueeze(1), k_rot], dim=-1)  # (B, 1, T, rank + rope)
        if ctx.cache is not None:
            cached = ctx.cache.append_latent(self.layer, cached)  # (B, 1, Tk, rank + rope)
        latent, k_rot = cached.squeeze(1).split([self.rank, self.rope], dim=-1)  # (B, Tk, rank), (B, Tk, rope)
        n_keys = latent.shape[1]
        kv = self.kv_up_proj(latent).view(b, n_keys, self.n_heads, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)  # (B, H, Tk, nope), (B, H, Tk, v)
        k = torch.cat([k_nope, k_rot.unsqueeze(1).expand(-1, self.n_heads, -1, -1)], dim=-1)  # (B, H, Tk, nope + rope)
        q = torch.cat([q_nope, q_rot], dim=-1)
        mask, is_causal = ctx.layer_mask(q, k, self.layer)
        y = attend(q, k, v, mask, is_causal, dropout, record, ctx.score_mod, ctx.sink)  # (B, H, T, v)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.v_dim))

    def roles(self) -> dict[str, str]:
        return {"out_proj.weight": HIDDEN_OUT}

    def value_output_weights(self) -> list[Tensor]:
        """The matrices that make values and the output (DeepNorm scales them): the latent's value rows, out_proj."""
        up = self.kv_up_proj.weight.view(self.n_heads, self.nope + self.v_dim, self.rank)  # (H, nope + v, rank)
        return [up[:, self.nope:], self.out_proj.weight]

    def flops_per_token(self, seq_len: int, causal: bool, n_heads: int, head_dim: int) -> float:
        """Its projections per token (the latent's up-projection once per key, as trained without a cache) and the
        core: 2 (nope + rope) H per key for the scores and 2 v H per key for the values."""
        projections = sum(2.0 * m.in_features * m.out_features for m in self.modules() if isinstance(m, nn.Linear))
        core = 2.0 * self.n_heads * (self.nope + self.rope + self.v_dim)
        return projections + core * mean_keys(seq_len, causal, None)
