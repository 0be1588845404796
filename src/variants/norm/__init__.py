"""Norm placements, one file per option (`base.py`: the base class and the norm types).

A new placement is one file here with `@NORM.register("<name>")` on its class, and `conf/norm/<name>.yaml`."""

from typing import Any

from archsweep.variants.registry import Registry, family_attribute

NORM: Registry = Registry("norm", __name__, default="post")
NORM_TYPES = ("layernorm", "rmsnorm")  # the norm type, a choice separate from the placement


def __getattr__(name: str) -> Any:
    return family_attribute(__name__, name)
