"""The layouts by their `architectures` name, and the choice of one for a configuration or a folder."""

from __future__ import annotations

from typing import Any

from archsweep.core.model.config import ModelConfig
from archsweep.core.model.hf.base import Layout
from archsweep.core.model.hf.gpt2 import GPT2
from archsweep.core.model.hf.llama import Llama, Mistral
from archsweep.core.model.hf.vit import ViT

LAYOUTS: dict[str, Layout] = {x.architecture: x for x in (GPT2(), Llama(), Mistral(), ViT())}


def layout_for(cfg: ModelConfig) -> Layout:
    """The first layout with a place for every option of `cfg`; a ValueError naming, for the closest ones, each
    option that has none."""
    refused = {name: layout.refusals(cfg) for name, layout in LAYOUTS.items()}
    fitting = [name for name, reasons in refused.items() if not reasons]
    if fitting:
        return LAYOUTS[fitting[0]]
    fewest = min(len(r) for r in refused.values())
    closest = "; ".join(f"as {name}: {', '.join(r)}" for name, r in refused.items() if len(r) == fewest)
    raise ValueError(f"this model has no exact Hugging Face equivalent ({closest}); nothing was written. "
                     f"Exported are {', '.join(LAYOUTS)} configurations")


def layout_of(hf: dict[str, Any], where: str) -> Layout:
    """The layout a config.json names in `architectures`."""
    names = hf.get("architectures") or []
    found = [LAYOUTS[n] for n in names if n in LAYOUTS]
    if not found:
        raise ValueError(f"{where}: architectures={names} is none of the layouts archsweep reads "
                         f"({', '.join(LAYOUTS)})")
    return found[0]


class _Reads(dict):
    """A dict that records which keys were read."""

    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def to_hf(layout: Layout, cfg: ModelConfig, ours: dict[str, Any]) -> dict[str, Any]:
    """`layout.to_hf`, refused (ValueError) when it leaves a weight of ours unmapped: every state-dict key is read
    by the layout or is the same tensor as one that is (a tied head). The error names each key and the option
    (plug-in) or module that owns it."""
    reads = _Reads(ours)
    weights = layout.to_hf(cfg, reads)
    mapped = {(ours[k].data_ptr(), tuple(ours[k].shape)) for k in reads.read if k in ours}
    left = [k for k in ours if k not in reads.read and (ours[k].data_ptr(), tuple(ours[k].shape)) not in mapped]
    if left:
        raise ValueError(f"{layout.architecture} has no place for {', '.join(owner(k) for k in left[:6])}"
                         f"{f' and {len(left) - 6} more' if len(left) > 6 else ''}; the exported model would compute "
                         f"something else, so nothing was written")
    return weights


def owner(key: str) -> str:
    """`decoder.blocks.0.self_attn.plugins.attn_gate.gate_proj.weight` -> that key, of the option attn_gate."""
    parts = key.split(".")
    if "plugins" in parts[:-1]:
        return f"{key} (of the option {parts[parts.index('plugins') + 1]})"
    return f"{key} (of the module {'.'.join(parts[:-1]) or 'model'})"
