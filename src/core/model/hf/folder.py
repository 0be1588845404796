"""Import: a Hugging Face folder as the start of a run (train.py `model.init_from=<folder>`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from archsweep.core.model.config import AXES
from archsweep.core.model.hf.base import Layout, Weights
from archsweep.core.model.hf.layouts import layout_of

# fields whose value adds or shapes no weight: the run may set them otherwise than the folder's config.json (an
# ablation on top of published weights, e.g. another rotary scaling); the other fields come from the folder
WEIGHT_FREE = ("dropout", "attn_dropout", "emb_dropout", "init", "activation_checkpointing", "norm_eps",
               "max_seq_len", "attention")
OPTIONS_FREE = ("pos", "attention")  # axes whose options (not the choice) may differ: pos.scaling=linear


def read_folder(folder: str | Path) -> tuple[Layout, dict[str, Any]]:
    """The layout and config.json of a Hugging Face model folder; ValueError naming what is missing."""
    folder = Path(folder)
    where = f"model.init_from={folder}"
    if not folder.is_dir():
        raise ValueError(f"{where}: not a folder; give a Hugging Face model folder (config.json and "
                         f"model.safetensors)")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{where}: no config.json; give a Hugging Face model folder")
    hf = json.loads((folder / "config.json").read_text())
    layout = layout_of(hf, where)
    weight_files(folder)
    return layout, hf


def weight_files(folder: Path) -> list[Path]:
    """model.safetensors, or the shards its index names; ValueError when there are none."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ValueError(f"model.init_from={folder}: the index names {', '.join(missing[:3])}, which are not "
                             f"there; copy the whole folder")
        return [folder / n for n in names]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    others = sorted(p.name for p in folder.glob("*.bin"))
    found = f" (found {', '.join(others[:3])}: convert it to safetensors)" if others else ""
    raise ValueError(f"model.init_from={folder}: no weights (model.safetensors or model.safetensors.index.json)"
                     f"{found}; nothing is loaded from pickle files")


def import_fields(composed: dict[str, Any], hf_fields: dict[str, Any], overridden: set[str]) -> dict[str, Any]:
    """The model fields of a run starting from a folder: the folder's (`hf_fields`), except what the run set itself
    (`overridden`: keys given on the command line, as `n_layers`, `pos`, `pos.scaling`) to a weight-free value.
    A weight-bearing field the run sets otherwise than the folder is refused, naming both values."""
    fields = {**composed, **hf_fields}
    clashes = []
    for path in sorted(overridden):
        top, _, sub = path.partition(".")
        if top not in composed:
            continue
        if top in AXES and sub:
            theirs, ours = AXES[top].spec(fields[top]), AXES[top].spec(composed[top])
            if top in OPTIONS_FREE and theirs["name"] == ours["name"]:
                fields[top] = {**theirs, sub: ours[sub]}
            elif theirs.get(sub) != ours.get(sub):
                clashes.append(f"{path}={ours.get(sub)} (the folder's: {theirs.get(sub)})")
            continue
        if top in WEIGHT_FREE or top not in hf_fields:
            fields[top] = composed[top]
            continue
        theirs, ours = hf_fields[top], composed[top]
        if top in AXES:
            theirs, ours = AXES[top].spec(theirs)["name"], AXES[top].spec(ours)["name"]
        if theirs != ours:
            clashes.append(f"{top}={ours} (the folder's config.json: {theirs})")
    if clashes:
        raise ValueError(f"the run's options contradict the model it starts from: {', '.join(clashes)}; leave them "
                         f"unset (they come from the folder) or start from other weights")
    return fields


def load_folder_weights(model, folder: str | Path) -> None:
    """Load a folder's weights into `model`, built from `import_fields`; ValueError naming what does not fit."""
    from safetensors.torch import load_file

    folder = Path(folder)
    layout, _ = read_folder(folder)
    theirs: Weights = {}
    for path in weight_files(folder):
        theirs.update(load_file(str(path)))
    if not any(k.startswith(layout.base_prefix) for k in theirs):  # e.g. the original gpt2 folder: h.0.attn...
        theirs = {k if k.startswith("lm_head.") else layout.base_prefix + k: v for k, v in theirs.items()}
    cfg = model.config
    try:
        ours = layout.from_hf(cfg, theirs)
    except KeyError as e:
        raise ValueError(f"model.init_from={folder}: the weights lack {e.args[0]} that a {layout.architecture} of "
                         f"this config.json has; the folder is incomplete or of another layout") from None
    own = model.state_dict()
    missing = sorted(set(own) - set(ours))
    shapes = [f"{k} {tuple(ours[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(set(own) & set(ours))
              if ours[k].shape != own[k].shape]
    if missing or shapes:
        found = "; ".join(p for p in (f"the run's model also has {', '.join(missing[:4])}" if missing else "",
                                      f"shapes differ: {'; '.join(shapes[:4])}" if shapes else "") if p)
        raise ValueError(f"model.init_from={folder}: the weights do not fit the run's model ({found}); options "
                         f"that add weights (plug-ins such as qk_norm or mtp) cannot be added to imported weights")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in ours.items()})
