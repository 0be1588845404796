"""The rules across axes, in one list (`RULES`): a choice on one axis that a choice on another axis, or a model
field, rules out.

A rule reads what the chosen classes declare (`forms_scores`, `score_bias`, `image_only`, `form`), never their
names, so a new variant that declares the same is held to the same rule with no edit here. It raises a ValueError
that names the fields, their values and the fix. A rule within one variant (its sizes, its options) is the
variant's own `check`.
"""

from __future__ import annotations

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


def softcap_needs_scores(c: Choices) -> None:
    """model.attn_softcap caps the scores, so it too needs an attention kind that forms them."""
    cap = c.fields["attn_softcap"]
    if cap is None or c.classes["attention"].forms_scores:
        return
    raise ValueError(f"attn_softcap={cap} caps the score matrix Q K^T, which attention={c.names['attention']} never "
                     f"forms; leave attn_softcap null or choose attention={scoring_attention()}")


def sink_needs_scores(c: Choices) -> None:
    """model.attn_sink adds a logit to the softmax denominator over the scores, so it needs them too."""
    sink = c.fields["attn_sink"]
    if sink == "none" or c.classes["attention"].forms_scores:
        return
    raise ValueError(f"attn_sink={sink} adds a logit to the softmax over the score matrix Q K^T, which "
                     f"attention={c.names['attention']} never forms (its kernel feature map has no softmax "
                     f"denominator to add it to); set attn_sink=none or choose attention={scoring_attention()}")


def patch_positions_need_images(c: Choices) -> None:
    """An encoding of an image's patch grid (`image_only`) needs a kind that reads images."""
    if not c.classes["pos"].image_only or c.classes["kind"].form == IMAGE:
        return
    raise ValueError(f"pos={c.names['pos']} places positions on an image's 2D patch grid and needs an image input: "
                     f"model kind={' or '.join(kinds_of((IMAGE,)))}, not kind={c.names['kind']}; choose another pos "
                     f"for a token sequence")


RULES: list[Callable[[Choices], None]] = [score_bias_needs_scores, softcap_needs_scores, sink_needs_scores,
                                          patch_positions_need_images]


def check_rules(choices: Choices) -> None:
    """Raise the first rule's ValueError that the choices break."""
    for rule in RULES:
        rule(choices)
