"""Feed-forward layers, one file per option (`base.py`: the two layer shapes they share).

A new FFN is one file here with `@FFN.register("<name>")` on its class, and `conf/ffn/<name>.yaml`."""

from archsweep.variants.registry import Registry

FFN: Registry = Registry("ffn", __name__, default="relu")
