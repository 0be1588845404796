"""Assemble a model from a `ModelConfig` (plain PyTorch: no lightning, hydra or wandb needed).

    from archsweep.core.model.build import ModelConfig, build_model
    model = build_model(ModelConfig(vocab_size=65))  # the 2017 paper's choices; any axis by its option name

The kind assembles itself from `Parts` (embeddings, the output head, stacks); each stack's norm placement,
positional encoding, attention kind and FFN come from their registries, built with the sizes they ask for.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from archsweep.core.model.config import ModelConfig
from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.layers import CrossAttention, SelfAttention
from archsweep.variants.blocks import Block, Stack
from archsweep.variants.embedding import LMHead, TokenEmbedding
from archsweep.variants.ffn import FFN
from archsweep.variants.flops import TRAIN_FACTOR, Shape, forward_flops
from archsweep.variants.hooks import active_parameters
from archsweep.variants.init import init_weights
from archsweep.variants.model import KIND
from archsweep.variants.norm import NORM
from archsweep.variants.norm_type import build_norm
from archsweep.variants.param import PARAM
from archsweep.variants.param.base import ForwardScales, Parametrisation, Widths, fans
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import AttentionPlugin, ModelPlugin, OutputPlugin, OutputPlugins
from archsweep.variants.pos import POS
from archsweep.variants.roles import parameter_roles

__all__ = ["COUNTS", "ModelConfig", "build_model", "count_parameters", "flop_count", "flops_per_token",
           "match_d_ff", "match_field", "parameter_count"]

COUNTS = ("total", "active")  # parameters and FLOPs: all of the model's, or those one token uses (hooks.py)


class Parts:
    """The factories a model kind assembles itself from (see `archsweep.variants.model.base.Parts`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.sizes = cfg.sizes()

    def embedding(self, vocab_size: int) -> TokenEmbedding:
        return TokenEmbedding(vocab_size, self.cfg.d_model, self.cfg.scale_embedding)

    def head(self, embedding: TokenEmbedding) -> LMHead:
        cfg = self.cfg
        return LMHead(cfg.d_model, cfg.vocab_size, cfg.output_bias, embedding if cfg.tie_embeddings else None,
                      self.output_plugins())

    def norm(self, dim: int | None = None) -> nn.Module:
        """A norm of the chosen type over `dim` channels (default d_model)."""
        cfg = self.cfg
        return build_norm(cfg.norm_type, dim or cfg.d_model, cfg.norm_eps, cfg.norm_bias)

    def context(self, role: str, causal: bool) -> dict[str, Any]:
        """What the variants of a stack in `role` may ask for: the sizes, the place, the norm factory."""
        return {**self.sizes, "causal": causal, "role": role, "make_norm": self.norm}

    def plugins(self, point: type, context: dict[str, Any], keep: Callable[[type], bool] = lambda cls: True
                ) -> dict[str, Any]:
        """The chosen plug-ins of the hook point `point` (those `keep` accepts), built with `context`, by name."""
        out = {}
        for name, options in self.cfg.plugins.items():
            cls = self.cfg.plugin(name)
            if issubclass(cls, point) and keep(cls):
                out[name] = PLUGIN.build({"name": name, **options}, context)
        return out

    def output_plugins(self) -> OutputPlugins:
        return OutputPlugins(self.plugins(OutputPlugin, self.sizes))

    def model_plugins(self) -> dict[str, Any]:
        return self.plugins(ModelPlugin, {**self.sizes, "parts": self})

    def block(self, role: str, layer: int, causal: bool, cross: bool = False) -> Block:
        """Layer `layer` of a stack in `role`: self-attention of the chosen kind (cross-attention too), the FFN, each
        wrapped by the norm placement; the attention plug-ins built for each attention layer."""
        cfg, sizes = self.cfg, self.sizes
        context = {**self.context(role, causal), "layer": layer}
        attn_args = (cfg.d_model, cfg.n_heads, cfg.kv_heads, sizes["attn_dropout"], cfg.bias, layer)
        cross_attn = CrossAttention(*attn_args, self.plugins(AttentionPlugin, context, lambda c: c.cross)) \
            if cross else None
        return Block(
            SelfAttention(*attn_args, kernel=ATTENTION.build(cfg.attention, context),
                          plugins=self.plugins(AttentionPlugin, context)),
            FFN.build(cfg.ffn, context),
            functools.partial(NORM.build, cfg.norm, context),
            cross_attn,
        )

    def final_norm(self) -> nn.Module | None:
        """The norm a stack ends with, where the placement wants one (pre-norm: yes; post-norm: none)."""
        return self.norm() if self.cfg.variant("norm").final_norm else None

    def stack(self, role: str, embedding: TokenEmbedding, n_layers: int, causal: bool, cross: bool) -> Stack:
        cfg, sizes = self.cfg, self.sizes
        blocks = [self.block(role, i, causal, cross) for i in range(n_layers)]
        pos = POS.build(cfg.pos, {**self.context(role, causal), **cfg.pos_sizes()})
        stack = Stack(embedding, pos, blocks, self.final_norm(), causal, sizes["emb_dropout"])
        stack.checkpointing = cfg.activation_checkpointing
        return stack


def build_model(cfg: ModelConfig) -> nn.Module:
    """Validate `cfg` and build the model it describes, initialised by `cfg.init`. The model keeps `cfg` as
    `model.config`."""
    cfg.validate()
    model = KIND.get(cfg.kind).assemble(Parts(cfg))
    init_weights(model, cfg.init, cfg.n_layers)
    for module in model.modules():
        if isinstance(module, Block):
            module.after_init()
    model.config = cfg
    parametrise(model)
    return model


def parametrisation(cfg: ModelConfig) -> Parametrisation:
    """The chosen parametrisation (`model.param`), built with its options."""
    return PARAM.build(cfg.param, {})


def base_config(cfg: ModelConfig) -> ModelConfig | None:
    """The base model a width-transferring parametrisation measures against (standard parametrisation, base
    sizes), None for one that does not transfer."""
    param = parametrisation(cfg)
    if not param.transfers_width:
        return None
    return dataclasses.replace(cfg, param=PARAM.default, **param.base_sizes(cfg.sizes())).validate()


def forward_scales(cfg: ModelConfig) -> ForwardScales:
    """The width-dependent forward constants of `cfg`'s parametrisation at its width (every one 1 under one that does
    not transfer)."""
    base = base_config(cfg)
    return ForwardScales() if base is None else parametrisation(cfg).forward_scales(cfg.sizes(), base.sizes())


def parameter_widths(model: nn.Module) -> dict[str, tuple[str | None, Widths]]:
    """{parameter name: (role, its Widths against the base model)} for a model built with a width-transferring
    parametrisation (its `config`), empty otherwise. Roles must be declared for every parameter (`roles.py`); the
    base model is built on the meta device (shapes only)."""
    base_cfg = base_config(model.config)
    if base_cfg is None:
        return {}
    with torch.device("meta"):
        base = KIND.get(base_cfg.kind).assemble(Parts(base_cfg))
    shapes = {name: tuple(p.shape) for name, p in base.named_parameters()}
    out = {}
    for name, role in parameter_roles(model).items():
        fan_in, fan_out = fans(role, tuple(model.get_parameter(name).shape))
        base_in, base_out = fans(role, shapes[name])
        out[name] = (role, Widths(fan_in / base_in, fan_out / base_out))
    return out


@torch.no_grad()
def parametrise(model: nn.Module) -> None:
    """Apply the model's parametrisation: each parameter whose shape scales with the width starts at the standard
    deviation its namesake in the base model drew (the init scheme at the base shape, measured there), times the
    parametrisation's `init_scale`; the modules take the forward constants (`scale_forward`). Nothing happens under
    the standard parametrisation."""
    cfg = model.config
    base_cfg = base_config(cfg)
    if base_cfg is None:
        return
    param = parametrisation(cfg)
    widths = parameter_widths(model)
    if not any(p.is_meta for p in model.parameters()):
        with torch.random.fork_rng(devices=[]):  # the base draw leaves the run's random stream alone
            torch.manual_seed(0)
            base = build_model(base_cfg)
        base_params = dict(base.named_parameters())
        for name, (role, width) in widths.items():
            p, factor = model.get_parameter(name), param.init_scale(role, width)
            if factor == 0.0:
                p.zero_()
            elif width.scales:
                actual, target = p.float().std(), base_params[name].float().std()
                if actual > 0 and target > 0:
                    p.mul_(target * factor / actual)
    scales = forward_scales(cfg)
    for module in model.modules():
        hook = getattr(module, "scale_forward", None)
        if callable(hook):
            hook(scales)


def count_parameters(model: nn.Module, trainable_only: bool = True, count: str = "total") -> int:
    """Parameters counted once even when shared (tied embeddings); `count="active"`: the trainable ones one token
    uses (modules say so with `active_params()`, e.g. a mixture of experts)."""
    check_count(count)
    if count == "active":
        return active_parameters(model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def check_count(count: str, what: str = "count") -> None:
    if count not in COUNTS:
        raise ValueError(f"{what}={count!r} is not a known count; valid: {', '.join(COUNTS)}")


def parameter_count(cfg: ModelConfig, count: str = "total") -> int:
    """Trainable parameters (`total`, or `active` per token) of the model `cfg` describes, built on the meta device
    (no memory, no init cost)."""
    with torch.device("meta"):
        return count_parameters(build_model(cfg), count=count)


def flop_count(cfg: ModelConfig, shape: Shape) -> float:
    """Forward FLOPs of the model `cfg` describes on `shape` (archsweep.variants.flops), built on the meta device."""
    with torch.device("meta"):
        return forward_flops(build_model(cfg), shape)


def tokens_of(shape: Shape) -> int:
    """Tokens a batch of `shape` counts (as the batches' `n_tokens`): source and target, or one per image."""
    return shape.batch * (shape.length + shape.memory) or shape.batch


def flops_per_token(cfg: ModelConfig, shape: Shape, count: str = "active") -> float:
    """Training FLOPs (3 x forward) per token of a batch of `shape`: the work a token does (`active`), or what it
    would be if each token used every parameter (`total`)."""
    check_count(count)
    return TRAIN_FACTOR * flop_count(cfg, shape.replace(total=count == "total")) / tokens_of(shape)


MATCHABLE = ("d_ff", "d_model", "n_layers", "n_decoder_layers", "n_heads")


def match_field(cfg: ModelConfig, target: float, measure: Callable[[ModelConfig], float], what: str,
                field: str = "d_ff", unit: str = "parameters") -> tuple[ModelConfig, float]:
    """The config with the value of `field` whose `measure` (parameters, FLOPs per token) comes closest to
    `target`, and that measure. The measure grows with the field; the search is over the values the model
    accepts (d_model a multiple of n_heads, ...)."""
    if field not in MATCHABLE:
        raise ValueError(f"{what} solves one of {', '.join(MATCHABLE)}, not {field!r}")
    if field == "d_ff" and not cfg.variant("ffn").follows_d_ff(cfg.options("ffn")):
        fixed = {k: v for k, v in cfg.options("ffn").items() if v is not None}
        raise ValueError(f"{what} adjusts d_ff, but ffn={cfg.choice('ffn')} fixes its hidden size ({fixed}); "
                         f"set those model.ffn options to null so it follows d_ff")
    if field == "n_decoder_layers" and cfg.n_decoder_layers is None:
        cfg = dataclasses.replace(cfg, n_decoder_layers=cfg.n_layers)

    def at(value: int) -> tuple[ModelConfig, float] | None:
        candidate = dataclasses.replace(cfg, **{field: value})
        try:
            return candidate, measure(candidate)
        except ValueError:  # a value the model refuses (d_model not divisible by n_heads, ...)
            return None

    def buildable(start: int, step: int) -> tuple[ModelConfig, float] | None:
        """The first value from `start` on (upwards or downwards) that builds, with its measure."""
        for value in range(start, start + 256 * step, step):
            if value < 1:
                return None
            if (got := at(value)) is not None:
                return got
        return None

    lo, hi = 0, max(int(getattr(cfg, field)), 1)
    while (got := buildable(hi, 1)) is None or got[1] < target:  # grow until the target is bracketed
        if hi > 1 << 20:
            raise ValueError(f"{what}={target:,.0f} is out of reach: no {field} up to {hi:,} gets there")
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # the measure grows with the field: bisect on "the next buildable value reaches it"
        mid = (lo + hi) // 2
        got = buildable(mid, 1)
        lo, hi = (mid, hi) if got is not None and got[1] < target else (lo, mid)
    found = [got for got in (buildable(hi, 1), buildable(hi - 1, -1)) if got is not None]
    best = min(found, key=lambda c: (abs(c[1] - target), getattr(c[0], field)))
    if best[1] > target * 1.02 and getattr(best[0], field) == 1:
        raise ValueError(f"{what}={target:,.0f} is below the {best[1]:,.0f} {unit} this model has with {field}=1; "
                         f"raise the target or shrink the model")
    return best


def match_d_ff(cfg: ModelConfig, target: int, count: str = "total") -> tuple[ModelConfig, int]:
    """The config with the d_ff (>= 1) whose model comes closest to `target` parameters (`count`: total or
    active per token), and that count."""
    if not isinstance(target, int) or isinstance(target, bool) or target < 1:
        raise ValueError(f"match_params={target!r} must be a positive parameter count, model fields naming a "
                         f"reference model (e.g. {{ffn: relu}}), or null to turn it off")
    cfg.validate()
    check_count(count, "match_count")
    matched, found = match_field(cfg, target, functools.partial(parameter_count, count=count), "match_params")
    return matched, int(found)
