"""Typed model configuration and its validation.

One flat dataclass: every architecture axis is a string option named as the config group option is named
(`norm="pre"`, `pos="rotary"`), plus each option's own hyperparameters. `validate()` refuses impossible
combinations with a message that names the field, the value and the fix, before any weight is allocated.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

KINDS = ("encoder_decoder", "decoder_only", "encoder_only")
NORM_PLACEMENTS = ("post", "pre", "sandwich", "deepnorm")
NORM_TYPES = ("layernorm", "rmsnorm")
POS_ENCODINGS = ("sinusoidal", "learned", "relative", "rotary", "alibi", "none")
FFNS = ("relu", "gelu", "swiglu", "geglu")
INITS = ("xavier", "gpt2")
STRATEGIES = ("greedy", "beam", "sample")
POOLINGS = ("cls", "mean")


def check_choice(name: str, value: Any, valid: tuple[str, ...]) -> None:
    """Raise a ValueError listing the valid options (and the closest one) for an unknown option name."""
    if value not in valid:
        text = str(value).lower()
        close = [v for v in valid if text.startswith(v) or v.startswith(text)]
        close = close or difflib.get_close_matches(text, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{name}={value!r} is not a known option; valid options: {', '.join(valid)}{hint}")


@dataclass
class ModelConfig:
    """Everything needed to build a model. Defaults are the 2017 paper's base model choices."""

    kind: str = "encoder_decoder"
    vocab_size: int = 32000  # target vocabulary (the only one for decoder_only / encoder_only)
    src_vocab_size: int | None = None  # encoder_decoder source vocabulary; None = same as vocab_size
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None  # fewer key/value heads: grouped-query (1 = multi-query); None = n_heads
    n_layers: int = 6  # encoder layers, and decoder layers unless n_decoder_layers is set
    n_decoder_layers: int | None = None
    d_ff: int = 2048
    max_seq_len: int = 512  # size of learned position tables; also the KV-cache default length
    dropout: float = 0.1  # residual paths
    attn_dropout: float | None = None  # attention probabilities; None = dropout
    emb_dropout: float | None = None  # after embedding + absolute position; None = dropout

    norm: str = "post"  # placement: post | pre | sandwich | deepnorm
    norm_type: str = "layernorm"  # layernorm | rmsnorm
    norm_eps: float = 1e-5

    pos: str = "sinusoidal"  # sinusoidal | learned | relative | rotary | alibi | none
    rel_num_buckets: int = 32  # relative (T5)
    rel_max_distance: int = 128  # relative (T5)
    rope_base: float = 10000.0  # rotary

    ffn: str = "relu"  # relu | gelu | swiglu | geglu
    gelu_approximate: str = "none"  # gelu: "none" (exact erf) or "tanh" (GPT-2)
    gated_d_ff: int | None = None  # swiglu/geglu hidden size; None = round(2 * d_ff / 3), same parameters

    bias: bool = True  # biases in attention and FFN projections
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    tie_embeddings: bool = True  # output projection shares the (target) input embedding matrix
    share_src_tgt_embeddings: bool = False  # encoder_decoder: one embedding for both sides (same vocabulary)
    output_bias: bool = False
    init: str = "xavier"  # xavier (2017 paper) | gpt2 (normal 0.02, residual projections / sqrt(2 n_layers))

    n_classes: int = 2  # encoder_only pooled sequence head
    pooling: str = "cls"  # encoder_only: cls (first token, BERT) | mean (over real tokens)

    activation_checkpointing: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """Build from a plain dict (e.g. a checkpoint's config); unknown keys are an error, not ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, names, n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ValueError(f"unknown model config field(s): {', '.join(hints)}")
        return cls(**values).validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> ModelConfig:
        check_choice("kind", self.kind, KINDS)
        check_choice("norm", self.norm, NORM_PLACEMENTS)
        check_choice("norm_type", self.norm_type, NORM_TYPES)
        check_choice("pos", self.pos, POS_ENCODINGS)
        check_choice("ffn", self.ffn, FFNS)
        check_choice("init", self.init, INITS)
        check_choice("pooling", self.pooling, POOLINGS)
        check_choice("gelu_approximate", self.gelu_approximate, ("none", "tanh"))
        self._check_sizes()
        self._check_heads()
        self._check_dropouts()
        self._check_embeddings()
        return self

    def _check_sizes(self) -> None:
        positive = ["vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_seq_len", "n_classes",
                    "rel_num_buckets", "rel_max_distance"]
        for name in positive + ["src_vocab_size", "n_kv_heads", "n_decoder_layers", "gated_d_ff"]:
            value = getattr(self, name)
            if value is None and name not in positive:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.rope_base <= 1:
            raise ValueError(f"rope_base={self.rope_base} must be greater than 1 (10000 is the usual value)")
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps={self.norm_eps} must be positive (1e-5 is the usual value)")

    def _check_heads(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model}; "
                             f"choose n_heads among the divisors of d_model or change d_model")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} "
                             f"(grouped-query attention shares each key/value head among n_heads/n_kv_heads heads)")
        if self.pos == "rotary" and self.head_dim % 2:
            raise ValueError(f"pos=rotary needs an even head dimension, but d_model/n_heads = "
                             f"{self.d_model}/{self.n_heads} = {self.head_dim}; change d_model or n_heads")
        if self.pos == "relative" and self.rel_num_buckets < 4:
            raise ValueError(f"rel_num_buckets={self.rel_num_buckets} is too small; use at least 4 (T5 uses 32)")

    def _check_dropouts(self) -> None:
        for name in ("dropout", "attn_dropout", "emb_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name}={value} must be in [0, 1)")

    def _check_embeddings(self) -> None:
        if self.share_src_tgt_embeddings:
            if self.kind != "encoder_decoder":
                raise ValueError(f"share_src_tgt_embeddings=True only applies to kind=encoder_decoder, not "
                                 f"kind={self.kind}; set it to false")
            if self.src_vocab_size not in (None, self.vocab_size):
                raise ValueError(f"share_src_tgt_embeddings=True needs one vocabulary, but src_vocab_size="
                                 f"{self.src_vocab_size} != vocab_size={self.vocab_size}; use a joint vocabulary "
                                 f"or set share_src_tgt_embeddings=false")
        if self.src_vocab_size is not None and self.kind != "encoder_decoder":
            raise ValueError(f"src_vocab_size={self.src_vocab_size} only applies to kind=encoder_decoder; "
                             f"leave it unset for kind={self.kind}")
        if self.n_decoder_layers is not None and self.kind != "encoder_decoder":
            raise ValueError(f"n_decoder_layers={self.n_decoder_layers} only applies to kind=encoder_decoder; "
                             f"use n_layers for kind={self.kind}")


@dataclass
class DecodingConfig:
    strategy: str = "greedy"  # greedy | beam | sample
    max_new_tokens: int = 64
    beam_size: int = 4
    length_penalty: float = 1.0  # beam: hypotheses ranked by sum log p / length ** length_penalty
    n_best: int = 1  # beam: hypotheses returned per input (<= beam_size)
    temperature: float = 1.0  # sample
    top_k: int = 0  # sample: keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # sample: keep the smallest set with probability >= top_p; 1.0 = off
    seed: int | None = None  # sample: fixes the random stream
    use_cache: bool = True

    def validate(self) -> DecodingConfig:
        check_choice("decoding.strategy", self.strategy, STRATEGIES)
        if self.max_new_tokens < 1:
            raise ValueError(f"decoding.max_new_tokens={self.max_new_tokens} must be at least 1")
        if self.beam_size < 1:
            raise ValueError(f"decoding.beam_size={self.beam_size} must be at least 1")
        if not 1 <= self.n_best <= (self.beam_size if self.strategy == "beam" else 1):
            limit = "beam_size" if self.strategy == "beam" else "1 unless decoding.strategy=beam"
            raise ValueError(f"decoding.n_best={self.n_best} must be between 1 and {limit}")
        if self.temperature <= 0:
            raise ValueError(f"decoding.temperature={self.temperature} must be positive; use strategy=greedy "
                             f"for the argmax")
        if self.top_k < 0:
            raise ValueError(f"decoding.top_k={self.top_k} must be >= 0 (0 turns it off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"decoding.top_p={self.top_p} must be in (0, 1] (1 turns it off)")
        return self

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DecodingConfig:
        """Build from a plain dict (e.g. the `decoding` config group); unknown keys are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown decoding setting(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        return cls(**values).validate()
