"""Feed-forward layers, one file per option (`base.py`: the two layer shapes they share).

A new FFN is one file here with `@FFN.register("<name>")` on its class, and `conf/ffn/<name>.yaml`."""

from typing import Any

from archsweep.variants.registry import Registry, family_attribute

FFN: Registry = Registry("ffn", __name__, default="relu")


def __getattr__(name: str) -> Any:
    return family_attribute(__name__, name)
