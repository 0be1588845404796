"""Self-attention kinds, one file per option: how queries read keys and values once they are projected
(`base.py`: the shared context, masks and base class; `layers.py`: the projections around them).

A new kind is one file here with `@ATTENTION.register("<name>")` on its class, and `conf/attention/<name>.yaml`."""

from archsweep.variants.registry import Registry

ATTENTION: Registry = Registry("attention", __name__, default="full")
GATES = ("none", "headwise", "elementwise")  # model.attn_gate: an output gate per head or channel (gates.py)
SINKS = ("none", "learned", "off_by_one")  # model.attn_sink: a sink logit per head in the softmax (gates.py)
