"""`moe`: a mixture of experts in place of the FFN (Shazeer et al. 2017; Switch, Fedus et al. 2021; Mixtral, Jiang
et al. 2024; DeepSeek-V3, 2024): a router sends each token to `top_k` of `n_experts` FFNs of the family's shape
(SwiGLU by default, as the dense FFN it replaces) and sums their outputs by the router's weights, plus `n_shared`
experts every token uses. More parameters at the same FLOPs per token.

Routing is dropless (tokens sorted by expert, one grouped matmul per matrix: `experts.py`) unless
`capacity_factor` caps each expert at capacity_factor x N top_k / E token slots in a training forward (later slots
are dropped, counted). Balancing: Switch/GShard's loss `moe_balance` = E sum_e f_e P_e (f_e: share of the token
slots routed to e, P_e: mean router probability of e; 1 when balanced), weighted by `balance_weight`; and/or
DeepSeek-V3's loss-free bias update: after each optimiser step, `route_bias` += bias_update_rate x sign(mean load -
load of e); the bias changes which experts are chosen, never their weights. `router_z` (ST-MoE, Zoph et al. 2022)
= mean logsumexp(router logits)^2, weighted by `router_z_weight`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import FeedForward, FFNBase, GatedFeedForward
from archsweep.variants.ffn.experts import Experts
from archsweep.variants.flops import Shape, forward_flops
from archsweep.variants.hooks import AuxLoss
from archsweep.variants.roles import ROUTER

SCORES = ("softmax", "sigmoid")


@FFN.register("moe")
class MoE(FFNBase):
    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool, n_experts: int = 8, top_k: int = 2,
                 n_shared: int = 0, expert: str = "swiglu", expert_d_ff: int | None = None, score: str = "softmax",
                 normalize_weights: bool = True, route_scale: float = 1.0, balance_weight: float = 0.01,
                 bias_update_rate: float = 0.0, router_z_weight: float = 0.001,
                 capacity_factor: float | None = None) -> None:
        super().__init__()
        self.check({}, {"n_experts": n_experts, "top_k": top_k, "n_shared": n_shared, "expert": expert,
                        "expert_d_ff": expert_d_ff, "score": score, "capacity_factor": capacity_factor})
        one = FFN.build(expert, {"d_model": d_model, "d_ff": d_ff, "dropout": dropout, "bias": bias})
        hidden = expert_d_ff if expert_d_ff is not None else one.hidden_size
        gated = isinstance(one, GatedFeedForward)
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = Experts(n_experts, d_model, hidden, one.activation, gated, dropout, bias)
        shape = GatedFeedForward if gated else FeedForward
        self.shared = shape(d_model, n_shared * hidden, one.activation, dropout, bias) if n_shared else None
        self.register_buffer("route_bias", torch.zeros(n_experts))  # (E,) DeepSeek-V3's correction bias
        self.n_experts, self.top_k, self.score, self.normalize, self.scale = n_experts, top_k, score, \
            normalize_weights, route_scale
        self.balance_weight, self.rate, self.z_weight, self.capacity_factor = balance_weight, bias_update_rate, \
            router_z_weight, capacity_factor
        self.hidden_size, self.p = hidden, dropout
        self.losses: dict[str, AuxLoss] = {}  # of the last training forward
        self.load: Tensor | None = None  # (E,) token slots per expert, summed over the step's training forwards
        self.dropped: Tensor | None = None
        self.forwards = 0

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        n, k, cf = options["n_experts"], options["top_k"], options["capacity_factor"]
        if n < 1:
            raise ValueError(f"ffn=moe: n_experts={n} must be at least 1")
        if not 1 <= k <= n:
            raise ValueError(f"ffn=moe: top_k={k} must be between 1 and n_experts={n}; lower top_k or raise "
                             f"n_experts")
        if options["n_shared"] < 0:
            raise ValueError(f"ffn=moe: n_shared={options['n_shared']} must be 0 or more shared experts")
        if cf is not None and cf <= 0:
            raise ValueError(f"ffn=moe: capacity_factor={cf} must be positive (e.g. 1.25), or null for dropless "
                             f"routing")
        if options["score"] not in SCORES:
            raise ValueError(f"ffn=moe: score={options['score']!r} is not a known router score; valid: "
                             f"{', '.join(SCORES)}")
        if options["expert_d_ff"] is not None and options["expert_d_ff"] < 1:
            raise ValueError(f"ffn=moe: expert_d_ff={options['expert_d_ff']} must be positive, or null for the "
                             f"expert's own size from d_ff")
        shapes = [name for name in FFN.names() if issubclass(FFN.get(name), (FeedForward, GatedFeedForward))]
        if options["expert"] not in shapes:
            raise ValueError(f"ffn=moe: expert={options['expert']!r} cannot be an expert (an expert is an FFN of "
                             f"the family's plain or gated shape); valid: {', '.join(shapes)}")

    @classmethod
    def follows_d_ff(cls, options: Mapping[str, Any]) -> bool:
        return options.get("expert_d_ff") is None

    def roles(self) -> dict[str, str]:
        return {"router.weight": ROUTER}

    def forward(self, x: Tensor) -> Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (N, D)
        logits = self.router(tokens).float()  # (N, E)
        scores = logits.softmax(-1) if self.score == "softmax" else logits.sigmoid()
        chosen = (scores + self.route_bias).topk(self.top_k, dim=-1).indices  # (N, k): the bias only selects
        weights = scores.gather(-1, chosen)  # (N, k)
        if self.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        expert = chosen.flatten()  # (N k,) slot i is token i // k
        order = expert.argsort(stable=True)
        counts = torch.bincount(expert, minlength=self.n_experts)  # (E,)
        recording = self.training and torch.is_grad_enabled()
        kept = counts
        if recording and self.capacity_factor is not None:
            order, kept = self._within_capacity(order, expert, counts)
        if recording:
            self._record(logits, scores, counts, counts - kept)
        token = order // self.top_k
        routed = self.experts(tokens[token], kept)  # (M, D), M slots sorted by expert
        routed = routed * (self.scale * weights.flatten()[order]).unsqueeze(-1).to(routed.dtype)
        out = torch.zeros_like(tokens, dtype=routed.dtype).index_add_(0, token, routed).to(x.dtype)
        out = out.reshape(x.shape)
        return out if self.shared is None else out + self.shared(x)

    def _within_capacity(self, order: Tensor, expert: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        """The sorted slots each expert keeps (its first `capacity`, in token order) and the kept counts (E,)."""
        capacity = math.ceil(self.capacity_factor * expert.numel() / self.n_experts)
        starts = counts.cumsum(0) - counts  # (E,) first sorted position of each expert
        rank = torch.arange(order.numel(), device=order.device) - starts[expert[order]]  # place within its expert
        return order[rank < capacity], counts.clamp(max=capacity)

    @torch.no_grad()
    def _count(self, counts: Tensor, dropped: Tensor) -> None:
        self.load = counts.float() if self.load is None else self.load + counts
        self.dropped = dropped.float() if self.dropped is None else self.dropped + dropped
        self.forwards += 1

    def _record(self, logits: Tensor, scores: Tensor, counts: Tensor, dropped: Tensor) -> None:
        self._count(counts, dropped)
        self.losses = {}
        if self.balance_weight:
            share = counts.float() / counts.sum()  # (E,) f_e
            probs = scores if self.score == "softmax" else scores / scores.sum(-1, keepdim=True)
            self.losses["moe_balance"] = AuxLoss(self.balance_weight, self.n_experts * (share * probs.mean(0)).sum())
        if self.z_weight:
            self.losses["router_z"] = AuxLoss(self.z_weight, logits.logsumexp(-1).square().mean())

    def aux_losses(self, labelled: Tensor) -> dict[str, AuxLoss]:
        losses, self.losses = self.losses, {}
        return losses

    def diagnostics(self, where: str) -> dict[str, Tensor]:
        """Expert load of this step's training forwards (a recomputed forward counts again, and so does the mean's
        divisor): token slots per expert and forward, their coefficient of variation, dropped slots per forward."""
        if self.load is None:
            return {}
        load = self.load / self.forwards
        out = {f"moe/{where}/tokens/{e}": n for e, n in enumerate(load)}
        out[f"moe/{where}/cv"] = load.std(correction=0) / load.mean().clamp(min=1e-9)
        if self.capacity_factor is not None:
            out[f"moe/{where}/dropped"] = self.dropped.sum() / self.forwards
        return out

    @torch.no_grad()
    def step_update(self) -> None:
        """After the step's last backward: DeepSeek-V3's bias update from the step's load (summed over ranks)."""
        if self.load is not None and self.rate:
            load = self.load.clone()
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(load)
            self.route_bias += self.rate * torch.sign(load.mean() - load)
        self.load, self.dropped, self.forwards = None, None, 0

    def active_params(self) -> int:
        total = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return total - (self.n_experts - self.top_k) * self.experts.expert_params()

    def flops(self, shape: Shape) -> float:
        used = self.n_experts if shape.total else self.top_k
        routed = shape.tokens * (2.0 * self.router.in_features * self.n_experts + used * self.experts.expert_flops())
        return routed + (forward_flops(self.shared, shape) if self.shared is not None else 0.0)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, top_k={self.top_k}, score={self.score}, "
                f"capacity_factor={self.capacity_factor}")
