"""Norm placements, one file per option (`base.py`: the base class and the norm types).

A new placement is one file here with `@NORM.register("<name>")` on its class, and `conf/norm/<name>.yaml`."""

from archsweep.variants.registry import Registry

NORM: Registry = Registry("norm", __name__, default="post")
NORM_TYPES = ("layernorm", "rmsnorm", "dyt")  # the norm type, a choice separate from the placement
