"""`performer` (Choromanski et al. 2021, "Rethinking Attention with Performers"): FAVOR+, kernel attention whose
positive random features phi(x) = exp(w^T x - |x|^2 / 2) / sqrt(m), with x = q or k scaled by Dh^-1/4, make
phi(q).phi(k) an unbiased estimate of the softmax kernel exp(q.k / sqrt(Dh)).

The m = `n_features` projections w (default Dh ln Dh) are block-orthogonal (orthogonal blocks of Dh rows, each
row scaled to the norm of a Gaussian vector), which lowers the estimator's variance; `orthogonal=false` draws
them iid. They are redrawn every `redraw_every` training forwards (0: never) and fixed in eval mode; the draws
are seeded (`feature_seed`, or the global seed when the model is built) and the features and counters are saved
with the weights, so a resumed or evaluated model uses the same features. Numerical stabilisation as in the
reference implementation: queries subtract their largest projection, keys the largest over the sequence
(constants that cancel between numerator and normaliser); in decoding the recurrent state is rescaled when a
new key raises that maximum. Unlike the reference, no eps is added inside the exponential and the normaliser's
eps is applied on the unscaled values, so the result does not depend on the stabilisers and cached decoding
equals the full forward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.kernel import FeatureMapAttention


def draw_features(m: int, d: int, generator: torch.Generator, orthogonal: bool = True) -> Tensor:
    """(m, d) random projections: block-orthogonal rows with Gaussian-vector norms, or iid Gaussian rows."""
    if not orthogonal:
        return torch.randn(m, d, generator=generator)
    blocks = []
    for _ in range(-(-m // d)):
        q, r = torch.linalg.qr(torch.randn(d, d, generator=generator))
        blocks.append((q * torch.sign(torch.diagonal(r))).T)  # d orthonormal rows, uniformly oriented (Haar)
    norms = torch.randn(m, d, generator=generator).norm(dim=1)  # chi(d): the norms iid Gaussian rows would have
    return torch.cat(blocks)[:m] * norms[:, None]


def positive_features(x: Tensor, w: Tensor, stabilise: str | None = None) -> tuple[Tensor, Tensor | None]:
    """phi(x) = exp(w^T x' - |x'|^2 / 2) / sqrt(m), x' = x Dh^-1/4, for x (..., T, Dh) and w (m, Dh).

    `stabilise`: "query" divides each row by exp(its largest projection), returned as the log-scale (..., T, 1);
    "key" every row by exp(the largest over the sequence), returned as (..., 1, 1)."""
    x = x * x.shape[-1] ** -0.25
    proj = x @ w.T  # (..., T, m)
    arg = proj - (x * x).sum(-1, keepdim=True) / 2
    scale = None
    if stabilise is not None:
        scale = proj.amax(dim=-1 if stabilise == "query" else (-1, -2), keepdim=True).detach()
        arg = arg - scale
    return torch.exp(arg) / math.sqrt(w.shape[0]), scale


def default_features(head_dim: int) -> int:
    """The paper's m = Dh ln Dh (at least 1)."""
    return max(1, round(head_dim * math.log(head_dim)))


@ATTENTION.register("performer")
class PerformerAttention(FeatureMapAttention):
    # read by the rules under a width-transferring parametrisation (param=mup)
    width_refusal = ("its random-feature attention's change grew with the width under muP in the coordinate check "
                     "(1.6x from d_model 64 to 512, where softmax attention holds within 1.4x)")
    def __init__(self, layer: int, causal: bool, head_dim: int, n_features: int | None = None,
                 redraw_every: int = 1000, orthogonal: bool = True, feature_seed: int | None = None,
                 chunk_size: int = 64, eps: float = 1e-6) -> None:
        super().__init__(layer, causal, chunk_size, eps)
        self.m = n_features if n_features is not None else default_features(head_dim)
        self.head_dim, self.redraw_every, self.orthogonal = head_dim, redraw_every, orthogonal
        self.seed = feature_seed if feature_seed is not None else torch.initial_seed() % 2**31
        self.calls, self.draws = 0, 0  # training forwards since the last draw; draws so far
        self.register_buffer("features", self._draw(), persistent=True)
        self.label = f"Performer, {self.m} features"
        # on_forward is a Python counter: run eagerly, so a compiled model neither breaks nor recompiles on it;
        # wrapped here rather than by a decorator, so importing the variants does not import torch._dynamo (0.8 s)
        self.on_forward = torch.compiler.disable(self.count_forward)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        super().check(sizes, options)
        if options["n_features"] is not None and options["n_features"] < 1:
            raise ValueError(f"attention.n_features={options['n_features']} must be a positive number of random "
                             f"features, or null for head_dim * ln(head_dim)")
        if options["redraw_every"] < 0:
            raise ValueError(f"attention.redraw_every={options['redraw_every']} must be >= 0 (0: never redraw)")

    def n_features(self, head_dim: int) -> int:
        return self.m

    def _draw(self) -> Tensor:
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + self.layer * 10_007 + self.draws) % 2**63)
        return draw_features(self.m, self.head_dim, generator, self.orthogonal)

    def count_forward(self) -> None:
        self.calls += 1
        if self.redraw_every and self.calls % self.redraw_every == 0:
            self.draws += 1
            self.features.copy_(self._draw())

    def get_extra_state(self) -> dict[str, int]:
        return {"seed": self.seed, "calls": self.calls, "draws": self.draws}

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.seed, self.calls, self.draws = int(state["seed"]), int(state["calls"]), int(state["draws"])

    def query_features(self, q: Tensor) -> tuple[Tensor, Tensor | None]:
        return positive_features(q, self.features, "query")

    def key_features(self, k: Tensor) -> tuple[Tensor, Tensor | None]:
        return positive_features(k, self.features, "key")

    def feature_flops(self, head_dim: int) -> float:
        return 2.0 * (2 * head_dim * self.m + 4 * self.m)  # projections w^T x and the exponentials, q and k
