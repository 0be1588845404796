"""Norm types, one file per option: what normalises the residual stream wherever a norm placement (the `norm`
axis), a final norm or a plug-in (QK-norm) asks for one. The type is a choice separate from the placement.

A new type is one file here (or anywhere on the Python path) with `@NORM_TYPE.register("<name>")` on an
`nn.Module` whose constructor takes `dim` (the width it normalises) and any of `norm_eps`, `norm_bias`, plus its
own options; and `conf/norm_type/<name>.yaml` (`# @package model.norm_type`)."""

from __future__ import annotations

from typing import Any

from archsweep.variants.registry import Registry

NORM_TYPE: Registry = Registry("norm_type", __name__, default="layernorm")


def build_norm(spec: Any, dim: int, eps: float, bias: bool) -> Any:
    """A norm of the type `spec` (an option name or {"name" | "_target_", options...}) over `dim` channels."""
    return NORM_TYPE.build(spec, {"dim": dim, "norm_eps": eps, "norm_bias": bias})
