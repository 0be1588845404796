"""Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks", kellerjordan.github.io):
SGD with Nesterov momentum whose update, for a 2-D weight, is orthogonalised by a quintic Newton-Schulz iteration
(the update's singular values are pushed towards 1), so every direction of the matrix moves by a similar amount.
It is meant for the hidden matrices only; embeddings, the output head, norms and biases (every 1-D parameter) take
AdamW, as in the reference. Plain PyTorch (the option names come from the light config schema).

One optimiser holds both kinds of group (`muon: True` or False), so the learning-rate schedule, gradient clipping
and checkpoints treat it as one. Under DDP the gradients are all-reduced before `step`, so every process computes
the same update from the same averaged gradient: no communication of its own is needed (the reference's
distributed version only splits the Newton-Schulz work among processes, which pays off on large models).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from archsweep.core.train.config.schemas import MUON_NS_DTYPES, MUON_SCALINGS

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the reference's quintic: steep at 0, singular values end in ~[0.7, 1.2]
SCALINGS = MUON_SCALINGS  # the names are kept in the config schema (light), which checks optim.scaling
NS_DTYPES = {name: getattr(torch, name) for name in MUON_NS_DTYPES}


def newton_schulz(g: Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> Tensor:
    """An approximate U V^T of g = U S V^T (rows x cols): g scaled to spectral norm <= 1 (by its Frobenius norm),
    then `steps` iterations x <- a x + (b x x^T + c (x x^T)^2) x on the wide orientation (the smaller Gram
    matrix). Leading dimensions are a batch: each (rows, cols) slice is orthogonalised on its own. The reference
    runs it in bfloat16 on GPU; float32 is the default here."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT  # (cols, rows): x x^T is the smaller square
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        gram = x @ x.mT  # (short, short)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(g.dtype)


def update_scale(rows: int, cols: int, scaling: str) -> float:
    """Factor on the orthogonalised update. `reference`: max(1, rows / cols) ** 0.5 (Jordan et al.; a tall matrix's
    orthogonal update has a smaller RMS); `moonlight`: 0.2 sqrt(max(rows, cols)) (Liu et al. 2025, Moonlight), which
    gives the update AdamW's typical RMS of about 0.2, so Muon can share AdamW's learning rate."""
    if scaling == "reference":
        return max(1.0, rows / cols) ** 0.5
    return 0.2 * max(rows, cols) ** 0.5


class Muon(torch.optim.Optimizer):
    """Param groups with `muon: True` (2-D weights, or 3-D stacks (E, out, in) orthogonalised slice by slice: each
    expert's matrix on its own) get Muon's update, the others AdamW's (Loshchilov & Hutter
    2019, bias-corrected). Per group: lr, weight_decay (decoupled, times lr, for both kinds); Muon: momentum,
    nesterov, ns_steps, ns_dtype, scaling; AdamW: betas, eps."""

    def __init__(self, params: Iterable[dict[str, Any]], lr: float, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, ns_dtype: str = "float32", scaling: str = "reference",
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, ns_dtype=ns_dtype,
                        scaling=scaling, betas=tuple(betas), eps=eps, weight_decay=weight_decay, muon=False)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["muon"] and any(p.ndim not in (2, 3) for p in group["params"]):
                raise ValueError("Muon orthogonalises 2-D weight matrices, or stacks of them (E, out, in) one slice "
                                 "at a time; give the other parameters to a group with muon=False (AdamW)")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            (self._muon_step if group["muon"] else self._adamw_step)(group)
        return loss

    def _muon_step(self, group: dict[str, Any]) -> None:
        lr, m = group["lr"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - m)  # buf = m buf + (1 - m) g
            direction = p.grad.lerp(buf, m) if group["nesterov"] else buf  # Nesterov: (1 - m) g + m buf
            update = newton_schulz(direction, group["ns_steps"], NS_DTYPES[group["ns_dtype"]])
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(update, alpha=-lr * update_scale(p.shape[-2], p.shape[-1], group["scaling"]))

    def _adamw_step(self, group: dict[str, Any]) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            t, g = state["step"], p.grad
            state["exp_avg"].lerp_(g, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt_().add_(eps)
            p.mul_(1 - lr * group["weight_decay"])
            p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** t))
