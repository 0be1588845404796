"""Reading runs written by older versions: before the package was renamed (import name `src`, flat model
fields), and before the model options became plug-ins (flat fields `qk_norm`, `attn_gate`, `mtp`, ...).

Checkpoints and configs of the first time name classes as `src.core.tasks.synthetic.ReverseTask` and keep each
variant's options as flat model fields (`rope_base`, `rel_num_buckets`, `gated_d_ff`, ...); those of the second
keep each plug-in as flat fields and its weights under the attention layer (`self_attn.q_norm.weight`). `upgrade`
turns such a checkpoint's `archsweep` entry into today's form and `upgrade_state` its weights' names, so old runs
load, evaluate and resume; a current checkpoint passes through unchanged. `upgrade_overrides` reads the old
command-line spellings (`model.attn_gate=headwise`) as today's (`attn_gate=headwise`), saying what each became.
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


# flat fields of the ModelConfig before the plug-ins -> the plug-in (its group) they became; `PLUGIN_VALUES` turns
# the old value (and its companion field) into the plug-in's options, or None where the old value meant off
FLAT_PLUGINS = {"qk_norm": "qk_norm", "attn_softcap": "attn_softcap", "logit_softcap": "logit_softcap",
                "z_loss": "z_loss", "value_residual": "value_residual", "attn_gate": "attn_gate",
                "attn_sink": "attn_sink", "mtp": "mtp"}
COMPANIONS = {"value_residual_lambda": "value_residual", "mtp_weight": "mtp"}  # a second flat field of a plug-in
OFF = (None, "none", 0, 0.0)  # old values that meant off


def plugin_options(name: str, value: Any, companion: Any) -> dict[str, Any] | None:
    """The options of plug-in `name` for the old flat field's value (and its companion field's); None: off."""
    if value in OFF:
        return None
    options: dict[str, Any] = {
        "qk_norm": lambda: {"type": value},
        "attn_softcap": lambda: {"cap": float(value)},
        "logit_softcap": lambda: {"cap": float(value)},
        "z_loss": lambda: {"weight": float(value)},
        "value_residual": lambda: {"learnable": value == "learnable", "weight": 0.5 if companion is None
                                   else float(companion)},
        "attn_gate": lambda: {"per": "channel" if value == "elementwise" else "head"},
        "attn_sink": lambda: {"learned": value != "off_by_one"},
        "mtp": lambda: {"depths": int(value), "weight": 0.3 if companion is None else float(companion)},
    }[name]()
    return options


def flat_to_plugins(fields: dict[str, Any]) -> dict[str, Any]:
    """Old flat plug-in fields -> `plugins`; fields without any pass through unchanged."""
    if not any(key in fields for key in (*FLAT_PLUGINS, *COMPANIONS)):
        return fields
    fields = dict(fields)
    plugins = dict(fields.get("plugins") or {})
    companions = {COMPANIONS[k]: fields.pop(k) for k in list(fields) if k in COMPANIONS}
    for key, name in FLAT_PLUGINS.items():
        if key in fields:
            options = plugin_options(name, fields.pop(key), companions.get(name))
            if options is not None:
                plugins[name] = options
    fields["plugins"] = plugins
    return fields


# weights that moved when the options became plug-ins: (old name part, new name part), on checkpoints whose
# model config had the flat fields
STATE_RENAMES = ((".q_norm.", ".plugins.qk_norm.q_norm."), (".k_norm.", ".plugins.qk_norm.k_norm."),
                 (".self_attn.gate.", ".self_attn.plugins.attn_gate."),
                 (".self_attn.sink.", ".self_attn.plugins.attn_sink."),
                 (".self_attn.value_lambdas", ".self_attn.plugins.value_residual.lambdas"))


def upgrade_state(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A state dict of a model built before the plug-ins, with today's names (`prefix`: "model." for a
    LightningModule's); names of today's models pass through."""
    out = {}
    for key, value in state.items():
        new = key
        if key.startswith(prefix) and key[len(prefix):].startswith("mtp."):
            new = f"{prefix}plugins.{key[len(prefix):]}"
        for old, moved in STATE_RENAMES:
            if old in new and moved not in new:
                new = new.replace(old, moved)
        out[new] = value
    return out


def is_flat(model_fields: Any) -> bool:
    """Whether a stored model config predates the plug-ins (it has their flat fields)."""
    return isinstance(model_fields, dict) and "plugins" not in model_fields and any(
        key in model_fields for key in FLAT_PLUGINS)


def upgrade_checkpoint(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A loaded checkpoint dict in today's form, in place: its `archsweep` entry and its weights' names."""
    meta = ckpt.get("archsweep")
    if isinstance(meta, dict):
        old = is_flat(meta.get("model_config"))
        ckpt["archsweep"] = upgrade(meta)
        if old and isinstance(ckpt.get("state_dict"), dict):
            ckpt["state_dict"] = upgrade_state(ckpt["state_dict"], "model.")
            # the parameters' order then (the optimizer's state is by position): `reorder_optimizer_state`
            ckpt["archsweep"]["legacy_order"] = list(ckpt["state_dict"])
    return ckpt


def reorder_optimizer_state(state: dict[str, Any], groups: list[list[str]], old_order: list[str]) -> dict[str, Any]:
    """An optimizer state dict saved by a model whose parameters were registered in `old_order` (today's names),
    for today's optimizer, whose groups hold the parameters named `groups` in today's order. The groups hold the
    same parameters as then; only the order within a group moved (a plug-in's parameters)."""
    position = {name: i for i, name in enumerate(old_order)}
    old_index, new_index, start = {}, {}, 0
    for names in groups:
        then = sorted(names, key=lambda n: position.get(n, len(position)))
        old_index.update((n, start + i) for i, n in enumerate(then))
        new_index.update((n, start + i) for i, n in enumerate(names))
        start += len(names)
    moved = {old_index[n]: new_index[n] for n in new_index}
    out = dict(state)
    out["state"] = {moved.get(k, k): v for k, v in state["state"].items()}
    # torch pairs a group's saved ids with its parameters by position: today's ids, in today's order
    out["param_groups"] = [{**g, "params": sorted(moved.get(k, k) for k in g["params"])} for g in state["param_groups"]]
    return out


# the option (yaml) of a plug-in's group that an old numeric flat field switches on, its value then set as an option
NUMERIC = {"attn_softcap": ("gemma2", "cap"), "logit_softcap": ("gemma2", "cap"), "z_loss": ("palm", "weight"),
           "mtp": ("deepseek_v3", "depths")}


def upgrade_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """Command-line overrides with the old spellings of plug-ins (`model.attn_gate=headwise`, `model.mtp=2`) as
    today's (`attn_gate=headwise`, `mtp=deepseek_v3 model.plugins.mtp.depths=2`), and a note for each naming what
    it became. A sweep of an old spelling whose values name options (`model.attn_sink=none,learned`) becomes the
    group's sweep; one of numbers (`model.logit_softcap=null,30`) is left alone (the composition check then names
    the setting)."""
    out, notes = [], []
    flat = {f"model.{k}": k for k in (*FLAT_PLUGINS, *COMPANIONS)}
    for arg in overrides:
        key, sep, value = arg.partition("=")
        field = flat.get(key.lstrip("+"))
        if not sep or field is None or ("," in value and (field in NUMERIC or field in COMPANIONS)):
            out.append(arg)
            continue
        if "," in value:
            new = [f"{field}={','.join('none' if v in ('null', 'None') else v for v in value.split(','))}"]
        elif field in COMPANIONS:
            new = [f"model.plugins.{COMPANIONS[field]}.weight={value}"]
        elif _number(value) in OFF or value in ("null", "None"):
            new = [f"{field}=none"]
        elif field in NUMERIC:
            option, key_of_value = NUMERIC[field]
            new = [f"{field}={option}", f"model.plugins.{field}.{key_of_value}={value}"]
        else:
            new = [f"{field}={value}"]
        out += new
        notes.append(f"{arg} is now {' '.join(new)}")
    return out, notes


def _number(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


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
    """Old flat model fields -> today's: each variant as {"name", its options}, each plug-in in `plugins`; other
    keys unchanged."""
    return keep_former_values(flat_to_plugins(flat_to_specs(fields)))


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
