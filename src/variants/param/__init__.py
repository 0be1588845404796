"""Parametrisations, one file per option: how a parameter's initial scale, learning rate and forward multipliers
depend on the model's width, read from each parameter's role (`roles.py`) and its shape beside the same parameter of
a base model. `sp` (standard) changes nothing; `mup` (Yang et al. 2022, Tensor Programs V) makes a learning rate
tuned at the base width hold at other widths.

A new parametrisation is one file here with `@PARAM.register("<name>")` on a `Parametrisation` subclass
(`base.py`), and `conf/param/<name>.yaml` (`# @package model.param`)."""

from archsweep.variants.registry import Registry

PARAM: Registry = Registry("param", __name__, default="sp")
