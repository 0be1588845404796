"""Self-attention kinds, one file per option: how queries read keys and values once they are projected
(`base.py`: the shared context, masks and base class; `layers.py`: the projections around them).

A new kind is one file here with `@ATTENTION.register("<name>")` on its class, and `conf/attention/<name>.yaml`."""

from archsweep.variants.pos import POS
from archsweep.variants.registry import Choices, Registry

ATTENTION: Registry = Registry("attention", __name__, default="full")


def _score_bias_needs_scores(choices: Choices) -> None:
    """A kind without a score matrix (`forms_scores = False`) cannot take an encoding that biases the scores."""
    if choices.declared("attention", "forms_scores") is not False or choices.declared("pos", "score_bias") is not True:
        return
    fine_pos = [n for n in POS.declared_names() if POS.declared(n, "score_bias") is False]
    scoring = [n for n in ATTENTION.declared_names() if ATTENTION.declared(n, "forms_scores") is True]
    raise ValueError(f"attention={choices.name('attention')} never forms the score matrix Q K^T, so "
                     f"pos={choices.name('pos')} (an additive bias on the scores) has nothing to act on; choose "
                     f"pos={' or '.join(fine_pos)}, or attention={' or '.join(scoring)}")


ATTENTION.rules.append(_score_bias_needs_scores)
