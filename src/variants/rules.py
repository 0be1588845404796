"""The rules across axes, in one list (`RULES`): a choice on one axis that a choice on another axis, or a model
field, rules out.

A rule reads what the chosen classes declare (`forms_scores`, `score_bias`, `image_only`, `form`, a plug-in's
`requires`), never their names, so a new variant or plug-in that declares the same is held to the same rule with
no edit here. It raises a ValueError
that names the fields, their values and the fix. A rule within one variant (its sizes, its options) is the
variant's own `check`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from archsweep.variants.attention import ATTENTION
from archsweep.variants.model import IMAGE, kinds_of
from archsweep.variants.pos import POS


@dataclass(frozen=True)
class Choices:
    """What a rule sees: per axis (kind, norm, pos, ffn, attention) the option name and its class, and the model's
    other fields (`ModelConfig.sizes()`)."""

    names: Mapping[str, str]
    classes: Mapping[str, type]
    fields: Mapping[str, Any]
    options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # per axis, when known
    plugins: Mapping[str, type] = dataclasses.field(default_factory=dict)  # the chosen plug-ins' classes, by name


def scoring_attention() -> str:
    return " or ".join(n for n in ATTENTION.names() if ATTENTION.get(n).forms_scores)


def score_bias_needs_scores(c: Choices) -> None:
    """An encoding that adds to the scores (ALiBi, T5 buckets, Shaw, DeBERTa) needs an attention kind that forms
    them; kernel attention (linear, performer) never does."""
    if c.classes["attention"].forms_scores or not c.classes["pos"].score_bias:
        return
    image = c.classes["kind"].form == IMAGE
    fitting = [n for n in POS.names() if not POS.get(n).score_bias and (image or not POS.get(n).image_only)]
    raise ValueError(f"attention={c.names['attention']} never forms the score matrix Q K^T, so pos={c.names['pos']} "
                     f"(an additive bias on the scores) has nothing to act on; choose pos={' or '.join(fitting)}, "
                     f"or attention={scoring_attention()}")


def patch_positions_need_images(c: Choices) -> None:
    """An encoding of an image's patch grid (`image_only`) needs a kind that reads images."""
    if not c.classes["pos"].image_only or c.classes["kind"].form == IMAGE:
        return
    raise ValueError(f"pos={c.names['pos']} places positions on an image's 2D patch grid and needs an image input: "
                     f"model kind={' or '.join(kinds_of((IMAGE,)))}, not kind={c.names['kind']}; choose another pos "
                     f"for a token sequence")


def attention_takes_the_encoding(c: Choices) -> None:
    """An attention kind may refuse an encoding it cannot apply (`pos_refusal`: latent attention rotates only part of
    each head and has no per-head keys of d_model / n_heads channels)."""
    attention, pos = c.classes["attention"], c.classes["pos"]
    reason = attention.pos_refusal(pos, c.options.get("pos", {}))
    if reason is None:
        return
    image = c.classes["kind"].form == IMAGE
    fitting = [n for n in POS.names() if attention.pos_refusal(POS.get(n), {}) is None
               and (image or not POS.get(n).image_only)]
    raise ValueError(f"attention={c.names['attention']} cannot take pos={c.names['pos']}: {reason}; choose "
                     f"pos={' or '.join(fitting)}, or another attention kind")


def _capabilities() -> dict[str, tuple[Callable[[Choices], bool], str, Callable[[], str]]]:
    """What each capability a plug-in may require (`plugins.base`) asks of the choices: (offered?, what it is,
    the choices that offer it)."""
    from archsweep.variants.model import CAUSAL, KIND
    from archsweep.variants.plugins import base

    return {
        base.SCORES: (lambda c: c.classes["attention"].forms_scores, "the score matrix Q K^T, which attention="
                      "{attention} never forms", lambda: f"attention={scoring_attention()}"),
        base.PROJECTIONS: (lambda c: not c.classes["attention"].projects, "the layer's own q, k, v and output "
                           "projections, which attention={attention} replaces with its own",
                           lambda: "attention=" + " or ".join(n for n in ATTENTION.names()
                                                              if not ATTENTION.get(n).projects)),
        base.CAUSAL_STACK: (lambda c: c.classes["kind"].form == CAUSAL, "one causal stack over one sequence, which "
                            "kind={kind} is not", lambda: "model=" + " or ".join(kinds_of((CAUSAL,)))),
        base.FIRST_LAYER: (lambda c: True, "", lambda: ""),
        "model_hooks": (lambda c: c.classes["kind"].model_hooks, "a kind that calls the model plug-ins' hooks, "
                        "which kind={kind} does not", lambda: "model=" + " or ".join(
                            n for n in KIND.names() if KIND.get(n).model_hooks)),
    }


def plugins_get_what_they_require(c: Choices) -> None:
    """Each plug-in's `requires`, checked against what the chosen kind and attention kind offer; then the plug-in's
    own `check_choices`."""
    from archsweep.variants.plugins.base import ModelPlugin

    capabilities = _capabilities()
    for name, cls in c.plugins.items():
        needs = set(cls.requires) | ({"model_hooks"} if issubclass(cls, ModelPlugin) else set())
        for need in sorted(needs):
            if need not in capabilities:
                raise ValueError(f"{name} requires {need!r}, which is not a known capability; valid: "
                                 f"{', '.join(capabilities)}")
            offered, what, fitting = capabilities[need]
            if not offered(c):
                raise ValueError(f"{name} needs {what.format(**c.names)}; set {name}=none or choose {fitting()}")
        cls.check_choices(c)


def width_transfer_covers_the_choices(c: Choices) -> None:
    """A parametrisation that transfers across widths (`param/`: `transfers_width`) reads every parameter's role and
    shape; a variant or plug-in that declares `width_refusal` (why it cannot be parametrised yet) is refused by
    name rather than scaled wrongly."""
    param = c.classes.get("param")
    if param is None or not param.transfers_width:
        return
    chosen = [(axis, c.names[axis], cls) for axis, cls in c.classes.items() if axis != "param"]
    chosen += [(name, "on", cls) for name, cls in c.plugins.items()]
    for axis, name, cls in chosen:
        reason = getattr(cls, "width_refusal", None)
        if reason:
            raise ValueError(f"param={c.names['param']} cannot parametrise {axis}={name} yet: {reason}; use "
                             f"param=sp, or another {axis}")


RULES: list[Callable[[Choices], None]] = [score_bias_needs_scores, patch_positions_need_images,
                                          attention_takes_the_encoding, plugins_get_what_they_require,
                                          width_transfer_covers_the_choices]


def check_rules(choices: Choices) -> None:
    """Raise the first rule's ValueError that the choices break."""
    for rule in RULES:
        rule(choices)
