"""Norm placements, one file per option (`base.py`: the base class; the norm types are `norm_type`).

A new placement is one file here with `@NORM.register("<name>")` on its class, and `conf/norm/<name>.yaml`."""

from archsweep.variants.registry import Registry

NORM: Registry = Registry("norm", __name__, default="post")
