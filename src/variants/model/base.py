"""Base class and registry of the model kinds.

A kind says how it is put together from stacks (`assemble`, given the builder's `Parts`) and how it reads data
(`form`), so tasks, decoding and evaluation ask the kind instead of naming it:

- `SOURCE_TARGET`: an encoder reads the source, a decoder cross-attends to it and predicts the target
  (`model(src, tgt_in, src_mask, tgt_mask)`, `encode`, `decode`).
- `CAUSAL`: one causal stack over one sequence; a (source, target) pair is packed as a prefix LM
  (`model(tokens, pad_mask, positions, cache)`).
- `BIDIRECTIONAL`: one bidirectional stack over one sequence, predicting a token per position (tagging, masked
  tokens) or a class (`model(tokens, pad_mask)`, `classify`).
- `IMAGE`: one bidirectional stack over an image's patches, predicting its class (`model(images)` ->
  (B, n_classes)); such a kind also says `n_tokens(sizes)` (its sequence length), `patch_grid` (H/P, W/P) and
  `n_prefix` (tokens before the patches, e.g. a class token).

A new kind is one file in this folder, `@KIND.register("<name>")` on its class, and `conf/model/<name>.yaml`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from torch import nn

from archsweep.variants.model import BIDIRECTIONAL, CAUSAL, KIND, SOURCE_TARGET  # noqa: F401


class Parts(Protocol):
    """What the builder hands a kind: the config's sizes, and factories that build parts in the config's
    variants (norm placement, positions, FFN), initialised afterwards by the builder."""

    sizes: Mapping[str, Any]  # d_model, n_layers, n_decoder_layers, vocab_size, ... (ModelConfig fields)

    def embedding(self, vocab_size: int) -> nn.Module: ...

    def head(self, embedding: nn.Module) -> nn.Module: ...

    def stack(self, role: str, embedding: nn.Module, n_layers: int, causal: bool, cross: bool) -> nn.Module: ...

    def block(self, role: str, layer: int, causal: bool, cross: bool = False) -> nn.Module: ...

    def final_norm(self) -> nn.Module | None: ...

    def output_plugins(self) -> nn.Module: ...  # a head's output plug-ins (`plugins.base.OutputPlugins`)

    def model_plugins(self) -> dict[str, nn.Module]: ...  # the model plug-ins, for a kind with `model_hooks`


class ModelKind(nn.Module):
    form: ClassVar[str]
    # ModelConfig fields that only this kind reads; setting one (to other than its default) for another kind is
    # refused, so a silently ignored setting never looks like part of an experiment
    own_fields: ClassVar[tuple[str, ...]] = ()
    # whether the kind builds the model plug-ins (`parts.model_plugins()`) and calls their hooks; a kind that does
    # not is refused a model plug-in by the rules
    model_hooks: ClassVar[bool] = False

    @classmethod
    def assemble(cls, parts: Parts) -> ModelKind:
        raise NotImplementedError

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        """Raise ValueError if the kind cannot be built with these sizes."""

    @classmethod
    def doc_mask_refusal(cls, options: Mapping[str, Any]) -> str | None:
        """Why this kind cannot take documents packed into one row (`task.doc_mask`); None: it can. One stack over
        one token sequence can; another form says why not."""
        if cls.form in (CAUSAL, BIDIRECTIONAL):
            return None
        return f"it reads its data as {cls.form}, not as one sequence of packed token documents"



