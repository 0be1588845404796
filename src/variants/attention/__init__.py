"""Self-attention kinds, one file per option: how queries read keys and values once they are projected
(`base.py`: the shared context, masks and base class; `layers.py`: the projections around them).

A new kind is one file here with `@ATTENTION.register("<name>")` on its class, and `conf/attention/<name>.yaml`."""

from archsweep.variants.registry import Registry

ATTENTION: Registry = Registry("attention", __name__, default="full")
