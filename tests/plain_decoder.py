"""A causal pre-norm decoder in plain torch, written from the papers' equations, for the reference tests of
test_mtp.py and test_attention_gates.py. It imports nothing from archsweep: `copy_weights` reads the model under
test's parameters by name and clones them into a dict under the reference's own names.

- embedding: Emb(t) sqrt(D) (Vaswani et al. 2017, section 3.4); the head tied to the embedding matrix, no bias;
- block: x + Attn(RMSNorm(x)), then x + FFN(RMSNorm(x)) with FFN(x) = W_2 relu(W_1 x + b_1) + b_2;
- attention: softmax(Q K^T / sqrt(Dh) + causal mask) V per head, key/value heads shared by consecutive query heads
  (grouped-query attention), rotary positions (Su et al. 2021) pairing channel i with i + Dh / 2 (GPT-NeoX's
  layout), base 10000;
- output gate (Qiu et al. 2025, "Gated Attention", position G1): Y' = Y * sigmoid(X W_theta + b) on each head's
  output Y, X the attention's input (after the norm), one score per head (headwise) or per channel (elementwise),
  before the output projection;
- multi-token prediction (DeepSeek-V3, section 2.2, equations 21-23): h'^k_i = M_k [RMSNorm(h^(k-1)_i);
  RMSNorm(Emb(t_(i+k)))], h^k = TRM_k(h'^k), logits = head(RMSNorm(h^k)), the embedding and the head shared.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

Weights = dict[str, Any]  # tensors by name; "block<i>" and each "mtp" depth a dict of their own
EPS = 1e-5


def rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * g over the last dimension."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * weight


def rotary_cos_sin(t: int, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin of the angles m theta_i at positions m = 0..t-1, theta_i = base^(-2i / Dh), each (T, Dh): the
    Dh / 2 angles twice, channel i and channel i + Dh / 2 turning together."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (Dh / 2,)
    angles = torch.arange(t, dtype=torch.float32)[:, None] * theta  # (T, Dh / 2)
    return angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)


def rotate(x: Tensor) -> Tensor:
    """x (B, H, T, Dh) rotated by its position: (x_i, x_(i + Dh/2)) -> (x_i cos - x_(i+Dh/2) sin, x_i sin + ...)."""
    cos, sin = rotary_cos_sin(x.shape[-2], x.shape[-1])
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def attention(x: Tensor, w: Weights, n_heads: int, n_kv_heads: int) -> Tensor:
    """Causal multi-head self-attention of x (B, T, D), with the output gate where `w` holds one."""
    b, t, d = x.shape
    dh = d // n_heads
    heads = lambda y, h: y.view(b, t, h, dh).transpose(1, 2)  # noqa: E731  (B, T, h Dh) -> (B, h, T, Dh)
    q = rotate(heads(F.linear(x, w["q.weight"], w["q.bias"]), n_heads))
    k = rotate(heads(F.linear(x, w["k.weight"], w["k.bias"]), n_kv_heads))
    v = heads(F.linear(x, w["v.weight"], w["v.bias"]), n_kv_heads)
    k, v = (y.repeat_interleave(n_heads // n_kv_heads, dim=1) for y in (k, v))  # query head j reads kv head j // g
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)  # (B, H, T, T)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = scores.softmax(-1) @ v  # (B, H, T, Dh): the heads' outputs, the gate's position G1
    if "gate.weight" in w:
        gate = torch.sigmoid(F.linear(x, w["gate.weight"], w["gate.bias"]))  # (B, T, H) or (B, T, H Dh)
        y = y * gate.view(b, t, n_heads, -1).transpose(1, 2)  # (B, H, T, 1 or Dh)
    return F.linear(y.transpose(1, 2).reshape(b, t, d), w["o.weight"], w["o.bias"])


def block(x: Tensor, w: Weights, n_heads: int, n_kv_heads: int) -> Tensor:
    x = x + attention(rms_norm(x, w["attn_norm"]), w, n_heads, n_kv_heads)
    h = rms_norm(x, w["ffn_norm"])
    return x + F.linear(F.relu(F.linear(h, w["up.weight"], w["up.bias"])), w["down.weight"], w["down.bias"])


def embed(tokens: Tensor, w: Weights) -> Tensor:
    return F.embedding(tokens, w["embed"]) * math.sqrt(w["embed"].shape[1])


def decoder(tokens: Tensor, w: Weights, n_heads: int, n_kv_heads: int) -> Tensor:
    """tokens (B, T) -> the final-normed hidden states (B, T, D) the next-token head reads."""
    x = embed(tokens, w)
    for i in range(w["n_layers"]):
        x = block(x, w[f"block{i}"], n_heads, n_kv_heads)
    return rms_norm(x, w["final_norm"])


def head(h: Tensor, w: Weights) -> Tensor:
    return h @ w["embed"].T  # (B, T, V), tied


def mtp_logits(tokens: Tensor, h0: Tensor, w: Weights, n_heads: int, n_kv_heads: int) -> list[Tensor]:
    """Depth k's logits at positions i = 0..T-k-2 (B, T - k - 1, V), predicting t_(i+k+1); h0 the decoder's output."""
    t, h, out = tokens.shape[1], h0, []
    for k, depth in enumerate(w["mtp"], start=1):
        n = t - k  # positions whose t_(i+k) is in the row
        joined = torch.cat([rms_norm(h[:, :n], depth["hidden_norm"]),
                            rms_norm(embed(tokens[:, k:], w), depth["embed_norm"])], dim=-1)  # (B, n, 2 D)
        h = block(joined @ depth["M"].T, depth["block"], n_heads, n_kv_heads)  # h^k (B, n, D)
        out.append(head(rms_norm(h, depth["final_norm"]), w)[:, :n - 1])
    return out


def copy_weights(model: torch.nn.Module, n_heads: int, n_kv_heads: int) -> Weights:
    """The model's parameters, cloned, under the reference's names (its fused q/k/v projection split in three)."""
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    d = state["decoder.embed.weight"].shape[1]
    dh = d // n_heads

    def block_weights(prefix: str) -> Weights:
        sizes = [n_heads * dh, n_kv_heads * dh, n_kv_heads * dh]  # the fused projection's rows: q, then k, then v
        w = {"attn_norm": state[f"{prefix}.attn_res.norm.weight"], "ffn_norm": state[f"{prefix}.ffn_res.norm.weight"]}
        for kind in ("weight", "bias"):
            w.update(zip((f"q.{kind}", f"k.{kind}", f"v.{kind}"),
                         state[f"{prefix}.self_attn.qkv_proj.{kind}"].split(sizes), strict=True))
        pairs = {"o": "self_attn.out_proj", "up": "ffn.up_proj", "down": "ffn.down_proj",
                 "gate": "self_attn.plugins.attn_gate.gate_proj"}
        for ours, theirs in pairs.items():
            for kind in ("weight", "bias"):
                if f"{prefix}.{theirs}.{kind}" in state:
                    w[f"{ours}.{kind}"] = state[f"{prefix}.{theirs}.{kind}"]
        return w

    n_layers = len({name.split(".")[2] for name in state if name.startswith("decoder.blocks.")})
    w: Weights = {"embed": state["decoder.embed.weight"], "final_norm": state["decoder.final_norm.weight"],
                  "n_layers": n_layers}
    w.update({f"block{i}": block_weights(f"decoder.blocks.{i}") for i in range(n_layers)})
    depths = len({name.split(".")[3] for name in state if name.startswith("plugins.mtp.depths.")})
    w["mtp"] = [{"hidden_norm": state[f"plugins.mtp.depths.{k}.hidden_norm.weight"],
                 "embed_norm": state[f"plugins.mtp.depths.{k}.embed_norm.weight"],
                 "M": state[f"plugins.mtp.depths.{k}.in_proj.weight"],
                 "block": block_weights(f"plugins.mtp.depths.{k}.block"),
                 "final_norm": state[f"plugins.mtp.depths.{k}.final_norm.weight"]} for k in range(depths)]
    return w
