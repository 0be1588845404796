"""Reading runs written before the package was renamed (import name `src`, flat model fields).

Checkpoints and configs of that time name classes as `src.core.tasks.synthetic.ReverseTask` and keep each
variant's options as flat model fields (`rope_base`, `rel_num_buckets`, `gated_d_ff`, ...). `upgrade` turns
such a checkpoint's `archsweep` entry into today's form, so old runs load, evaluate and resume; a current
checkpoint passes through unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

MODULES = {  # old module prefix -> new, most specific first
    "src.core.config": "archsweep.core.model.config",
    "src.core.build": "archsweep.core.model.build",
    "src.core.checkpoint": "archsweep.core.model.checkpoint",
    "src.core.tasks": "archsweep.core.data.tasks",
    "src.core.codec": "archsweep.core.data.codec",
    "src.core.data": "archsweep.core.data",
    "src.core.compare": "archsweep.core.report",
    **{f"src.core.{m}": f"archsweep.core.eval.{m}"
       for m in ("generation", "evaluation", "inference", "attention_maps", "trace")},
    "src.core.lit": "archsweep.core.train.lit",
    # the train wing's modules before its sub-packages (archsweep.core.train.<m>; src.core.<m> for those the oldest
    # runs name) -> the sub-package each is in now
    **{f"{old}.{m}": f"archsweep.core.train.{room}.{m}"
       for room, names in {"config": ("schemas", "rules", "setup", "diagnostics", "wsd"),
                           "optimisers": ("optim", "muon"),
                           "launch": ("torchrun", "submitit_job", "shard"),
                           "monitoring": ("callbacks", "callback_group", "decode_callback", "diagnostic_callbacks",
                                          "image_callbacks", "compute", "memory", "console", "loggers",
                                          "metrics_csv", "summary"),
                           "runs": ("rundir", "runinfo", "results", "resume", "sweep"),
                           "lifecycle": ("job", "fit", "branches")}.items()
       for m in names for old in ("archsweep.core.train", "src.core")
       if old != "src.core" or m in ("fit", "job", "callbacks", "decode_callback", "diagnostic_callbacks",
                                     "diagnostics", "loggers", "optim", "runinfo", "sweep")},
    "src.variants": "archsweep.variants",
}

# flat fields of the old ModelConfig -> (axis, option): the value goes to the chosen variant if it takes the option
FLAT_OPTIONS = {
    "rel_num_buckets": ("pos", "num_buckets"),
    "rel_max_distance": ("pos", "max_distance"),
    "rope_base": ("pos", "base"),
    "gelu_approximate": ("ffn", "approximate"),
    "gated_d_ff": ("ffn", "gated_d_ff"),
}
AXES = ("norm", "pos", "ffn")
# options added later with a default that computes something else than before: a variant spec written before the
# option existed (it lacks the key; specs written since carry every option) keeps what it computed then, where the
# spec holds the options with which it acts: (axis, option) -> (former value, {option: value where it acts})
FORMER_VALUES = {("pos", "p2c_index"): ("paper", {}), ("pos", "yarn_ramp"): ("paper", {"scaling": "yarn"})}


def module_path(name: str) -> str:
    for old, new in MODULES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return name


def _rename_targets(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: module_path(v) if k == "_target_" and isinstance(v, str) else _rename_targets(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rename_targets(v) for v in node]
    return node


def upgrade_model_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Old flat model fields -> today's: each variant as {"name", its options}; other keys unchanged."""
    return keep_former_values(flat_to_specs(fields))


def keep_former_values(fields: dict[str, Any]) -> dict[str, Any]:
    """A variant spec without an option of `FORMER_VALUES` that its variant takes, holding the options with which
    it acts, gets the former value."""
    from archsweep.core.model.config import AXES as REGISTRIES

    out = fields
    for (axis, option), (value, acts) in FORMER_VALUES.items():
        spec = fields.get(axis)
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or option in spec:
            continue
        if any(spec.get(key) != wanted for key, wanted in acts.items()):
            continue
        if spec["name"] not in REGISTRIES[axis].names():  # a user's variant (built from its _target_): no former value
            continue
        if option in REGISTRIES[axis].options(REGISTRIES[axis].get(spec["name"])):
            out = dict(out) if out is fields else out
            out[axis] = {**spec, option: value}
    return out


def flat_to_specs(fields: dict[str, Any]) -> dict[str, Any]:
    if not any(key in fields for key in FLAT_OPTIONS) and all(not isinstance(fields.get(a), str) for a in AXES):
        return fields
    fields = dict(fields)
    specs = {axis: {"name": fields[axis]} if isinstance(fields.get(axis), str) else fields.get(axis)
             for axis in AXES if axis in fields}
    from archsweep.core.model.config import AXES as REGISTRIES

    for key, (axis, option) in FLAT_OPTIONS.items():
        value = fields.pop(key, None)
        spec = specs.get(axis)
        if spec is not None and option in REGISTRIES[axis].options(REGISTRIES[axis].get(spec["name"])):
            spec[option] = value
    fields.update(specs)
    return fields


def upgrade(meta: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's `archsweep` entry in today's form."""
    meta = _rename_targets(copy.deepcopy(meta))
    if "model_config" in meta:
        meta["model_config"] = upgrade_model_fields(meta["model_config"])
    config = meta.get("config")
    if isinstance(config, dict) and isinstance(config.get("model"), dict):
        config["model"] = upgrade_model_fields(config["model"])
    return meta
