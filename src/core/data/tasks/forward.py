"""How a model of each data form runs on a batch (the batch keys of `batches.py`), returning logits (B, T, V)
aligned with batch["labels"]."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from archsweep.variants.flops import Shape
from archsweep.variants.model import BIDIRECTIONAL, CAUSAL, IMAGE, SOURCE_TARGET

if TYPE_CHECKING:
    from torch import Tensor, nn

Batch = dict[str, Any]


def forward_encoder_decoder(model: nn.Module, batch: Batch) -> Tensor:
    return model(batch["src"], batch["tgt_in"], batch["src_mask"], batch["tgt_mask"])  # (B, T, V)


def forward_tokens(model: nn.Module, batch: Batch) -> Tensor:
    """A batch with "doc_ids" (document masking, `task.doc_mask=true`) passes them on; otherwise they are left out."""
    if "doc_ids" in batch:
        return model(batch["tokens"], batch["pad_mask"], doc_ids=batch["doc_ids"])  # (B, T, V)
    return model(batch["tokens"], batch["pad_mask"])  # (B, T, V)


def forward_images(model: nn.Module, batch: Batch) -> Tensor:
    return model(batch["images"])[:, None, :]  # (B, 1, n_classes): one label per image


FORWARD: dict[str, Callable[[nn.Module, Batch], Tensor]] = {  # by data form
    SOURCE_TARGET: forward_encoder_decoder,
    CAUSAL: forward_tokens,
    BIDIRECTIONAL: forward_tokens,
    IMAGE: forward_images,
}


def flop_shape(batch: Batch) -> Shape:
    """The shape a batch is computed at, for the FLOP count (padded sizes: padding costs what real tokens cost).
    Prefix-LM packing is one causal sequence of the packed length; a classification batch (one label per row)
    has a pooled head."""
    if "images" in batch:
        return Shape(batch["images"].shape[0], 0)
    if "src" in batch:
        b, t = batch["tgt_in"].shape
        return Shape(b, t, memory=batch["src"].shape[1])
    b, t = batch["tokens"].shape
    return Shape(b, t, pooled=batch["labels"].ndim == 1)
