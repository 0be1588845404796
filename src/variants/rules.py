"""The rules across axes, in one list (`RULES`): a choice on one axis that a choice on another axis, or a model
field, rules out.

A rule reads what the chosen classes declare (`forms_scores`, `score_bias`, `image_only`, `form`), never their
names, so a new variant that declares the same is held to the same rule with no edit here. It raises a ValueError
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


def gate_needs_the_layers_projections(c: Choices) -> None:
    """model.attn_gate scales each head's output between the kernel and the layer's output projection; a kind that
    projects its input and output itself (`projects`: latent attention) has no such point in the layer."""
    gate = c.fields["attn_gate"]
    if gate == "none" or not c.classes["attention"].projects:
        return
    raise ValueError(f"attn_gate={gate} gates each head's output before the layer's output projection, which "
                     f"attention={c.names['attention']} applies inside its own kernel (with heads of its own "
                     f"v_head_dim); set attn_gate=none or choose attention="
                     f"{' or '.join(n for n in ATTENTION.names() if not ATTENTION.get(n).projects)}")


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


def mtp_shares_the_encoding(c: Choices) -> None:
    """model.mtp's modules attend with the stack's positional encoding; one with a table per layer (Shaw, DeBERTa:
    `content_bias`) has none for them."""
    from archsweep.variants.pos.base import PositionalEncoding  # here: the rules module itself needs no torch

    mtp, pos = c.fields.get("mtp", 0), c.classes["pos"]
    if not mtp or pos.content_bias is PositionalEncoding.content_bias:
        return
    fitting = [n for n in POS.names() if POS.get(n).content_bias is PositionalEncoding.content_bias
               and not POS.get(n).image_only]
    raise ValueError(f"mtp={mtp} cannot be used with pos={c.names['pos']}: its score terms are learned per layer of "
                     f"the stack, and the prediction modules' blocks are not among those layers; choose "
                     f"pos={' or '.join(fitting)}, or set model.mtp=0")


RULES: list[Callable[[Choices], None]] = [score_bias_needs_scores, softcap_needs_scores, sink_needs_scores,
                                          gate_needs_the_layers_projections, patch_positions_need_images,
                                          attention_takes_the_encoding, mtp_shares_the_encoding]


def check_rules(choices: Choices) -> None:
    """Raise the first rule's ValueError that the choices break."""
    for rule in RULES:
        rule(choices)
