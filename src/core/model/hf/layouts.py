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
