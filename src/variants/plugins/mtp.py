"""`mtp`, multi-token prediction (DeepSeek-V3, arXiv 2412.19437, section 2.2): D sequential modules after a causal
stack, the k-th predicting the token k + 1 places ahead, for a denser training signal; decoding uses the next-token
head only.

Module k at position i: h^k_i = Block(W_k [RMSNorm(h^(k-1)_i) ; RMSNorm(Emb(t_(i+k)))]), then the output head
(after the stack's final norm, where the placement has one) predicts t_(i+k+1). h^0 is the stack's output, the
embedding and the head are the stack's own (shared); each module's block is a layer of the stack's kinds (norm
placement, attention, FFN), at the same positions i, with the stack's positional encoding. Its loss is the mean over
`depths` of the cross-entropy over labelled positions; the training step adds it with `weight` (DeepSeek-V3: 0.3,
then 0.1) through the auxiliary-loss hook (`train/aux/mtp`, and `mtp_<k>` per depth, logged
only). Targets come from the input itself (the labels of a causal batch are its next tokens), so depth k trains on
T - k - 1 positions of a T-token row; with document masking it skips positions whose t_(i+k) is in another
document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archsweep.variants.attention.base import AttnContext
from archsweep.variants.blocks import Stack, document_positions
from archsweep.variants.embedding import LMHead
from archsweep.variants.flops import Shape, forward_flops, linear_flops
from archsweep.variants.hooks import AuxLoss
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import CAUSAL_STACK, FIRST_LAYER, ModelPlugin


class PredictionModule(nn.Module):
    """One depth: the two normalised inputs joined and projected to d_model, one block, the final norm."""

    def __init__(self, d_model: int, eps: float, block: nn.Module, final_norm: nn.Module | None) -> None:
        super().__init__()
        self.hidden_norm, self.embed_norm = nn.RMSNorm(d_model, eps=eps), nn.RMSNorm(d_model, eps=eps)
        self.in_proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.block = block
        self.final_norm = final_norm if final_norm is not None else nn.Identity()

    def forward(self, hidden: Tensor, embedded: Tensor, ctx: AttnContext) -> tuple[Tensor, Tensor]:
        """hidden, embedded (B, L, D) -> (this depth's hidden states, their final-normed form), each (B, L, D)."""
        h = self.block(self.in_proj(torch.cat([self.hidden_norm(hidden), self.embed_norm(embedded)], dim=-1)), ctx)
        return h, self.final_norm(h)


@PLUGIN.register("mtp")
class MultiTokenPrediction(ModelPlugin):
    requires = frozenset({CAUSAL_STACK})
    label = "multi-token prediction"

    def __init__(self, parts: Any, d_model: int, norm_eps: float, n_layers: int, vocab_size: int, depths: int = 1,
                 weight: float = 0.3) -> None:
        super().__init__()
        self.depths = nn.ModuleList(
            PredictionModule(d_model, norm_eps, parts.block("stack", n_layers + k, causal=True), parts.final_norm())
            for k in range(depths))
        self.weight, self.vocab_size = weight, vocab_size
        self.predictions: list[tuple[Tensor, Tensor, Tensor]] = []  # per depth: logits, targets, valid positions

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if options["depths"] < 1:
            raise ValueError(f"mtp: depths={options['depths']} must be >= 1 (DeepSeek-V3: 1); mtp=none turns it off")
        if options["weight"] < 0:
            raise ValueError(f"mtp: weight={options['weight']} must be >= 0 (DeepSeek-V3: 0.3, then 0.1)")

    @classmethod
    def check_choices(cls, choices: Any) -> None:
        """Its blocks are not layers of the stack: a plug-in that reads the stack's first layer (value residual)
        has none there, and an encoding with score terms learned per layer (Shaw, DeBERTa) none for them."""
        from archsweep.variants.pos import POS
        from archsweep.variants.pos.base import PositionalEncoding

        for name, other in choices.plugins.items():
            if FIRST_LAYER in other.requires:
                raise ValueError(f"mtp cannot be used with {name}: the prediction modules' blocks see no first "
                                 f"layer of their own; set mtp=none or {name}=none")
        if choices.classes["pos"].content_bias is not PositionalEncoding.content_bias:
            fitting = [n for n in POS.names() if POS.get(n).content_bias is PositionalEncoding.content_bias
                       and not POS.get(n).image_only]
            raise ValueError(f"mtp cannot be used with pos={choices.names['pos']}: its score terms are learned per "
                             f"layer of the stack, and the prediction modules' blocks are not among those layers; "
                             f"choose pos={' or '.join(fitting)}, or set mtp=none")

    def after_stack(self, hidden: Tensor, tokens: Tensor, stack: Stack, head: LMHead, pad_mask: Tensor | None = None,
                    doc_ids: Tensor | None = None) -> None:
        """Records each depth's predictions for `aux_losses`. hidden (B, T, D): the stack's output on tokens (B, T);
        pad_mask (B, T) True at real tokens; doc_ids (B, T) documents (block-causal attention, as the stack)."""
        self.predictions = []
        t = tokens.shape[1]
        for module in self.depths:
            module.block.self_attn.kernel.on_forward()  # as the stack does for its blocks (random features)
        for k, module in enumerate(self.depths, start=1):
            n = t - k  # positions i whose token t_(i+k) is in the row
            if n < 2:  # no position left with its target t_(i+k+1) in the row
                break
            hidden, normed = module(hidden[:, :n], stack.embed(tokens[:, k:]), self.context(stack, n, k, pad_mask,
                                                                                         doc_ids, tokens.device))
            valid = pad_mask[:, k + 1:] if pad_mask is not None else torch.ones_like(tokens[:, k + 1:], dtype=bool)
            if doc_ids is not None:  # t_(i+k) of the position's own document
                valid = valid & (doc_ids[:, :n - 1] == doc_ids[:, k:t - 1])
            self.predictions.append((head.logits(normed[:, :n - 1]), tokens[:, k + 1:], valid))

    @staticmethod
    def context(stack: Stack, n: int, k: int, pad_mask: Tensor | None, doc_ids: Tensor | None,
                device: torch.device) -> AttnContext:
        """Attention over the first n positions, at their own positions; a position is padding where t_(i+k) is."""
        docs = doc_ids[:, :n] if doc_ids is not None else None
        positions = document_positions(docs) if docs is not None else torch.arange(n, device=device)[None]
        keys = pad_mask[:, k:] if pad_mask is not None else None
        return AttnContext(keys, True, n, n, positions, stack.pos.rotate_qk, stack.pos.attn_bias, None, device,
                           stack.pos.content_bias, doc_ids=docs)

    def aux_losses(self, labelled: Tensor) -> dict[str, AuxLoss]:
        """`mtp`: the mean over depths of each one's cross-entropy; `mtp_<k>` per depth (weight 0: logged only).
        labelled (B, T): positions whose next token counts; depth k's target t_(i+k+1) is position i + k's label."""
        predictions, self.predictions = self.predictions, []
        if not predictions:
            return {}
        losses = {}
        for k, (logits, targets, valid) in enumerate(predictions, start=1):
            keep = valid & labelled[:, k:k + targets.shape[1]]
            per_token = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
            losses[f"mtp_{k}"] = AuxLoss(0.0, (per_token * keep.flatten()).sum() / keep.sum().clamp(min=1))
        mean = torch.stack([loss.value for loss in losses.values()]).mean()
        return {"mtp": AuxLoss(self.weight, mean), **losses}

    def flops(self, shape: Shape) -> float:
        """What training adds: per depth k, the projection and the block over T - k positions, the head over
        T - k - 1 (no work at inference, where the modules are not run)."""
        total = 0.0
        d_model = self.depths[0].in_proj.out_features if len(self.depths) else 0
        for k, module in enumerate(self.depths, start=1):
            n = shape.length - k
            if n < 2:
                break
            block = Shape(shape.batch, n, causal=True, total=shape.total)
            total += linear_flops(module.in_proj, shape.batch * n) + forward_flops(module.block, block)
            total += 2.0 * d_model * self.vocab_size * shape.batch * (n - 1)
        return total
