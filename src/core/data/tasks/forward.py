"""How a model of each data form runs on a batch (the batch keys of `batches.py`), returning logits (B, T, V)
aligned with batch["labels"]."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from archsweep.variants.model import BIDIRECTIONAL, CAUSAL, IMAGE, SOURCE_TARGET

if TYPE_CHECKING:
    from torch import Tensor, nn

Batch = dict[str, Any]


def forward_encoder_decoder(model: nn.Module, batch: Batch) -> Tensor:
    return model(batch["src"], batch["tgt_in"], batch["src_mask"], batch["tgt_mask"])  # (B, T, V)


def forward_tokens(model: nn.Module, batch: Batch) -> Tensor:
    return model(batch["tokens"], batch["pad_mask"])  # (B, T, V)


def forward_images(model: nn.Module, batch: Batch) -> Tensor:
    return model(batch["images"])[:, None, :]  # (B, 1, n_classes): one label per image


FORWARD: dict[str, Callable[[nn.Module, Batch], Tensor]] = {  # by data form
    SOURCE_TARGET: forward_encoder_decoder,
    CAUSAL: forward_tokens,
    BIDIRECTIONAL: forward_tokens,
    IMAGE: forward_images,
}
