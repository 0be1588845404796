"""Positional encodings, one file per option; see `base.py` for the three hooks they share.

A new encoding is one file here with `@POS.register("<name>")` on its class, and `conf/pos/<name>.yaml`."""

from archsweep.variants.registry import Registry

POS: Registry = Registry("pos", __name__, default="sinusoidal")
