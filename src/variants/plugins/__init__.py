"""Model options that are not a leaf of an axis, one file per option: each a registered plug-in that the
attention layer, the output head or the model kind calls at a declared hook point (`base.py`), never a field wired
by name in the builder.

A plug-in is chosen in its own config group, named as it is registered (`conf/attn_gate/elementwise.yaml`:
`# @package model.plugins.attn_gate`, then its options; `none.yaml` turns it off), and kept in
`ModelConfig.plugins` as {name: options}. A new option is one file here (or anywhere on the Python path, its
yaml naming the class with `_target_`) with `@PLUGIN.register("<name>")` on a subclass of `AttentionPlugin`,
`OutputPlugin` or `ModelPlugin`, and one yaml in `conf/<name>/`; choose it with `+<name>=<option>` (the built-in
groups are in train.yaml's defaults, so theirs need no `+`).
"""

from __future__ import annotations

from archsweep.variants.registry import Registry

PLUGIN: Registry = Registry("plugin", __name__, default="")
