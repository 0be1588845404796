"""Positional encodings, one file per option; see `base.py` for the three hooks they share.

A new encoding is one file here with `@POS.register("<name>")` on its class, and `conf/pos/<name>.yaml`."""

from typing import Any

from archsweep.variants.registry import Registry, family_attribute

POS: Registry = Registry("pos", __name__, default="sinusoidal")


def __getattr__(name: str) -> Any:
    return family_attribute(__name__, name)
