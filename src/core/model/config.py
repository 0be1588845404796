"""Typed model configuration and its validation.

`ModelConfig` holds the structural sizes of the architecture; per axis (`kind`, `norm`, `norm_type`, `pos`,
`ffn`, `attention`) the chosen variant: an option name (the name of its yaml in `conf/<axis>/`) or a mapping of the
name and the variant's own options (`{"name": <option>, <its option>: <value>}`; from Hydra, the yaml's
`_target_` and options); and the chosen plug-ins (`plugins`: {plug-in name: its options}, `archsweep.variants.
plugins`). It is also the `model` group's schema in Hydra's ConfigStore (`schema_model`), so a value of the wrong
type is refused while the config is composed. The axes, plug-ins and their options come from the registries in
`archsweep.variants`; nothing here names a variant. `validate()` refuses impossible combinations with a message
that names the field, the value and the fix, before any weight is allocated, asking each chosen variant and
plug-in for its own constraints.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archsweep.variants.attention import ATTENTION
from archsweep.variants.ffn import FFN
from archsweep.variants.model import KIND
from archsweep.variants.norm import NORM
from archsweep.variants.norm_type import NORM_TYPE
from archsweep.variants.param import PARAM
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.pos import POS
from archsweep.variants.registry import Registry, close_match
from archsweep.variants.rules import Choices, check_rules

INITS = ("xavier", "gpt2")
STRATEGIES = ("greedy", "beam", "sample")


def check_choice(name: str, value: Any, valid: tuple[str, ...] | list[str]) -> None:
    """Raise a ValueError listing the valid options (and the closest one) for an unknown option name."""
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not a known option; valid options: {', '.join(valid)}"
                         f"{close_match(str(value), list(valid))}")


@dataclass
class ModelConfig:
    """Everything needed to build a model. Defaults are the 2017 paper's base model choices."""

    kind: str = KIND.default
    vocab_size: int | None = 32000  # target vocabulary (the only one for single-stack kinds); None: from the task
    src_vocab_size: int | None = None  # source vocabulary of a source-target kind; None = same as vocab_size
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

    # a variant field: its registry in the field's metadata (a new axis is one such field, a registry, a group)
    norm: Any = dataclasses.field(default=NORM.default, metadata={"registry": NORM})  # placement
    norm_type: Any = dataclasses.field(default=NORM_TYPE.default, metadata={"registry": NORM_TYPE})
    norm_eps: float = 1e-5
    norm_bias: bool = True  # LayerNorm's additive bias (beta); false: LayerNorm without bias (RMSNorm has none)
    pos: Any = dataclasses.field(default=POS.default, metadata={"registry": POS})
    ffn: Any = dataclasses.field(default=FFN.default, metadata={"registry": FFN})
    attention: Any = dataclasses.field(default=ATTENTION.default, metadata={"registry": ATTENTION})  # self-attention
    # the chosen plug-ins (`archsweep.variants.plugins`), {name: its options}; a name whose value is None is off
    plugins: dict[str, Any] = dataclasses.field(default_factory=dict)
    # how init, learning rates and forward constants depend on the width (sp: as set; mup: relative to a base width)
    param: Any = dataclasses.field(default=PARAM.default, metadata={"registry": PARAM})

    bias: bool = True  # biases in attention and FFN projections
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    tie_embeddings: bool = True  # output projection shares the (target) input embedding matrix
    share_src_tgt_embeddings: bool = False  # source-target kinds: one embedding for both sides (same vocabulary)
    output_bias: bool = False
    init: str = "xavier"  # xavier (2017 paper) | gpt2 (normal 0.02, residual projections / sqrt(2 n_layers))

    n_classes: int | None = 2  # pooled sequence head of a bidirectional kind; None: from the task
    pooling: str = "cls"  # cls (first token, BERT) | mean (over real tokens)

    # image kinds (their `own_fields`; an image task sets the sizes of its images)
    image_size: Any = None  # [H, W] of the input images (one int: square)
    patch_size: int = 16  # P: the image is cut into P x P patches (the paper's ViT-B/16)
    in_channels: int | None = 3  # C: colour channels of the input images; None: from the task
    head_hidden: int | None = None  # hidden width of the MLP head (dense + tanh); None: one linear layer

    activation_checkpointing: bool = False
    init_from: str | None = None  # a Hugging Face model folder the run's weights start from (train.py reads it)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    def choice(self, axis: str) -> str:
        """The option name chosen on `axis` (kind, norm, pos, ffn): the name of its yaml."""
        value = getattr(self, axis)
        if axis == "kind" or isinstance(value, str):
            return value
        return AXES[axis].resolve(value)[0]

    def variant(self, axis: str) -> type:
        """The class chosen on `axis`."""
        return KIND.get(self.kind) if axis == "kind" else AXES[axis].resolve(getattr(self, axis))[1]

    def options(self, axis: str) -> dict[str, Any]:
        """The chosen variant's own options on `axis`, defaults filled in."""
        return {} if axis == "kind" else AXES[axis].resolve(getattr(self, axis))[2]

    def plugin(self, name: str) -> type:
        """The class of the chosen plug-in `name`."""
        return PLUGIN.resolve({"name": name, **(self.plugins[name] or {})})[1]

    def plugin_options(self, name: str) -> dict[str, Any]:
        return PLUGIN.resolve({"name": name, **(self.plugins[name] or {})})[2]

    def sizes(self) -> dict[str, Any]:
        """Every field but the variant and plug-in choices, with the derived sizes resolved: what a variant may ask
        for."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in AXES and f.name not in ("plugins", "init_from")}
        dropout = self.dropout
        return {**values, "head_dim": self.head_dim, "n_kv_heads": self.kv_heads,
                "n_decoder_layers": self.decoder_layers,
                "attn_dropout": self.attn_dropout if self.attn_dropout is not None else dropout,
                "emb_dropout": self.emb_dropout if self.emb_dropout is not None else dropout}

    def position_limit(self) -> int | None:
        """Longest sequence the positional encoding supports (a learned table), None = unbounded."""
        return self.variant("pos").max_positions(self.sizes())

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
        """Check every field and put each variant choice in its canonical form ({"name", options...}).

        The sizes are checked first and import nothing heavy; asking the variants for their constraints imports
        them (and torch)."""
        check_choice("init", self.init, INITS)
        self._check_sizes()
        self._check_heads()
        self._check_dropouts()
        for axis, registry in AXES.items():
            setattr(self, axis, registry.spec(getattr(self, axis)))
        self.plugins = canonical_plugins(self.plugins)
        self._check_kind_fields()
        self._check_rules()
        sizes = self.sizes()
        self.variant("kind").check(sizes, {})
        for axis in sorted(AXES, key=lambda a: a != "attention"):  # the attention kind sizes the encoding's heads
            check = getattr(self.variant(axis), "check", None)  # a norm type is a plain module: no check
            if check is not None:
                check(self.pos_sizes() if axis == "pos" else sizes, self.options(axis))
        for name in self.plugins:
            self.plugin(name).check(sizes, self.plugin_options(name))
        return self

    def pos_sizes(self) -> dict[str, Any]:
        """The sizes the positional encoding is built and checked with: its `head_dim` is the channels per head the
        attention kind rotates (all of them, or latent attention's rotary part)."""
        sizes = self.sizes()
        return {**sizes, "head_dim": self.variant("attention").rotary_dim(sizes, self.options("attention"))}

    def _check_rules(self) -> None:
        """The rules across axes (`archsweep.variants.rules`), on the chosen classes (variants from outside the
        package included), before each variant checks its own sizes."""
        axes = ["kind", *AXES]
        check_rules(Choices({a: self.choice(a) for a in axes}, {a: self.variant(a) for a in axes}, self.sizes(),
                            {a: self.options(a) for a in AXES}, {n: self.plugin(n) for n in self.plugins}))

    def _check_sizes(self) -> None:
        positive = ["vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_seq_len", "n_classes"]
        for name in positive + ["src_vocab_size", "n_kv_heads", "n_decoder_layers"]:
            value = getattr(self, name)
            if value is None and name not in positive:
                continue
            if value is None or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps={self.norm_eps} must be positive (1e-5 is the usual value)")

    def _check_heads(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model}; "
                             f"choose n_heads among the divisors of d_model or change d_model")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} "
                             f"(grouped-query attention shares each key/value head among n_heads/n_kv_heads heads)")

    def _check_dropouts(self) -> None:
        for name in ("dropout", "attn_dropout", "emb_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name}={value} must be in [0, 1)")

    def _check_kind_fields(self) -> None:
        """A field only some kinds read, set for another kind, is refused rather than silently ignored."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        own = set(KIND.get(self.kind).own_fields)
        users: dict[str, list[str]] = {}
        for name in KIND.names():
            for field in KIND.get(name).own_fields:
                users.setdefault(field, []).append(name)
        for field, kinds in users.items():
            value = getattr(self, field)
            if field not in own and value != defaults[field]:
                raise ValueError(f"{field}={value!r} only applies to kind={' or '.join(kinds)}; leave it unset "
                                 f"({defaults[field]!r}) for kind={self.kind}")

AXES: dict[str, Registry] = {f.name: f.metadata["registry"] for f in dataclasses.fields(ModelConfig)
                             if "registry" in f.metadata}  # variant fields with options: norm, pos, ffn, ...


def canonical_plugins(plugins: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """{name: options, defaults filled (and `_target_` for a class outside this package)}, by name; entries set to
    None (a group's `none` option) are left out."""
    if not isinstance(plugins, Mapping):
        raise ValueError(f"plugins={plugins!r} must map plug-in names to their options, e.g. {{attn_gate: {{}}}}")
    out = {}
    for name in sorted(plugins):
        value = plugins[name]
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ValueError(f"plugins.{name}={value!r} must be the plug-in's options (a mapping, {{}} for its "
                             f"defaults) or null for off")
        spec = PLUGIN.spec({"name": name, **value})
        if spec.pop("name") != name:
            raise ValueError(f"plugins.{name}: its _target_ is registered as another plug-in; give the name it is "
                             f"registered under")
        out[name] = spec
    return out


def check_doc_mask(cfg: ModelConfig) -> None:
    """Refuse document masking (`task.doc_mask=true`: attention block-causal across the documents packed into a
    row) where the model kind or the attention kind cannot apply it; each says why itself (`doc_mask_refusal`)."""
    for axis, group in (("kind", "model"), ("attention", "attention")):
        reason = cfg.variant(axis).doc_mask_refusal(cfg.options(axis))
        if reason is None:
            continue
        registry = KIND if axis == "kind" else AXES[axis]
        fitting = [n for n in registry.names() if registry.get(n).doc_mask_refusal(_defaults(registry, n)) is None]
        raise ValueError(f"task.doc_mask=true cannot be used with {group}={cfg.choice(axis)}: {reason}; set "
                         f"task.doc_mask=false or choose {group}={' or '.join(fitting)}")


def _defaults(registry: Registry, name: str) -> dict[str, Any]:
    """The default options of a variant (those without a default are left out; a model kind has none)."""
    if registry is KIND:
        return {}
    params = registry.options(registry.get(name))
    return {key: p.default for key, p in params.items() if p.default is not p.empty}


@dataclass
class DecodingConfig:
    """How to decode; also the schema of the `decoding` config group (archsweep.core.train.config.schemas), so a value
    of the wrong type is refused when the config is composed and the rules below run when it becomes this class."""

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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> DecodingConfig:
        """The range rules (the types are the schema's); generate() runs them again on a config changed since."""
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
