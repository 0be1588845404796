"""The plug-in contract: three hook points, each a base class whose methods do nothing by default.

- `AttentionPlugin`: built once per attention layer (self-attention; cross-attention too where `cross`), its hooks
  called by the layer: `qk(q, k)` after the positional rotation, `values(v, ctx)` before attending,
  `score_mod(scores)` on the pre-softmax scores, shaped (B, H, ..., Tq, Tk) with the heads on dim 1 and maybe more
  dims before the last two (a sliding window's blocks): it makes the kernel take the explicit path; `sink()` a
  logit per head in the softmax denominator, `output(x, y)` on the heads' outputs before the output projection.
- `OutputPlugin`: built once per output head (the token head, a class head): `transform_logits(logits)` on every
  prediction through the head, `observe_logits(logits)` on the model's own prediction (not on the extra ones of
  multi-token prediction), e.g. to record an auxiliary loss.
- `ModelPlugin`: built once per model by a kind that offers its hook: `after_stack(...)` after a causal stack's
  forward in training (multi-token prediction).

A plug-in declares what the rest of the system reads instead of knowing its name:
`requires` (capabilities the model must offer: `rules.py` refuses a model without them, naming the plug-in),
`hf` (its Hugging Face equivalent, None: export refuses it), `roles()` (the role of each parameter it owns,
`archsweep.variants.roles`), `label` (shape trace). Every hook a plug-in implements is found by method override,
and the module hooks of `archsweep.variants.hooks` (`aux_losses`, `diagnostics`, ...) apply as to any module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

# capabilities a plug-in may require (`requires`); `archsweep.variants.rules` says which choices offer each
SCORES = "scores"  # an attention kind that forms the softmax over Q K^T
PROJECTIONS = "projections"  # an attention layer that projects q, k, v and the output itself (not latent attention)
CAUSAL_STACK = "causal_stack"  # a kind with one causal stack over one sequence
FIRST_LAYER = "first_layer"  # every attention layer belongs to a stack whose first layer runs first


class Plugin(nn.Module):
    """Base of every plug-in. `hook_point` is set by the three bases below."""

    hook_point: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()
    hf: ClassVar[str | None] = None  # its Hugging Face equivalent, or None: export refuses a model with it
    label: ClassVar[str] = ""  # shape trace: what it adds, e.g. "sigmoid output gate"

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        """Raise ValueError (naming the option, the value and the fix) if the sizes or options cannot work."""

    @classmethod
    def check_choices(cls, choices: Any) -> None:
        """Raise ValueError if the model's other choices (`rules.Choices`) rule this plug-in out."""

    def roles(self) -> dict[str, str]:
        """{parameter name (relative to this module): role} for the parameters it owns directly (not those of its
        nn.Linear / norm children, whose roles are known); `archsweep.variants.roles`."""
        return {}


class AttentionPlugin(Plugin):
    hook_point = "attention"
    cross: ClassVar[bool] = False  # also built for cross-attention layers

    def qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def values(self, v: Tensor, ctx: Any) -> Tensor:
        return v

    def score_mod(self, scores: Tensor) -> Tensor:
        return scores

    def sink(self) -> Tensor | None:
        return None

    def output(self, x: Tensor, y: Tensor) -> Tensor:
        return y


class OutputPlugin(Plugin):
    hook_point = "output"

    def transform_logits(self, logits: Tensor) -> Tensor:
        return logits

    def observe_logits(self, logits: Tensor) -> None:
        return None


class ModelPlugin(Plugin):
    hook_point = "model"

    def after_stack(self, hidden: Tensor, tokens: Tensor, stack: nn.Module, head: nn.Module,
                    pad_mask: Tensor | None, doc_ids: Tensor | None) -> None:
        return None


# the hooks of each point: the methods its base class defines
HOOK_METHODS: dict[type, tuple[str, ...]] = {
    point: tuple(n for n, v in vars(point).items() if callable(v) and not n.startswith("_"))
    for point in (AttentionPlugin, OutputPlugin, ModelPlugin)}


def implemented(plugin: type, base: type) -> tuple[str, ...]:
    """The hooks of `base` that the plug-in class overrides."""
    return tuple(h for h in HOOK_METHODS[base] if getattr(plugin, h) is not getattr(base, h))


def hooks_of(plugins: Mapping[str, Plugin], base: type) -> dict[str, tuple[str, ...]]:
    """{hook: names of the plug-ins (in order) that implement it} for plug-ins of the hook point `base`."""
    out: dict[str, list[str]] = {h: [] for h in HOOK_METHODS[base]}
    for name, plugin in plugins.items():
        if isinstance(plugin, base):
            for hook in implemented(type(plugin), base):
                out[hook].append(name)
    return {h: tuple(names) for h, names in out.items()}


class OutputPlugins(nn.Module):
    """The output plug-ins of one head: `transform(logits)` runs their `transform_logits`; calling it runs those and
    then `observe_logits` (the head's own prediction)."""

    def __init__(self, plugins: Mapping[str, OutputPlugin] | None = None) -> None:
        super().__init__()
        self.plugins = nn.ModuleDict(plugins or {})
        hooks = hooks_of(self.plugins, OutputPlugin)
        self.transform_hooks, self.observe_hooks = hooks["transform_logits"], hooks["observe_logits"]

    def transform(self, logits: Tensor) -> Tensor:
        for name in self.transform_hooks:
            logits = self.plugins[name].transform_logits(logits)
        return logits

    def forward(self, logits: Tensor) -> Tensor:
        logits = self.transform(logits) if self.transform_hooks else logits
        for name in self.observe_hooks:
            self.plugins[name].observe_logits(logits)
        return logits
